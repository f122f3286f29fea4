//! Checkpoints of the operator's own (`[checkpoints.extra]`, upstream's `LAYA_EXTRA_MODELS`) with
//! real workers: one (a copy of the fixture english checkpoint under another name) is served under
//! `model=` with its source as `routing.repo`, listed in `/v1/models` and `/health` with its SHA-256,
//! reloaded out and back in while requests run (none fails), and a broken one is refused at reload
//! and at start-up with the checkpoint and the file named.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use layad_system_tests::{Server, fixture_hf_home, get, post_json};
use serde_json::Value;

/// The fixture english checkpoint's directory (inside the fixture cache's snapshot).
fn fixture_english() -> PathBuf {
    let snapshots = fixture_hf_home().join("hub/models--convaiinnovations--laya/snapshots");
    std::fs::read_dir(&snapshots)
        .expect("fixture snapshots")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .next()
        .expect("one snapshot")
}

/// Copies a checkpoint's files (following the cache's symlinks) into `to`.
fn copy_checkpoint(from: &Path, to: &Path) {
    for part in ["rl_agent_config.json", "model.safetensors", "encoder", "tokenizer"] {
        let src = from.join(part);
        if src.is_dir() {
            std::fs::create_dir_all(to.join(part)).expect("mkdir");
            for entry in std::fs::read_dir(&src).expect("read dir").filter_map(Result::ok) {
                std::fs::copy(entry.path(), to.join(part).join(entry.file_name())).expect("copy");
            }
        } else {
            std::fs::create_dir_all(to).expect("mkdir");
            std::fs::copy(&src, to.join(part)).expect("copy");
        }
    }
}

fn config(extra: &[(&str, &Path)]) -> String {
    let mut text = String::from(
        "[server]\nrequest_timeout = \"60s\"\n\n[[pool]]\nname = \"cpu\"\ndevice = \"cpu\"\nworkers = 1\nthreads = 1\n",
    );
    if !extra.is_empty() {
        text.push_str("\n[checkpoints.extra]\n");
        for (name, dir) in extra {
            text.push_str(&format!("{name} = {:?}\n", dir.display().to_string()));
        }
    }
    text
}

fn body(model: Option<&str>) -> String {
    let model = model.map_or(String::new(), |m| format!(r#""model": "{m}", "#));
    format!(
        r#"{{{model}"state": "I was charged twice for invoice 4411, please refund it today.",
            "questions": {{"queue": {{"type": "choice", "instructions": "Which queue?",
                                     "criteria": {{"billing": "payment problems", "tech": "technical issue"}}}},
                          "refund": {{"type": "noul", "instructions": "Is a refund asked for?"}}}}}}"#
    )
}

async fn ask(server: &Server, model: Option<&str>) -> Value {
    let response = post_json(server.addr, "/v1/systemone", body(model).as_bytes())
        .await
        .expect("answer");
    assert_eq!(response.status, 200, "{}", response.text());
    response.json()
}

async fn health(server: &Server) -> Value {
    get(server.addr, "/health").await.expect("health").json()
}

/// Waits until `done(health)` holds, failing with the last `/health` after `timeout`.
async fn wait_for(server: &Server, timeout: Duration, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    let start = Instant::now();
    loop {
        let health = health(server).await;
        if done(&health) {
            return health;
        }
        assert!(start.elapsed() < timeout, "{what}: {health}\n{}", server.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Keeps sending requests (half naming `mine`, half routed automatically) until stopped.
fn load(server: &Server, stop: Arc<AtomicBool>) -> (tokio::task::JoinHandle<()>, Arc<AtomicUsize>, Arc<AtomicUsize>) {
    let (ok, failed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let addr = server.addr;
    let counters = (Arc::clone(&ok), Arc::clone(&failed));
    let task = tokio::spawn(async move {
        let mut clients = tokio::task::JoinSet::new();
        for client in 0..4 {
            let (stop, ok, failed) = (Arc::clone(&stop), Arc::clone(&counters.0), Arc::clone(&counters.1));
            let body = body((client % 2 == 0).then_some("mine"));
            clients.spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    match post_json(addr, "/v1/systemone", body.as_bytes()).await {
                        Ok(r) if r.status == 200 => ok.fetch_add(1, Ordering::Relaxed),
                        Ok(r) => {
                            eprintln!("failed: {} {}", r.status, r.text());
                            failed.fetch_add(1, Ordering::Relaxed)
                        }
                        Err(e) => {
                            eprintln!("failed: {e}");
                            failed.fetch_add(1, Ordering::Relaxed)
                        }
                    };
                }
            });
        }
        while clients.join_next().await.is_some() {}
    });
    (task, ok, failed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extra_checkpoint_is_served_reloaded_out_and_in_under_load_and_a_broken_one_is_refused() {
    let files = tempfile::tempdir().expect("tempdir");
    let mine = files.path().join("mine");
    copy_checkpoint(&fixture_english(), &mine);
    let broken = files.path().join("broken");
    copy_checkpoint(&fixture_english(), &broken);
    std::fs::write(
        broken.join("model.safetensors"),
        b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}",
    )
    .expect("break");

    let mut server = Server::start(&config(&[("Mine", &mine)]), &[]);
    server.wait_ready(Duration::from_secs(180)).await;
    let config_path = server.dir.path().join("layad.toml");

    // Served under model= like a built-in, with its directory as routing.repo.
    let answer = ask(&server, Some(" MINE ")).await;
    assert_eq!(answer["routing"]["model"], "mine", "{answer}");
    assert_eq!(answer["routing"]["repo"], mine.display().to_string(), "{answer}");
    assert_eq!(answer["routing"]["reason"], "explicit model='mine'", "{answer}");
    // The same weights as english: the same answer.
    let english = ask(&server, Some("english")).await;
    assert_eq!(answer["answers"], english["answers"]);
    let health = health(&server).await;
    let entry = &health["checkpoints"]["mine"];
    assert_eq!(entry["servable"], true, "{health}");
    assert_eq!(entry["revision"], Value::Null, "{health}");
    assert_eq!(entry["sha256"], health["checkpoints"]["english"]["sha256"], "{health}");
    assert_eq!(entry["sha256"].as_str().map(str::len), Some(64), "{health}");
    let models = get(server.addr, "/v1/models").await.expect("models").json();
    let listed = models["models"].as_array().expect("models");
    assert!(listed.iter().any(|m| m["name"] == "mine"), "{models}");

    let stop = Arc::new(AtomicBool::new(false));
    let (clients, ok, failed) = load(&server, Arc::clone(&stop));

    // Out: the name is no longer a checkpoint (it routes automatically, as upstream's unknown
    // names do), and the pool is replaced by one without it.
    std::fs::write(&config_path, config(&[])).expect("write config");
    let (reloaded, output) = server.reload(&config_path);
    assert!(reloaded, "{output}");
    assert!(
        output.contains("checkpoint mine: removed"),
        "{output}\n{}",
        server.log()
    );
    wait_for(&server, Duration::from_secs(120), "mine never left", |h| {
        h["checkpoints"].get("mine").is_none() && h["pools"].as_array().map(Vec::len) == Some(1)
    })
    .await;
    let answer = ask(&server, Some("mine")).await;
    assert_eq!(answer["routing"]["model"], "english", "{answer}");

    // In again: accepted only once a worker has loaded and warmed it.
    std::fs::write(&config_path, config(&[("mine", &mine)])).expect("write config");
    let (reloaded, output) = server.reload(&config_path);
    assert!(reloaded, "{output}");
    assert!(output.contains("checkpoint mine: added"), "{output}");
    let health = wait_for(&server, Duration::from_secs(120), "mine never came back", |h| {
        h["checkpoints"]["mine"]["servable"] == true
    })
    .await;
    let warmed = health["pools"]
        .as_array()
        .expect("pools")
        .iter()
        .flat_map(|p| p["workers"].as_array().cloned().unwrap_or_default())
        .filter(|w| w["state"] == "ready")
        .any(|w| {
            w["warmup"]
                .as_array()
                .is_some_and(|shapes| shapes.iter().any(|s| s["checkpoint"] == "mine"))
        });
    assert!(warmed, "no ready worker reports a warm-up of mine: {health}");
    assert_eq!(ask(&server, Some("mine")).await["routing"]["model"], "mine");

    // A broken one is refused with the checkpoint and the file named; nothing changes.
    std::fs::write(&config_path, config(&[("mine", &mine), ("bad", &broken)])).expect("write config");
    let (reloaded, output) = server.reload(&config_path);
    assert!(!reloaded, "{output}");
    assert!(
        output.contains("checkpoint 'bad'") && output.contains("model.safetensors"),
        "{output}"
    );
    let health = wait_for(&server, Duration::from_secs(10), "the refusal is not in /health", |h| {
        h["reload"]["ok"] == false
    })
    .await;
    assert!(health["checkpoints"].get("bad").is_none(), "{health}");
    assert_eq!(health["checkpoints"]["mine"]["servable"], true, "{health}");

    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::Relaxed);
    clients.await.expect("clients");
    assert_eq!(failed.load(Ordering::Relaxed), 0, "requests failed during the reloads");
    assert!(ok.load(Ordering::Relaxed) > 0);

    // At start-up the same refusal stops the server before any worker starts.
    let mut refused = Server::start(&config(&[("bad", &broken)]), &[]);
    let status = refused.wait_exit(Duration::from_secs(60));
    assert!(!status.success());
    let log = refused.log();
    assert!(
        log.contains("checkpoint 'bad'") && log.contains("model.safetensors") && log.contains("header"),
        "{log}"
    );
}

/// The first worker of the first pool in `/health`.
fn first_worker(health: &Value) -> Value {
    health["pools"][0]["workers"][0].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_pool_unloads_its_worker_and_the_next_request_loads_it_again() {
    // Upstream's variable, as a laya-serve unit would set it: 1 s without a request.
    let mut server = Server::start(&config(&[]), &[("LAYA_IDLE_UNLOAD_SECONDS", "1")]);
    server.wait_ready(Duration::from_secs(180)).await;
    let before = ask(&server, Some("english")).await;

    // Requests closer together than the window keep it resident.
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(2500) {
        ask(&server, None).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let busy = health(&server).await;
    assert_eq!(first_worker(&busy)["state"], "ready", "{busy}");
    assert_eq!(first_worker(&busy)["unloads"], 0, "{busy}");
    let pid = first_worker(&busy)["pid"].as_u64().expect("pid");

    // Idle for the window: the worker process is gone, the pool still counts as able to answer.
    let unloaded = wait_for(&server, Duration::from_secs(20), "the worker never unloaded", |h| {
        first_worker(h)["state"] == "unloaded"
    })
    .await;
    let worker = first_worker(&unloaded);
    assert_eq!(
        (worker["unloads"].as_u64(), worker["pid"].is_null()),
        (Some(1), true),
        "{unloaded}"
    );
    let gone = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), None).is_err();
    assert!(gone, "worker process {pid} still runs after the unload");
    assert_eq!(unloaded["checkpoints"]["english"]["servable"], true, "{unloaded}");
    assert_eq!(get(server.addr, "/readyz").await.expect("readyz").status, 200);

    // The next request loads and warms it again, waits for that, and gets the same answer.
    let after = ask(&server, Some("english")).await;
    assert_eq!(after["answers"], before["answers"]);
    let reloaded = health(&server).await;
    let worker = first_worker(&reloaded);
    assert_eq!(worker["state"], "ready", "{reloaded}");
    let cost = worker["last_reload_ms"].as_f64().expect("last_reload_ms");
    assert!(cost > 0.0, "{reloaded}");
    let queue_ms = after["x_layad"]["queue_ms"].as_f64().expect("queue_ms");
    assert!(
        queue_ms >= cost * 0.5,
        "the waking request waited {queue_ms} ms, the reload took {cost} ms"
    );
    assert!(worker["warmup"].as_array().is_some_and(|w| !w.is_empty()), "{reloaded}");
}
