//! The `POST /v1/systemone` body before any model work: decoding and JSON parsing like Python's
//! `json.loads(bytes)`, then upstream's shape and size checks with their exact status and `detail`.
//!
//! Auth and the streamed 2 MiB cap belong to the HTTP layer; everything after the body is read is here.

use serde_json::{Map, Value};

use crate::python_text::{py_len, py_repr};

/// Largest accepted body (`MAX_BODY_BYTES`), measured while streaming.
pub const MAX_BODY_BYTES: usize = 2 * 1024 * 1024;
/// Most questions in one request (`MAX_QUESTIONS`).
pub const MAX_QUESTIONS: usize = 64;
/// Longest state in characters (`MAX_STATE_CHARS`).
pub const MAX_STATE_CHARS: usize = 50_000;

/// A request answered with an error status and upstream's `{"detail": ...}` text.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{status}: {detail}")]
pub struct RequestError {
    /// HTTP status code.
    pub status: u16,
    /// The `detail` text.
    pub detail: String,
}

impl RequestError {
    /// An error with this status and detail.
    pub fn new(status: u16, detail: impl Into<String>) -> Self {
        Self {
            status,
            detail: detail.into(),
        }
    }

    /// Upstream's 500 for failures that are not the client's (`inference failed`).
    pub fn inference_failed() -> Self {
        Self::new(500, "inference failed")
    }

    /// The error body, `{"detail":"..."}`, as upstream writes it.
    pub fn body(&self) -> String {
        let mut body = Map::new();
        body.insert("detail".to_owned(), Value::from(self.detail.clone()));
        crate::python_text::py_json(&Value::Object(body), crate::python_text::Separators::Compact)
    }
}

/// A decision request whose shape and sizes passed upstream's checks.
#[derive(Clone, Debug, PartialEq)]
pub struct DecisionRequest {
    /// The state (`None` when absent; 0.3.20 accepts that and renders it as `null`).
    pub state: Option<Value>,
    /// The questions, in request order, not yet validated one by one.
    pub questions: Map<String, Value>,
    /// The raw `model` field, if sent.
    pub model: Option<Value>,
}

/// Python's `json.detect_encoding` + decode for a bytes body: UTF-8 (a BOM is skipped), UTF-16 and
/// UTF-32 by BOM or by the position of zero bytes. `None` when the bytes do not decode.
fn decode_like_python(bytes: &[u8]) -> Option<String> {
    let utf16 = |b: &[u8], big: bool| -> Option<String> {
        if !b.len().is_multiple_of(2) {
            return None;
        }
        let units = b.chunks_exact(2).map(|c| {
            if big {
                u16::from_be_bytes([c[0], c[1]])
            } else {
                u16::from_le_bytes([c[0], c[1]])
            }
        });
        char::decode_utf16(units).collect::<Result<String, _>>().ok()
    };
    let utf32 = |b: &[u8], big: bool| -> Option<String> {
        if !b.len().is_multiple_of(4) {
            return None;
        }
        b.chunks_exact(4)
            .map(|c| {
                let v = if big {
                    u32::from_be_bytes([c[0], c[1], c[2], c[3]])
                } else {
                    u32::from_le_bytes([c[0], c[1], c[2], c[3]])
                };
                char::from_u32(v)
            })
            .collect()
    };
    match bytes {
        [0, 0, 0xFE, 0xFF, rest @ ..] => utf32(rest, true),
        [0xFF, 0xFE, 0, 0, rest @ ..] => utf32(rest, false),
        [0xFE, 0xFF, rest @ ..] => utf16(rest, true),
        [0xFF, 0xFE, rest @ ..] => utf16(rest, false),
        [0xEF, 0xBB, 0xBF, rest @ ..] => String::from_utf8(rest.to_vec()).ok(),
        [0, 0, _, _, ..] => utf32(bytes, true),
        [0, _, _, _, ..] => utf16(bytes, true),
        [_, 0, 0, 0, ..] => utf32(bytes, false),
        [_, 0, _, _, ..] => utf16(bytes, false),
        [0, _] => utf16(bytes, true),
        [_, 0] => utf16(bytes, false),
        _ => String::from_utf8(bytes.to_vec()).ok(),
    }
}

/// Parses a complete body and applies upstream's checks in upstream's order (spec §1.3 steps 4–6).
///
/// Known differences, all for input upstream itself cannot answer sensibly: `NaN`/`Infinity`
/// literals, lone `\udXXX` escapes and nesting deeper than 128 levels are rejected as invalid JSON
/// (400) where upstream would accept them or fail later with a 500.
pub fn parse_body(bytes: &[u8]) -> Result<DecisionRequest, RequestError> {
    let invalid_json = || RequestError::new(400, "request body must be valid JSON");
    let text = decode_like_python(bytes).ok_or_else(invalid_json)?;
    let body: Value = serde_json::from_str(&text).map_err(|_| invalid_json())?;
    let Value::Object(mut body) = body else {
        return Err(RequestError::new(
            400,
            "request body must be an object with a 'questions' field",
        ));
    };
    let Some(questions) = body.remove("questions") else {
        return Err(RequestError::new(
            400,
            "request body must be an object with a 'questions' field",
        ));
    };
    let Value::Object(questions) = questions else {
        return Err(RequestError::new(400, "'questions' must be an object"));
    };
    if questions.len() > MAX_QUESTIONS {
        return Err(RequestError::new(
            413,
            format!("too many questions ({} > {MAX_QUESTIONS})", questions.len()),
        ));
    }
    let state = body.remove("state").filter(|s| !s.is_null());
    let state_chars = match &state {
        Some(Value::String(s)) => py_len(s),
        Some(other) => py_len(&py_repr(other)),
        None => py_len("None"),
    };
    if state_chars > MAX_STATE_CHARS {
        return Err(RequestError::new(
            413,
            format!("state too large ({state_chars} > {MAX_STATE_CHARS} chars)"),
        ));
    }
    Ok(DecisionRequest {
        state,
        questions,
        model: body.remove("model"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(body: &[u8]) -> (u16, String) {
        match parse_body(body) {
            Ok(_) => (200, String::new()),
            Err(e) => (e.status, e.detail),
        }
    }

    #[test]
    fn decodes_like_python_json_loads() {
        let utf16: Vec<u8> = "{\"questions\": {}}"
            .encode_utf16()
            .flat_map(u16::to_le_bytes)
            .collect();
        assert_eq!(status(&utf16).0, 200);
        assert_eq!(status(b"\xef\xbb\xbf{\"questions\": {}}").0, 200);
        assert_eq!(status(b"{\"questions\": {}, \"x\": \"\xff\"}").0, 400);
        assert_eq!(status(b"").1, "request body must be valid JSON");
    }

    #[test]
    fn shape_and_limits() {
        assert_eq!(
            status(b"[]").1,
            "request body must be an object with a 'questions' field"
        );
        assert_eq!(status(b"{\"questions\": []}").1, "'questions' must be an object");
        let many: Vec<String> = (0..65).map(|i| format!("\"q{i}\": {{}}")).collect();
        let body = format!("{{\"questions\": {{{}}}}}", many.join(","));
        assert_eq!(
            status(body.as_bytes()),
            (413, "too many questions (65 > 64)".to_owned())
        );
        let state = format!(
            "{{\"questions\": {{}}, \"state\": {{\"k\": \"{}\"}}}}",
            "a".repeat(49_992)
        );
        assert_eq!(
            status(state.as_bytes()),
            (413, "state too large (50001 > 50000 chars)".to_owned())
        );
        let ok = parse_body(b"{\"questions\": {}, \"state\": null, \"model\": \"ML\"}").expect("valid");
        assert_eq!((ok.state, ok.model), (None, Some(Value::from("ML"))));
    }
}
