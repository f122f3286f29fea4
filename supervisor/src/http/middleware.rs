//! What wraps every request: its id (`x-request-id`, echoed or generated, and the same id again in
//! the Jev API's `x-typesafe-request-id`), the DNS-rebinding `Host` check on loopback binds (421),
//! error answers in the output profile's shape, the `Server-Timing` header, and one log line per
//! request.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, Uri, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tracing::Instrument;

use laya::output::OutputProfile;

use crate::decisions::Timings;
use crate::http::response::{ApiError, in_profile};

/// The `x-request-id` header.
static REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
/// The Jev API's name for the same id: Jev clients (jevantic) read it from every answer, and
/// neither upstream release sends it, so layad sends both in every profile.
static TYPESAFE_REQUEST_ID: HeaderName = HeaderName::from_static("x-typesafe-request-id");
/// The `server-timing` header.
static SERVER_TIMING: HeaderName = HeaderName::from_static("server-timing");

/// Longest client-sent request id that is echoed; longer or odd ones are replaced.
const MAX_REQUEST_ID_LEN: usize = 128;

/// Per-request facts every handler may need, put in the request's extensions.
#[derive(Clone, Debug)]
pub struct RequestContext {
    /// The request id sent back in `x-request-id`.
    pub id: String,
    /// When the request's headers had been read.
    pub started: Instant,
}

/// Ids are `<process seed><counter>`: unique within the process, and across restarts in practice.
fn new_request_id() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    static SEED: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    let seed = *SEED.get_or_init(|| {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        splitmix64(nanos ^ u64::from(std::process::id()).rotate_left(32))
    });
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{seed:016x}{:08x}", n as u32)
}

fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// The client's id if it is short visible ASCII (safe to log and echo), else a new one.
fn request_id(headers: &HeaderMap) -> String {
    headers
        .get(&REQUEST_ID)
        .map(HeaderValue::as_bytes)
        .filter(|id| !id.is_empty() && id.len() <= MAX_REQUEST_ID_LEN && id.iter().all(|b| (b'!'..=b'~').contains(b)))
        .and_then(|id| std::str::from_utf8(id).ok())
        .map_or_else(new_request_id, str::to_owned)
}

/// Which `Host` names a loopback-bound server answers (the DNS-rebinding guard: a page from another
/// site may reach 127.0.0.1 but cannot make its `Host` a loopback name). Bound elsewhere: none.
#[derive(Clone, Debug)]
pub struct HostCheck {
    /// Configured extra names (`server.allowed_hosts`), lower-cased.
    allowed: Vec<String>,
}

impl HostCheck {
    /// A check accepting loopback names plus `allowed`.
    pub fn new(allowed: &[String]) -> Self {
        Self {
            allowed: allowed.iter().map(|h| h.to_ascii_lowercase()).collect(),
        }
    }

    /// 421 unless the request names a loopback host (or an allowed one). A request with no
    /// `Host` at all (HTTP/1.0) is not a browser's, so it passes.
    pub fn check(&self, headers: &HeaderMap, uri: &Uri) -> Result<(), ApiError> {
        let host = match uri.authority() {
            Some(authority) => authority.as_str().to_owned(),
            None => match headers.get(header::HOST) {
                Some(value) => String::from_utf8_lossy(value.as_bytes()).into_owned(),
                None => return Ok(()),
            },
        };
        let name = host_name(&host).to_ascii_lowercase();
        let name = name.strip_suffix('.').unwrap_or(&name);
        if is_loopback_name(name) || self.allowed.iter().any(|a| a == name) {
            return Ok(());
        }
        Err(ApiError::new(
            StatusCode::MISDIRECTED_REQUEST,
            format!(
                "Host '{host}' is not a loopback name; this server is bound to loopback and only \
                 answers local clients (add the name to server.allowed_hosts to accept it)"
            ),
        ))
    }
}

/// The host part of a `Host` value: `[::1]:80` → `[::1]`, `localhost:8642` → `localhost`.
fn host_name(host: &str) -> &str {
    let host = host.trim();
    if host.starts_with('[') {
        return host.find(']').map_or(host, |end| &host[..=end]);
    }
    match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    }
}

/// `localhost`, `*.localhost` (RFC 6761 keeps both on loopback), `127.0.0.0/8`, `[::1]`.
fn is_loopback_name(name: &str) -> bool {
    if name == "localhost" || name.ends_with(".localhost") {
        return true;
    }
    if let Some(v6) = name.strip_prefix('[').and_then(|n| n.strip_suffix(']')) {
        return v6.parse::<Ipv6Addr>().is_ok_and(|ip| ip.is_loopback());
    }
    name.parse::<Ipv4Addr>().is_ok_and(|ip| IpAddr::V4(ip).is_loopback())
}

/// The `x-inference-time-ms` header (upstream 0.4.x).
static INFERENCE_TIME: HeaderName = HeaderName::from_static("x-inference-time-ms");

/// `prepare;dur=0.214, queue;dur=0.010, device;dur=3.870, total;dur=4.502` (milliseconds), after
/// upstream 0.4.x's own `inference;dur=4.40` (two decimals, as upstream writes it) when the
/// decision reported one.
fn server_timing(timings: &Timings, total: Duration) -> String {
    let upstream = timings
        .inference
        .map(|d| format!("inference;dur={:.2}", d.as_secs_f64() * 1000.0));
    let ours = [
        ("prepare", timings.prepare),
        ("queue", timings.queue),
        ("device", timings.device),
        ("total", Some(total)),
    ]
    .into_iter()
    .filter_map(|(name, d)| d.map(|d| format!("{name};dur={:.3}", d.as_secs_f64() * 1000.0)));
    upstream.into_iter().chain(ours).collect::<Vec<_>>().join(", ")
}

/// What the frame around every request needs.
#[derive(Clone, Debug)]
pub struct Frame {
    /// The `Host` check, on loopback binds only.
    pub host_check: Option<Arc<HostCheck>>,
    /// The server's output profile, whose shape every error answer takes (whichever route or
    /// fallback produced it).
    pub output: OutputProfile,
}

/// Wraps every request: id, `Host` check (when `host_check` is set), then the route, then the
/// error answer's shape in the output profile, `x-request-id`, `x-typesafe-request-id` and
/// `Server-Timing` on whatever answer came back.
pub async fn frame(State(frame): State<Frame>, mut request: Request, next: Next) -> Response {
    let context = RequestContext {
        id: request_id(request.headers()),
        started: Instant::now(),
    };
    let span = tracing::info_span!("request", id = %context.id);
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let host_check = match &frame.host_check {
        Some(check) => check.check(request.headers(), request.uri()),
        None => Ok(()),
    };
    request.extensions_mut().insert(context.clone());
    let response = match host_check {
        Ok(()) => next.run(request).instrument(span.clone()).await,
        Err(e) => e.into_response(),
    };
    let mut response = in_profile(response, frame.output);
    let total = context.started.elapsed();
    let timings = response.extensions().get::<Timings>().copied().unwrap_or_default();
    let headers = response.headers_mut();
    if let Ok(id) = HeaderValue::from_str(&context.id) {
        headers.insert(TYPESAFE_REQUEST_ID.clone(), id.clone());
        headers.insert(REQUEST_ID.clone(), id);
    }
    if let Ok(timing) = HeaderValue::from_str(&server_timing(&timings, total)) {
        headers.insert(SERVER_TIMING.clone(), timing);
    }
    if let Some(inference) = timings.inference
        && let Ok(ms) = HeaderValue::from_str(&format!("{:.2}", inference.as_secs_f64() * 1000.0))
    {
        headers.insert(INFERENCE_TIME.clone(), ms);
    }
    let status = response.status().as_u16();
    let _enter = span.enter();
    let ms = total.as_secs_f64() * 1000.0;
    if path.starts_with("/v1/") {
        tracing::info!(%method, %path, status, ms, "request");
    } else {
        tracing::debug!(%method, %path, status, ms, "request");
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(host: Option<&str>, allowed: &[&str]) -> Option<u16> {
        let mut headers = HeaderMap::new();
        if let Some(host) = host {
            headers.insert(header::HOST, HeaderValue::from_str(host).expect("host"));
        }
        let allowed: Vec<String> = allowed.iter().map(|s| s.to_string()).collect();
        HostCheck::new(&allowed)
            .check(&headers, &Uri::from_static("/health"))
            .err()
            .map(|e| e.status.as_u16())
    }

    #[test]
    fn loopback_names_pass_and_others_get_421() {
        for ok in [
            "localhost",
            "LOCALHOST:8642",
            "localhost.",
            "app.localhost:1",
            "127.0.0.1",
            "127.1.2.3:80",
            "[::1]",
            "[::1]:8642",
        ] {
            assert_eq!(check(Some(ok), &[]), None, "{ok}");
        }
        assert_eq!(check(None, &[]), None);
        for bad in [
            "evil.example",
            "evil.example:8642",
            "localhost.evil.example",
            "10.0.0.1",
            "[::2]:80",
            "0.0.0.0",
            "",
        ] {
            assert_eq!(check(Some(bad), &[]), Some(421), "{bad}");
        }
        assert_eq!(check(Some("layad.internal:8642"), &["Layad.Internal"]), None);
    }

    #[test]
    fn an_absolute_form_target_is_checked_too() {
        let uri: Uri = "http://evil.example/health".parse().expect("uri");
        let mut headers = HeaderMap::new();
        headers.insert(header::HOST, HeaderValue::from_static("localhost"));
        assert!(HostCheck::new(&[]).check(&headers, &uri).is_err());
    }

    #[test]
    fn sane_request_ids_are_echoed_and_others_replaced() {
        let id = |value: &[u8]| {
            let mut headers = HeaderMap::new();
            headers.insert(REQUEST_ID.clone(), HeaderValue::from_bytes(value).expect("value"));
            request_id(&headers)
        };
        assert_eq!(id(b"abc-123_x.y:z"), "abc-123_x.y:z");
        for odd in [&b"has space"[..], &[b'a'; 129][..], b"caf\xc3\xa9"] {
            let replaced = id(odd);
            assert_eq!(replaced.len(), 24, "{replaced}");
            assert!(replaced.bytes().all(|b| b.is_ascii_hexdigit()));
        }
        assert_ne!(new_request_id(), new_request_id());
    }

    #[test]
    fn server_timing_lists_known_phases_in_milliseconds() {
        let timings = Timings {
            prepare: Some(Duration::from_micros(250)),
            queue: None,
            device: Some(Duration::from_millis(4)),
            class: None,
            inference: None,
        };
        assert_eq!(
            server_timing(&timings, Duration::from_millis(5)),
            "prepare;dur=0.250, device;dur=4.000, total;dur=5.000"
        );
        let upstream = Timings {
            inference: Some(Duration::from_micros(4_406)),
            ..timings
        };
        assert_eq!(
            server_timing(&upstream, Duration::from_millis(5)),
            "inference;dur=4.41, prepare;dur=0.250, device;dur=4.000, total;dur=5.000"
        );
    }
}
