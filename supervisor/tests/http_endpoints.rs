//! What layad adds to upstream's contract, over real TCP: compressed bodies, size and time limits
//! while streaming, the Host check, request ids and Server-Timing, /v1/models, /health, /readyz,
//! /metrics, backend failures, and graceful shutdown.

mod http_support;

use std::io::Write;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use http_support::{Framing, Request, TestServer, send};
use laya::routing::CheckpointName;
use laya::upstream::Upstream;
use layad::backend::BackendError;
use layad_config::ApiKey;
use layad_system_tests::goldens::fixture_json;
use serde_json::Value;

const JSON: (&str, &str) = ("content-type", "application/json");

/// A golden request of at least 1 KiB (the size from which Jev SDKs compress) and its answer.
fn large_golden_case() -> (Vec<u8>, String) {
    let golden = fixture_json("goldens-0.4.15/cases.json");
    let case = golden["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .find(|c| {
            c["status"] == 200
                && c["body"].as_str().is_some_and(|b| b.len() >= 1024)
                && c["rows"].as_array().is_some_and(|r| r.len() > 1)
        })
        .expect("a large multi-question golden case");
    (
        case["body"].as_str().expect("body").as_bytes().to_vec(),
        case["response"].as_str().expect("response").to_owned(),
    )
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    encoder.write_all(data).expect("gzip");
    encoder.finish().expect("gzip")
}

fn zlib(data: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
    encoder.write_all(data).expect("zlib");
    encoder.finish().expect("zlib")
}

fn zstd(data: &[u8]) -> Vec<u8> {
    ruzstd::encoding::compress_to_vec(data, ruzstd::encoding::CompressionLevel::Fastest)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compressed_bodies_are_answered_like_the_plain_one() {
    let server = TestServer::start(|_| {}).await;
    let (body, upstream) = large_golden_case();
    let plain = server.post("/v1/systemone", &[JSON], &body).await;
    assert_eq!(plain.status, 200, "{}", plain.text());
    assert_eq!(plain.text(), upstream);
    for (encoding, wire) in [
        ("zstd", zstd(&body)),
        ("gzip", gzip(&body)),
        ("deflate", zlib(&body)),
        ("identity", body.clone()),
    ] {
        assert!(
            encoding == "identity" || wire.len() < body.len(),
            "{encoding} must compress"
        );
        let response = server
            .post("/v1/systemone", &[JSON, ("content-encoding", encoding)], &wire)
            .await;
        assert_eq!(response.status, 200, "{encoding}: {}", response.text());
        assert_eq!(response.text(), plain.text(), "{encoding}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decompression_bombs_are_refused_with_413_and_the_server_keeps_serving() {
    let server = TestServer::start(|_| {}).await;
    // 64 MiB of JSON whitespace inside a valid object: small on the wire, far over 2 MiB decoded.
    let mut inflated = b"{\"questions\": {}, \"state\": \"x\"".to_vec();
    inflated.resize(64 * 1024 * 1024, b' ');
    inflated.push(b'}');
    for (encoding, wire) in [("gzip", gzip(&inflated)), ("zstd", zstd(&inflated))] {
        assert!(wire.len() < 1024 * 1024, "{encoding} bomb is {} bytes", wire.len());
        let started = Instant::now();
        let response = server
            .post("/v1/systemone", &[JSON, ("content-encoding", encoding)], &wire)
            .await;
        assert_eq!(
            (response.status, response.detail().as_str()),
            (413, "request body too large"),
            "{encoding}"
        );
        println!(
            "{encoding} bomb: {} bytes on the wire, refused in {:?}",
            wire.len(),
            started.elapsed()
        );
    }
    // Decoded size exactly at the cap is fine.
    let mut at_cap = b"{\"state\": \"x\", \"questions\": {}}".to_vec();
    at_cap.resize(2 * 1024 * 1024, b' ');
    let response = server
        .post("/v1/systemone", &[JSON, ("content-encoding", "gzip")], &gzip(&at_cap))
        .await;
    assert_eq!(response.status, 200, "{}", response.text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_or_corrupt_encodings_are_client_errors() {
    let server = TestServer::start(|_| {}).await;
    let body = br#"{"questions": {}}"#;
    let response = server
        .post("/v1/systemone", &[JSON, ("content-encoding", "br")], body)
        .await;
    assert_eq!(response.status, 415);
    assert!(response.detail().contains("'br'"), "{}", response.detail());
    let response = server
        .post("/v1/systemone", &[JSON, ("content-encoding", "zstd")], body)
        .await;
    assert_eq!(response.status, 400);
    assert!(response.detail().contains("zstd"), "{}", response.detail());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_3_mib_chunked_body_is_refused_before_it_is_all_sent() {
    let server = TestServer::start(|_| {}).await;
    let mut body = b"{\"questions\": {}, \"state\": \"".to_vec();
    body.resize(3 * 1024 * 1024, b'x');
    // The final chunk is never sent: only a server that stops at the cap can answer at all.
    let request = Request::new("POST", "/v1/systemone")
        .headers(&[JSON])
        .body(&body)
        .framing(Framing::ChunkedUnfinished(64 * 1024));
    let response = send(server.addr, &request).await;
    assert_eq!(
        (response.status, response.detail().as_str()),
        (413, "request body too large")
    );
    assert_eq!(server.get("/livez", &[]).await.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_never_finishes_gets_408() {
    let server = TestServer::start(|c| c.server.body_timeout = Duration::from_millis(300)).await;
    let request = Request::new("POST", "/v1/systemone")
        .headers(&[JSON, ("content-length", "100")])
        .body(b"{\"questions\"");
    let started = Instant::now();
    let response = send(server.addr, &request).await;
    assert_eq!(
        (response.status, response.detail().as_str()),
        (408, "request body was not received in time")
    );
    assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_that_never_finish_close_the_connection() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let server = TestServer::start(|c| c.server.body_timeout = Duration::from_millis(300)).await;
    let mut stream = tokio::net::TcpStream::connect(server.addr).await.expect("connects");
    stream
        .write_all(b"GET /livez HTTP/1.1\r\nHost: localhost\r\n")
        .await
        .expect("writes");
    let started = Instant::now();
    let mut rest = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut rest)).await;
    assert!(read.is_ok(), "the server kept a half-sent request open");
    assert!(
        started.elapsed() >= Duration::from_millis(250),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(server.get("/livez", &[]).await.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_that_is_off_gets_501_without_retry_after() {
    let checkpoints = http_support::checkpoints_except(CheckpointName::TypedDecisions);
    let server = TestServer::start_with(checkpoints, |_| {}).await;
    let body = br#"{"state": "x", "model": "typed", "questions": {"q": {"type": "noul", "instructions": "ok?"}}}"#;
    let response = server.post("/v1/systemone", &[JSON], body).await;
    assert_eq!(
        (response.status, response.detail().as_str()),
        (
            501,
            "checkpoint 'typed-decisions' is turned off in this server's configuration; requests routed to it are \
             refused until an operator serves it (retrying will not help)"
        )
    );
    // Permanent: asking again cannot help, so nothing says when to.
    assert_eq!(response.header("retry-after"), None);
    let models = server.get("/v1/models", &[]).await.json();
    let names: Vec<&str> = models["models"]
        .as_array()
        .expect("models")
        .iter()
        .filter_map(|m| m["name"].as_str())
        .collect();
    assert!(
        !names.contains(&"typed-decisions") && !names.contains(&"typed"),
        "{names:?}"
    );
    assert!(names.contains(&"multi"), "{names:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_loopback_host_names_get_421_on_a_loopback_bind() {
    let server = TestServer::start(|c| c.server.allowed_hosts = vec!["layad.test".into()]).await;
    let evil = server.get("/health", &[("host", "evil.example:8642")]).await;
    assert_eq!(evil.status, 421);
    assert!(evil.detail().contains("'evil.example:8642'"), "{}", evil.detail());
    assert!(evil.header("x-request-id").is_some());
    assert_eq!(evil.header("x-typesafe-request-id"), evil.header("x-request-id"));
    let posted = server
        .post(
            "/v1/systemone",
            &[JSON, ("host", "attacker.example")],
            br#"{"questions": {}}"#,
        )
        .await;
    assert_eq!(posted.status, 421);
    for ok in ["localhost", "localhost:1234", "127.0.0.1", "[::1]:80", "layad.test"] {
        assert_eq!(server.get("/livez", &[("host", ok)]).await.status, 200, "{ok}");
    }

    // Bound to every interface, the Host check is off (the operator chose to be reachable).
    let open = TestServer::start(|c| c.server.listen = "0.0.0.0:0".parse().expect("addr")).await;
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], open.addr.port()));
    let response = send(
        addr,
        &Request::new("GET", "/livez").headers(&[("host", "evil.example")]),
    )
    .await;
    assert_eq!(response.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_ids_are_echoed_or_generated_and_timing_is_reported() {
    let server = TestServer::start(|_| {}).await;
    let (body, _) = large_golden_case();
    let response = server
        .post("/v1/systemone", &[JSON, ("x-request-id", "client-42")], &body)
        .await;
    assert_eq!(response.status, 200);
    assert_eq!(response.header("x-request-id"), Some("client-42"));
    // The Jev API's name for the same id (jevantic reads it), on every answer.
    assert_eq!(response.header("x-typesafe-request-id"), Some("client-42"));
    let timing = response.header("server-timing").expect("Server-Timing");
    let phases: Vec<&str> = timing.split(", ").map(|p| p.split(';').next().unwrap_or("")).collect();
    // Upstream 0.4.x's own entry first, two decimals, and the same time in X-Inference-Time-Ms.
    assert_eq!(phases, ["inference", "prepare", "queue", "device", "total"], "{timing}");
    let inference = response.header("x-inference-time-ms").expect("X-Inference-Time-Ms");
    assert!(
        timing.starts_with(&format!("inference;dur={inference}, ")),
        "{timing} / {inference}"
    );
    assert_eq!(inference.split_once('.').map(|(_, d)| d.len()), Some(2), "{inference}");
    assert!(
        timing.contains("device;dur=0.700"),
        "the backend's own device time: {timing}"
    );

    let a = server.get("/livez", &[]).await;
    let b = server.get("/livez", &[("x-request-id", "has space")]).await;
    assert_eq!(a.header("x-typesafe-request-id"), a.header("x-request-id"));
    assert_eq!(b.header("x-typesafe-request-id"), b.header("x-request-id"));
    let (a, b) = (
        a.header("x-request-id").expect("id"),
        b.header("x-request-id").expect("id"),
    );
    assert_ne!(a, b);
    assert!(b.len() == 24 && b.bytes().all(|c| c.is_ascii_hexdigit()), "{b}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn models_are_listed_in_the_jev_shape_behind_the_key() {
    let server = TestServer::start(|c| c.api_key = Some(ApiKey::new("secret"))).await;
    assert_eq!(server.get("/v1/models", &[]).await.status, 401);
    let response = server.get("/v1/models", &[("authorization", "Bearer secret")]).await;
    assert_eq!(response.status, 200);
    let body = response.json();
    let models = body["models"].as_array().expect("models");
    for model in models {
        let keys: Vec<&String> = model.as_object().expect("object").keys().collect();
        assert_eq!(keys, ["name", "description", "release_date"]);
        assert!(
            model.as_object().expect("object").values().all(Value::is_string),
            "{model}"
        );
    }
    let names: Vec<&str> = models.iter().filter_map(|m| m["name"].as_str()).collect();
    assert_eq!(&names[..3], ["english", "multilingual", "typed-decisions"]);
    for name in &names[3..names.len() - 1] {
        let target = CheckpointName::from_name_or_alias(name).expect("an alias");
        let description = models.iter().find(|m| m["name"] == *name).expect("model")["description"].clone();
        assert_eq!(description, format!("Alias resolving to {}.", target.as_str()));
    }
    assert_eq!(names.last(), Some(&"jev-latest"));
    assert!(
        models[0]["description"]
            .as_str()
            .expect("description")
            .contains("@ 7a1e5eed0f1c")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_waits_for_the_workers_and_health_tells_the_truth() {
    let server = TestServer::start(|c| c.api_key = Some(ApiKey::new("secret"))).await;
    server.backend.ready.store(false, Ordering::SeqCst);
    let not_ready = server.get("/readyz", &[]).await;
    assert_eq!(not_ready.status, 503);
    assert_eq!(
        not_ready.json(),
        serde_json::json!({"status": "not ready", "waiting_for": ["english", "multilingual", "typed-decisions"]})
    );
    let bearer = ("authorization", "Bearer secret");
    let health = server.get("/health", &[bearer]).await.json();
    assert_eq!(health["status"], "starting");
    assert_eq!(health["loaded"], serde_json::json!([]));
    assert_eq!(health["pools"][0]["workers"][0]["state"], "starting");

    server.backend.ready.store(true, Ordering::SeqCst);
    let ready = server.get("/readyz", &[]).await;
    assert_eq!(
        (ready.status, ready.json()),
        (200, serde_json::json!({"status": "ready"}))
    );
    assert_eq!(
        server.get("/livez", &[]).await.json(),
        serde_json::json!({"status": "ok"})
    );

    // Like upstream 0.4.x, a caller without the key learns only that the server is up...
    let response = server.get("/health", &[]).await;
    assert_eq!(response.status, 200, "no key needed");
    assert_eq!(response.json(), serde_json::json!({"status": "ok"}));
    // ...and 0.3.20 told everyone everything.
    let older = TestServer::start(|c| {
        c.api_key = Some(ApiKey::new("secret"));
        c.compat.upstream = Upstream::V0_3_20;
    })
    .await;
    let older = older.get("/health", &[]).await.json();
    assert_eq!(older["pools"][0]["workers"][0]["state"], "ready");
    let health = server.get("/health", &[bearer]).await.json();
    let keys = |v: &Value| v.as_object().expect("object").keys().cloned().collect::<Vec<_>>();
    assert_eq!(
        keys(&health),
        ["status", "version", "pid", "reload", "loaded", "checkpoints", "pools"]
    );
    assert_eq!(health["pid"], std::process::id());
    assert_eq!(health["reload"], Value::Null, "no reload yet");
    assert_eq!(health["status"], "ok");
    assert_eq!(health["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(
        health["loaded"],
        serde_json::json!(["english", "multilingual", "typed-decisions"])
    );
    let english = &health["checkpoints"]["english"];
    assert_eq!(english["revision"], "7a1e5eed0f1c7ee5c0de5eed0f1c7ee5c0de0320");
    assert_eq!(english["sha256"].as_str().map(str::len), Some(64));
    let pool = &health["pools"][0];
    assert_eq!(
        keys(pool),
        [
            "name",
            "worker",
            "device",
            "checkpoints",
            "queue_depth",
            "queue_capacity",
            "in_flight",
            "degraded",
            "unavailable",
            "retiring",
            "takes",
            "backlog_ms",
            "offered_load",
            "routed",
            "batches",
            "queue_wait_ms",
            "speed",
            "workers"
        ]
    );
    assert_eq!(
        pool["speed"],
        serde_json::json!({"factor": 4.0, "slowed": true, "since_unix": 1_800_000_000.0,
                           "why": "the last 2 forwards took 4.1× and 3.9× their normal time", "changes": 1})
    );
    assert_eq!(pool["backlog_ms"], 3.0);
    assert_eq!(pool["offered_load"], 0.93);
    assert_eq!(pool["routed"]["taken_from_others"], 2);
    assert_eq!(
        pool["queue_wait_ms"],
        serde_json::json!({"single-64": {"jobs": 5, "recent": 5, "p50": 1.5, "p99": 12.0, "max": 12.0}})
    );
    assert_eq!(pool["takes"]["max_questions"], 64);
    assert_eq!(
        (pool["queue_depth"].as_u64(), pool["in_flight"].as_u64()),
        (Some(3), Some(1))
    );
    let worker = &pool["workers"][0];
    assert_eq!(
        keys(worker),
        [
            "id",
            "pid",
            "state",
            "device",
            "dtype",
            "cpu_kernels",
            "gpu",
            "device_fallback",
            "checkpoints",
            "restarts",
            "last_exit",
            "last_error",
            "stderr_tail",
            "warmup",
            "parity_gate",
            "unloads",
            "last_reload_ms"
        ]
    );
    assert_eq!(
        (worker["pid"].as_u64(), worker["state"].as_str()),
        (Some(4242), Some("ready"))
    );
    assert_eq!(
        (
            worker["device"].as_str(),
            worker["dtype"].as_str(),
            worker["cpu_kernels"].as_str()
        ),
        (Some("cpu"), Some("f32"), Some("avx2"))
    );
    // The pool asked for `auto`; a worker that fell back from a GPU says why, and a CPU has no GPU facts.
    assert_eq!(worker["gpu"], serde_json::Value::Null);
    assert_eq!(
        worker["device_fallback"],
        "cuda:0 unavailable (no CUDA device); running on cpu"
    );
    assert_eq!(worker["restarts"], 2);
    assert_eq!(worker["last_exit"], "killed by SIGKILL");
    assert_eq!(keys(&worker["checkpoints"][0]), ["name", "revision", "sha256"]);
    assert_eq!(worker["checkpoints"][0]["sha256"], english["sha256"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_requests_and_read_the_pools() {
    let server = TestServer::start(|_| {}).await;
    let (body, _) = large_golden_case();
    assert_eq!(server.post("/v1/systemone", &[JSON], &body).await.status, 200);
    assert_eq!(server.post("/v1/systemone", &[JSON], b"not json").await.status, 400);
    let response = server.get("/metrics", &[("accept", OPENMETRICS_ACCEPT)]).await;
    assert_eq!(response.status, 200);
    assert!(
        response
            .header("content-type")
            .is_some_and(|t| t.starts_with("application/openmetrics-text"))
    );
    let text = response.text();
    for line in [
        "layad_requests_total{status=\"200\",checkpoint=\"english\",pool=\"gpu\"} 1",
        "layad_requests_total{status=\"400\",checkpoint=\"\",pool=\"\"} 1",
        "layad_request_duration_seconds_count{checkpoint=\"english\"} 1",
        "layad_prepare_duration_seconds_count 2",
        "layad_queue_wait_seconds_count{pool=\"gpu\",class=\"multi-128\"} 1",
        "layad_taken_over_total{pool=\"gpu\",direction=\"in\"} 2",
        "layad_device_duration_seconds_count{pool=\"gpu\"} 1",
        "layad_queue_depth{pool=\"gpu\"} 3",
        "layad_in_flight{pool=\"gpu\"} 1",
        "layad_pool_degraded{pool=\"gpu\"} 0",
        "layad_workers{pool=\"gpu\",state=\"ready\"} 1",
        "layad_workers{pool=\"gpu\",state=\"restarting\"} 0",
        "layad_worker_restarts_total{pool=\"gpu\",worker=\"gpu-0\"} 2",
        "layad_pool_backlog_seconds{pool=\"gpu\"} 0.003",
        "layad_pool_speed_factor{pool=\"gpu\"} 4.0",
        "layad_pool_speed_changed_seconds{pool=\"gpu\"} 1800000000.0",
        "layad_pool_speed_changes_total{pool=\"gpu\"} 1",
    ] {
        assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
    }
    assert!(text.ends_with("# EOF\n"));
}

/// What Prometheus 2.42 sends when it scrapes.
const OPENMETRICS_ACCEPT: &str = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";

/// Every layad metric family, by its name in the Prometheus text format, with its type: a family
/// that disappears or changes type fails the test below (and the dashboards that chart it).
const FAMILIES: [(&str, &str); 21] = [
    ("layad_requests_total", "counter"),
    ("layad_request_duration_seconds", "histogram"),
    ("layad_prepare_duration_seconds", "histogram"),
    ("layad_queue_wait_seconds", "histogram"),
    ("layad_device_duration_seconds", "histogram"),
    ("layad_queue_depth", "gauge"),
    ("layad_in_flight", "gauge"),
    ("layad_pool_degraded", "gauge"),
    ("layad_pool_backlog_seconds", "gauge"),
    ("layad_pool_unavailable", "gauge"),
    ("layad_pool_speed_factor", "gauge"),
    ("layad_pool_speed_changed_seconds", "gauge"),
    ("layad_pool_speed_changes_total", "counter"),
    ("layad_workers", "gauge"),
    ("layad_worker_cpu_kernels", "gauge"),
    ("layad_worker_restarts_total", "counter"),
    ("layad_routed_total", "counter"),
    ("layad_spilled_out_total", "counter"),
    ("layad_taken_over_total", "counter"),
    ("layad_batched_forwards_total", "counter"),
    ("layad_batch_requests_total", "counter"),
];

/// The problems of one exposition: a sample whose family has no `HELP` or no `TYPE` (the family of
/// `x_bucket`, `x_sum`, `x_count` is histogram `x`; in OpenMetrics that of `x_total` is counter `x`),
/// a `TYPE` without `HELP`, or a family named twice.
fn exposition_problems(text: &str, openmetrics: bool) -> (Vec<String>, std::collections::BTreeMap<String, String>) {
    use std::collections::{BTreeMap, BTreeSet};
    let mut problems = Vec::new();
    let mut helps = BTreeSet::new();
    let mut types = BTreeMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let name = rest.split(' ').next().unwrap_or_default().to_owned();
            if !helps.insert(name.clone()) {
                problems.push(format!("HELP of {name} given twice"));
            }
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, ""));
            if types.insert(name.to_owned(), kind.to_owned()).is_some() {
                problems.push(format!("TYPE of {name} given twice"));
            }
            if !helps.contains(name) {
                problems.push(format!("TYPE of {name} comes without a HELP before it"));
            }
        }
    }
    for line in text.lines().filter(|l| !l.is_empty() && !l.starts_with('#')) {
        let sample = line.split(['{', ' ']).next().unwrap_or_default();
        let family = |suffix: &str, kind: &str| {
            sample
                .strip_suffix(suffix)
                .filter(|f| types.get(*f).is_some_and(|t| t == kind))
        };
        let name = if types.contains_key(sample) {
            Some(sample)
        } else {
            ["_bucket", "_sum", "_count"]
                .into_iter()
                .find_map(|suffix| family(suffix, "histogram"))
                .or_else(|| if openmetrics { family("_total", "counter") } else { None })
        };
        match name {
            Some(name) if helps.contains(name) => {}
            _ => problems.push(format!("sample {sample} has no family with HELP and TYPE")),
        }
    }
    (problems, types)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_family_has_help_and_type_in_both_formats() {
    let server = TestServer::start(|_| {}).await;
    let (body, _) = large_golden_case();
    assert_eq!(server.post("/v1/systemone", &[JSON], &body).await.status, 200);
    assert_eq!(server.post("/v1/systemone", &[JSON], b"not json").await.status, 400);
    // A family appears once it has a sample: the batch route's, too.
    assert_eq!(
        server.post("/v1/systemone/batch", &[JSON], b"not json").await.status,
        400
    );
    // curl and `promtool check metrics` (no Accept) read the Prometheus text format 0.0.4.
    let classic = server.get("/metrics", &[]).await;
    assert_eq!(
        classic.header("content-type"),
        Some("text/plain; version=0.0.4; charset=utf-8")
    );
    let text = classic.text();
    let (problems, types) = exposition_problems(&text, false);
    assert!(problems.is_empty(), "{problems:#?} in\n{text}");
    for (name, kind) in FAMILIES {
        assert_eq!(
            types.get(name).map(String::as_str),
            Some(kind),
            "family {name} in\n{text}"
        );
    }
    assert_eq!(types.len(), FAMILIES.len(), "families not in FAMILIES: {types:?}");
    assert!(!text.contains("# EOF") && !text.contains("# UNIT"), "{text}");
    // Prometheus asks for OpenMetrics.
    let open = server.get("/metrics", &[("accept", OPENMETRICS_ACCEPT)]).await.text();
    let (problems, types) = exposition_problems(&open, true);
    assert!(problems.is_empty(), "{problems:#?} in\n{open}");
    for (name, kind) in FAMILIES {
        let name = if kind == "counter" {
            name.trim_end_matches("_total")
        } else {
            name
        };
        assert_eq!(
            types.get(name).map(String::as_str),
            Some(kind),
            "family {name} in\n{open}"
        );
    }
    // The same samples either way.
    let samples = |t: &str| {
        t.lines()
            .filter(|l| !l.starts_with('#'))
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    assert_eq!(samples(&text), samples(&open));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backend_failures_become_retryable_503s_a_permanent_413_or_a_500() {
    let server = TestServer::start(|_| {}).await;
    let (body, _) = large_golden_case();
    let cases = [
        (
            BackendError::Overloaded {
                retry_after: Duration::from_secs(2),
            },
            503,
            "server busy, try again later",
            Some("2"),
        ),
        (
            BackendError::CheckpointUnavailable(CheckpointName::English),
            503,
            "checkpoint 'english' has no ready worker; try again later",
            Some("1"),
        ),
        (
            BackendError::DeadlineExpired,
            503,
            "request timed out waiting for a worker; try again later",
            Some("1"),
        ),
        (
            BackendError::NoCapablePool("no pool can run 40 questions of up to 900 tokens in one forward pass".into()),
            413,
            "no pool can run 40 questions of up to 900 tokens in one forward pass",
            None,
        ),
        (
            BackendError::Failed("device lost".into()),
            500,
            "inference failed",
            None,
        ),
    ];
    for (error, status, detail, retry_after) in cases {
        *server.backend.fail_with.lock().expect("lock") = Some(error.clone());
        let response = server.post("/v1/systemone", &[JSON], &body).await;
        assert_eq!(
            (response.status, response.detail().as_str()),
            (status, detail),
            "{error:?}"
        );
        assert_eq!(response.header("retry-after"), retry_after, "{error:?}");
    }
    *server.backend.fail_with.lock().expect("lock") = None;
    // Requests that need no forward pass never reach the backend.
    let jobs = server.backend.jobs.load(Ordering::SeqCst);
    assert_eq!(
        server
            .post("/v1/systemone", &[JSON], br#"{"state": "x", "questions": {}}"#)
            .await
            .status,
        200
    );
    assert_eq!(server.backend.jobs.load(Ordering::SeqCst), jobs);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_slower_than_the_request_timeout_gets_503() {
    let server = TestServer::start(|c| c.server.request_timeout = Duration::from_millis(200)).await;
    *server.backend.delay.lock().expect("lock") = Duration::from_secs(5);
    let (body, _) = large_golden_case();
    let started = Instant::now();
    let response = server.post("/v1/systemone", &[JSON], &body).await;
    assert_eq!(response.status, 503);
    assert_eq!(response.header("retry-after"), Some("1"));
    assert!(started.elapsed() < Duration::from_secs(3), "{:?}", started.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_paths_and_methods_answer_like_fastapi() {
    let server = TestServer::start(|_| {}).await;
    let response = server.get("/v1/systemone", &[]).await;
    assert_eq!(
        (response.status, response.text().as_str()),
        (405, r#"{"detail":"Method Not Allowed"}"#)
    );
    assert_eq!(response.header("allow"), Some("POST"));
    let response = server.post("/health", &[], b"").await;
    assert_eq!(
        (response.status, response.detail().as_str()),
        (405, "Method Not Allowed")
    );
    let response = server.get("/nope", &[]).await;
    assert_eq!(
        (response.status, response.text().as_str()),
        (404, r#"{"detail":"Not Found"}"#)
    );
    let response = server.get("/health/?verbose=1", &[]).await;
    assert_eq!(response.status, 307);
    assert_eq!(
        response.header("location"),
        Some(format!("http://{}/health?verbose=1", server.addr).as_str())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_lets_in_flight_requests_finish_then_stops_accepting() {
    let mut server = TestServer::start(|_| {}).await;
    *server.backend.delay.lock().expect("lock") = Duration::from_millis(600);
    let (body, upstream) = large_golden_case();
    let addr = server.addr;
    let in_flight = tokio::spawn(async move {
        send(
            addr,
            &Request::new("POST", "/v1/systemone").headers(&[JSON]).body(&body),
        )
        .await
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    server.begin_shutdown();
    let response = in_flight.await.expect("request task");
    assert_eq!(response.status, 200);
    assert_eq!(response.text(), upstream);
    let report = (&mut server.task).await.expect("server task");
    assert!(report.drained && report.abandoned_connections == 0, "{report:?}");
    assert!(tokio::net::TcpStream::connect(addr).await.is_err(), "still accepting");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_grace_period_bounds_the_drain() {
    let mut server = TestServer::start(|c| c.server.shutdown_grace = Duration::from_millis(200)).await;
    *server.backend.delay.lock().expect("lock") = Duration::from_secs(10);
    let (body, _) = large_golden_case();
    let addr = server.addr;
    let stuck = tokio::spawn(async move {
        send(
            addr,
            &Request::new("POST", "/v1/systemone").headers(&[JSON]).body(&body),
        )
        .await
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let started = Instant::now();
    server.begin_shutdown();
    let report = (&mut server.task).await.expect("server task");
    assert!(!report.drained && report.abandoned_connections == 1, "{report:?}");
    assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());
    stuck.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_diagnostics_block_follows_upstreams_keys_and_the_switch_removes_it() {
    let (body, upstream) = large_golden_case();
    let server = TestServer::start(|config| config.server.diagnostics = true).await;
    let response = server.post("/v1/systemone", &[JSON], &body).await;
    assert_eq!(response.status, 200, "{}", response.text());
    let text = response.text();
    // Upstream's body, then one more key: clients that read upstream's keys see no change.
    let upstream_prefix = upstream.strip_suffix('}').expect("an object");
    assert!(text.starts_with(upstream_prefix), "{text}");
    let answer: Value = serde_json::from_str(&text).expect("json");
    let block = &answer["x_layad"];
    assert_eq!(block["pool"], "gpu");
    assert_eq!(block["route"], "preferred");
    assert_eq!(block["reason"], "'gpu' is the only pool");
    assert_eq!(block["device_ms"], 0.7);
    assert_eq!(block["batch_rows"], 1);
    let server = TestServer::start(|config| config.server.diagnostics = false).await;
    assert_eq!(server.post("/v1/systemone", &[JSON], &body).await.text(), upstream);
}
