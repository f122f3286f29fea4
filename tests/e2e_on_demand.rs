//! Checkpoints served on demand, and refusals that say they are permanent, with real workers:
//! under `LAYA_MODELS=english` and nothing else, a German state (which upstream routes to
//! `multilingual` and loads it for) is answered 200 with upstream's answer by a pool that started
//! unloaded and was loaded by that request; a checkpoint the configuration turns "off" is refused
//! with 501 and no `Retry-After`; and a pool that asks for CUDA with `require_device = true` on this
//! machine (no CUDA) refuses to start, `/health` turns `degraded` naming the pool and the reason, and
//! a request only that pool could answer is refused at once with 501, no `Retry-After`.

use std::time::{Duration, Instant};

use laya::upstream::Upstream;
use layad_system_tests::goldens::goldens;
use layad_system_tests::{Server, get, json_differences, post_json};
use serde_json::Value;

const ONE_POOL: &str = r#"
[server]
request_timeout = "60s"
diagnostics = false   # answers compared with upstream's

[[pool]]
name = "cpu"
device = "cpu"
threads = 1
"#;

/// A golden case of upstream 0.4.15: its body and its response.
fn golden(name: &str) -> (String, Value) {
    let cases = goldens(Upstream::V0_4_15, "cases.json");
    let case = cases["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no golden case {name}"))
        .clone();
    let response = serde_json::from_str(case["response"].as_str().expect("response")).expect("json");
    (case["body"].as_str().expect("body").to_owned(), response)
}

async fn health(server: &Server) -> Value {
    get(server.addr, "/health").await.expect("health").json()
}

/// The pool named `name` in `/health`.
fn pool<'a>(health: &'a Value, name: &str) -> &'a Value {
    health["pools"]
        .as_array()
        .expect("pools")
        .iter()
        .find(|p| p["name"] == name)
        .unwrap_or_else(|| panic!("no pool {name}: {health}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_laya_models_leaves_out_is_loaded_by_its_first_request_as_upstream_does() {
    let mut server = Server::start(ONE_POOL, &[("LAYA_MODELS", "english")]);
    // Ready once english is: the others are served on demand.
    server.wait_ready(Duration::from_secs(180)).await;
    let before = health(&server).await;
    assert_eq!(before["status"], "ok", "{before}");
    assert_eq!(pool(&before, "cpu")["workers"][0]["state"], "ready", "{before}");
    for lazy in ["cpu-multilingual", "cpu-typed-decisions"] {
        let worker = &pool(&before, lazy)["workers"][0];
        assert_eq!(
            (worker["state"].as_str(), worker["pid"].is_null()),
            (Some("unloaded"), true),
            "{before}"
        );
    }
    assert_eq!(before["checkpoints"]["multilingual"]["servable"], true, "{before}");

    // Upstream 0.4.15 routes this German state to multilingual; its answer is the golden one.
    let (body, upstream) = golden("multilingual_german");
    let started = Instant::now();
    let response = post_json(server.addr, "/v1/systemone", body.as_bytes())
        .await
        .expect("answer");
    let waited = started.elapsed();
    assert_eq!(response.status, 200, "{}\n{}", response.text(), server.log());
    let answer = response.json();
    assert_eq!(answer["routing"]["model"], "multilingual", "{answer}");
    let differences = json_differences(&answer, &upstream);
    assert!(
        differences.is_empty(),
        "{differences:?}\nours: {answer}\nupstream: {upstream}"
    );

    let after = health(&server).await;
    let worker = &pool(&after, "cpu-multilingual")["workers"][0];
    assert_eq!(worker["state"], "ready", "{after}");
    let reload_ms = worker["last_reload_ms"].as_f64().expect("last_reload_ms");
    assert!(
        reload_ms > 0.0 && waited.as_secs_f64() * 1e3 >= reload_ms * 0.5,
        "the first request waited {waited:?} for a load of {reload_ms} ms"
    );
    // The one not asked for stays unloaded.
    assert_eq!(
        pool(&after, "cpu-typed-decisions")["workers"][0]["state"],
        "unloaded",
        "{after}"
    );
    let log = server.log();
    assert!(
        log.contains("LAYA_MODELS=english: english load at start; multilingual (pool cpu-multilingual)"),
        "{log}"
    );
    assert_eq!(
        server.terminate(Duration::from_secs(30)).code(),
        Some(0),
        "{}",
        server.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_turned_off_is_refused_for_good_without_retry_after() {
    let config = format!("{ONE_POOL}\n[checkpoints]\ntyped-decisions = \"off\"\n");
    let mut server = Server::start(&config, &[]);
    server.wait_ready(Duration::from_secs(180)).await;
    let body = br#"{"state": "x", "model": "typed", "questions": {"q": {"type": "noul", "instructions": "ok?"}}}"#;
    let response = post_json(server.addr, "/v1/systemone", body).await.expect("answer");
    assert_eq!(response.status, 501, "{}", response.text());
    assert_eq!(response.header("retry-after"), None);
    let detail = response.json()["detail"].as_str().unwrap_or_default().to_owned();
    assert!(
        detail.starts_with("checkpoint 'typed-decisions' is turned off in this server's configuration")
            && detail.ends_with("(retrying will not help)"),
        "{detail}"
    );
    assert_eq!(
        server.terminate(Duration::from_secs(30)).code(),
        Some(0),
        "{}",
        server.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn require_device_refuses_the_cpu_fallback_and_health_names_the_pool_and_reason() {
    let config = r#"
[server]
request_timeout = "60s"

[[pool]]
name = "cpu"
device = "cpu"
threads = 1
checkpoints = ["english", "multilingual"]

[[pool]]
name = "cuda"
device = "cuda"
require_device = true
threads = 1
checkpoints = ["typed-decisions"]

[workers]
restart_backoff_initial = "100ms"
"#;
    let mut server = Server::start(config, &[]);
    let start = Instant::now();
    let degraded = loop {
        if let Ok(response) = get(server.addr, "/health").await {
            let health = response.json();
            let cpu_ready = pool(&health, "cpu")["workers"][0]["state"] == "ready";
            if cpu_ready && pool(&health, "cuda")["unavailable"].is_string() {
                break health;
            }
        }
        assert!(
            start.elapsed() < Duration::from_secs(180),
            "no outcome:\n{}",
            server.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // Long enough for restarts at 100 ms backoff, had there been any.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let health = health(&server).await;
    assert_eq!(health["status"], "degraded", "{health}");
    let cuda = pool(&health, "cuda");
    let reason = cuda["unavailable"].as_str().unwrap_or_default();
    assert!(reason.contains("--require-device: cuda:0 unavailable ("), "{degraded}");
    let worker = &cuda["workers"][0];
    assert_eq!(
        (worker["state"].as_str(), worker["restarts"].as_u64()),
        (Some("failed"), Some(0)),
        "{health}"
    );
    // The CPU pool serves on; a request only the refused pool could answer is refused at once.
    let english = br#"{"state": "Please refund invoice 4411.", "model": "english", "questions": {"q": {"type": "noul", "instructions": "refund?"}}}"#;
    let answered = post_json(server.addr, "/v1/systemone", english).await.expect("answer");
    assert_eq!(answered.status, 200, "{}", answered.text());
    let typed = br#"{"state": "x", "model": "typed", "questions": {"q": {"type": "noul", "instructions": "ok?"}}}"#;
    let started = Instant::now();
    let refused = post_json(server.addr, "/v1/systemone", typed).await.expect("answer");
    assert_eq!(refused.status, 501, "{}", refused.text());
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "refused only after {:?}",
        started.elapsed()
    );
    assert_eq!(refused.header("retry-after"), None);
    let detail = refused.json()["detail"].as_str().unwrap_or_default().to_owned();
    assert!(
        detail.starts_with(
            "checkpoint 'typed-decisions' cannot be served by this server as configured: pool 'cuda' is unavailable ("
        ) && detail.contains("--require-device"),
        "{detail}"
    );
    assert_eq!(
        server.terminate(Duration::from_secs(30)).code(),
        Some(0),
        "{}",
        server.log()
    );
}
