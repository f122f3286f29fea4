//! Tournament choices (`[compat] tournament_group`, upstream 0.4.15's `LAYA_TOURNAMENT_GROUP`)
//! over real TCP: a 128-option choice in groups of 16 is one elimination round of eight group
//! questions plus the final call, two jobs; every label in `probabilities`, `x_tournament`; the
//! same on the batch route, one tournament per state; the raised cap of 255 and its refusal; the
//! one-pass cap of 100 without the group; the strict profile drops the tournament keys.
//!
//! The golden backend answers rows it has no recording for with equal logits, so every group's
//! winner is its first label (upstream's first argmax), which pins the finalists.

mod http_support;

use std::sync::atomic::Ordering;

use http_support::TestServer;
use laya::output::OutputProfile;
use serde_json::{Value, json};

const JSON: (&str, &str) = ("content-type", "application/json");

fn labels(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("option {i}")).collect()
}

fn body(options: usize) -> Value {
    json!({
        "state": "The customer asks where the parcel is.",
        "questions": {
            "intent": {"type": "choice", "instructions": "What does the customer want?", "criteria": labels(options)},
            "urgent": {"type": "noul", "instructions": "Is it urgent?"},
        },
    })
}

fn bytes(value: &Value) -> Vec<u8> {
    serde_json::to_vec(value).expect("json")
}

/// Asserts the answer of `body(128)` in groups of 16 (every group's first label goes through).
fn assert_128_in_groups_of_16(result: &Value) {
    let answer = &result["answers"]["intent"];
    let finalists: Vec<String> = (0..8).map(|i| format!("option {}", i * 16)).collect();
    assert_eq!(
        answer["x_tournament"],
        json!({"finalists": finalists, "rounds": 1}),
        "{answer}"
    );
    assert_eq!(answer["choice"], json!("option 0"));
    let probabilities = answer["probabilities"].as_object().expect("probabilities");
    let keys: Vec<&String> = probabilities.keys().collect();
    assert_eq!(
        keys,
        labels(128).iter().collect::<Vec<_>>(),
        "every label, in criteria order"
    );
    for (label, p) in probabilities {
        let expected = if finalists.contains(label) { 0.125 } else { 0.0 };
        assert_eq!(p.as_f64(), Some(expected), "{label}");
    }
    let answer_keys: Vec<&String> = answer.as_object().expect("answer").keys().collect();
    assert_eq!(
        answer_keys.iter().rev().take(2).collect::<Vec<_>>(),
        [&&"x_jev_confidence".to_owned(), &&"x_tournament".to_owned()],
        "x_tournament, then x_jev_confidence, as 0.4.15 adds them"
    );
    assert_eq!(result["answers"]["urgent"]["type"], json!("noul"));
    // The rows of both calls are counted.
    let tokens = result["usage"]["input_tokens"].as_u64().expect("input_tokens");
    assert!(tokens > 128, "{tokens}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_choice_of_128_in_groups_of_16_is_one_round_and_the_final_call() {
    let server = TestServer::start(|c| c.compat.tournament_group = 16).await;
    let response = server.post("/v1/systemone", &[JSON], &bytes(&body(128))).await;
    assert_eq!(response.status, 200, "{}", response.text());
    assert_eq!(
        server.backend.jobs.load(Ordering::SeqCst),
        2,
        "one round, then the final call"
    );
    assert_128_in_groups_of_16(&response.json());
    // A choice within the group is one pass: one job, no tournament keys.
    let small = server.post("/v1/systemone", &[JSON], &bytes(&body(16))).await;
    assert_eq!(small.status, 200, "{}", small.text());
    assert_eq!(server.backend.jobs.load(Ordering::SeqCst), 3);
    assert!(small.json()["answers"]["intent"].get("x_tournament").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_batch_route_plays_one_tournament_per_state_in_order() {
    let server = TestServer::start(|c| c.compat.tournament_group = 16).await;
    let single = body(128);
    let batch =
        json!({"states": [single["state"], "Another state.", single["state"]], "questions": single["questions"]});
    let response = server.post("/v1/systemone/batch", &[JSON], &bytes(&batch)).await;
    assert_eq!(response.status, 200, "{}", response.text());
    assert_eq!(server.backend.jobs.load(Ordering::SeqCst), 6, "two calls per state");
    let answer = response.json();
    let results = answer["results"].as_array().expect("results");
    assert_eq!(results.len(), 3);
    for result in results {
        assert_128_in_groups_of_16(result);
    }
    let alone = server.post("/v1/systemone", &[JSON], &bytes(&single)).await;
    assert_eq!(results[0], alone.json(), "a state answers as its single request");
    let total: u64 = results
        .iter()
        .map(|r| r["usage"]["input_tokens"].as_u64().unwrap_or(0))
        .sum();
    assert_eq!(answer["total_usage"]["input_tokens"], json!(total));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cap_is_255_with_the_group_and_100_without() {
    let server = TestServer::start(|c| c.compat.tournament_group = 16).await;
    let response = server.post("/v1/systemone", &[JSON], &bytes(&body(255))).await;
    assert_eq!(response.status, 200, "{}", response.text());
    assert_eq!(response.json()["answers"]["intent"]["x_tournament"]["rounds"], json!(1));
    let refused = server.post("/v1/systemone", &[JSON], &bytes(&body(256))).await;
    assert_eq!(refused.status, 413);
    assert_eq!(
        refused.json(),
        json!({"detail": "too many choice options for 'intent' (256 > 255)"})
    );
    let batch = json!({"states": ["s"], "questions": body(256)["questions"]});
    let refused = server.post("/v1/systemone/batch", &[JSON], &bytes(&batch)).await;
    assert_eq!(refused.status, 413, "{}", refused.text());

    let off = TestServer::start(|_| {}).await;
    let refused = off.post("/v1/systemone", &[JSON], &bytes(&body(128))).await;
    assert_eq!(refused.status, 413);
    assert_eq!(
        refused.json(),
        json!({"detail": "too many choice options for 'intent' (128 > 100)"})
    );
    assert_eq!(off.backend.jobs.load(Ordering::SeqCst), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_strict_profile_keeps_only_jevs_keys_of_a_tournament_answer() {
    let server = TestServer::start(|c| {
        c.compat.tournament_group = 16;
        c.compat.output = OutputProfile::JevStrict;
    })
    .await;
    let response = server.post("/v1/systemone", &[JSON], &bytes(&body(128))).await;
    assert_eq!(response.status, 200, "{}", response.text());
    let answer = &response.json()["answers"]["intent"];
    let keys: Vec<&String> = answer.as_object().expect("answer").keys().collect();
    assert_eq!(keys, ["type", "choice", "confidence", "probabilities"]);
    assert_eq!(answer["probabilities"].as_object().map(|p| p.len()), Some(128));
}
