//! Golden tests against upstream `laya[serve]==0.3.20` itself (fixtures from tools/fixtures):
//! token rows, validation messages, answers and whole response bodies, plus laya-apple's real goldens.

mod support;

use std::collections::HashMap;

use laya::checkpoint::Checkpoint;
use laya::decision::{DecisionOptions, RowOutput, prepare, respond};
use laya::prompt::Row;
use laya::python_text::{Separators, py_json};
use laya::request::{RequestError, RequestLimits, parse_body};
use laya::routing::CheckpointName;
use laya::upstream::Upstream;
use layad_system_tests::goldens::{TOLERANCE, compare, deliberate_difference, fixture_json, goldens, request_body};
use serde_json::Value;
use support::open_checkpoints;

/// The act head's softmax from a golden's `action_logits`, as an engine returns it.
fn act_probabilities(action_logits: &Value) -> Vec<f32> {
    let logits: Vec<f32> = action_logits
        .as_array()
        .expect("action_logits")
        .iter()
        .map(|v| v.as_f64().expect("number") as f32)
        .collect();
    laya::answer::softmax_f32(&logits)
}

fn act_probability(action_logits: &Value) -> f32 {
    act_probabilities(action_logits)[0]
}

fn f32s(v: &Value) -> Vec<f32> {
    v.as_array()
        .expect("list")
        .iter()
        .map(|x| x.as_f64().expect("number") as f32)
        .collect()
}

fn u32s(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("list")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

/// Runs one golden body through the host pipeline, feeding upstream's logits where rows exist.
fn run_case(
    checkpoints: &HashMap<CheckpointName, Checkpoint>,
    case: &Value,
    upstream: Upstream,
) -> Result<(Value, Vec<Row>), RequestError> {
    let body = case["body"].as_str().expect("body");
    let request = parse_body(body.as_bytes(), upstream, RequestLimits::default())?;
    let prepared = prepare(
        &request,
        |name| checkpoints.get(&name),
        DecisionOptions {
            upstream,
            ..DecisionOptions::default()
        },
    )?;
    let rows = prepared.rows.to_vec();
    let golden_rows = case["rows"].as_array().expect("rows");
    let outputs: Vec<RowOutput> = golden_rows
        .iter()
        .map(|r| RowOutput {
            logits: f32s(&r["logits"]),
            act_probabilities: act_probabilities(&r["action_logits"]),
        })
        .collect();
    let checkpoint = &checkpoints[&prepared.checkpoint()];
    if outputs.len() != prepared.rows.len() {
        return Ok((Value::Null, rows));
    }
    Ok((respond(&prepared, checkpoint, &outputs)?, rows))
}

#[test]
fn rows_answers_and_responses_match_upstream_0_3_20() {
    rows_answers_and_responses_match(Upstream::V0_3_20);
}

#[test]
fn rows_answers_and_responses_match_upstream_0_4_15() {
    rows_answers_and_responses_match(Upstream::V0_4_15);
}

fn rows_answers_and_responses_match(upstream: Upstream) {
    let checkpoints = open_checkpoints();
    let golden = goldens(upstream, "cases.json");
    let cases = golden["cases"].as_array().expect("cases");
    assert!(cases.len() >= 60, "the fixtures must cover at least 60 requests");
    let (mut failures, mut byte_identical, mut rows_checked) = (Vec::new(), 0, 0);
    for case in cases {
        let name = case["name"].as_str().expect("name");
        let status = case["status"].as_u64().expect("status") as u16;
        let response = case["response"].as_str().expect("response");
        let result = run_case(&checkpoints, case, upstream);
        if let Some((want_status, want_detail)) = deliberate_difference(name, upstream) {
            match result {
                Err(e) if e.status == want_status && (want_detail.is_empty() || e.detail == want_detail) => {}
                Err(e) => failures.push(format!(
                    "{name}: expected our {want_status} {want_detail:?}, got {} {:?}",
                    e.status, e.detail
                )),
                Ok(_) => failures.push(format!("{name}: expected our {want_status}, got 200")),
            }
            continue;
        }
        match result {
            Err(e) => {
                let upstream: Value = serde_json::from_str(response).unwrap_or(Value::Null);
                if e.status != status || upstream["detail"].as_str() != Some(e.detail.as_str()) {
                    failures.push(format!(
                        "{name}: we answer {} {:?}, upstream {status} {response}",
                        e.status, e.detail
                    ));
                }
            }
            Ok((body, rows)) => {
                if status != 200 {
                    failures.push(format!("{name}: we answer 200, upstream {status} {response}"));
                    continue;
                }
                for (i, (Row { ids, markers, qtype }, want)) in
                    rows.iter().zip(case["rows"].as_array().expect("rows")).enumerate()
                {
                    rows_checked += 1;
                    if *ids != u32s(&want["ids"])
                        || *markers != u32s(&want["markers"])
                        || *qtype as u64 != want["qtype"].as_u64().expect("qtype")
                    {
                        failures.push(format!(
                            "{name}: row {i} differs\n  ours     {ids:?} {markers:?}\n  upstream {} {}",
                            want["ids"], want["markers"]
                        ));
                    }
                }
                let ours = py_json(&body, Separators::Compact);
                if ours == response {
                    byte_identical += 1;
                    continue;
                }
                let upstream: Value = serde_json::from_str(response).expect("upstream body is JSON");
                let mut problems = Vec::new();
                compare("$", &body, &upstream, Some(TOLERANCE), &mut problems);
                if !problems.is_empty() {
                    failures.push(format!("{name}: {}", problems.join("; ")));
                }
            }
        }
    }
    println!(
        "{upstream}: {} cases, {rows_checked} rows identical, {byte_identical} bodies byte-identical",
        cases.len()
    );
    assert!(
        failures.is_empty(),
        "{} of {} cases differ from upstream:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

#[test]
fn http_body_checks_match_upstream_0_3_20() {
    http_body_checks_match(Upstream::V0_3_20);
}

#[test]
fn http_body_checks_match_upstream_0_4_15() {
    http_body_checks_match(Upstream::V0_4_15);
}

fn http_body_checks_match(upstream_version: Upstream) {
    let golden = goldens(upstream_version, "bad_requests.json");
    let (mut rejected, mut accepted) = (0, 0);
    let mut failures = Vec::new();
    for request in golden["requests"].as_array().expect("requests") {
        let name = request["name"].as_str().expect("name");
        // Routes, methods, auth and the declared/streamed size caps belong to the HTTP layer.
        let headers = request["headers"].as_object().expect("headers");
        let http_layer = request["app"] != "main"
            || request["method"] != "POST"
            || request["path"] != "/v1/systemone"
            || request["chunked"] == true
            || headers
                .keys()
                .any(|h| h.eq_ignore_ascii_case("content-length") || h.eq_ignore_ascii_case("content-encoding"))
            || request["body_len"].as_u64().unwrap_or(0) > laya::request::MAX_BODY_BYTES as u64;
        if http_layer {
            continue;
        }
        let body = request_body(request);
        let status = request["status"].as_u64().expect("status") as u16;
        let upstream: Value =
            serde_json::from_str(request["response"].as_str().expect("response")).unwrap_or(Value::Null);
        let deliberate = deliberate_difference(name, upstream_version);
        match (parse_body(&body, upstream_version, RequestLimits::default()), status) {
            (Err(e), _) if deliberate.is_some_and(|(s, d)| s == e.status && e.detail == d) => rejected += 1,
            (Err(e), 400 | 413 | 422)
                if e.status == status && upstream["detail"].as_str() == Some(e.detail.as_str()) =>
            {
                rejected += 1
            }
            // Refusals that need the checkpoint (question rules, head overflow) come later.
            (Ok(_), 200 | 422) if deliberate.is_none() => accepted += 1,
            (Err(e), _) => failures.push(format!(
                "{name}: we answer {} {:?}, upstream {status} {upstream}",
                e.status, e.detail
            )),
            (Ok(_), _) => failures.push(format!("{name}: we accept it, upstream {status} {upstream}")),
        }
    }
    println!(
        "{rejected} body-level bad requests rejected like upstream, {accepted} edge bodies accepted like upstream"
    );
    assert!(
        rejected >= 20,
        "expected at least 20 body-level bad requests, found {rejected}"
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn tokenizer_ids_match_python_tokenizers() {
    let golden = fixture_json("goldens/tokenizer.json");
    let checkpoints = open_checkpoints();
    let mut checked = 0;
    for (name, checkpoint) in [
        ("english", CheckpointName::English),
        ("multilingual", CheckpointName::Multilingual),
    ] {
        let tokenizer = &checkpoints[&checkpoint].tokenizer;
        for case in golden[name]["cases"].as_array().expect("cases") {
            let text = case["text"].as_str().expect("text");
            let ids = tokenizer.encode(text).expect("encodes");
            assert_eq!(ids, u32s(&case["ids"]), "{name}: {text:?}");
            checked += 1;
        }
    }
    assert!(checked >= 80, "{checked}");
}

/// laya-apple 1.7.0's goldens were made by upstream 0.3.20 on the real checkpoints; their
/// temperatures are recovered by tools/fixtures/fit_laya_apple_temperatures.py.
#[test]
fn real_checkpoint_answers_match_laya_apple_goldens() {
    use laya::config::Temperatures;
    use laya::question::parse_questions;
    let fitted = fixture_json("laya-apple/temperatures.json");
    let mut checked = 0;
    let mut failures = Vec::new();
    for file in ["laya", "laya-multilingual", "laya-typed-decisions"] {
        let golden = fixture_json(&format!("laya-apple/{file}.json"));
        let by_options = fitted[file]
            .as_object()
            .expect("fitted temperatures")
            .iter()
            .map(|(k, v)| (k.clone(), v["temperature"].as_f64().expect("t")))
            .collect();
        // Every bucket a question can fall in is fitted, so the per-type fallback is never used.
        let temperatures = Temperatures {
            by_type: [1.0, 1.0, 1.0],
            by_options,
            clamped: Vec::new(),
        };
        for case in golden["cases"].as_array().expect("cases") {
            let name = case["name"].as_str().expect("name");
            let questions = parse_questions(case["questions"].as_object().expect("questions"), Upstream::V0_3_20)
                .expect("valid questions");
            let answers = case["answers"].as_object().expect("answers");
            for (i, question) in questions.iter().enumerate() {
                let k = case["items"][i]["markers"].as_array().expect("markers").len();
                let logits = &f32s(&case["logits"][i])[..k];
                let ours = laya::answer::answer(
                    question,
                    logits,
                    act_probability(&case["action_logits"][i]),
                    &temperatures,
                    Upstream::V0_3_20,
                );
                let mut problems = Vec::new();
                compare(
                    &format!("{file}/{name}/{}", question.id),
                    &ours,
                    &answers[&question.id],
                    Some(TOLERANCE),
                    &mut problems,
                );
                failures.extend(problems);
                checked += 1;
            }
        }
    }
    assert!(checked > 300, "{checked}");
    assert!(
        failures.is_empty(),
        "{} answers differ:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
