//! The `POST /v1/systemone/batch` body (upstream 0.4.15 only): parsing and upstream's checks in
//! its order and with its texts — the body's shape, `states` (a non-empty list of at most 64),
//! each state checked like a single request's against the shared `questions`, hook fields and
//! `diagnostics` refused, lone surrogates, `model`, the single route's controls, then `batch_size`
//! and `sort_by_length` — and the rendering of the answer, `{"results": [...], "total_usage": {...}}`.
//!
//! What a state's answer is does not depend on the batch: each state becomes the same
//! [`DecisionRequest`] a single request with that state would be, so its result is that request's
//! answer (upstream's `predict_batch` results equal `predict`'s up to float noise of 1e-4).

use serde_json::{Map, Value};

use crate::error::RequestError;
use crate::output::OutputProfile;
use crate::python_text::{Separators, number_is_int, py_json, py_len, py_repr};
use crate::request::{
    BODY_REFUSALS, Controls, DecisionRequest, MAX_QUESTIONS, MAX_STATE_CHARS, RequestLimits, check_option_counts,
    decode_like_python, hooks_refused, lone_surrogate_refused, mask_lone_surrogates, no_questions, read_controls,
    state_chars_0_4,
};
use crate::routing::{CheckpointName, Registry, resolve_model_field_in};
use crate::upstream::Upstream;

/// Most states in one batch (`MAX_BATCH_STATES`).
pub const MAX_BATCH_STATES: usize = 64;

/// A batch whose shape, sizes and controls passed upstream 0.4.15's checks.
#[derive(Clone, Debug, PartialEq)]
pub struct BatchRequest {
    /// The states, in request order (none is null).
    pub states: Vec<Value>,
    /// The questions every state is asked, not yet validated one by one.
    pub questions: Map<String, Value>,
    /// The checkpoint the `model` field names (`None`: route each state automatically).
    pub model: Option<CheckpointName>,
    /// The controls, applied to every state.
    pub controls: Controls,
    /// `batch_size`: upstream's most states per forward pass. Validated as upstream does; layad
    /// runs every state as its own job and lets its pools pack rows, so it does not change answers.
    pub batch_size: Option<u64>,
    /// `sort_by_length`: upstream's padding optimisation; validated, with no effect on answers.
    pub sort_by_length: Option<bool>,
}

impl BatchRequest {
    /// The single request state `index` stands for.
    pub fn request(&self, index: usize) -> Option<DecisionRequest> {
        Some(DecisionRequest {
            state: Some(self.states.get(index)?.clone()),
            questions: self.questions.clone(),
            model: self.model,
            controls: self.controls.clone(),
        })
    }
}

/// `_check_request_limits` for one state of the batch against the shared questions.
fn check_state(state: &Value, questions: &Value, limits: RequestLimits) -> Result<(), RequestError> {
    if state.is_null() {
        return Err(RequestError::new(400, "'state' is required").at(&["states"], "missing"));
    }
    let Value::Object(questions) = questions else {
        return Err(RequestError::new(400, "'questions' must be an object").at(&["questions"], "dict_type"));
    };
    if questions.len() > MAX_QUESTIONS {
        return Err(RequestError::new(
            413,
            format!("too many questions ({} > {MAX_QUESTIONS})", questions.len()),
        ));
    }
    check_option_counts(questions, limits.max_choice_options)?;
    let chars = match state {
        Value::String(s) => py_len(s),
        other => state_chars_0_4(other),
    };
    if chars > MAX_STATE_CHARS {
        return Err(RequestError::new(
            413,
            format!("state too large ({chars} > {MAX_STATE_CHARS} chars)"),
        ));
    }
    Ok(())
}

/// Parses a complete batch body and applies upstream 0.4.15's checks in its order (serve.py's
/// `_systemone_batch_inner` up to the inference call). Routing (an unknown `task`) and question
/// validation come after, per state, as for a single request.
pub fn parse_batch_body(bytes: &[u8], limits: RequestLimits) -> Result<BatchRequest, RequestError> {
    parse_batch_body_in(bytes, OutputProfile::Laya, limits, Registry::builtin_only())
}

/// [`parse_batch_body`] for a server in the `output` profile that may have registered checkpoints
/// of its own (`model` may name them): under `jev`, `model` is read as the Jev API reads it and an
/// empty `questions` is refused, as for a single request (`crate::request::parse_body_in`).
pub fn parse_batch_body_in(
    bytes: &[u8],
    output: OutputProfile,
    limits: RequestLimits,
    registry: &Registry,
) -> Result<BatchRequest, RequestError> {
    let invalid_json = || RequestError::new(400, "request body must be valid JSON").at(&[], "json_invalid");
    let text = decode_like_python(bytes).ok_or_else(invalid_json)?;
    let (text, lone_surrogate) = mask_lone_surrogates(&text);
    let body: Value = serde_json::from_str(&text).map_err(|_| invalid_json())?;
    let shape = || {
        RequestError::new(
            400,
            "request body must be an object with 'states' and 'questions' fields",
        )
    };
    let Value::Object(mut body) = body else {
        return Err(shape().at(&[], "dict_type"));
    };
    if !body.contains_key("questions") {
        return Err(shape().at(&["questions"], "missing"));
    }
    if !body.contains_key("states") {
        return Err(shape().at(&["states"], "missing"));
    }
    let states = body.remove("states").unwrap_or(Value::Null);
    let questions = body.remove("questions").unwrap_or(Value::Null);
    let states = match states {
        Value::Array(states) if !states.is_empty() => states,
        _ => return Err(RequestError::new(400, "'states' must be a non-empty list").at(&["states"], "list_type")),
    };
    if states.len() > MAX_BATCH_STATES {
        return Err(RequestError::new(
            413,
            format!("too many states in batch ({} > {MAX_BATCH_STATES})", states.len()),
        ));
    }
    for state in &states {
        check_state(state, &questions, limits)?;
    }
    let Value::Object(questions) = questions else {
        // check_state refused it already; kept for the type.
        return Err(RequestError::new(400, "'questions' must be an object").at(&["questions"], "dict_type"));
    };
    if output.is_jev() && questions.is_empty() {
        return Err(no_questions());
    }
    let given = |key: &str| body.get(key).is_some_and(|v| !v.is_null());
    let refused: Vec<&str> = BODY_REFUSALS.into_iter().filter(|key| given(key)).collect();
    if !refused.is_empty() {
        return Err(hooks_refused(&refused));
    }
    if given("diagnostics") {
        return Err(RequestError::new(
            422,
            "diagnostics is filled in place for an in-process caller and cannot be returned over HTTP; \
             read the per-group report from the CLI or a local Router",
        )
        .at(&["diagnostics"], "extra_forbidden"));
    }
    if lone_surrogate {
        return Err(lone_surrogate_refused());
    }
    let model = if output.is_jev() {
        crate::jev::resolve_model(body.get("model"), registry)?
    } else {
        resolve_model_field_in(body.get("model"), Upstream::V0_4_15, registry).map_err(RequestError::from_route)?
    };
    let controls = read_controls(&body, limits)?;
    let batch_size = match body.get("batch_size").filter(|v| !v.is_null()) {
        None => None,
        Some(value @ Value::Number(n)) if number_is_int(n) => match n.to_string().parse::<i128>() {
            Ok(v) if v >= 1 => Some(u64::try_from(v).unwrap_or(u64::MAX)),
            Ok(_) => {
                return Err(RequestError::new(
                    422,
                    format!("batch_size must be a positive integer, got {}", py_repr(value)),
                )
                .at(&["batch_size"], "greater_than_equal"));
            }
            // More digits than an i128 holds: positive is huge, negative is refused.
            Err(_) if n.to_string().starts_with('-') => {
                return Err(RequestError::new(
                    422,
                    format!("batch_size must be a positive integer, got {}", py_repr(value)),
                )
                .at(&["batch_size"], "greater_than_equal"));
            }
            Err(_) => Some(u64::MAX),
        },
        Some(_) => return Err(RequestError::new(422, "batch_size must be an integer").at(&["batch_size"], "int_type")),
    };
    let sort_by_length = match body.get("sort_by_length").filter(|v| !v.is_null()) {
        None => None,
        Some(Value::Bool(b)) => Some(*b),
        Some(_) => {
            return Err(RequestError::new(422, "sort_by_length must be a boolean").at(&["sort_by_length"], "bool_type"));
        }
    };
    Ok(BatchRequest {
        states,
        questions,
        model,
        controls,
        batch_size,
        sort_by_length,
    })
}

/// The batch answer, `{"results": [...], "total_usage": {"input_tokens", "output_tokens"}}`, as
/// Starlette renders it; the totals sum each result's `usage` (a missing count is 0).
pub fn render_batch(results: Vec<Value>) -> String {
    let count = |result: &Value, key: &str| {
        result
            .get("usage")
            .and_then(|u| u.get(key))
            .and_then(Value::as_u64)
            .unwrap_or(0)
    };
    let input: u64 = results.iter().map(|r| count(r, "input_tokens")).sum();
    let output: u64 = results.iter().map(|r| count(r, "output_tokens")).sum();
    let mut total = Map::new();
    total.insert("input_tokens".to_owned(), Value::from(input));
    total.insert("output_tokens".to_owned(), Value::from(output));
    let mut body = Map::new();
    body.insert("results".to_owned(), Value::Array(results));
    body.insert("total_usage".to_owned(), Value::Object(total));
    py_json(&Value::Object(body), Separators::Compact)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn refused(body: &str) -> (u16, String) {
        match parse_batch_body(body.as_bytes(), RequestLimits::default()) {
            Ok(_) => (200, String::new()),
            Err(e) => (e.status, e.detail),
        }
    }

    const Q: &str = r#"{"q": {"type": "noul", "instructions": "Is it?"}}"#;

    #[test]
    fn a_good_batch_keeps_its_states_and_controls() {
        let body = format!(
            r#"{{"states": ["a", {{"k": 1}}, ["t"]], "questions": {Q}, "model": "en", "max_len": 64,
                "lang": "de", "min_confidence": 0.5, "batch_size": 2, "sort_by_length": true}}"#
        );
        let batch = parse_batch_body(body.as_bytes(), RequestLimits::default()).expect("valid");
        assert_eq!(batch.states, [json!("a"), json!({"k": 1}), json!(["t"])]);
        assert_eq!(batch.model, Some(CheckpointName::English));
        assert_eq!(batch.controls.max_len, Some(64));
        assert_eq!(batch.controls.lang.as_deref(), Some("de"));
        assert_eq!((batch.batch_size, batch.sort_by_length), (Some(2), Some(true)));
        let one = batch.request(1).expect("state 1");
        assert_eq!(one.state, Some(json!({"k": 1})));
        assert_eq!(one.questions.len(), 1);
        assert!(batch.request(3).is_none());
    }

    #[test]
    fn shape_errors_have_upstreams_texts_in_its_order() {
        let shape = (
            400,
            "request body must be an object with 'states' and 'questions' fields".to_owned(),
        );
        assert_eq!(refused("[]"), shape);
        assert_eq!(refused(r#"{"states": ["a"]}"#), shape);
        assert_eq!(refused(&format!(r#"{{"state": "a", "questions": {Q}}}"#)), shape);
        assert_eq!(refused("{"), (400, "request body must be valid JSON".to_owned()));
        let empty = (400, "'states' must be a non-empty list".to_owned());
        assert_eq!(refused(&format!(r#"{{"states": [], "questions": {Q}}}"#)), empty);
        assert_eq!(refused(&format!(r#"{{"states": "a", "questions": {Q}}}"#)), empty);
        let many = format!(
            r#"{{"states": {}, "questions": "not checked yet"}}"#,
            json!(vec!["s"; 65])
        );
        assert_eq!(refused(&many), (413, "too many states in batch (65 > 64)".to_owned()));
        assert_eq!(
            refused(&format!(r#"{{"states": ["a", null], "questions": {Q}}}"#)),
            (400, "'state' is required".to_owned())
        );
        // The first state's null wins over the questions' shape; a good first state lets the
        // questions' error through.
        assert_eq!(
            refused(r#"{"states": [null], "questions": []}"#),
            (400, "'state' is required".to_owned())
        );
        assert_eq!(
            refused(r#"{"states": ["a"], "questions": []}"#),
            (400, "'questions' must be an object".to_owned())
        );
        let long = "x".repeat(50_001);
        assert_eq!(
            refused(&format!(r#"{{"states": ["a", "{long}"], "questions": {Q}}}"#)),
            (413, "state too large (50001 > 50000 chars)".to_owned())
        );
        let options: Vec<String> = (0..101).map(|i| format!("o{i}")).collect();
        let choice = json!({"c": {"type": "choice", "instructions": "?", "criteria": options}});
        assert_eq!(
            refused(&format!(r#"{{"states": ["a"], "questions": {choice}}}"#)),
            (413, "too many choice options for 'c' (101 > 100)".to_owned())
        );
    }

    #[test]
    fn refused_fields_and_controls_have_upstreams_texts() {
        let with = |extra: &str| refused(&format!(r#"{{"states": ["a"], "questions": {Q}, {extra}}}"#));
        assert_eq!(
            with(r#""hooks_timeout": 1, "hooks": 2"#),
            (
                422,
                "hooks, hooks_timeout run inside the server process and cannot be sent to this endpoint; \
                 install them where laya-serve runs, or drop them"
                    .to_owned()
            )
        );
        assert_eq!(
            with(r#""diagnostics": {}"#),
            (
                422,
                "diagnostics is filled in place for an in-process caller and cannot be returned over HTTP; \
                 read the per-group report from the CLI or a local Router"
                    .to_owned()
            )
        );
        assert_eq!(with(r#""diagnostics": null"#).0, 200);
        assert_eq!(
            with(r#""x": "\ud800""#),
            (
                400,
                "request body contains an unpaired surrogate escape; those cannot be encoded as UTF-8".to_owned()
            )
        );
        assert_eq!(with(r#""model": "./mine""#).0, 422);
        assert_eq!(
            with(r#""max_len": 0"#),
            (422, "max_len must be a positive integer".to_owned())
        );
        for bad in ["true", "1.5", "\"2\""] {
            assert_eq!(
                with(&format!(r#""batch_size": {bad}"#)),
                (422, "batch_size must be an integer".to_owned()),
                "{bad}"
            );
        }
        assert_eq!(
            with(r#""batch_size": 0"#),
            (422, "batch_size must be a positive integer, got 0".to_owned())
        );
        assert_eq!(
            with(r#""batch_size": -3"#),
            (422, "batch_size must be a positive integer, got -3".to_owned())
        );
        assert_eq!(
            with(r#""batch_size": 1000000000000000000000000000000000000000000"#).0,
            200
        );
        assert_eq!(
            with(r#""sort_by_length": 1"#),
            (422, "sort_by_length must be a boolean".to_owned())
        );
        // The controls' order: max_len before batch_size before sort_by_length.
        assert_eq!(
            with(r#""sort_by_length": 1, "batch_size": 0, "max_len": "x""#),
            (422, "max_len must be an integer".to_owned())
        );
        assert_eq!(
            with(r#""sort_by_length": 1, "batch_size": 0"#).1,
            "batch_size must be a positive integer, got 0"
        );
    }

    #[test]
    fn the_answer_sums_the_results_usage() {
        let results = vec![
            json!({"model": "m", "answers": {}, "usage": {"input_tokens": 5, "output_tokens": 0}}),
            json!({"model": "m", "answers": {}, "usage": {"input_tokens": 7, "output_tokens": 0}}),
        ];
        assert_eq!(
            render_batch(results),
            concat!(
                r#"{"results":[{"model":"m","answers":{},"usage":{"input_tokens":5,"output_tokens":0}},"#,
                r#"{"model":"m","answers":{},"usage":{"input_tokens":7,"output_tokens":0}}],"#,
                r#""total_usage":{"input_tokens":12,"output_tokens":0}}"#
            )
        );
    }

    #[test]
    fn jev_batches_read_model_as_jev_and_refuse_empty_questions() {
        let jev = |body: &str| {
            parse_batch_body_in(
                body.as_bytes(),
                OutputProfile::Jev,
                RequestLimits::default(),
                Registry::builtin_only(),
            )
        };
        let q = r#"{"q": {"type": "noul", "instructions": "x"}}"#;
        let batch = jev(&format!(
            r#"{{"states": ["a"], "model": "~typesafe/jev-latest", "questions": {q}}}"#
        ))
        .expect("a Jev id");
        assert_eq!(batch.model, None);
        assert!(
            parse_batch_body(
                format!(r#"{{"states": ["a"], "model": "~typesafe/jev-latest", "questions": {q}}}"#).as_bytes(),
                RequestLimits::default()
            )
            .is_err(),
            "0.4.15 refuses it as a path"
        );
        let unknown = jev(&format!(r#"{{"states": ["a"], "model": "nope", "questions": {q}}}"#)).expect_err("unknown");
        assert_eq!(unknown.status, 400);
        let empty = r#"{"states": ["a"], "questions": {}}"#;
        assert!(parse_batch_body(empty.as_bytes(), RequestLimits::default()).is_ok());
        assert_eq!(jev(empty).expect_err("empty").status, 422);
        let missing = jev(r#"{"questions": {}}"#).expect_err("no states");
        assert_eq!(
            missing.problem,
            crate::error::Problem::Invalid {
                loc: vec![Value::from("states")],
                kind: "missing"
            }
        );
    }
}
