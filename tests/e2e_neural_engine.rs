//! The Neural Engine pool beside a GPU pool, with real workers: the candle executor of the
//! `bc1s-masked` graphs takes short single questions and answers within the parity gate; where
//! Core ML does not exist the pool is reported unavailable and the GPU pool answers, saying why.

use std::time::{Duration, Instant};

use laya::upstream::Upstream;
use layad_system_tests::goldens::{fixtures_dir, golden_body, goldens};
use layad_system_tests::{Server, get, post_json};
use serde_json::Value;

/// A GPU pool for everything plus an `ane` pool over the fixture artifacts with `executor`. Spill is
/// off: these tests check what the `ane` pool answers and when it is unavailable, and on a busy
/// 2-vCPU test machine (the other test's server warming beside it) its CPU stand-in can measure
/// slowed, which moves requests to the other pool on purpose (issue 40; `e2e_scheduling`'s business).
fn config(executor: &str, dtype: &str) -> String {
    let artifacts = fixtures_dir().join("ane-artifacts");
    format!(
        r#"
[server]
request_timeout = "60s"

[scheduling]
spill = false

[[pool]]
name = "gpu"
device = "cpu"
workers = 1
threads = 1

[[pool]]
name = "ane"
worker = "ane"
executor = "{executor}"
dtype = "{dtype}"
threads = 1
artifacts = "{}"
checkpoints = ["english", "multilingual"]
"#,
        artifacts.display()
    )
}

/// Golden single-question english requests that fit the english artifacts, with upstream's answer.
fn short_cases() -> Vec<(String, Value)> {
    goldens(Upstream::default(), "cases.json")["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .filter(|c| {
            c["status"] == 200
                && c["checkpoint"] == "english"
                && c["rows"].as_array().is_some_and(|r| r.len() == 1)
                && c["rows"][0]["ids"].as_array().is_some_and(|ids| ids.len() <= 96)
        })
        .filter_map(|c| {
            let body = c["body"].as_str()?;
            serde_json::from_str::<Value>(body).ok()?;
            Some((body.to_owned(), serde_json::from_str(c["response"].as_str()?).ok()?))
        })
        .take(12)
        .collect()
}

/// Every probability and act probability of an answer, in order.
fn probabilities(answer: &Value) -> Vec<f64> {
    let mut out = Vec::new();
    for (_, question) in answer["answers"].as_object().into_iter().flatten() {
        for (_, p) in question["probabilities"].as_object().into_iter().flatten() {
            out.extend(p.as_f64());
        }
        out.extend(question["action"]["act_probability"].as_f64());
    }
    out
}

async fn wait_for<F: Fn(&Value) -> bool>(server: &Server, what: &str, done: F) -> Value {
    let start = Instant::now();
    loop {
        let health = get(server.addr, "/health").await.expect("health").json();
        if done(&health) {
            return health;
        }
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "{what}: {health}\n{}",
            server.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_single_questions_run_on_the_neural_engine_pool_within_the_gate() {
    let mut server = Server::start(&config("candle", "f16"), &[]);
    server.wait_ready(Duration::from_secs(120)).await;
    let health = wait_for(&server, "every worker ready", |h| h["status"] == "ok").await;
    let ane = &health["pools"][1];
    assert_eq!(ane["takes"]["max_questions"], 1, "{ane}");
    assert_eq!(ane["takes"]["buckets"], serde_json::json!([64, 96, 128]), "{ane}");
    assert_eq!(ane["workers"][0]["dtype"], "f16");
    // The gate it passed before joining, per checkpoint, as it told Describe.
    let gates = ane["workers"][0]["parity_gate"]
        .as_array()
        .expect("parity_gate")
        .clone();
    let checkpoints: Vec<&str> = gates.iter().filter_map(|g| g["checkpoint"].as_str()).collect();
    assert_eq!(checkpoints, ["english", "multilingual"], "{ane}");
    for gate in &gates {
        assert_eq!(gate["hard_mismatches"], 0, "{gate}");
        assert!(gate["max_probability_diff"].as_f64() <= Some(0.02), "{gate}");
        assert!(gate["rows"].as_u64() > Some(0), "{gate}");
    }
    assert_eq!(health["pools"][0]["workers"][0]["parity_gate"], serde_json::json!([]));

    let cases = short_cases();
    assert!(cases.len() >= 8, "{} cases", cases.len());
    for (body, upstream) in &cases {
        let response = post_json(server.addr, "/v1/systemone", body.as_bytes())
            .await
            .expect("post");
        assert_eq!(response.status, 200, "{}", response.text());
        let answer = response.json();
        let block = &answer["x_layad"];
        assert_eq!(
            (block["pool"].as_str(), block["route"].as_str()),
            (Some("ane"), Some("preferred")),
            "{block}"
        );
        let (ours, theirs) = (probabilities(&answer), probabilities(upstream));
        assert_eq!(ours.len(), theirs.len());
        for (a, b) in ours.iter().zip(&theirs) {
            // The parity gate's tolerance for FP16 graphs (laya-apple's, fixed before measuring).
            assert!((a - b).abs() <= 0.02, "{a} vs upstream {b}: {answer} vs {upstream}");
        }
    }
    // More than one question never goes to the one-row pool.
    let multi = golden_body("multi_five_questions_mixed");
    let answer = post_json(server.addr, "/v1/systemone", multi.as_bytes())
        .await
        .expect("post")
        .json();
    assert_eq!(answer["x_layad"]["pool"], "gpu", "{answer}");
}

#[cfg(not(target_os = "macos"))]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_core_ml_the_pool_is_unavailable_and_the_gpu_pool_answers_with_the_reason() {
    let mut server = Server::start(&config("coreml", "f16"), &[]);
    server.wait_ready(Duration::from_secs(120)).await;
    let health = wait_for(&server, "the ane pool reported unavailable", |h| {
        h["pools"][1]["unavailable"].is_string()
    })
    .await;
    let why = health["pools"][1]["unavailable"].as_str().expect("reason");
    assert!(why.contains("Core ML"), "{why}");
    assert_eq!(
        health["pools"][1]["workers"][0]["state"], "failed",
        "not restarted: {health}"
    );
    let (body, upstream) = short_cases().remove(0);
    let response = post_json(server.addr, "/v1/systemone", body.as_bytes())
        .await
        .expect("post");
    assert_eq!(response.status, 200, "{}", response.text());
    let answer = response.json();
    let block = &answer["x_layad"];
    assert_eq!(
        (block["pool"].as_str(), block["route"].as_str()),
        (Some("gpu"), Some("fallback")),
        "{block}"
    );
    let reason = block["reason"].as_str().expect("reason");
    assert!(
        reason.starts_with("'ane' would take 1 question") && reason.contains(why),
        "{reason}"
    );
    for (a, b) in probabilities(&answer).iter().zip(probabilities(&upstream)) {
        assert!((a - b).abs() <= 1e-4, "{a} vs {b}");
    }
    let metrics = get(server.addr, "/metrics").await.expect("metrics").text();
    assert!(metrics.contains(r#"layad_pool_unavailable{pool="ane"} 1"#), "{metrics}");
}
