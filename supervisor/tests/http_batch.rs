//! `POST /v1/systemone/batch` over real TCP: each state answered as the same single request would
//! be, in order, one job per state, `total_usage`; upstream 0.4.15's refusals with their texts; a
//! refused job failing the whole batch; 404 under 0.3.20; its `/metrics` line; the strict profile;
//! and the in-progress cap (`server.max_concurrent`, upstream's `LAYA_MAX_CONCURRENT`).

mod http_support;

use std::sync::atomic::Ordering;
use std::time::Duration;

use http_support::TestServer;
use laya::output::OutputProfile;
use laya::upstream::Upstream;
use layad::backend::BackendError;
use layad_config::ApiKey;
use layad_system_tests::goldens::fixture_json;
use serde_json::{Value, json};

const JSON: (&str, &str) = ("content-type", "application/json");

/// Golden 0.4.15 request bodies that upstream answered 200, with their recorded answers.
fn golden_bodies() -> Vec<(Value, String)> {
    let golden = fixture_json("goldens-0.4.15/cases.json");
    golden["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .filter(|c| c["status"] == 200)
        .filter_map(|c| {
            let body: Value = serde_json::from_str(c["body"].as_str()?).ok()?;
            let plain = body.as_object()?.keys().all(|k| k == "state" || k == "questions");
            (plain && body["questions"].as_object().is_some_and(|q| !q.is_empty()))
                .then(|| (body, c["response"].as_str().unwrap_or_default().to_owned()))
        })
        .collect()
}

fn bytes(value: &Value) -> Vec<u8> {
    serde_json::to_vec(value).expect("json")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_state_is_answered_as_its_single_request_in_order_one_job_each() {
    let server = TestServer::start(|_| {}).await;
    let goldens = golden_bodies();
    assert!(goldens.len() >= 8, "{} golden bodies", goldens.len());
    let (first, recorded) = &goldens[0];
    let questions = first["questions"].clone();
    // The first state is the golden's own (its answer is upstream's recorded one); the others are
    // other goldens' states in several shapes, asked the same questions.
    let states: Vec<Value> = goldens.iter().take(8).map(|(b, _)| b["state"].clone()).collect();
    let batch = json!({"states": states, "questions": questions});
    let response = server.post("/v1/systemone/batch", &[JSON], &bytes(&batch)).await;
    assert_eq!(response.status, 200, "{}", response.text());
    assert_eq!(response.header("content-type"), Some("application/json"));
    assert!(response.header("x-inference-time-ms").is_some());
    assert_eq!(
        server.backend.jobs.load(Ordering::SeqCst),
        states.len(),
        "one job per state"
    );
    let body = response.json();
    let keys: Vec<&String> = body.as_object().expect("object").keys().collect();
    assert_eq!(keys, ["results", "total_usage"]);
    let results = body["results"].as_array().expect("results");
    assert_eq!(results.len(), states.len());
    let mut input_tokens = 0;
    for (i, state) in states.iter().enumerate() {
        let single = json!({"state": state, "questions": questions});
        let alone = server.post("/v1/systemone", &[JSON], &bytes(&single)).await;
        assert_eq!(alone.status, 200, "{}", alone.text());
        assert_eq!(results[i], alone.json(), "state {i}");
        input_tokens += results[i]["usage"]["input_tokens"].as_u64().expect("input_tokens");
    }
    assert_eq!(results[0], serde_json::from_str::<Value>(recorded).expect("recorded"));
    assert_eq!(
        body["total_usage"],
        json!({"input_tokens": input_tokens, "output_tokens": 0})
    );
    // The text is Starlette's compact JSON, results in order.
    let text = response.text();
    assert!(
        text.starts_with("{\"results\":[{\"model\":\"laya-rl-agent\",\"answers\":"),
        "{text}"
    );

    let metrics = server.get("/metrics", &[]).await.text();
    assert!(
        metrics.contains("layad_batch_requests_total{status=\"200\"} 1"),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_questions_and_controls_apply_to_every_state() {
    let server = TestServer::start(|_| {}).await;
    let batch = json!({"states": ["one", {"k": "two"}], "questions": {}});
    let response = server.post("/v1/systemone/batch", &[JSON], &bytes(&batch)).await;
    assert_eq!(response.status, 200, "{}", response.text());
    let body = response.json();
    for result in body["results"].as_array().expect("results") {
        assert_eq!(result["answers"], json!({}));
        assert_eq!(result["usage"], json!({"input_tokens": 0, "output_tokens": 0}));
        assert!(result["routing"].is_object(), "{result}");
    }
    assert_eq!(server.backend.jobs.load(Ordering::SeqCst), 0, "nothing to run");

    let (first, _) = &golden_bodies()[0];
    let batch = json!({"states": ["a", "b", "c"], "questions": first["questions"], "min_confidence": 0.99,
                       "batch_size": 2, "sort_by_length": true, "model": "english"});
    let response = server.post("/v1/systemone/batch", &[JSON], &bytes(&batch)).await;
    assert_eq!(response.status, 200, "{}", response.text());
    for result in response.json()["results"].as_array().expect("results") {
        assert_eq!(result["routing"]["model"], "english", "{result}");
        for answer in result["answers"].as_object().expect("answers").values() {
            assert!(answer.get("abstention").is_some(), "{answer}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_batches_get_upstreams_status_and_detail() {
    let server = TestServer::start(|_| {}).await;
    let q = json!({"q": {"type": "noul", "instructions": "Is it?"}});
    let many: Vec<&str> = vec!["s"; 65];
    let cases: Vec<(Vec<u8>, u16, &str)> = vec![
        (b"{".to_vec(), 400, "request body must be valid JSON"),
        (
            bytes(&json!({"state": "a", "questions": q})),
            400,
            "request body must be an object with 'states' and 'questions' fields",
        ),
        (
            bytes(&json!({"states": [], "questions": q})),
            400,
            "'states' must be a non-empty list",
        ),
        (
            bytes(&json!({"states": many, "questions": q})),
            413,
            "too many states in batch (65 > 64)",
        ),
        (
            bytes(&json!({"states": ["a", null], "questions": q})),
            400,
            "'state' is required",
        ),
        (
            bytes(&json!({"states": ["a"], "questions": q, "diagnostics": {}})),
            422,
            "diagnostics is filled in place for an in-process caller and cannot be returned over HTTP; \
             read the per-group report from the CLI or a local Router",
        ),
        (
            bytes(&json!({"states": ["a"], "questions": q, "batch_size": 0})),
            422,
            "batch_size must be a positive integer, got 0",
        ),
        (
            bytes(&json!({"states": ["a"], "questions": q, "sort_by_length": "yes"})),
            422,
            "sort_by_length must be a boolean",
        ),
        (
            bytes(&json!({"states": ["a"], "questions": {"q": {"type": "noul"}}})),
            422,
            "question 'q': no 'instructions'; add the text the model should answer",
        ),
    ];
    for (body, status, detail) in cases {
        let response = server.post("/v1/systemone/batch", &[JSON], &body).await;
        assert_eq!(
            (response.status, response.detail()),
            (status, detail.to_owned()),
            "{}",
            String::from_utf8_lossy(&body)
        );
    }
    assert_eq!(server.backend.jobs.load(Ordering::SeqCst), 0);
    // A task no checkpoint has is refused by routing, before any question is checked.
    let response = server
        .post(
            "/v1/systemone/batch",
            &[JSON],
            &bytes(&json!({"states": ["a"], "questions": {"q": {"type": "noul"}}, "task": "chess"})),
        )
        .await;
    assert_eq!(response.status, 422);
    assert!(
        response.detail().starts_with("unknown model 'chess'"),
        "{}",
        response.detail()
    );
    assert_eq!(server.get("/v1/systemone/batch", &[]).await.status, 405);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_refused_job_fails_the_batch_and_the_key_is_required() {
    let server = TestServer::start(|c| c.api_key = Some(ApiKey::new("secret"))).await;
    let (first, _) = &golden_bodies()[0];
    let batch = bytes(&json!({"states": ["a", "b"], "questions": first["questions"]}));
    let unauthorized = server.post("/v1/systemone/batch", &[JSON], &batch).await;
    assert_eq!(unauthorized.status, 401);
    let auth = ("authorization", "Bearer secret");
    *server.backend.fail_with.lock().expect("lock") = Some(BackendError::Overloaded {
        retry_after: Duration::from_secs(2),
    });
    let busy = server.post("/v1/systemone/batch", &[JSON, auth], &batch).await;
    assert_eq!(
        (busy.status, busy.detail().as_str()),
        (503, "server busy, try again later")
    );
    assert_eq!(busy.header("retry-after"), Some("2"));
    let metrics = server.get("/metrics", &[]).await.text();
    assert!(
        metrics.contains("layad_batch_requests_total{status=\"503\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("layad_batch_requests_total{status=\"401\"} 1"),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_batch_route_is_unknown_under_0_3_20() {
    let server = TestServer::start(|c| c.compat.upstream = Upstream::V0_3_20).await;
    let batch = bytes(&json!({"states": ["a"], "questions": {}}));
    let response = server.post("/v1/systemone/batch", &[JSON], &batch).await;
    assert_eq!((response.status, response.detail().as_str()), (404, "Not Found"));
    assert_eq!(server.get("/v1/systemone/batch", &[]).await.status, 404);
    assert_eq!(server.backend.jobs.load(Ordering::SeqCst), 0);
    // Under 0.4.15 the trailing-slash form redirects like the other routes.
    let current = TestServer::start(|_| {}).await;
    let redirect = current.post("/v1/systemone/batch/", &[JSON], &batch).await;
    assert_eq!(redirect.status, 307);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_strict_profile_projects_single_and_batch_answers() {
    let server = TestServer::start(|c| {
        c.compat.output = OutputProfile::JevStrict;
        c.server.diagnostics = true;
    })
    .await;
    let (first, _) = &golden_bodies()[0];
    let single = server.post("/v1/systemone", &[JSON], &bytes(first)).await;
    assert_eq!(single.status, 200, "{}", single.text());
    let body = single.json();
    let keys: Vec<&String> = body.as_object().expect("object").keys().collect();
    assert_eq!(keys, ["model", "answers", "usage"], "no routing, no x_layad: {body}");
    assert_eq!(
        body["usage"].as_object().expect("usage").keys().collect::<Vec<_>>(),
        ["input_tokens", "output_tokens"]
    );
    for answer in body["answers"].as_object().expect("answers").values() {
        let keys: Vec<&str> = answer.as_object().expect("answer").keys().map(String::as_str).collect();
        let want: &[&str] = match answer["type"].as_str() {
            Some("choice") => &["type", "choice", "confidence", "probabilities"],
            Some("score") => &["type", "score", "confidence", "probabilities", "legend"],
            _ => &["type", "noul"],
        };
        assert_eq!(keys, want, "{answer}");
    }
    let batch = json!({"states": [first["state"], "other"], "questions": first["questions"]});
    let response = server.post("/v1/systemone/batch", &[JSON], &bytes(&batch)).await;
    assert_eq!(response.status, 200, "{}", response.text());
    let results = response.json()["results"].clone();
    assert_eq!(results[0], body, "the batch's first result is the single answer");
    assert!(results[1].get("routing").is_none() && results[1].get("x_layad").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_past_the_in_progress_cap_get_503_at_once() {
    let server = TestServer::start(|c| c.server.max_concurrent = Some(1)).await;
    *server.backend.delay.lock().expect("lock") = Duration::from_millis(600);
    let (first, _) = &golden_bodies()[0];
    let body = bytes(first);
    let slow = server.post("/v1/systemone", &[JSON], &body);
    let refused = async {
        tokio::time::sleep(Duration::from_millis(150)).await;
        server
            .post(
                "/v1/systemone/batch",
                &[JSON],
                &bytes(&json!({"states": ["a"], "questions": {}})),
            )
            .await
    };
    let (slow, refused) = tokio::join!(slow, refused);
    assert_eq!(slow.status, 200, "{}", slow.text());
    assert_eq!(
        (refused.status, refused.detail().as_str()),
        (503, "server busy, try again later")
    );
    assert_eq!(refused.header("retry-after"), Some("1"));
    // The place is given back with the answer.
    assert_eq!(server.post("/v1/systemone", &[JSON], &body).await.status, 200);
}
