//! The `jev` output profile end to end: the real `layad serve` with `[compat] output = "jev"` and a
//! key (its own port and socket directory), answering with a real worker on the fixture
//! checkpoints the way a Jev client expects: Jev model ids routed automatically, the strict keys
//! with Jev's confidence formula, the request id under the Jev API's header, Jev's error shapes
//! (401, 422 `detail[]`, 400 `api_usage_error`), a 255-option choice by elimination without a
//! configured group, and the batch route.

use std::time::Duration;

use layad_system_tests::{ONE_CPU_POOL, Server, request};
use serde_json::{Value, json};

const KEY: &str = "e2e-jev-key";

fn config() -> String {
    format!("[compat]\noutput = \"jev\"\n{ONE_CPU_POOL}")
}

async fn post(server: &Server, path: &str, body: &Value, key: Option<&str>) -> layad_system_tests::Response {
    let auth = key.map(|k| format!("Bearer {k}"));
    let mut headers = vec![("content-type", "application/json")];
    if let Some(auth) = &auth {
        headers.push(("authorization", auth.as_str()));
    }
    let bytes = serde_json::to_vec(body).expect("json");
    request(server.addr, "POST", path, &headers, &bytes)
        .await
        .expect("response")
}

/// Jev's reference confidence of a choice (`(max p − 1/n) / (1 − 1/n)`).
fn choice_confidence(probabilities: &serde_json::Map<String, Value>) -> f64 {
    let p: Vec<f64> = probabilities.values().filter_map(Value::as_f64).collect();
    let n = p.len() as f64;
    let max = p.iter().copied().fold(f64::MIN, f64::max);
    (max - 1.0 / n) / (1.0 - 1.0 / n)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jev_server_answers_jev_clients_as_the_jev_api_does() {
    let mut server = Server::start(&config(), &[("LAYA_API_KEY", KEY)]);
    server.wait_ready(Duration::from_secs(180)).await;
    let ticket = "I was charged twice for invoice 4411, please refund it today.";

    let asked = json!({"model": "typesafe/jev-1.13", "state": ticket, "questions": {
        "team": {"type": "choice", "instructions": "Which team?", "criteria": {
            "Billing": "Payments, invoices, refunds", "Technical": "Bugs and outages", "Sales": null}},
        "anger": {"type": "score", "instructions": "How frustrated?", "criteria": ["Calm", "Frustrated", "Very angry"]},
        "threat": {"type": "noul", "criteria": {"true": "The customer threatens a chargeback", "false": "No threat"}},
    }});
    let answered = post(&server, "/v1/systemone", &asked, Some(KEY)).await;
    assert_eq!(answered.status, 200, "{}\n{}", answered.text(), server.log());
    assert_eq!(
        answered.header("x-typesafe-request-id"),
        answered.header("x-request-id")
    );
    let body = answered.json();
    let root: Vec<&String> = body.as_object().expect("root").keys().collect();
    assert_eq!(root, ["model", "answers", "usage"]);
    let team = body["answers"]["team"].as_object().expect("team");
    let keys: Vec<&String> = team.keys().collect();
    assert_eq!(keys, ["type", "choice", "confidence", "probabilities"]);
    let probabilities = team["probabilities"].as_object().expect("probabilities");
    let confidence = team["confidence"].as_f64().expect("confidence");
    assert!(
        (confidence - choice_confidence(probabilities)).abs() < 1e-3,
        "{confidence} is not Jev's confidence of {probabilities:?}"
    );
    let anger: Vec<&String> = body["answers"]["anger"].as_object().expect("anger").keys().collect();
    assert_eq!(anger, ["type", "score", "confidence", "probabilities", "legend"]);
    // Unrounded, as Jev's: each distribution sums to one, and the score is its expectation, within
    // the 1e-6 a Jev client such as jevantic allows.
    let levels: Vec<f64> = body["answers"]["anger"]["probabilities"]
        .as_object()
        .expect("probabilities")
        .values()
        .filter_map(Value::as_f64)
        .collect();
    let team_total: f64 = probabilities.values().filter_map(Value::as_f64).sum();
    assert!(
        (team_total - 1.0).abs() < 1e-9 && (levels.iter().sum::<f64>() - 1.0).abs() < 1e-9,
        "{body}"
    );
    let expectation: f64 = levels.iter().enumerate().map(|(i, p)| i as f64 * p).sum();
    let score = body["answers"]["anger"]["score"].as_f64().expect("score");
    assert!((score - expectation).abs() < 1e-9, "{score} vs {expectation}");
    assert!(
        body["answers"]["threat"]["noul"]
            .as_f64()
            .is_some_and(|p| (0.0..=1.0).contains(&p))
    );

    // Errors, in the Jev API's shapes.
    let unauthorized = post(&server, "/v1/systemone", &asked, None).await;
    assert_eq!(unauthorized.status, 401);
    assert_eq!(
        unauthorized.json()["detail"]["error_type"],
        json!("authentication_error")
    );
    let empty = post(
        &server,
        "/v1/systemone",
        &json!({"state": ticket, "questions": {}}),
        Some(KEY),
    )
    .await;
    assert_eq!(empty.status, 422, "{}", empty.text());
    assert_eq!(empty.json()["detail"][0]["loc"], json!(["body", "questions"]));
    let unknown = post(
        &server,
        "/v1/systemone",
        &json!({"model": "gpt-4o", "state": ticket, "questions": asked["questions"]}),
        Some(KEY),
    )
    .await;
    assert_eq!(unknown.status, 400, "{}", unknown.text());
    assert_eq!(unknown.json()["detail"]["error_type"], json!("api_usage_error"));
    // The other Laya runtimes' ids: laya-mlx's English checkpoint, and "let the router choose".
    for peer in ["laya-421m", "auto", "laya-rl-agent"] {
        let answered = post(
            &server,
            "/v1/systemone",
            &json!({"model": peer, "state": ticket, "questions": asked["questions"]}),
            Some(KEY),
        )
        .await;
        assert_eq!(answered.status, 200, "{peer}: {}", answered.text());
    }

    // 255 options, answered by elimination in groups of 16 (no group configured).
    let queues: serde_json::Map<String, Value> = (0..255)
        .map(|i| (format!("Queue {i:03}"), json!(format!("tickets for queue {i}"))))
        .collect();
    let wide = json!({"model": "jev-latest", "state": ticket, "questions": {
        "queue": {"type": "choice", "instructions": "Which queue?", "criteria": queues}}});
    let answered = post(&server, "/v1/systemone", &wide, Some(KEY)).await;
    assert_eq!(answered.status, 200, "{}", answered.text());
    let queue = &answered.json()["answers"]["queue"];
    assert_eq!(queue["probabilities"].as_object().map(|p| p.len()), Some(255));
    let total: f64 = queue["probabilities"]
        .as_object()
        .expect("probabilities")
        .values()
        .filter_map(Value::as_f64)
        .sum();
    assert!((total - 1.0).abs() < 1e-9, "{total}");

    // The batch route answers each state in the same shape.
    let batch = json!({"model": "~typesafe/jev-latest", "states": [ticket, "The app crashes on start."],
                       "questions": asked["questions"]});
    let answered = post(&server, "/v1/systemone/batch", &batch, Some(KEY)).await;
    assert_eq!(answered.status, 200, "{}", answered.text());
    let results = answered.json()["results"].as_array().cloned().expect("results");
    assert_eq!(results.len(), 2);
    for result in &results {
        let root: Vec<&String> = result.as_object().expect("result").keys().collect();
        assert_eq!(root, ["model", "answers", "usage"]);
    }
}
