//! Routing against upstream's own answers, byte for byte: every request of the `language.json` and
//! `cases.json` goldens (recorded from `laya[serve]==0.3.20`), and every case of
//! `routing-0.3.20.json` and `routing-0.4.15.json` (computed by each release's own server code path,
//! `tools/fixtures/make_routing_goldens.py`), refusals included.

use laya::python_text::{Separators, py_json};
use laya::routing::{CheckpointName, RouteOptions, RouteRequest, resolve_model_field, route};
use laya::upstream::Upstream;
use serde_json::Value;

const LANGUAGE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/goldens/language.json");
const CASES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/goldens/cases.json");
const ROUTING_0_3_20: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../tests/fixtures/goldens/routing-0.3.20.json"
);
const ROUTING_0_4_15: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../tests/fixtures/goldens/routing-0.4.15.json"
);

fn read_fixture(path: &str) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {path}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path} is not JSON: {e}"))
}

/// Python's `json.loads` also takes the literals `NaN`, `Infinity` and `-Infinity`; serde_json does
/// not. Routing never reads numbers, so they are read as `null` here.
fn parse_python_json(text: &str) -> Option<Value> {
    if let Ok(value) = serde_json::from_str(text) {
        return Some(value);
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    let mut in_string = false;
    while let Some(ch) = rest.chars().next() {
        if in_string {
            if ch == '\\' {
                let escaped: String = rest.chars().take(2).collect();
                out.push_str(&escaped);
                rest = &rest[escaped.len()..];
                continue;
            }
            in_string = ch != '"';
        } else if ch == '"' {
            in_string = true;
        } else if let Some(literal) = ["NaN", "-Infinity", "Infinity"]
            .into_iter()
            .find(|lit| rest.starts_with(lit))
        {
            out.push_str("null");
            rest = &rest[literal.len()..];
            continue;
        }
        out.push(ch);
        rest = &rest[ch.len_utf8()..];
    }
    serde_json::from_str(&out).ok()
}

/// Routes one request body the way the 0.3.20 server does and renders the `routing` object.
fn routing_of(body: &Value) -> String {
    let ids: Vec<&str> = body
        .get("questions")
        .and_then(Value::as_object)
        .map(|questions| questions.keys().map(String::as_str).collect())
        .unwrap_or_default();
    let upstream = Upstream::V0_3_20;
    let request = RouteRequest {
        model: resolve_model_field(body.get("model"), upstream).unwrap_or_default(),
        ..RouteRequest::default()
    };
    let options = RouteOptions {
        upstream,
        ..RouteOptions::default()
    };
    match route(body.get("state"), &ids, &request, &options) {
        Ok(decision) => py_json(&decision.to_json(), Separators::Compact),
        Err(e) => format!("refused: {e}"),
    }
}

fn text<'a>(entry: &'a Value, key: &str) -> &'a str {
    entry.get(key).and_then(Value::as_str).unwrap_or_default()
}

#[test]
fn language_goldens_route_like_upstream() {
    let fixture = read_fixture(LANGUAGE);
    let samples = fixture
        .get("samples")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    assert!(!samples.is_empty(), "{LANGUAGE} has no samples");
    let mut failures = Vec::new();
    for sample in &samples {
        let name = text(sample, "name");
        let Some(body) = parse_python_json(text(sample, "body")) else {
            failures.push(format!("{name}: body does not parse"));
            continue;
        };
        let got = routing_of(&body);
        let want = sample
            .get("routing")
            .map(|r| py_json(r, Separators::Compact))
            .unwrap_or_default();
        if got != want {
            failures.push(format!("{name}:\n  got  {got}\n  want {want}"));
            continue;
        }
        // No questions: the whole response is fixed by routing, so its exact bytes are checked too.
        let response = format!(
            r#"{{"model":"laya-rl-agent","answers":{{}},"usage":{{"input_tokens":0,"output_tokens":0}},"routing":{got}}}"#
        );
        if response != text(sample, "response") {
            failures.push(format!(
                "{name}: response text differs\n  got  {response}\n  want {}",
                text(sample, "response")
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} samples differ:\n{}",
        failures.len(),
        samples.len(),
        failures.join("\n")
    );
}

#[test]
fn case_goldens_route_like_upstream() {
    let fixture = read_fixture(CASES);
    let cases = fixture
        .get("cases")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    assert!(!cases.is_empty(), "{CASES} has no cases");
    let mut failures = Vec::new();
    let mut checked = 0;
    for case in &cases {
        let name = text(case, "name");
        if case.get("status").and_then(Value::as_u64) != Some(200) {
            continue;
        }
        let Some(response) = parse_python_json(text(case, "response")) else {
            failures.push(format!("{name}: response does not parse"));
            continue;
        };
        let Some(body) = parse_python_json(text(case, "body")) else {
            failures.push(format!("{name}: body does not parse"));
            continue;
        };
        let want = response
            .get("routing")
            .map(|r| py_json(r, Separators::Compact))
            .unwrap_or_default();
        let got = routing_of(&body);
        if got != want {
            failures.push(format!("{name}:\n  got  {got}\n  want {want}"));
        }
        let checkpoint = case.get("checkpoint").and_then(Value::as_str);
        let routed = response.pointer("/routing/model").and_then(Value::as_str);
        if checkpoint != routed {
            failures.push(format!(
                "{name}: checkpoint {checkpoint:?} but routing.model {routed:?}"
            ));
        }
        checked += 1;
    }
    assert!(checked > 0, "{CASES} has no 200 cases");
    assert!(
        failures.is_empty(),
        "{} of {checked} cases differ:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// One case of a `routing-<version>.json` golden, routed the way that release's server does:
/// the routing text, or `422 <detail>` for a refusal.
fn replay(case: &Value, upstream: Upstream) -> Result<String, String> {
    let state = match case.get("state_json") {
        None | Some(Value::Null) => None,
        Some(text) => {
            Some(serde_json::from_str::<Value>(text.as_str().unwrap_or_default()).map_err(|e| e.to_string())?)
        }
    };
    let ids: Vec<&str> = case
        .get("question_ids")
        .and_then(Value::as_array)
        .map(|ids| ids.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let hints = case.get("hints").cloned().unwrap_or(Value::Null);
    let default_checkpoint = case
        .get("default_checkpoint")
        .and_then(Value::as_str)
        .map(|name| CheckpointName::from_name_or_alias(name).ok_or(format!("bad default {name}")))
        .transpose()?;
    let options = RouteOptions {
        upstream,
        auto_task: case.get("auto_task").and_then(Value::as_bool).unwrap_or(false),
        default_checkpoint,
        ..RouteOptions::default()
    };
    let refused = |e: laya::routing::RouteError| format!("{} {e}", e.status());
    let model = match resolve_model_field(hints.get("model"), upstream) {
        Ok(model) => model,
        Err(e) => return Ok(refused(e)),
    };
    let request = RouteRequest {
        model,
        task: hints.get("task"),
        lang: hints.get("lang").and_then(Value::as_str),
        lang_guess: hints.get("lang_guess").and_then(Value::as_str),
    };
    Ok(match route(state.as_ref(), &ids, &request, &options) {
        Ok(decision) => py_json(&decision.to_json(), Separators::Compact),
        Err(e) => refused(e),
    })
}

fn replay_golden(path: &str, upstream: Upstream) {
    let fixture = read_fixture(path);
    assert_eq!(
        fixture.get("upstream").and_then(Value::as_str),
        Some(format!("laya[serve]=={upstream}").as_str())
    );
    let cases = fixture
        .get("cases")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    assert!(cases.len() >= 500, "{path} has only {} cases", cases.len());
    let mut failures = Vec::new();
    for case in &cases {
        let name = text(case, "name");
        let result = case.get("result").cloned().unwrap_or(Value::Null);
        let want = match result.get("routing_json").and_then(Value::as_str) {
            Some(routing) => routing.to_owned(),
            None => format!(
                "{} {}",
                result.get("status").and_then(Value::as_u64).unwrap_or_default(),
                text(&result, "detail")
            ),
        };
        match replay(case, upstream) {
            Ok(got) if got == want => {}
            Ok(got) => failures.push(format!("{name}:\n  got  {got}\n  want {want}")),
            Err(e) => failures.push(format!("{name}: {e}")),
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases differ:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

#[test]
fn routing_goldens_of_0_3_20_replay_byte_for_byte() {
    replay_golden(ROUTING_0_3_20, Upstream::V0_3_20);
}

#[test]
fn routing_goldens_of_0_4_15_replay_byte_for_byte() {
    replay_golden(ROUTING_0_4_15, Upstream::V0_4_15);
}
