//! The HTTP/1.1 request head, checked before hyper sees it: its size (431), the target's length (414),
//! its syntax, the body's framing (`Content-Length`, `Transfer-Encoding`: RFC 9112 §6) and `Host`
//! (RFC 9112 §3.2). Each refusal names the problem in a JSON `detail`, where hyper would answer an
//! empty 400, 414 or 431, or accept a head RFC 9112 says to refuse. Pure: unit-tested on bytes.

use axum::http::{StatusCode, Uri};

/// Largest request head (request line and header fields), in bytes.
pub const MAX_HEAD_BYTES: usize = 64 * 1024;
/// Longest request target (the URL path and query), in bytes.
pub const MAX_TARGET_BYTES: usize = 8 * 1024;
/// Most header fields in one request (hyper's own limit, which `http::server` sets explicitly).
pub const MAX_HEADERS: usize = 100;

/// How the body after a head is framed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Framing {
    /// No body (neither `Content-Length` nor `Transfer-Encoding`).
    Empty,
    /// `Content-Length` bytes.
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
}

/// A complete head that passed every check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Head {
    /// Its length in bytes, the final empty line (and any empty lines before it) included.
    pub len: usize,
    /// How its body is framed.
    pub framing: Framing,
}

/// Why a head is refused: the answer's status and `detail`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// 400, 414 or 431.
    pub status: StatusCode,
    /// What is wrong, for the client.
    pub detail: String,
}

fn refuse(status: StatusCode, detail: impl Into<String>) -> Refusal {
    Refusal {
        status,
        detail: detail.into(),
    }
}

fn bad(detail: impl Into<String>) -> Refusal {
    refuse(StatusCode::BAD_REQUEST, detail)
}

/// Checks the bytes received since the previous request ended: `Ok(None)` while the head is
/// incomplete (and still within its limits), `Ok(Some(head))` once it is whole and acceptable.
pub fn check_head(received: &[u8]) -> Result<Option<Head>, Refusal> {
    let mut fields = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut request = httparse::Request::new(&mut fields);
    let len = match request.parse(received) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return incomplete(received).map(|()| None),
        Err(httparse::Error::TooManyHeaders) => {
            return Err(refuse(
                StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                format!("more than {MAX_HEADERS} header fields"),
            ));
        }
        Err(error) => return Err(bad(format!("malformed request head: {error}"))),
    };
    if len > MAX_HEAD_BYTES {
        return Err(head_too_large());
    }
    let target = request.path.unwrap_or("");
    if target.len() > MAX_TARGET_BYTES {
        return Err(target_too_long(target.len()));
    }
    if Uri::try_from(target).is_err() {
        return Err(bad("the request target is not a valid URI"));
    }
    let http_11 = request.version == Some(1);
    let framing = framing(request.headers, http_11)?;
    let hosts = request
        .headers
        .iter()
        .filter(|h| h.name.eq_ignore_ascii_case("host"))
        .count();
    match hosts {
        0 if http_11 => return Err(bad("an HTTP/1.1 request needs a Host header (RFC 9112 §3.2)")),
        0 | 1 => {}
        n => return Err(bad(format!("Host is given {n} times; send it once (RFC 9112 §3.2)"))),
    }
    Ok(Some(Head { len, framing }))
}

/// An incomplete head is refused as soon as it cannot fit: the request line past the target limit,
/// or the whole head past its limit.
fn incomplete(received: &[u8]) -> Result<(), Refusal> {
    let start = received
        .iter()
        .position(|&b| b != b'\r' && b != b'\n')
        .unwrap_or(received.len());
    let line = &received[start..];
    let line_end = line.iter().position(|&b| b == b'\n');
    // Method, spaces and "HTTP/1.1" take well under 64 bytes beside the target.
    if line_end.is_none() && line.len() > MAX_TARGET_BYTES + 64 {
        let target = line.iter().skip_while(|&&b| b != b' ').skip(1).count();
        return Err(target_too_long(target));
    }
    if received.len() > MAX_HEAD_BYTES {
        return Err(head_too_large());
    }
    Ok(())
}

fn head_too_large() -> Refusal {
    refuse(
        StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
        format!("request head is larger than {MAX_HEAD_BYTES} bytes"),
    )
}

fn target_too_long(len: usize) -> Refusal {
    refuse(
        StatusCode::URI_TOO_LONG,
        format!("request target is {len} bytes or more; at most {MAX_TARGET_BYTES} are accepted"),
    )
}

/// The body's framing from `Content-Length` and `Transfer-Encoding` (RFC 9112 §6).
fn framing(headers: &[httparse::Header<'_>], http_11: bool) -> Result<Framing, Refusal> {
    let named = |name: &'static str| headers.iter().filter(move |h| h.name.eq_ignore_ascii_case(name));
    let lengths: Vec<&[u8]> = named("content-length").map(|h| h.value).collect();
    let codings: Vec<String> = named("transfer-encoding")
        .flat_map(|h| {
            String::from_utf8_lossy(h.value)
                .split(',')
                .map(|c| c.trim().to_ascii_lowercase())
                .collect::<Vec<_>>()
        })
        .filter(|c| !c.is_empty())
        .collect();
    let has_encoding = named("transfer-encoding").next().is_some();
    if has_encoding && !lengths.is_empty() {
        return Err(bad(
            "both Content-Length and Transfer-Encoding are given; send one of them (RFC 9112 §6.1)",
        ));
    }
    if has_encoding {
        if !http_11 {
            return Err(bad("Transfer-Encoding needs HTTP/1.1 (RFC 9112 §6.1)"));
        }
        let listed = codings.join(", ");
        let chunked = codings.iter().filter(|c| *c == "chunked").count();
        return match codings.last().map(String::as_str) {
            Some("chunked") if codings.len() == 1 => Ok(Framing::Chunked),
            Some("chunked") if chunked == 1 => Err(refuse(
                StatusCode::NOT_IMPLEMENTED,
                format!(
                    "Transfer-Encoding '{listed}': only 'chunked' is decoded; compress with Content-Encoding instead"
                ),
            )),
            _ => Err(bad(format!(
                "Transfer-Encoding '{listed}' does not end with a single 'chunked', so the body's length is \
                 unknown (RFC 9112 §6.3)"
            ))),
        };
    }
    match lengths.as_slice() {
        [] => Ok(Framing::Empty),
        [value] => {
            let text = String::from_utf8_lossy(value);
            let text = text.trim();
            match text.parse::<u64>() {
                Ok(n) if text.bytes().all(|b| b.is_ascii_digit()) => Ok(Framing::Length(n)),
                _ => Err(bad(format!("Content-Length '{text}' is not a number of bytes"))),
            }
        }
        several => Err(bad(format!(
            "Content-Length is given {} times; send it once",
            several.len()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(head: &str) -> Result<Option<Head>, Refusal> {
        check_head(head.as_bytes())
    }

    fn refused(head: &str) -> (u16, String) {
        let refusal = check(head).expect_err("refused");
        (refusal.status.as_u16(), refusal.detail)
    }

    #[test]
    fn a_complete_head_gives_its_length_and_framing() {
        let head = "POST /v1/systemone HTTP/1.1\r\nHost: x\r\nContent-Length: 12\r\n\r\n{\"state\"";
        assert_eq!(
            check(head),
            Ok(Some(Head {
                len: head.len() - 8,
                framing: Framing::Length(12)
            }))
        );
        let chunked = "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: Chunked\r\n\r\n";
        assert_eq!(check(chunked).map(|h| h.map(|h| h.framing)), Ok(Some(Framing::Chunked)));
        // HTTP/1.0 needs no Host; empty lines before a request are skipped and counted.
        let old = "\r\n\r\nGET /health HTTP/1.0\r\n\r\n";
        assert_eq!(
            check(old),
            Ok(Some(Head {
                len: old.len(),
                framing: Framing::Empty
            }))
        );
        assert_eq!(check("GET /health HTTP/1.1\r\nHost: x\r\n"), Ok(None));
        assert_eq!(check(""), Ok(None));
    }

    #[test]
    fn framing_that_rfc_9112_refuses_is_a_400_naming_it() {
        let cases = [
            (
                "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
                "both Content-Length and Transfer-Encoding",
            ),
            (
                "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n",
                "given 2 times",
            ),
            (
                "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5, 5\r\n\r\n",
                "'5, 5' is not a number",
            ),
            (
                "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n",
                "'-1' is not a number",
            ),
            (
                "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: +7\r\n\r\n",
                "'+7' is not a number",
            ),
            (
                "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999999\r\n\r\n",
                "is not a number",
            ),
            (
                "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n",
                "'gzip' does not end with",
            ),
            (
                "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked, chunked\r\n\r\n",
                "does not end with a single 'chunked'",
            ),
            (
                "POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n",
                "needs HTTP/1.1",
            ),
            ("GET / HTTP/1.1\r\n\r\n", "needs a Host header"),
            ("GET / HTTP/1.1\r\nHost: a\r\nhost: b\r\n\r\n", "Host is given 2 times"),
            (
                "GET / HTTP/1.1\r\nHo st: a\r\n\r\n",
                "malformed request head: invalid header name",
            ),
            ("G@T / HTTP/1.1\r\nHost: a\r\n\r\n", "malformed request head"),
            (
                "GET / HTTP/2.5\r\nHost: a\r\n\r\n",
                "malformed request head: invalid HTTP version",
            ),
        ];
        for (head, want) in cases {
            let (status, detail) = refused(head);
            assert_eq!(status, 400, "{head:?}");
            assert!(detail.contains(want), "{head:?}: {detail}");
        }
        let (status, detail) = refused("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n");
        assert_eq!(status, 501);
        assert!(detail.contains("only 'chunked' is decoded"), "{detail}");
    }

    #[test]
    fn sizes_past_the_limits_are_414_and_431_even_before_the_head_ends() {
        let long_target = format!("GET /{} HTTP/1.1\r\nHost: x\r\n\r\n", "a".repeat(MAX_TARGET_BYTES));
        assert_eq!(refused(&long_target).0, 414);
        // Still arriving: refused as soon as the request line cannot fit.
        let arriving = format!("GET /{}", "a".repeat(MAX_TARGET_BYTES + 100));
        let (status, detail) = refused(&arriving);
        assert_eq!(status, 414);
        assert!(detail.contains("at most 8192"), "{detail}");
        let big_field = format!("GET / HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n", "b".repeat(MAX_HEAD_BYTES));
        let (status, detail) = refused(&big_field);
        assert_eq!(status, 431);
        assert!(detail.contains("larger than 65536 bytes"), "{detail}");
        let many: String = (0..=MAX_HEADERS).map(|i| format!("X-{i}: v\r\n")).collect();
        let (status, detail) = refused(&format!("GET / HTTP/1.1\r\nHost: x\r\n{many}\r\n"));
        assert_eq!((status, detail.as_str()), (431, "more than 100 header fields"));
    }
}
