//! Admission of a decision request before any Laya work, in upstream's order: bearer key, the
//! in-progress cap when one is configured (`server.max_concurrent`, upstream's
//! `LAYA_MAX_CONCURRENT`), declared size, then the body streamed under a byte cap and a deadline,
//! then its `Content-Encoding` decoded.
//!
//! Decoding stops one byte past the cap, so a decompression bomb costs at most the cap to refuse.

use std::io::Read;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderMap, StatusCode, header};
use bytes::{Bytes, BytesMut};
use http_body_util::BodyExt;
use layad_config::ApiKey;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::http::response::ApiError;

/// Largest zstd window accepted: zstd level 19 uses 8 MiB; larger windows only serve to make the
/// decoder allocate more than any accepted body needs.
const ZSTD_MAX_WINDOW: u64 = 8 * 1024 * 1024;

/// The checks every `POST /v1/systemone` passes before Laya sees its body.
#[derive(Clone, Debug)]
pub struct Admission {
    api_key: Option<ApiKey>,
    max_body_bytes: usize,
    body_timeout: Duration,
    /// Places for decision requests in progress (`server.max_concurrent`); `None`: no cap.
    in_progress: Option<Arc<Semaphore>>,
}

impl Admission {
    /// Checks with this key (none = no auth), body cap (after decoding) and body deadline.
    pub fn new(api_key: Option<ApiKey>, max_body_bytes: usize, body_timeout: Duration) -> Self {
        Self {
            api_key,
            max_body_bytes,
            body_timeout,
            in_progress: None,
        }
    }

    /// At most `cap` admitted requests in progress at once; more are refused at once (503).
    pub fn with_max_concurrent(mut self, cap: Option<u32>) -> Self {
        self.in_progress = cap.map(|n| Arc::new(Semaphore::new(n as usize)));
        self
    }

    /// Upstream 0.4.15's admission: a place, or 503 `server busy, try again later` with
    /// `Retry-After: 1` without queueing.
    fn take_place(&self) -> Result<Option<OwnedSemaphorePermit>, ApiError> {
        match &self.in_progress {
            None => Ok(None),
            Some(places) => Arc::clone(places)
                .try_acquire_owned()
                .map(Some)
                .map_err(|_| ApiError::unavailable("server busy, try again later", Duration::from_secs(1))),
        }
    }

    /// Everything before Laya sees a `POST /v1/systemone`: the bearer key, the headers, the body
    /// read under its cap and deadline, then decoded (off the reactor when it is compressed).
    pub async fn admit(&self, request: Request) -> Result<Admitted, ApiError> {
        let (parts, body) = request.into_parts();
        self.authorize(&parts.headers)?;
        let place = self.take_place()?;
        let encoding = self.check_headers(&parts.headers)?;
        let wire = self.read_body(body).await?;
        let prepare_started = Instant::now();
        let json = match encoding {
            ContentEncoding::Identity => wire,
            coding => {
                let cap = self.max_body_bytes;
                tokio::task::spawn_blocking(move || coding.decode(wire, cap))
                    .await
                    .map_err(|join| {
                        tracing::error!(error = %join, "decoding the request body panicked");
                        ApiError::inference_failed()
                    })??
            }
        };
        Ok(Admitted {
            json,
            prepare_started,
            _place: place,
        })
    }

    /// Upstream's bearer check: with a key configured, the `Authorization` header must be exactly
    /// `Bearer <key>` (compared in constant time; header bytes read as Latin-1, as Starlette does).
    pub fn authorize(&self, headers: &HeaderMap) -> Result<(), ApiError> {
        let Some(key) = &self.api_key else {
            return Ok(());
        };
        let expected = format!("Bearer {}", key.expose());
        let supplied: String = headers
            .get(header::AUTHORIZATION)
            .map(|v| v.as_bytes().iter().map(|&b| char::from(b)).collect())
            .unwrap_or_default();
        if constant_time_eq(supplied.as_bytes(), expected.as_bytes()) {
            Ok(())
        } else {
            Err(ApiError::unauthorized())
        }
    }

    /// Everything decidable from the headers: a declared `Content-Length` over the cap (413, before
    /// reading), then the `Content-Encoding` (415 for one layad cannot decode).
    pub fn check_headers(&self, headers: &HeaderMap) -> Result<ContentEncoding, ApiError> {
        if let Some(declared) = headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()) {
            let declared = declared.trim();
            // Upstream ignores a value that is not an integer; hyper has already refused those.
            let too_large = match declared.parse::<u64>() {
                Ok(n) => n > self.max_body_bytes as u64,
                Err(_) => !declared.is_empty() && declared.bytes().all(|b| b.is_ascii_digit()),
            };
            if too_large {
                return Err(ApiError::body_too_large());
            }
        }
        ContentEncoding::from_headers(headers)
    }

    /// Reads the body as it arrives: 413 as soon as it passes the cap, 408 if it is not complete
    /// within the body deadline.
    pub async fn read_body(&self, body: Body) -> Result<Bytes, ApiError> {
        let cap = self.max_body_bytes;
        let read = async move {
            let mut body = body;
            let mut buffer = BytesMut::new();
            while let Some(frame) = body.frame().await {
                let frame = frame.map_err(|e| {
                    ApiError::new(StatusCode::BAD_REQUEST, format!("request body could not be read: {e}"))
                })?;
                if let Ok(data) = frame.into_data() {
                    if buffer.len() + data.len() > cap {
                        return Err(ApiError::body_too_large());
                    }
                    buffer.extend_from_slice(&data);
                }
            }
            Ok(buffer.freeze())
        };
        tokio::time::timeout(self.body_timeout, read)
            .await
            .map_err(|_| ApiError::body_timeout())?
    }
}

/// A request body that passed admission.
#[derive(Debug)]
pub struct Admitted {
    /// The body, decoded: what Laya parses.
    pub json: Bytes,
    /// When host work on it began (its decoding), for the prepare timing.
    pub prepare_started: Instant,
    /// Its place under `server.max_concurrent`, held until the answer is ready.
    _place: Option<OwnedSemaphorePermit>,
}

/// Compares without returning early, so the time taken does not tell how much of a guess matched.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut difference = u8::from(a.len() != b.len());
    for (i, &expected) in b.iter().enumerate() {
        difference |= a.get(i).copied().unwrap_or(!expected) ^ expected;
    }
    difference == 0
}

/// How the request body is encoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ContentEncoding {
    /// Not encoded.
    Identity,
    /// `gzip` / `x-gzip` (one or more gzip members).
    Gzip,
    /// `deflate`: zlib-wrapped as RFC 9110 says, or raw deflate as some clients send.
    Deflate,
    /// `zstd`, as the Jev SDKs send bodies of 1 KiB and more (one or more frames).
    Zstd,
}

impl ContentEncoding {
    /// Reads `Content-Encoding`; `identity` entries are ignored. 415 for anything else than one
    /// coding layad can decode.
    pub fn from_headers(headers: &HeaderMap) -> Result<Self, ApiError> {
        let mut codings = Vec::new();
        for value in headers.get_all(header::CONTENT_ENCODING) {
            let text = String::from_utf8_lossy(value.as_bytes()).into_owned();
            codings.extend(
                text.split(',')
                    .map(|c| c.trim().to_ascii_lowercase())
                    .filter(|c| !c.is_empty() && c != "identity"),
            );
        }
        let unsupported = |detail: String| ApiError::new(StatusCode::UNSUPPORTED_MEDIA_TYPE, detail);
        match codings.as_slice() {
            [] => Ok(Self::Identity),
            [one] => match one.as_str() {
                "gzip" | "x-gzip" => Ok(Self::Gzip),
                "deflate" => Ok(Self::Deflate),
                "zstd" => Ok(Self::Zstd),
                other => Err(unsupported(format!(
                    "unsupported Content-Encoding '{other}'; send the body as identity, gzip, deflate or zstd"
                ))),
            },
            several => Err(unsupported(format!(
                "Content-Encoding '{}' stacks several codings; use at most one of gzip, deflate or zstd",
                several.join(", ")
            ))),
        }
    }

    /// The header spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Identity => "identity",
            Self::Gzip => "gzip",
            Self::Deflate => "deflate",
            Self::Zstd => "zstd",
        }
    }

    /// Decodes `wire`, refusing (413) as soon as the output passes `cap` bytes, and answering 400
    /// naming the coding when the data is not valid. CPU work: call it off the async reactor.
    pub fn decode(self, wire: Bytes, cap: usize) -> Result<Bytes, ApiError> {
        let limit = cap as u64 + 1;
        let mut out = Vec::new();
        let result = match self {
            Self::Identity => return Ok(wire),
            Self::Gzip => flate2::read::MultiGzDecoder::new(&wire[..])
                .take(limit)
                .read_to_end(&mut out),
            Self::Deflate if is_zlib_header(&wire) => flate2::read::ZlibDecoder::new(&wire[..])
                .take(limit)
                .read_to_end(&mut out),
            Self::Deflate => flate2::read::DeflateDecoder::new(&wire[..])
                .take(limit)
                .read_to_end(&mut out),
            Self::Zstd => decode_zstd_frames(&wire, limit, &mut out),
        };
        if out.len() > cap {
            return Err(ApiError::body_too_large());
        }
        result.map_err(|e| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                format!(
                    "request body is not valid {} data (Content-Encoding: {}): {e}",
                    self.as_str(),
                    self.as_str()
                ),
            )
        })?;
        Ok(Bytes::from(out))
    }
}

/// RFC 1950: compression method 8 and a header checksum divisible by 31.
fn is_zlib_header(data: &[u8]) -> bool {
    match data {
        [cmf, flg, ..] => cmf & 0x0F == 8 && (u16::from(*cmf) * 256 + u16::from(*flg)) % 31 == 0,
        _ => false,
    }
}

/// Decodes consecutive zstd frames until the input ends or `limit` bytes were produced.
fn decode_zstd_frames(wire: &[u8], limit: u64, out: &mut Vec<u8>) -> std::io::Result<usize> {
    let mut input = wire;
    if input.is_empty() {
        return Err(std::io::Error::other("empty body"));
    }
    while !input.is_empty() && (out.len() as u64) < limit {
        let mut frame = ruzstd::decoding::StreamingDecoder::new_with_max_window_size(&mut input, ZSTD_MAX_WINDOW)
            .map_err(std::io::Error::other)?;
        (&mut frame).take(limit - out.len() as u64).read_to_end(out)?;
    }
    Ok(out.len())
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use axum::http::HeaderValue;

    use super::*;

    fn headers(pairs: &[(&str, &[u8])]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(
                header::HeaderName::from_bytes(name.as_bytes()).expect("name"),
                HeaderValue::from_bytes(value).expect("value"),
            );
        }
        map
    }

    fn with_key(key: &str) -> Admission {
        Admission::new(Some(ApiKey::new(key)), 100, Duration::from_secs(1))
    }

    #[test]
    fn the_bearer_check_is_exact() {
        let admission = with_key("secret");
        let auth = |v: &[u8]| admission.authorize(&headers(&[("authorization", v)])).is_ok();
        assert!(auth(b"Bearer secret"));
        for bad in [
            &b"bearer secret"[..],
            b"Bearer  secret",
            b"Bearer secret ",
            b"secret",
            b"Bearer secre",
            b"",
        ] {
            assert!(!auth(bad), "{:?}", String::from_utf8_lossy(bad));
        }
        assert!(admission.authorize(&HeaderMap::new()).is_err());
        assert!(
            Admission::new(None, 1, Duration::from_secs(1))
                .authorize(&HeaderMap::new())
                .is_ok()
        );
    }

    #[test]
    fn header_bytes_are_read_as_latin1_like_starlette() {
        // Starlette decodes header bytes as Latin-1 and laya re-encodes UTF-8: only the Latin-1
        // byte 0xE9 matches a key containing "é"; its UTF-8 bytes do not.
        let admission = with_key("caf\u{e9}");
        assert!(
            admission
                .authorize(&headers(&[("authorization", b"Bearer caf\xe9")]))
                .is_ok()
        );
        assert!(
            admission
                .authorize(&headers(&[("authorization", "Bearer caf\u{e9}".as_bytes())]))
                .is_err()
        );
    }

    #[test]
    fn declared_length_and_encoding() {
        let admission = Admission::new(None, 100, Duration::from_secs(1));
        let check = |pairs: &[(&str, &[u8])]| admission.check_headers(&headers(pairs));
        assert_eq!(check(&[("content-length", b"100")]), Ok(ContentEncoding::Identity));
        assert_eq!(
            check(&[("content-length", b"101")]).map_err(|e| e.status),
            Err(StatusCode::PAYLOAD_TOO_LARGE)
        );
        assert_eq!(
            check(&[("content-length", b"99999999999999999999999")]).map_err(|e| e.status),
            Err(StatusCode::PAYLOAD_TOO_LARGE)
        );
        assert_eq!(check(&[("content-encoding", b"ZSTD")]), Ok(ContentEncoding::Zstd));
        assert_eq!(
            check(&[("content-encoding", b"identity, x-gzip")]),
            Ok(ContentEncoding::Gzip)
        );
        assert_eq!(check(&[("content-encoding", b"deflate")]), Ok(ContentEncoding::Deflate));
        let br = check(&[("content-encoding", b"br")]).expect_err("br is refused");
        assert_eq!(br.status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
        assert!(br.detail.contains("'br'"), "{}", br.detail);
        let stacked = check(&[("content-encoding", b"gzip"), ("content-encoding", b"zstd")]).expect_err("stacked");
        assert!(stacked.detail.contains("'gzip, zstd'"), "{}", stacked.detail);
    }

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        encoder.write_all(data).expect("gzip");
        encoder.finish().expect("gzip")
    }

    #[test]
    fn every_coding_decodes_to_the_same_bytes() {
        let plain = br#"{"questions": {}, "state": "hello"}"#;
        let zlib = {
            let mut e = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
            e.write_all(plain).expect("zlib");
            e.finish().expect("zlib")
        };
        let raw = {
            let mut e = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::default());
            e.write_all(plain).expect("deflate");
            e.finish().expect("deflate")
        };
        let zstd = ruzstd::encoding::compress_to_vec(&plain[..], ruzstd::encoding::CompressionLevel::Fastest);
        let two_frames = [zstd.clone(), zstd.clone()].concat();
        let two_members = [gzip(plain), gzip(plain)].concat();
        let cases = [
            (ContentEncoding::Identity, plain.to_vec(), plain.to_vec()),
            (ContentEncoding::Gzip, gzip(plain), plain.to_vec()),
            (ContentEncoding::Gzip, two_members, [&plain[..], &plain[..]].concat()),
            (ContentEncoding::Deflate, zlib, plain.to_vec()),
            (ContentEncoding::Deflate, raw, plain.to_vec()),
            (ContentEncoding::Zstd, zstd, plain.to_vec()),
            (ContentEncoding::Zstd, two_frames, [&plain[..], &plain[..]].concat()),
        ];
        for (coding, wire, want) in cases {
            let got = coding.decode(Bytes::from(wire), 1000).expect("decodes");
            assert_eq!(&got[..], &want[..], "{coding:?}");
        }
    }

    #[test]
    fn the_cap_applies_after_decoding_and_stops_a_bomb_early() {
        let bomb = gzip(&vec![b' '; 50 * 1024 * 1024]);
        assert!(bomb.len() < 100 * 1024, "{} bytes", bomb.len());
        let refused = ContentEncoding::Gzip
            .decode(Bytes::from(bomb), 2 * 1024 * 1024)
            .expect_err("refused");
        assert_eq!(refused.status, StatusCode::PAYLOAD_TOO_LARGE);
        let exact = gzip(&[b' '; 100]);
        assert!(ContentEncoding::Gzip.decode(Bytes::from(exact.clone()), 100).is_ok());
        assert!(ContentEncoding::Gzip.decode(Bytes::from(exact), 99).is_err());
    }

    #[test]
    fn corrupt_data_is_a_400_naming_the_coding() {
        for coding in [ContentEncoding::Gzip, ContentEncoding::Deflate, ContentEncoding::Zstd] {
            let e = coding
                .decode(Bytes::from_static(b"{\"questions\": {}}"), 1000)
                .expect_err("corrupt");
            assert_eq!(e.status, StatusCode::BAD_REQUEST, "{coding:?}");
            assert!(e.detail.contains(coding.as_str()), "{}", e.detail);
        }
        assert!(ContentEncoding::Zstd.decode(Bytes::new(), 10).is_err());
    }
}
