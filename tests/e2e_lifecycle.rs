//! The service's life: not ready until its workers are, scaled pools visible in `/health`, a clean
//! drain on SIGTERM under load, no worker outliving a killed supervisor, and config mistakes named.

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use layad_system_tests::goldens::golden_body;
use layad_system_tests::{ONE_CPU_POOL, Server, bin_dir, fixture_hf_home, get, post_json};

fn small_request() -> String {
    golden_body("multi_five_questions_mixed")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_is_503_until_the_workers_are_ready() {
    let mut server = Server::start(ONE_CPU_POOL, &[]);
    let start = Instant::now();
    let first = loop {
        if let Ok(r) = get(server.addr, "/readyz").await {
            break r;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "layad never listened:\n{}",
            server.log()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    assert_eq!(first.status, 503, "{}", first.text());
    assert_eq!(get(server.addr, "/livez").await.expect("livez").status, 200);
    server.wait_ready(Duration::from_secs(120)).await;
    let health = get(server.addr, "/health").await.expect("health").json();
    assert_eq!(health["status"], "ok", "{health}");
    let worker = &health["pools"][0]["workers"][0];
    assert_eq!(worker["state"], "ready");
    assert_eq!(worker["device"], "cpu");
    assert_eq!(worker["dtype"], "f32");
    // The real worker chose its CPU kernels at start-up from what this CPU has.
    let kernels = worker["cpu_kernels"].as_str().unwrap_or_default();
    assert!(["amx", "avx512", "avx2", "gemm"].contains(&kernels), "{worker}");
    let revisions: Vec<&str> = worker["checkpoints"]
        .as_array()
        .expect("checkpoints")
        .iter()
        .filter_map(|c| c["revision"].as_str())
        .collect();
    assert_eq!(revisions, ["7a1e5eed0f1c7ee5c0de5eed0f1c7ee5c0de0320"; 3], "{worker}");
    assert_eq!(server.terminate(Duration::from_secs(30)).code(), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_pools_of_two_workers_all_show_in_health() {
    let config = r#"
[[pool]]
name = "english"
device = "cpu"
workers = 2
threads = 1
checkpoints = ["english"]

[[pool]]
name = "others"
device = "cpu"
workers = 2
threads = 1
checkpoints = ["multilingual", "typed-decisions"]
"#;
    let mut server = Server::start(config, &[]);
    server.wait_ready(Duration::from_secs(180)).await;
    // Ready means every checkpoint has one ready worker; the pools' second workers may still warm.
    let start = Instant::now();
    let health = loop {
        let health = get(server.addr, "/health").await.expect("health").json();
        if health["status"] == "ok" || start.elapsed() > Duration::from_secs(120) {
            break health;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let pools = health["pools"].as_array().expect("pools");
    let names: Vec<&str> = pools.iter().filter_map(|p| p["name"].as_str()).collect();
    assert_eq!(names, ["english", "others"]);
    for pool in pools {
        let workers = pool["workers"].as_array().expect("workers");
        assert_eq!(workers.len(), 2, "{pool}");
        assert!(
            workers
                .iter()
                .all(|w| w["state"] == "ready" && w["pid"].as_u64().is_some()),
            "{pool}"
        );
    }
    // A German state routes to multilingual, which only the second pool serves.
    let body = br#"{"state": "Mein Konto wurde zweimal belastet, bitte erstatten Sie den Betrag", "questions": {"q": {"type": "noul", "instructions": "Is this about billing?"}}}"#;
    let response = post_json(server.addr, "/v1/systemone", body).await.expect("post");
    assert_eq!(response.status, 200, "{}", response.text());
    assert_eq!(response.json()["routing"]["model"], "multilingual");
    assert_eq!(server.terminate(Duration::from_secs(30)).code(), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigterm_under_load_drains_and_exits_zero() {
    let mut server = Server::start(ONE_CPU_POOL, &[]);
    server.wait_ready(Duration::from_secs(120)).await;
    let body = Arc::new(small_request());
    let addr = server.addr;
    let clients: Vec<_> = (0..8)
        .map(|_| {
            let body = Arc::clone(&body);
            tokio::spawn(async move { post_json(addr, "/v1/systemone", body.as_bytes()).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let status = tokio::task::spawn_blocking(move || {
        let status = server.terminate(Duration::from_secs(60));
        (status, server.log())
    });
    for client in clients {
        // Requests accepted before SIGTERM are answered; later ones may find the port closed.
        if let Ok(response) = client.await.expect("client") {
            assert_eq!(response.status, 200, "{}", response.text());
        }
    }
    let (status, log) = status.await.expect("terminate");
    assert_eq!(status.code(), Some(0), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_worker_outlives_a_killed_supervisor() {
    let mut server = Server::start(ONE_CPU_POOL, &[]);
    server.wait_ready(Duration::from_secs(120)).await;
    let health = get(server.addr, "/health").await.expect("health").json();
    let pid = health["pools"][0]["workers"][0]["pid"].as_i64().expect("worker pid") as i32;
    let supervisor = nix::unistd::Pid::from_raw(server.pid() as i32);
    nix::sys::signal::kill(supervisor, nix::sys::signal::Signal::SIGKILL).expect("kill layad");
    server.wait_exit(Duration::from_secs(5));
    let worker = nix::unistd::Pid::from_raw(pid);
    let start = Instant::now();
    // Signal 0 probes for existence; the worker may linger briefly as a zombie of init.
    while nix::sys::signal::kill(worker, None).is_ok() && !is_zombie(pid) {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "worker {pid} still runs 5 s after its supervisor died"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Whether `pid` is a zombie (or gone): its state in `/proc/<pid>/stat`.
#[cfg(target_os = "linux")]
fn is_zombie(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            s.rsplit(')')
                .next()
                .is_some_and(|rest| rest.trim_start().starts_with('Z'))
        })
        .unwrap_or(true)
}

/// Whether `pid` is a zombie (or gone): its state from `ps`, as macOS has no `/proc`. An error
/// running `ps` fails the test rather than answering "gone", which would pass it unchecked.
#[cfg(not(target_os = "linux"))]
fn is_zombie(pid: i32) -> bool {
    let out = Command::new("ps")
        .args(["-o", "stat=", "-p", &pid.to_string()])
        .output()
        .expect("ps");
    // ps exits 1 and prints nothing when no such process exists.
    let state = String::from_utf8_lossy(&out.stdout);
    state.trim().is_empty() || state.trim_start().starts_with('Z')
}

/// README's run command: no config file, the embedded defaults, the fixture cache; JSON logs;
/// a decision answered by a real worker; SIGTERM → exit 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_with_no_config_file_answers_and_stops_on_sigterm() {
    let addr = format!("127.0.0.1:{}", layad_system_tests::free_port());
    let sockets = tempfile::tempdir().expect("tempdir");
    let mut child = Command::new(bin_dir().join("layad"))
        .args(["serve", "--listen", &addr, "--log-format", "json"])
        .env("HF_HOME", fixture_hf_home())
        .env("LAYAD_WORKERS__SOCKET_DIR", sockets.path())
        .env_remove("LAYA_API_KEY")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("layad serve starts");
    let addr = addr.parse().expect("addr");
    let start = Instant::now();
    loop {
        if get(addr, "/readyz").await.is_ok_and(|r| r.status == 200) {
            break;
        }
        assert!(child.try_wait().expect("wait").is_none(), "layad serve exited early");
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "layad serve never became ready"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let response = post_json(addr, "/v1/systemone", small_request().as_bytes())
        .await
        .expect("post");
    assert_eq!(response.status, 200, "{}", response.text());
    let health = get(addr, "/health").await.expect("health").json();
    assert_eq!(health["pools"][0]["name"], "gpu");
    assert_eq!(
        health["pools"][0]["workers"][0]["device"], "cpu",
        "auto means CPU on Linux: {health}"
    );
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .expect("SIGTERM");
    let output = tokio::task::spawn_blocking(move || child.wait_with_output())
        .await
        .expect("join")
        .expect("exit");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert!(stderr.lines().all(|l| l.starts_with('{')), "JSON logs only: {stderr}");
    // Worker lines are re-emitted by the supervisor, tagged with their pool and pid.
    assert!(stderr.contains("\"pool\":\"gpu\""), "{stderr}");
}

/// A `laya-serve` unit's environment, unchanged, and no layad setting at all (no config file, no
/// flag): layad binds `LAYA_HOST:LAYA_PORT`, serves only `LAYA_MODELS`, answers in the strict Jev
/// shape, requires the key, caps `max_len` at `LAYA_MAX_TOKEN_BUDGET`, sends a language-less state
/// to `LAYA_DEFAULT_MODEL`, and logs what it made of each variable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_laya_serve_environment_starts_layad_with_the_same_meaning() {
    let port = layad_system_tests::free_port();
    let sockets = tempfile::tempdir().expect("tempdir");
    let log_dir = tempfile::tempdir().expect("tempdir");
    let log_path = log_dir.path().join("layad.log");
    let log = std::fs::File::create(&log_path).expect("log");
    let mut command = Command::new(bin_dir().join("layad"));
    for (name, _) in std::env::vars() {
        if name.starts_with("LAYA_") || name.starts_with("LAYAD_") {
            command.env_remove(name);
        }
    }
    let port_text = port.to_string();
    let environment = [
        ("LAYA_HOST", "127.0.0.1"),
        ("LAYA_PORT", port_text.as_str()),
        ("LAYA_DEVICE", "cpu"),
        ("LAYA_THREADS", "1"),
        ("LAYA_MODELS", "english,multilingual"),
        ("LAYA_DEFAULT_MODEL", "english"),
        ("LAYA_JEV_STRICT", "1"),
        ("LAYA_MAX_TOKEN_BUDGET", "512"),
        ("LAYA_BODY_READ_TIMEOUT", "5"),
        ("LAYA_MAX_CONCURRENT", "8"),
        ("LAYA_TOURNAMENT_GROUP", "16"),
        ("LAYA_LOG_LEVEL", "info"),
        ("LAYA_PRELOAD", "1"),
        ("LAYA_MAX_LOADED", "2"),
        ("LAYA_API_KEY", "unit-key"),
    ];
    let mut child = command
        .arg("serve")
        .envs(environment)
        .env("HF_HOME", fixture_hf_home())
        .env("HF_HUB_OFFLINE", "1")
        // Not a layad setting: where this test's workers put their sockets.
        .env("LAYAD_WORKERS__SOCKET_DIR", sockets.path())
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("log"))
        .stderr(log)
        .spawn()
        .expect("layad serve starts");
    // A failed assertion must not leave the server running (its workers follow it out).
    let mut guard = KillOnDrop(Some(child.id()));
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().expect("addr");
    let read_log = || std::fs::read_to_string(&log_path).unwrap_or_default();
    let start = Instant::now();
    while !get(addr, "/readyz").await.is_ok_and(|r| r.status == 200) {
        assert!(
            child.try_wait().expect("wait").is_none(),
            "layad exited:\n{}",
            read_log()
        );
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "never ready:\n{}",
            read_log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let auth = [
        ("content-type", "application/json"),
        ("authorization", "Bearer unit-key"),
    ];
    let body = br#"{"state": "12345 67890", "questions": {"ok": {"type": "noul", "instructions": "Is it fine?"}}}"#;
    let without_key = post_json(addr, "/v1/systemone", body).await.expect("post");
    assert_eq!(without_key.status, 401);
    let answer = layad_system_tests::request(addr, "POST", "/v1/systemone", &auth, body)
        .await
        .expect("post");
    assert_eq!(answer.status, 200, "{}", answer.text());
    // LAYA_JEV_STRICT: the strict projection, no routing, no x_layad.
    let json = answer.json();
    let keys: Vec<&String> = json.as_object().expect("object").keys().collect();
    assert_eq!(keys, ["model", "answers", "usage"], "{json}");
    assert_eq!(json["answers"]["ok"].as_object().map(|a| a.len()), Some(2), "{json}");
    assert_eq!(answer.header("x-typesafe-request-id"), answer.header("x-request-id"));
    // LAYA_MAX_TOKEN_BUDGET.
    let long = br#"{"state": "x", "max_len": 1024, "questions": {}}"#;
    let refused = layad_system_tests::request(addr, "POST", "/v1/systemone", &auth, long)
        .await
        .expect("post");
    assert_eq!(
        (refused.status, refused.json()["detail"].as_str()),
        (422, Some("max_len exceeds server limit (1024 > 512)"))
    );
    // LAYA_MODELS: typed-decisions is served on demand, as upstream loads it on first use (its
    // pool starts unloaded; `e2e_on_demand` follows a request that loads one).
    let typed = br#"{"state": "x", "task": "typed", "questions": {}}"#;
    let on_demand = layad_system_tests::request(addr, "POST", "/v1/systemone", &auth, typed)
        .await
        .expect("post");
    assert_eq!(on_demand.status, 200, "{}", on_demand.text());
    // The batch route, strict too, under the same key.
    let batch =
        br#"{"states": ["12345 67890", "67890"], "questions": {"ok": {"type": "noul", "instructions": "Is it fine?"}}}"#;
    let answered = layad_system_tests::request(addr, "POST", "/v1/systemone/batch", &auth, batch)
        .await
        .expect("post");
    assert_eq!(answered.status, 200, "{}", answered.text());
    let results = answered.json()["results"].clone();
    assert_eq!(results[0], json, "the same state, the same strict answer");
    // LAYA_DEFAULT_MODEL, LAYA_THREADS, LAYA_DEVICE, LAYA_MODELS: /health (with the key).
    let health = layad_system_tests::request(addr, "GET", "/health", &auth[1..], b"")
        .await
        .expect("health")
        .json();
    let worker = &health["pools"][0]["workers"][0];
    assert_eq!(worker["device"], "cpu", "{health}");
    let served: Vec<&str> = worker["checkpoints"]
        .as_array()
        .expect("checkpoints")
        .iter()
        .filter_map(|c| c["name"].as_str())
        .collect();
    assert_eq!(served, ["english", "multilingual"], "{health}");
    let text = read_log();
    for line in [
        &format!("LAYA_HOST=127.0.0.1 LAYA_PORT={port}: server.listen = 127.0.0.1:{port}"),
        "LAYA_MODELS=english,multilingual: english, multilingual load at start; typed-decisions (pool \
         gpu-typed-decisions) load on their first request",
        "LAYA_JEV_STRICT=1: compat.output = \"jev-strict\"",
        "LAYA_DEFAULT_MODEL=english: compat.default_checkpoint = \"english\"",
        "LAYA_MAX_TOKEN_BUDGET=512: compat.max_token_budget = 512",
        "LAYA_THREADS=1: threads = 1 per worker",
        "LAYA_DEVICE=cpu: device = \"cpu\"",
        "LAYA_BODY_READ_TIMEOUT=5: server.body_timeout = 5s",
        "LAYA_MAX_CONCURRENT=8: server.max_concurrent = 8",
        "LAYA_MAX_LOADED=2 has no effect in layad",
        "LAYA_TOURNAMENT_GROUP=16: compat.tournament_group = 16",
        "LAYA_API_KEY is set",
    ] {
        assert!(text.contains(line), "missing {line:?} in:\n{text}");
    }
    assert!(!text.contains("unit-key"), "the key is never logged");
    guard.0 = None;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .expect("SIGTERM");
    let status = tokio::task::spawn_blocking(move || child.wait())
        .await
        .expect("join")
        .expect("exit");
    assert_eq!(status.code(), Some(0), "{}", read_log());
}

/// SIGKILLs the process with this id when dropped, unless disarmed (`None`).
struct KillOnDrop(Option<u32>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(pid) = self.0 {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}
