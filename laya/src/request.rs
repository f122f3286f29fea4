//! The `POST /v1/systemone` body before any model work: decoding and JSON parsing like Python's
//! `json.loads(bytes)`, then upstream's shape and size checks with their exact status and `detail`.
//!
//! Auth and the streamed 2 MiB cap belong to the HTTP layer; everything after the body is read is here.

use std::borrow::Cow;

use serde_json::{Map, Value};

use crate::output::OutputProfile;
use crate::python_text::{Separators, number_as_f64, number_is_int, py_json, py_len, py_repr, py_repr_str};
use crate::routing::{CheckpointName, Registry, resolve_model_field_in};
use crate::upstream::Upstream;

pub use crate::error::{Problem, RequestError};
pub use crate::limits::DEFAULT_MAX_TOKEN_BUDGET;

/// Largest accepted body (`MAX_BODY_BYTES`), measured while streaming.
pub const MAX_BODY_BYTES: usize = 2 * 1024 * 1024;
/// Most questions in one request (`MAX_QUESTIONS`).
pub const MAX_QUESTIONS: usize = 64;
/// Longest state in characters (`MAX_STATE_CHARS`).
pub const MAX_STATE_CHARS: usize = 50_000;

/// A decision request whose shape and sizes passed upstream's checks.
#[derive(Clone, Debug, PartialEq)]
pub struct DecisionRequest {
    /// The state (`None` when absent; 0.3.20 accepts that and renders it as `null`, 0.4.15 refuses
    /// it with 400).
    pub state: Option<Value>,
    /// The questions, in request order, not yet validated one by one.
    pub questions: Map<String, Value>,
    /// The checkpoint the `model` field names (`None`: route automatically).
    pub model: Option<CheckpointName>,
    /// The per-request controls of 0.4.x (all `None` under 0.3.20, which ignores them).
    pub controls: Controls,
}

/// What a 0.4.x request may set beside its state and questions (spec §1.8 step 9). Each is
/// `None` when the client did not send it (or sent `null`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Controls {
    /// `max_len`: the row length for this request instead of the checkpoint's.
    pub max_len: Option<usize>,
    /// `head_max_len`: the question head's budget for this request instead of the checkpoint's.
    pub head_max_len: Option<usize>,
    /// `task`: a checkpoint by task name (validated by routing, as upstream's router does).
    pub task: Option<Value>,
    /// `lang`: the caller's language code.
    pub lang: Option<String>,
    /// `lang_guess`: a language-identification hint, weaker than `lang`.
    pub lang_guess: Option<String>,
    /// `min_confidence`: the abstention threshold.
    pub min_confidence: Option<MinConfidence>,
}

/// A validated `min_confidence` (upstream's `check_min_confidence`).
#[derive(Clone, Debug, PartialEq)]
pub enum MinConfidence {
    /// One threshold for every answer.
    All(f64),
    /// A threshold per option-count bucket (`"choice:3-5"`, …), with an optional `"default"`, in
    /// the order sent.
    ByBucket(Vec<(String, f64)>),
}

impl MinConfidence {
    /// The threshold an answer of this bucket is gated at (`resolve_min_confidence`): its own
    /// entry, else the map's `default`, else 0.0 (gate nothing).
    pub fn threshold(&self, bucket: &str) -> f64 {
        match self {
            MinConfidence::All(t) => *t,
            MinConfidence::ByBucket(map) => {
                let find = |key: &str| map.iter().find(|(k, _)| k == key).map(|(_, t)| *t);
                find(bucket).or_else(|| find("default")).unwrap_or(0.0)
            }
        }
    }
}

/// Server-side limits a request is checked against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestLimits {
    /// Largest `max_len`/`head_max_len` a request may ask for (`LAYA_MAX_TOKEN_BUDGET`).
    pub max_token_budget: usize,
    /// Most options of one choice question (100; 255 with tournament mode).
    pub max_choice_options: usize,
}

/// Most options of one choice question in 0.4.15 (`MAX_CHOICE_OPTIONS`).
pub const MAX_CHOICE_OPTIONS: usize = 100;
/// Most levels of one score question in 0.4.15 (`MAX_SCORE_LEVELS`).
pub const MAX_SCORE_LEVELS: usize = 32;
/// Most choice and score options of one request in 0.4.15 (`MAX_TOTAL_OPTIONS`).
pub const MAX_TOTAL_OPTIONS: usize = 512;
/// How many values 0.4.15's cheap state-length bound visits (`_STATE_PROBE_VALUES`).
const STATE_PROBE_VALUES: usize = 64;
/// Fields that name in-process hooks, refused by 0.4.15 (`BODY_REFUSALS`, sorted for the message).
pub(crate) const BODY_REFUSALS: [&str; 5] = [
    "hooks",
    "hooks_raise",
    "hooks_timeout",
    "on_predict_end",
    "on_predict_start",
];

impl Default for RequestLimits {
    fn default() -> Self {
        Self {
            max_token_budget: DEFAULT_MAX_TOKEN_BUDGET,
            max_choice_options: MAX_CHOICE_OPTIONS,
        }
    }
}

/// Python's `json.detect_encoding` + decode for a bytes body: UTF-8 (a BOM is skipped), UTF-16 and
/// UTF-32 by BOM or by the position of zero bytes. `None` when the bytes do not decode.
pub(crate) fn decode_like_python(bytes: &[u8]) -> Option<String> {
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

/// Parses a complete body and applies the checks of `upstream`'s server in its order (spec §1.3
/// steps 4–6 for 0.3.20; §1.8 steps 3–9 for 0.4.15, except the `model` field, which routing
/// resolves).
///
/// Known differences, all for input upstream itself cannot answer sensibly: `NaN`/`Infinity`
/// literals and nesting of 128 levels or more are rejected as invalid JSON (400) where upstream
/// would accept them or fail later; so are lone `\udXXX` escapes under 0.3.20 (0.4.15 refuses them
/// itself, with its own 400, after the size checks).
pub fn parse_body(bytes: &[u8], upstream: Upstream, limits: RequestLimits) -> Result<DecisionRequest, RequestError> {
    parse_body_in(bytes, upstream, OutputProfile::Laya, limits, Registry::builtin_only())
}

/// [`parse_body`] for a server in the `output` profile that may have registered checkpoints of its
/// own (`model` may name them): the same checks, except that under `jev` the `model` is read as the
/// Jev API reads it (`crate::jev::resolve_model`) and an empty `questions` is refused (422
/// `too_short`, as Jev's validation does; upstream answers it with no answers).
pub fn parse_body_in(
    bytes: &[u8],
    upstream: Upstream,
    output: OutputProfile,
    limits: RequestLimits,
    registry: &Registry,
) -> Result<DecisionRequest, RequestError> {
    let invalid_json = || RequestError::new(400, "request body must be valid JSON").at(&[], "json_invalid");
    let text = decode_like_python(bytes).ok_or_else(invalid_json)?;
    let (text, lone_surrogate) = match upstream {
        Upstream::V0_3_20 => (Cow::Borrowed(text.as_str()), false),
        Upstream::V0_4_15 => mask_lone_surrogates(&text),
    };
    let body: Value = serde_json::from_str(&text).map_err(|_| invalid_json())?;
    let Value::Object(mut body) = body else {
        return Err(
            RequestError::new(400, "request body must be an object with a 'questions' field").at(&[], "dict_type"),
        );
    };
    let Some(questions) = body.remove("questions") else {
        return Err(
            RequestError::new(400, "request body must be an object with a 'questions' field")
                .at(&["questions"], "missing"),
        );
    };
    let state = body.remove("state").filter(|s| !s.is_null());
    if upstream.differences().state_required && state.is_none() {
        return Err(RequestError::new(400, "'state' is required").at(&["state"], "missing"));
    }
    let Value::Object(questions) = questions else {
        return Err(RequestError::new(400, "'questions' must be an object").at(&["questions"], "dict_type"));
    };
    if output.is_jev() && questions.is_empty() {
        return Err(no_questions());
    }
    if questions.len() > MAX_QUESTIONS {
        return Err(RequestError::new(
            413,
            format!("too many questions ({} > {MAX_QUESTIONS})", questions.len()),
        ));
    }
    if upstream.differences().option_counts_checked {
        check_option_counts(&questions, limits.max_choice_options)?;
    }
    let state_chars = match (&state, upstream) {
        (Some(Value::String(s)), Upstream::V0_3_20 | Upstream::V0_4_15) => py_len(s),
        (Some(other), Upstream::V0_3_20) => py_len(&py_repr(other)),
        (Some(other), Upstream::V0_4_15) => state_chars_0_4(other),
        (None, Upstream::V0_3_20 | Upstream::V0_4_15) => py_len("None"),
    };
    if state_chars > MAX_STATE_CHARS {
        return Err(RequestError::new(
            413,
            format!("state too large ({state_chars} > {MAX_STATE_CHARS} chars)"),
        ));
    }
    // 0.3.20 never refuses a `model`; 0.4.15 refuses a path-like one after the checks above; Jev
    // refuses every name that is neither a checkpoint nor a Jev model id.
    let resolve_model = || {
        if output.is_jev() {
            crate::jev::resolve_model(body.get("model"), registry)
        } else {
            resolve_model_field_in(body.get("model"), upstream, registry).map_err(RequestError::from_route)
        }
    };
    let (model, controls) = match upstream {
        Upstream::V0_3_20 => (resolve_model()?, Controls::default()),
        Upstream::V0_4_15 => {
            let refused: Vec<&str> = BODY_REFUSALS
                .into_iter()
                .filter(|key| body.get(*key).is_some_and(|v| !v.is_null()))
                .collect();
            if !refused.is_empty() {
                return Err(hooks_refused(&refused));
            }
            if lone_surrogate {
                return Err(lone_surrogate_refused());
            }
            let model = resolve_model()?;
            (model, read_controls(&body, limits)?)
        }
    };
    Ok(DecisionRequest {
        state,
        questions,
        model,
        controls,
    })
}

/// The `jev` profile's refusal of an empty `questions` (pydantic's `too_short`).
pub(crate) fn no_questions() -> RequestError {
    RequestError::new(
        422,
        "'questions' must hold at least one question; an empty request has nothing to answer",
    )
    .at(&["questions"], "too_short")
}

/// 0.4.15's 422 for fields that name in-process hooks (`refused` in `BODY_REFUSALS` order).
pub(crate) fn hooks_refused(refused: &[&str]) -> RequestError {
    let mut e = RequestError::new(
        422,
        format!(
            "{} run inside the server process and cannot be sent to this endpoint; \
             install them where laya-serve runs, or drop them",
            refused.join(", ")
        ),
    );
    if let [field, ..] = refused {
        e = e.at(&[field], "extra_forbidden");
    }
    e
}

/// 0.4.15's 400 for a lone surrogate escape.
pub(crate) fn lone_surrogate_refused() -> RequestError {
    RequestError::new(
        400,
        "request body contains an unpaired surrogate escape; those cannot be encoded as UTF-8",
    )
    .at(&[], "string_unicode")
}

/// 0.4.15's option limits, question by question in request order (only well-formed choice and
/// score criteria count; validation later says what is wrong with the others).
pub(crate) fn check_option_counts(
    questions: &Map<String, Value>,
    max_choice_options: usize,
) -> Result<(), RequestError> {
    let mut total = 0;
    for (qid, question) in questions {
        let Some(question) = question.as_object() else {
            continue;
        };
        let qtype = question.get("type").and_then(Value::as_str);
        let count = match (qtype, question.get("criteria")) {
            (Some("choice"), Some(Value::Object(m))) => m.len(),
            (Some("choice"), Some(Value::Array(a))) => a.len(),
            (Some("score"), Some(Value::Array(a))) => a.len(),
            _ => continue,
        };
        total += count;
        let q = py_repr_str(qid);
        if qtype == Some("choice") && count > max_choice_options {
            return Err(RequestError::new(
                413,
                format!("too many choice options for {q} ({count} > {max_choice_options})"),
            ));
        }
        if let (Some("score"), Some(Value::Array(levels))) = (qtype, question.get("criteria")) {
            if count > MAX_SCORE_LEVELS {
                return Err(RequestError::new(
                    413,
                    format!("too many score levels for {q} ({count} > {MAX_SCORE_LEVELS})"),
                ));
            }
            if let Some(i) = levels.iter().position(Value::is_null) {
                return Err(RequestError::new(
                    422,
                    format!("score question {q} has a null level at index {i}; give every level a description"),
                )
                .at(&["questions", qid.as_str(), "criteria"], "string_type"));
            }
        }
    }
    if total > MAX_TOTAL_OPTIONS {
        return Err(RequestError::new(
            413,
            format!("too many answer options across questions ({total} > {MAX_TOTAL_OPTIONS})"),
        ));
    }
    Ok(())
}

/// 0.4.15's `_state_length` of a state that is not a string: the cheap lower bound when it already
/// exceeds the cap, else the length of its JSON text.
pub(crate) fn state_chars_0_4(state: &Value) -> usize {
    state_length_lower_bound_over(state, MAX_STATE_CHARS).unwrap_or_else(|| py_len(&py_json(state, Separators::Spaced)))
}

/// 0.4.15's `_state_length_lower_bound_over`: the summed lengths of the strings among the first 64
/// values a stack walk visits, once that already exceeds `cap`; `None` when it does not, or when
/// the walk meets a number, bool or null first (then the exact serialized length decides).
fn state_length_lower_bound_over(state: &Value, cap: usize) -> Option<usize> {
    let mut total = 0;
    let mut stack = vec![state];
    let mut budget = STATE_PROBE_VALUES;
    while budget > 0 {
        let item = stack.pop()?;
        budget -= 1;
        match item {
            Value::String(s) => {
                total += py_len(s);
                if total > cap {
                    return Some(total);
                }
            }
            Value::Object(map) => stack.extend(map.values()),
            Value::Array(items) => stack.extend(items),
            _ => return None,
        }
    }
    None
}

/// Replaces every `\uXXXX` escape of a surrogate that is not half of a high–low pair by the
/// escape of U+FFFD, which serde_json accepts, and says whether there was one. 0.4.15 parses such
/// bodies (Python's `json` keeps lone surrogates) and refuses them only after its size checks,
/// which count a lone surrogate as one character, as U+FFFD is.
pub(crate) fn mask_lone_surrogates(text: &str) -> (Cow<'_, str>, bool) {
    let bytes = text.as_bytes();
    let surrogate_at = |i: usize| -> Option<u16> {
        let hex = bytes.get(i..i + 6)?;
        if hex[0] != b'\\' || hex[1] != b'u' {
            return None;
        }
        let unit = u16::from_str_radix(std::str::from_utf8(&hex[2..]).ok()?, 16).ok()?;
        (0xD800..=0xDFFF).contains(&unit).then_some(unit)
    };
    let mut out: Option<String> = None;
    let mut copied = 0;
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] != b'\\' {
            i += 1;
            continue;
        }
        match surrogate_at(i) {
            Some(high @ 0xD800..=0xDBFF) if surrogate_at(i + 6).is_some_and(|low| low >= 0xDC00) => {
                let _ = high;
                i += 12;
            }
            Some(_) => {
                let out = out.get_or_insert_with(|| String::with_capacity(text.len()));
                out.push_str(&text[copied..i]);
                out.push_str("\\ufffd");
                i += 6;
                copied = i;
            }
            // Any other escape: skip the escaped character so `\\u` is never read as an escape.
            None => i += 2,
        }
    }
    match out {
        Some(mut out) => {
            out.push_str(&text[copied..]);
            (Cow::Owned(out), true)
        }
        None => (Cow::Borrowed(text), false),
    }
}

/// The 0.4.15 controls, in upstream's order, each with its 422 text.
pub(crate) fn read_controls(body: &Map<String, Value>, limits: RequestLimits) -> Result<Controls, RequestError> {
    let present = |key: &str| body.get(key).filter(|v| !v.is_null());
    let budget = |key: &str| -> Result<Option<usize>, RequestError> {
        let Some(value) = present(key) else {
            return Ok(None);
        };
        let fail = |detail: String| Err(RequestError::new(422, detail).at(&[key], "value_error"));
        let Value::Number(n) = value else {
            return fail(format!("{key} must be an integer"));
        };
        if !number_is_int(n) {
            return fail(format!("{key} must be an integer"));
        }
        let text = n.to_string();
        if text.starts_with('-') || text.trim_start_matches('0').is_empty() {
            return fail(format!("{key} must be a positive integer"));
        }
        match text.parse::<usize>() {
            Ok(v) if v <= limits.max_token_budget => Ok(Some(v)),
            _ => fail(format!(
                "{key} exceeds server limit ({} > {})",
                text.trim_start_matches('0'),
                limits.max_token_budget
            )),
        }
    };
    let max_len = budget("max_len")?;
    let head_max_len = budget("head_max_len")?;
    let task = present("task").cloned();
    let language = |key: &str| -> Result<Option<String>, RequestError> {
        match present(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(RequestError::new(
                422,
                format!("{key} must be a language code string such as \"de\", or null"),
            )
            .at(&[key], "string_type")),
        }
    };
    let lang = language("lang")?;
    let lang_guess = language("lang_guess")?;
    let min_confidence = present("min_confidence")
        .map(check_min_confidence)
        .transpose()
        .map_err(|e| e.at(&["min_confidence"], "value_error"))?;
    Ok(Controls {
        max_len,
        head_max_len,
        task,
        lang,
        lang_guess,
        min_confidence,
    })
}

/// Every bucket a `min_confidence` map may name, and `default`.
fn is_bucket_key(key: &str) -> bool {
    key == "default"
        || key.split_once(':').is_some_and(|(qtype, size)| {
            ["choice", "score", "noul"].contains(&qtype) && ["2", "3-5", "6-10", "11+"].contains(&size)
        })
}

/// Upstream's `check_min_confidence`: a number in [0, 1] (not a bool), or a non-empty map of
/// bucket → such a number.
fn check_min_confidence(value: &Value) -> Result<MinConfidence, RequestError> {
    let one = |v: &Value| -> Result<f64, RequestError> {
        match v {
            Value::Number(n) if (0.0..=1.0).contains(&number_as_f64(n)) => Ok(number_as_f64(n)),
            _ => Err(RequestError::new(
                422,
                format!("min_confidence must be a float in [0.0, 1.0], got {}", py_repr(v)),
            )),
        }
    };
    let Value::Object(map) = value else {
        return one(value).map(MinConfidence::All);
    };
    if map.is_empty() {
        return Err(RequestError::new(
            422,
            "a min_confidence map must be a non-empty dict of bucket -> float, got {}",
        ));
    }
    let mut out = Vec::with_capacity(map.len());
    for (key, v) in map {
        if !is_bucket_key(key) {
            return Err(RequestError::new(
                422,
                format!(
                    "min_confidence map keys must be a bucket like 'choice:3-5' or 'default', got {}",
                    py_repr_str(key)
                ),
            ));
        }
        out.push((key.clone(), one(v)?));
    }
    Ok(MinConfidence::ByBucket(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(body: &[u8]) -> (u16, String) {
        status_of(body, Upstream::V0_3_20)
    }

    fn status_of(body: &[u8], upstream: Upstream) -> (u16, String) {
        match parse_body(body, upstream, RequestLimits::default()) {
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
        let ok = parse_body(
            b"{\"questions\": {}, \"state\": null, \"model\": \"ML\"}",
            Upstream::V0_3_20,
            RequestLimits::default(),
        )
        .expect("valid");
        assert_eq!((ok.state, ok.model), (None, Some(CheckpointName::Multilingual)));
    }

    fn newer(body: &str) -> (u16, String) {
        status_of(body.as_bytes(), Upstream::V0_4_15)
    }

    #[test]
    fn the_0_4_15_checks_run_in_upstreams_order() {
        // A state is required, and that is checked before the questions' shape and count.
        let many: Vec<String> = (0..65).map(|i| format!("\"q{i}\": {{}}")).collect();
        let body = format!("{{\"questions\": {{{}}}}}", many.join(","));
        assert_eq!(newer(&body), (400, "'state' is required".to_owned()));
        assert_eq!(newer(r#"{"state": null, "questions": []}"#).1, "'state' is required");
        // Option limits, per question, then the total, then the state's size.
        let choice = |n: usize| {
            let labels: Vec<String> = (0..n).map(|i| format!("\"l{i}\"")).collect();
            format!(
                r#"{{"type": "choice", "instructions": "x", "criteria": [{}]}}"#,
                labels.join(",")
            )
        };
        let body = format!(r#"{{"state": "x", "questions": {{"a": {}}}}}"#, choice(101));
        assert_eq!(
            newer(&body),
            (413, "too many choice options for 'a' (101 > 100)".to_owned())
        );
        let body = format!(
            r#"{{"state": "x", "questions": {{"a": {}, "b": {}, "c": {}, "d": {}, "e": {}, "f": {}}}}}"#,
            choice(100),
            choice(100),
            choice(100),
            choice(100),
            choice(100),
            choice(13)
        );
        assert_eq!(
            newer(&body),
            (413, "too many answer options across questions (513 > 512)".to_owned())
        );
        let levels = vec!["\"x\""; 33].join(",");
        let body = format!(r#"{{"state": "x", "questions": {{"s": {{"type": "score", "criteria": [{levels}]}}}}}}"#);
        assert_eq!(
            newer(&body),
            (413, "too many score levels for 's' (33 > 32)".to_owned())
        );
        let body = r#"{"state": "x", "questions": {"s": {"type": "score", "criteria": ["a", null]}}}"#;
        assert_eq!(
            newer(body),
            (
                422,
                "score question 's' has a null level at index 1; give every level a description".to_owned()
            )
        );
        // Hook fields (sorted, nulls ignored), then lone surrogates, then `model`, then controls.
        let body = r#"{"state": "x", "questions": {}, "on_predict_start": 1, "hooks": [], "hooks_raise": null, "max_len": "x"}"#;
        assert_eq!(
            newer(body).1,
            "hooks, on_predict_start run inside the server process and cannot be sent to this endpoint; \
             install them where laya-serve runs, or drop them"
        );
        let body = r#"{"state": "x", "questions": {}, "extra\udc00": 1, "model": "./ckpt"}"#;
        assert_eq!(
            newer(body),
            (
                400,
                "request body contains an unpaired surrogate escape; those cannot be encoded as UTF-8".to_owned()
            )
        );
        assert_eq!(
            newer(r#"{"state": "x", "questions": {}, "model": "./ckpt", "max_len": 0}"#).0,
            422
        );
        assert!(
            newer(r#"{"state": "x", "questions": {}, "model": "./ckpt", "max_len": 0}"#)
                .1
                .starts_with("unknown model './ckpt'")
        );
        // A surrogate pair is an ordinary character, and an escaped backslash is no escape.
        assert_eq!(newer(r#"{"state": "\ud83d\ude00 \\ud800", "questions": {}}"#).0, 200);
        // 0.3.20 knows none of this: no state needed, controls ignored, lone surrogates not JSON.
        assert_eq!(status(br#"{"questions": {}, "max_len": "x", "hooks": 1}"#).0, 200);
        assert_eq!(
            status(br#"{"questions": {}, "state": "\udc00"}"#).1,
            "request body must be valid JSON"
        );
    }

    #[test]
    fn the_0_4_15_state_length_is_its_json_text_or_a_lower_bound() {
        // `"` is one character in repr but two in JSON: 0.4.15 counts the JSON.
        let body = format!(
            r#"{{"state": {{"k": "{}"}}, "questions": {{}}}}"#,
            "\\\"".repeat(30_000)
        );
        assert_eq!(newer(&body), (413, "state too large (60009 > 50000 chars)".to_owned()));
        assert_eq!(status(body.as_bytes()).0, 200);
        // A long string found by the probe is reported as the probe's (understated) sum.
        let body = format!(
            r#"{{"state": ["{}", "{}"], "questions": {{}}}}"#,
            "a".repeat(30_000),
            "b".repeat(30_000)
        );
        assert_eq!(newer(&body), (413, "state too large (60000 > 50000 chars)".to_owned()));
    }

    #[test]
    fn controls_are_validated_with_upstreams_texts() {
        let with = |controls: &str| newer(&format!(r#"{{"state": "x", "questions": {{}}, {controls}}}"#));
        assert_eq!(with(r#""max_len": true"#).1, "max_len must be an integer");
        assert_eq!(with(r#""max_len": 2.0"#).1, "max_len must be an integer");
        assert_eq!(
            with(r#""head_max_len": -3"#).1,
            "head_max_len must be a positive integer"
        );
        assert_eq!(
            with(r#""max_len": 8193"#).1,
            "max_len exceeds server limit (8193 > 8192)"
        );
        assert_eq!(
            with(r#""max_len": 100000000000000000000000"#).1,
            "max_len exceeds server limit (100000000000000000000000 > 8192)"
        );
        assert_eq!(
            with(r#""lang": 5"#).1,
            "lang must be a language code string such as \"de\", or null"
        );
        assert_eq!(
            with(r#""lang_guess": ["en"]"#).1,
            "lang_guess must be a language code string such as \"de\", or null"
        );
        assert_eq!(
            with(r#""min_confidence": 1.5"#).1,
            "min_confidence must be a float in [0.0, 1.0], got 1.5"
        );
        assert_eq!(
            with(r#""min_confidence": true"#).1,
            "min_confidence must be a float in [0.0, 1.0], got True"
        );
        assert_eq!(
            with(r#""min_confidence": {}"#).1,
            "a min_confidence map must be a non-empty dict of bucket -> float, got {}"
        );
        assert_eq!(
            with(r#""min_confidence": {"choice:7": 0.5}"#).1,
            "min_confidence map keys must be a bucket like 'choice:3-5' or 'default', got 'choice:7'"
        );
        let ok = parse_body(
            br#"{"state": "x", "questions": {}, "max_len": 300, "task": "", "lang": "de", "min_confidence": {"noul:2": 0.9, "default": 1}}"#,
            Upstream::V0_4_15,
            RequestLimits::default(),
        )
        .expect("valid");
        assert_eq!(ok.controls.max_len, Some(300));
        assert_eq!(ok.controls.task, Some(Value::from("")));
        assert_eq!(ok.controls.lang.as_deref(), Some("de"));
        let threshold = ok.controls.min_confidence.expect("a threshold");
        assert_eq!(
            (threshold.threshold("noul:2"), threshold.threshold("choice:2")),
            (0.9, 1.0)
        );
    }

    #[test]
    fn jev_reads_model_as_jev_refuses_an_empty_request_and_says_where_a_body_fails() {
        let jev = |body: &str| {
            parse_body_in(
                body.as_bytes(),
                Upstream::V0_4_15,
                OutputProfile::Jev,
                RequestLimits::default(),
                Registry::builtin_only(),
            )
        };
        let laya = |body: &str| parse_body(body.as_bytes(), Upstream::V0_4_15, RequestLimits::default());
        let q = r#"{"q": {"type": "noul", "instructions": "x"}}"#;
        let with_model = |model: &str| format!(r#"{{"state": "s", "model": {model}, "questions": {q}}}"#);
        let path_like = with_model(r#""typesafe/jev-1.13""#);
        assert_eq!(laya(&path_like).expect_err("0.4.15 refuses a path").status, 422);
        assert_eq!(jev(&path_like).expect("a Jev id").model, None);
        assert_eq!(laya(&with_model(r#""whatever""#)).expect("routed").model, None);
        let unknown = jev(&with_model(r#""whatever""#)).expect_err("Jev refuses it");
        assert_eq!(
            (unknown.status, unknown.problem),
            (
                400,
                Problem::Refused {
                    error_type: "api_usage_error"
                }
            )
        );
        assert_eq!(
            jev(&with_model(r#""ml""#)).expect("an alias").model,
            Some(CheckpointName::Multilingual)
        );

        let empty = r#"{"state": "s", "questions": {}}"#;
        assert!(laya(empty).expect("upstream answers it").questions.is_empty());
        let e = jev(empty).expect_err("Jev refuses it");
        assert_eq!(e.status, 422);
        assert_eq!(
            e.problem,
            Problem::Invalid {
                loc: vec![Value::from("questions")],
                kind: "too_short"
            }
        );

        // Where each body check fails, in every profile (only `jev` shows it).
        let invalid = |body: &str| laya(body).expect_err("invalid").problem;
        let at = |loc: &[&str], kind| Problem::Invalid {
            loc: loc.iter().map(|&l| Value::from(l)).collect(),
            kind,
        };
        assert_eq!(invalid("{"), at(&[], "json_invalid"));
        assert_eq!(invalid("[]"), at(&[], "dict_type"));
        assert_eq!(invalid(r#"{"state": "s"}"#), at(&["questions"], "missing"));
        assert_eq!(invalid(r#"{"questions": {}}"#), at(&["state"], "missing"));
        assert_eq!(
            invalid(r#"{"state": "s", "questions": []}"#),
            at(&["questions"], "dict_type")
        );
        assert_eq!(
            invalid(&format!(r#"{{"state": "s", "max_len": "x", "questions": {q}}}"#)),
            at(&["max_len"], "value_error")
        );
        assert_eq!(
            invalid(&format!(r#"{{"state": "s", "hooks": [1], "questions": {q}}}"#)),
            at(&["hooks"], "extra_forbidden")
        );
        let too_many = format!(
            r#"{{"state": "s", "questions": {{"q": {{"type": "choice", "instructions": "x", "criteria": [{}]}}}}}}"#,
            (0..101).map(|i| format!("\"o{i}\"")).collect::<Vec<_>>().join(",")
        );
        let large = laya(&too_many).expect_err("over 100 options");
        assert_eq!(
            (large.status, large.problem),
            (
                413,
                Problem::Refused {
                    error_type: "request_too_large"
                }
            )
        );
    }
}
