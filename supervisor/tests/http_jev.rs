//! The `jev` output profile (`[compat] output = "jev"`) over real TCP, each difference from the
//! default profile against the same request: Jev's error shapes (FastAPI's 422 list for a body that
//! fails validation, `{"detail": {"error_type", "message"}}` for everything else, `Retry-After`
//! kept), Jev's model ids routed automatically and other unknown names refused, an empty
//! `questions` refused, questions without `instructions` answered, Jev's `confidence`, the strict
//! keys, and choices of up to 255 options (groups of 16 when no group is configured).
//!
//! The golden backend answers rows it has no recording for with equal logits, so every choice is
//! uniform: Jev's confidence of a uniform choice is 0, Laya's entropy confidence too, so the
//! confidence test uses a recorded golden answer whose probabilities are not uniform.

mod http_support;

use std::sync::atomic::Ordering;
use std::time::Duration;

use http_support::TestServer;
use laya::jev::jev_confidence;
use laya::output::OutputProfile;
use layad::backend::BackendError;
use layad_config::ApiKey;
use layad_system_tests::goldens::fixture_json;
use serde_json::{Value, json};

const JSON: (&str, &str) = ("content-type", "application/json");

fn bytes(value: &Value) -> Vec<u8> {
    serde_json::to_vec(value).expect("json")
}

async fn jev() -> TestServer {
    TestServer::start(|c| c.compat.output = OutputProfile::Jev).await
}

fn noul(model: Option<&str>) -> Value {
    let mut body = json!({
        "state": "I was charged twice for invoice 4411, please refund it today.",
        "questions": {"refund": {"type": "noul", "instructions": "Does the customer want money back?"}},
    });
    if let Some(model) = model {
        body["model"] = json!(model);
    }
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn validation_failures_are_fastapis_422_list_in_jev_and_upstreams_text_by_default() {
    let jev = jev().await;
    let laya = TestServer::start(|_| {}).await;
    let cases: [(&[u8], u16, Value, &str); 4] = [
        (
            b"{\"state\": \"x\", \"questions\": {",
            400,
            json!(["body"]),
            "json_invalid",
        ),
        (
            br#"{"questions": {"q": {"type": "noul", "instructions": "x"}}}"#,
            400,
            json!(["body", "state"]),
            "missing",
        ),
        (br#"{"state": "x"}"#, 400, json!(["body", "questions"]), "missing"),
        (
            br#"{"state": "x", "questions": {"q": {"type": "boolean", "instructions": "x"}}}"#,
            422,
            json!(["body", "questions"]),
            "value_error",
        ),
    ];
    for (body, laya_status, loc, kind) in cases {
        let upstream = laya.post("/v1/systemone", &[JSON], body).await;
        assert_eq!(upstream.status, laya_status, "{}", upstream.text());
        let detail = upstream.json()["detail"].clone();
        assert!(detail.is_string(), "{detail}");
        let answered = jev.post("/v1/systemone", &[JSON], body).await;
        assert_eq!(answered.status, 422, "{}", answered.text());
        assert_eq!(answered.header("content-type"), Some("application/json"));
        assert_eq!(
            answered.json(),
            json!({"detail": [{"loc": loc, "msg": detail, "type": kind}]}),
            "the same text, in Jev's shape"
        );
        assert!(answered.header("x-typesafe-request-id").is_some());
    }
    assert_eq!(jev.backend.jobs.load(Ordering::SeqCst), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_refusals_carry_error_type_and_message_and_keep_retry_after() {
    let server = TestServer::start(|c| {
        c.compat.output = OutputProfile::Jev;
        c.api_key = Some(ApiKey::new("secret"));
    })
    .await;
    let missing = server.post("/v1/systemone", &[JSON], &bytes(&noul(None))).await;
    assert_eq!(
        (missing.status, missing.json()),
        (
            401,
            json!({"detail": {"error_type": "authentication_error", "message": "invalid or missing bearer token"}})
        )
    );
    let wrong = server
        .post(
            "/v1/systemone",
            &[JSON, ("authorization", "Bearer nope")],
            &bytes(&noul(None)),
        )
        .await;
    assert_eq!(wrong.json()["detail"]["error_type"], json!("authentication_error"));
    let auth = ("authorization", "Bearer secret");
    let not_found = server.get("/v1/nothing", &[auth]).await;
    assert_eq!(
        (not_found.status, not_found.json()),
        (
            404,
            json!({"detail": {"error_type": "not_found", "message": "Not Found"}})
        )
    );
    let many: serde_json::Map<String, Value> = (0..65)
        .map(|i| (format!("q{i}"), json!({"type": "noul", "instructions": "x"})))
        .collect();
    let large = server
        .post(
            "/v1/systemone",
            &[JSON, auth],
            &bytes(&json!({"state": "x", "questions": many})),
        )
        .await;
    assert_eq!(
        (large.status, large.json()),
        (
            413,
            json!({"detail": {"error_type": "request_too_large", "message": "too many questions (65 > 64)"}})
        )
    );
    *server.backend.fail_with.lock().expect("lock") = Some(BackendError::Overloaded {
        retry_after: Duration::from_secs(2),
    });
    let busy = server.post("/v1/systemone", &[JSON, auth], &bytes(&noul(None))).await;
    assert_eq!(
        (busy.status, busy.json()),
        (
            503,
            json!({"detail": {"error_type": "overloaded_error", "message": "server busy, try again later"}})
        )
    );
    assert_eq!(busy.header("retry-after"), Some("2"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jev_model_ids_let_the_router_choose_and_unknown_names_are_refused() {
    let jev = jev().await;
    let laya = TestServer::start(|_| {}).await;
    for id in ["jev-latest", "typesafe/jev-1.13", "~typesafe/jev-latest"] {
        let answered = jev.post("/v1/systemone", &[JSON], &bytes(&noul(Some(id)))).await;
        assert_eq!(answered.status, 200, "{id}: {}", answered.text());
        assert_eq!(answered.json()["model"], json!("laya-rl-agent"));
    }
    // The default profile keeps upstream 0.4.15's answers: a path-like name is a Hub repo it
    // cannot load (422), a plain unknown name routes automatically.
    let upstream = laya
        .post("/v1/systemone", &[JSON], &bytes(&noul(Some("typesafe/jev-1.13"))))
        .await;
    assert_eq!(upstream.status, 422, "{}", upstream.text());
    assert!(
        upstream.json()["detail"]
            .as_str()
            .is_some_and(|d| d.contains("omit model"))
    );
    let plain = laya
        .post("/v1/systemone", &[JSON], &bytes(&noul(Some("no-such-model"))))
        .await;
    assert_eq!(plain.status, 200);
    let refused = jev
        .post("/v1/systemone", &[JSON], &bytes(&noul(Some("no-such-model"))))
        .await;
    assert_eq!(refused.status, 400, "{}", refused.text());
    let detail = &refused.json()["detail"];
    assert_eq!(detail["error_type"], json!("api_usage_error"));
    assert!(
        detail["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("unknown model 'no-such-model'; choose one of ['english'")),
        "{detail}"
    );
    let named = jev.post("/v1/systemone", &[JSON], &bytes(&noul(Some("english")))).await;
    assert_eq!(named.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_request_is_refused_and_questions_need_no_instructions() {
    let jev = jev().await;
    let laya = TestServer::start(|_| {}).await;
    let empty = bytes(&json!({"state": "x", "questions": {}}));
    assert_eq!(laya.post("/v1/systemone", &[JSON], &empty).await.status, 200);
    let refused = jev.post("/v1/systemone", &[JSON], &empty).await;
    assert_eq!(refused.status, 422);
    assert_eq!(refused.json()["detail"][0]["loc"], json!(["body", "questions"]));
    assert_eq!(refused.json()["detail"][0]["type"], json!("too_short"));
    let batch = jev
        .post(
            "/v1/systemone/batch",
            &[JSON],
            &bytes(&json!({"states": ["x"], "questions": {}})),
        )
        .await;
    assert_eq!(batch.status, 422, "{}", batch.text());

    let bare = bytes(&json!({"state": "The customer threatens a chargeback.", "questions": {
        "threat": {"type": "noul", "criteria": {"true": "The customer threatens a chargeback", "false": "No threat"}},
        "team": {"type": "choice", "instructions": null, "criteria": {"Billing": null, "Technical": null}},
    }}));
    let upstream = laya.post("/v1/systemone", &[JSON], &bare).await;
    assert_eq!(upstream.status, 422);
    let answered = jev.post("/v1/systemone", &[JSON], &bare).await;
    assert_eq!(answered.status, 200, "{}", answered.text());
    let answers = &answered.json()["answers"];
    assert_eq!(answers["threat"]["type"], json!("noul"));
    assert_eq!(answers["team"]["type"], json!("choice"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_keep_jevs_keys_with_jevs_confidence() {
    let jev = jev().await;
    let laya = TestServer::start(|_| {}).await;
    // A recorded 0.4.15 exchange (state and questions only) whose choice is not uniform.
    let exchanges = fixture_json("goldens-0.4.15/cases.json");
    let body = exchanges["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .filter(|c| c["status"] == 200)
        .find_map(|c| {
            let body: Value = serde_json::from_str(c["body"].as_str()?).ok()?;
            let response: Value = serde_json::from_str(c["response"].as_str()?).ok()?;
            let plain = body.as_object()?.keys().all(|k| k == "state" || k == "questions");
            let spread = response["answers"]
                .as_object()?
                .values()
                .any(|a| a["type"] == "choice" && a["x_jev_confidence"].as_f64().is_some_and(|c| c > 0.05 && c < 0.95));
            (plain && spread).then_some(body)
        })
        .expect("a golden choice with a spread");
    let body = bytes(&body);
    let upstream = laya.post("/v1/systemone", &[JSON], &body).await.json();
    let answered = jev.post("/v1/systemone", &[JSON], &body).await;
    assert_eq!(answered.status, 200, "{}", answered.text());
    let answered = answered.json();
    let root: Vec<&String> = answered.as_object().expect("root").keys().collect();
    assert_eq!(root, ["model", "answers", "usage"]);
    let mut compared = 0;
    for (qid, answer) in answered["answers"].as_object().expect("answers") {
        let laya_answer = &upstream["answers"][qid];
        if answer["type"] == "noul" {
            let (p, r) = (
                answer["noul"].as_f64().expect("noul"),
                laya_answer["noul"].as_f64().expect("noul"),
            );
            assert!((p - r).abs() <= 5.1e-5, "{qid}: {p} vs upstream's {r}");
            continue;
        }
        // Unrounded, summing to one as Jev's do; each within rounding of upstream's 4 decimals.
        let exact = answer["probabilities"].as_object().expect("probabilities");
        let rounded = laya_answer["probabilities"].as_object().expect("probabilities");
        assert_eq!(
            exact.keys().collect::<Vec<_>>(),
            rounded.keys().collect::<Vec<_>>(),
            "{qid}"
        );
        let sum: f64 = exact.values().map(|p| p.as_f64().expect("a number")).sum();
        assert!((sum - 1.0).abs() < 1e-12, "{qid}: sums to {sum}");
        for (label, p) in exact {
            let (p, r) = (
                p.as_f64().expect("a number"),
                rounded[label].as_f64().expect("a number"),
            );
            assert!((p - r).abs() <= 5.1e-5, "{qid}/{label}: {p} vs upstream's {r}");
        }
        let expected = jev_confidence(answer.as_object().expect("answer")).expect("confidence");
        let confidence = answer["confidence"].as_f64().expect("a number");
        assert_eq!(
            confidence, expected,
            "{qid}: Jev's formula over the answer's own probabilities"
        );
        // Upstream's x_jev_confidence is the same formula over its rounded probabilities.
        let upstream_jev = laya_answer["x_jev_confidence"].as_f64().expect("x_jev_confidence");
        assert!(
            (confidence - upstream_jev).abs() < 1e-3,
            "{qid}: {confidence} vs {upstream_jev}"
        );
        compared += 1;
    }
    assert!(compared > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_choice_of_255_options_is_answered_in_groups_of_16_without_a_configured_group() {
    let jev = jev().await;
    let labels: Vec<String> = (0..255).map(|i| format!("queue {i}")).collect();
    let wide = bytes(&json!({"state": "x", "model": "jev-latest", "questions": {
        "queue": {"type": "choice", "instructions": "Which queue?", "criteria": labels},
    }}));
    let answered = jev.post("/v1/systemone", &[JSON], &wide).await;
    assert_eq!(answered.status, 200, "{}", answered.text());
    let answer = &answered.json()["answers"]["queue"];
    assert_eq!(answer["probabilities"].as_object().map(|p| p.len()), Some(255));
    let keys: Vec<&String> = answer.as_object().expect("answer").keys().collect();
    assert_eq!(keys, ["type", "choice", "confidence", "probabilities"]);
    // 255 options in groups of 16: one round of 16 groups, then the final call.
    assert_eq!(jev.backend.jobs.load(Ordering::SeqCst), 2);
    let laya = TestServer::start(|_| {}).await;
    assert_eq!(laya.post("/v1/systemone", &[JSON], &wide).await.status, 413);
}
