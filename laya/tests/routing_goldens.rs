//! Routing against upstream's own answers: every request of the `language.json` and `cases.json`
//! goldens (recorded from `laya[serve]==0.3.20`) must produce the same `routing` object, byte for byte.

use laya::python_text::{Separators, py_json};
use laya::routing::{resolve_model_field, route};
use serde_json::Value;

const LANGUAGE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/goldens/language.json");
const CASES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/goldens/cases.json");

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

/// Routes one request body the way the server does and renders the `routing` object.
fn routing_of(body: &Value) -> String {
    let ids: Vec<&str> = body
        .get("questions")
        .and_then(Value::as_object)
        .map(|questions| questions.keys().map(String::as_str).collect())
        .unwrap_or_default();
    let explicit = resolve_model_field(body.get("model"));
    let decision = route(body.get("state"), &ids, explicit, false);
    py_json(&decision.to_json(), Separators::Compact)
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
