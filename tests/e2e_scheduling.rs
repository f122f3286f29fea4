//! Heterogeneous pools with real workers: shape routing with its recorded reason, spill from a
//! saturated short pool, an idle pool taking over a job queued on a busy one, admission by deadline
//! (503 with Retry-After at once, not a timeout), shortest-first order
//! inside a pool (and arrival order when configured), dynamic batching that does not change answers,
//! and live reloads that add and remove workers under load or refuse a broken file.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use laya::upstream::Upstream;
use layad_system_tests::goldens::{golden_body, goldens};
use layad_system_tests::{Server, deliberate_difference, get, json_differences, post_json};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::Value;

const SHORT_AND_GENERAL: &str = r#"
[server]
request_timeout = "60s"

[[pool]]
name = "general"
device = "cpu"
workers = 1
threads = 1

[[pool]]
name = "short"
device = "cpu"
workers = 1
threads = 1
max_questions = 1
max_tokens = 64
"#;

/// A request with one noul question whose state has `words` words.
fn noul(words: usize) -> String {
    let state = "please refund the order ".repeat(words);
    serde_json::json!({"state": state.trim_end(), "questions": {"q": {"type": "noul", "instructions": "Is this a refund request?"}}})
        .to_string()
}

/// The golden request with five questions.
fn five_questions() -> String {
    golden_body("multi_five_questions_mixed")
}

async fn decide(server: &Server, body: &str) -> Value {
    let response = post_json(server.addr, "/v1/systemone", body.as_bytes())
        .await
        .expect("post");
    assert_eq!(response.status, 200, "{}", response.text());
    response.json()
}

async fn health(server: &Server) -> Value {
    get(server.addr, "/health").await.expect("health").json()
}

/// Starts layad with `config` and waits until every worker of every pool is ready.
async fn start_all_ready(config: &str) -> Server {
    let mut server = Server::start(config, &[]);
    server.wait_ready(Duration::from_secs(120)).await;
    let start = Instant::now();
    while health(&server).await["status"] != "ok" {
        assert!(start.elapsed() < Duration::from_secs(120), "{}", server.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    server
}

/// The pid of the first worker of `pool`.
async fn worker_pid(server: &Server, pool: &str) -> i32 {
    let health = health(server).await;
    let pools = health["pools"].as_array().expect("pools");
    let pool = pools.iter().find(|p| p["name"] == pool).expect("pool");
    pool["workers"][0]["pid"].as_i64().expect("pid") as i32
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_go_to_the_pool_their_shape_prefers_and_say_why() {
    let server = start_all_ready(SHORT_AND_GENERAL).await;

    let short = decide(&server, &noul(4)).await;
    assert!(short["usage"]["input_tokens"].as_u64().expect("tokens") <= 64);
    let block = &short["x_layad"];
    assert_eq!(
        (block["pool"].as_str(), block["route"].as_str()),
        (Some("short"), Some("preferred")),
        "{block}"
    );
    let reason = block["reason"].as_str().expect("reason");
    assert!(
        reason.contains("fits 'short'") && reason.contains("most specialised"),
        "{reason}"
    );
    assert_eq!(block["device"], "cpu");
    assert_eq!(block["batch_rows"], 1);

    let multi = decide(&server, &five_questions()).await;
    assert_eq!(multi["x_layad"]["pool"], "general", "{}", multi["x_layad"]);
    assert_eq!(
        multi["x_layad"]["reason"],
        "'general' is the only pool that holds 5 questions of up to 64 tokens",
    );

    let long = decide(&server, &noul(30)).await;
    assert!(long["usage"]["input_tokens"].as_u64().expect("tokens") > 64);
    assert_eq!(long["x_layad"]["pool"], "general", "{}", long["x_layad"]);
    assert!(
        long["x_layad"]["reason"]
            .as_str()
            .expect("reason")
            .contains("only pool")
    );

    let health = health(&server).await;
    let routed = |pool: usize| health["pools"][pool]["routed"].clone();
    assert_eq!(routed(0)["preferred"], 2, "{health}");
    assert_eq!(routed(1)["preferred"], 1, "{health}");
    assert_eq!(health["pools"][1]["takes"]["max_questions"], 1);
    // Each pool's device speed as the scheduler estimates it (1 request: nothing to change it).
    let speed = &health["pools"][1]["speed"];
    assert!(
        speed["factor"].as_f64().is_some() && speed["slowed"].is_boolean(),
        "{speed}"
    );
    let metrics = get(server.addr, "/metrics").await.expect("metrics").text();
    assert!(
        metrics.contains(r#"layad_routed_total{pool="short",route="preferred"} 1"#),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"layad_pool_speed_factor{pool="short"} "#)
            && metrics.contains(r#"layad_pool_speed_changes_total{pool="short"} "#),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_saturated_short_pool_spills_and_nothing_lands_where_it_does_not_fit() {
    let server = start_all_ready(SHORT_AND_GENERAL).await;
    let server = Arc::new(server);
    // Freeze the short pool's worker: what it holds cannot finish, so its backlog only grows.
    let short_worker = Pid::from_raw(worker_pid(&server, "short").await);
    kill(short_worker, Signal::SIGSTOP).expect("SIGSTOP");
    let mut stuck = Vec::new();
    let mut spilled = None;
    for i in 0..8 {
        let server = Arc::clone(&server);
        let mut request = tokio::spawn(async move { decide(&server, &noul(2 + i % 3)).await });
        // An answer within a second cannot have come from the frozen pool.
        match tokio::time::timeout(Duration::from_secs(1), &mut request).await {
            Ok(answer) => {
                spilled = Some(answer.expect("task"));
                break;
            }
            Err(_) => stuck.push(request),
        }
    }
    let spilled = spilled.expect("a short request spilled once the short pool backed up");
    let block = &spilled["x_layad"];
    assert_eq!(
        (block["pool"].as_str(), block["route"].as_str()),
        (Some("general"), Some("spilled")),
        "{block}"
    );
    assert!(
        block["reason"]
            .as_str()
            .expect("reason")
            .starts_with("spilled from 'short'"),
        "{block}"
    );
    assert!(!stuck.is_empty(), "the first request waits on the frozen short pool");
    // Multi-question and long requests still go to the general pool only.
    let multi = decide(&server, &five_questions()).await;
    assert_eq!(multi["x_layad"]["pool"], "general");
    kill(short_worker, Signal::SIGCONT).expect("SIGCONT");
    for request in stuck {
        let answer = request.await.expect("task");
        assert_eq!(
            answer["x_layad"]["pool"], "short",
            "queued work finishes where it was queued"
        );
    }
    let health = health(&server).await;
    assert!(
        health["pools"][1]["routed"]["spilled_out"].as_u64() >= Some(1),
        "{health}"
    );
    assert!(
        health["pools"][0]["routed"]["spilled_in"].as_u64() >= Some(1),
        "{health}"
    );
}

/// The pool `name` in `/health`.
async fn pool_health(server: &Server, name: &str) -> Value {
    let health = health(server).await;
    let pools = health["pools"].as_array().expect("pools");
    pools.iter().find(|p| p["name"] == name).expect("pool").clone()
}

/// Waits until `/health` says pool `name` has `key` (`queue_depth`, `in_flight`) at `value`.
async fn wait_for_pool(server: &Server, name: &str, key: &str, value: u64) {
    let start = Instant::now();
    while pool_health(server, name).await[key].as_u64() != Some(value) {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{name}.{key} never reached {value}: {}",
            pool_health(server, name).await
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Sends `body` in its own task; the task answers with the moment the answer arrived and the answer.
fn send_timed(server: &Arc<Server>, body: String) -> tokio::task::JoinHandle<(Instant, Value)> {
    let server = Arc::clone(server);
    tokio::spawn(async move {
        let answer = decide(&server, &body).await;
        (Instant::now(), answer)
    })
}

/// The golden case `name`'s upstream answer.
fn golden_answer(name: &str) -> Value {
    let cases = goldens(Upstream::default(), "cases.json");
    let case = cases["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .find(|c| c["name"] == name)
        .expect("case")
        .clone();
    serde_json::from_str(case["response"].as_str().expect("response")).expect("golden JSON")
}

/// `answer` without its `x_layad` block agrees with the golden case `name` (within 1e-4).
fn assert_golden(mut answer: Value, name: &str) {
    answer.as_object_mut().and_then(|o| o.remove("x_layad"));
    let problems = json_differences(&answer, &golden_answer(name));
    assert!(problems.is_empty(), "{name}: {problems:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_request_queued_behind_long_ones_is_answered_first_unless_order_is_arrival() {
    // Twelve questions of up to 73 tokens, and one question of 37 tokens. With `max_rows = 12`
    // every job runs in a forward of its own, so the queue's order is the order of the answers
    // (give or take the one answered just before or after the short one: answers race to the client).
    const LONG: &str = "multi_twelve_questions_mixed";
    const SHORT: &str = "choice_one_option_list";
    const QUEUED: usize = 12;
    for order in ["shortest-first", "arrival"] {
        // Aging 100: a long job keeps its place against later short ones only after waiting 100
        // times its own estimate (tens of seconds here), far longer than this test takes to queue
        // them. (Not more: a priority is never later than the deadline minus the estimate, and at
        // 1000 the 60 s timeout would cap every job's priority and give back arrival order.)
        let config = format!(
            "[server]\nrequest_timeout = \"60s\"\n\n[[pool]]\nname = \"cpu\"\ndevice = \"cpu\"\nworkers = 1\nthreads = 1\nmax_rows = 12\n\n[scheduling]\norder = \"{order}\"\naging = 100\n"
        );
        let server = Arc::new(start_all_ready(&config).await);
        let worker = Pid::from_raw(worker_pid(&server, "cpu").await);
        kill(worker, Signal::SIGSTOP).expect("SIGSTOP");
        // The first long job is on the frozen worker; more queue behind it, then a short one.
        let running = send_timed(&server, golden_body(LONG));
        wait_for_pool(&server, "cpu", "in_flight", 1).await;
        let queued: Vec<_> = (0..QUEUED).map(|_| send_timed(&server, golden_body(LONG))).collect();
        wait_for_pool(&server, "cpu", "queue_depth", QUEUED as u64).await;
        let short = send_timed(&server, golden_body(SHORT));
        wait_for_pool(&server, "cpu", "queue_depth", QUEUED as u64 + 1).await;
        kill(worker, Signal::SIGCONT).expect("SIGCONT");

        let (short_at, short_answer) = short.await.expect("task");
        assert_golden(short_answer, SHORT);
        let (_, first) = running.await.expect("task");
        assert_golden(first, LONG);
        let mut answered_before_short = 0;
        for long in queued {
            let (long_at, answer) = long.await.expect("task");
            answered_before_short += usize::from(long_at < short_at);
            assert_golden(answer, LONG);
        }
        match order {
            "shortest-first" => assert!(
                answered_before_short <= 1,
                "{answered_before_short} long jobs queued before the short one were answered first"
            ),
            _ => assert!(
                answered_before_short >= QUEUED - 1,
                "arrival order: only {answered_before_short} of {QUEUED} long jobs went first"
            ),
        }
        let waits = &pool_health(&server, "cpu").await["queue_wait_ms"];
        assert_eq!(waits["multi-128"]["jobs"], QUEUED + 1, "{waits}");
        assert_eq!(waits["single-64"]["jobs"], 1, "{waits}");
        let metrics = get(server.addr, "/metrics").await.expect("metrics").text();
        assert!(
            metrics.contains(r#"layad_queue_wait_seconds_count{pool="cpu",class="single-64"} 1"#),
            "{metrics}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_cannot_finish_before_its_timeout_is_refused_at_once_with_retry_after() {
    const CASE: &str = "choice_one_option_list";
    let config =
        "[server]\nrequest_timeout = \"2s\"\n\n[[pool]]\nname = \"cpu\"\ndevice = \"cpu\"\nworkers = 1\nthreads = 1\n";
    let server = Arc::new(start_all_ready(config).await);
    let post = |server: &Arc<Server>| {
        let server = Arc::clone(server);
        tokio::spawn(async move {
            post_json(server.addr, "/v1/systemone", golden_body(CASE).as_bytes())
                .await
                .expect("post")
        })
    };
    assert_golden(decide(&server, &golden_body(CASE)).await, CASE);

    // A job on a frozen worker overruns its estimate (tens of milliseconds) and then its own 2 s
    // deadline: that one times out, as before.
    let worker = Pid::from_raw(worker_pid(&server, "cpu").await);
    kill(worker, Signal::SIGSTOP).expect("SIGSTOP");
    let stuck = post(&server);
    wait_for_pool(&server, "cpu", "in_flight", 1).await;
    let timed_out = stuck.await.expect("task");
    assert_eq!(timed_out.status, 503, "{}", timed_out.text());
    assert!(timed_out.detail().contains("timed out"), "{}", timed_out.text());

    // The worker is now seconds past its estimate and expected to stay busy as long again: a new
    // request could not finish within its 2 s, so it is refused at once instead of timing out.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let asked = Instant::now();
    let refused = post(&server).await.expect("task");
    let waited = asked.elapsed();
    assert_eq!(refused.status, 503, "{}", refused.text());
    assert!(
        refused.detail().contains("would finish in about") && refused.detail().contains("after its timeout"),
        "{}",
        refused.text()
    );
    let retry_after: u64 = refused
        .header("retry-after")
        .expect("Retry-After")
        .parse()
        .expect("whole seconds");
    assert!((1..=60).contains(&retry_after), "Retry-After: {retry_after}");
    assert!(waited < Duration::from_secs(2), "refused only after {waited:?}");
    assert_eq!(
        pool_health(&server, "cpu").await["queue_depth"],
        0,
        "nothing queued for it"
    );

    // Once the worker is back, requests are admitted again and answered as upstream does.
    kill(worker, Signal::SIGCONT).expect("SIGCONT");
    wait_for_pool(&server, "cpu", "in_flight", 0).await;
    let start = Instant::now();
    let answer = loop {
        let response = post(&server).await.expect("task");
        if response.status == 200 {
            break response.json();
        }
        // The stalled forward's time moved the estimate; it is back within the timeout at once,
        // but allow the worker a moment.
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "never admitted again: {}",
            response.text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_golden(answer, CASE);
    let metrics = get(server.addr, "/metrics").await.expect("metrics").text();
    assert!(metrics.contains("status=\"503\""), "{metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_pool_takes_over_a_job_queued_on_a_busy_one() {
    let server = Arc::new(start_all_ready(SHORT_AND_GENERAL).await);
    let general = Pid::from_raw(worker_pid(&server, "general").await);
    let short = Pid::from_raw(worker_pid(&server, "short").await);
    kill(general, Signal::SIGSTOP).expect("SIGSTOP");
    kill(short, Signal::SIGSTOP).expect("SIGSTOP");
    // Both workers hold a job they cannot finish, the general one for longer: a short request is
    // then expected to finish sooner on the short pool and queues there.
    let long = send_timed(&server, noul(30));
    wait_for_pool(&server, "general", "in_flight", 1).await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    let first_short = send_timed(&server, noul(2));
    wait_for_pool(&server, "short", "in_flight", 1).await;
    let queued_short = send_timed(&server, noul(3));
    wait_for_pool(&server, "short", "queue_depth", 1).await;
    // The general worker finishes its job, finds nothing in its own queue and takes the one
    // waiting behind the stalled short worker.
    kill(general, Signal::SIGCONT).expect("SIGCONT");
    let (_, answer) = tokio::time::timeout(Duration::from_secs(30), queued_short)
        .await
        .expect("answered while the short worker is still stopped")
        .expect("task");
    let block = &answer["x_layad"];
    assert_eq!(
        (block["pool"].as_str(), block["route"].as_str()),
        (Some("general"), Some("spilled")),
        "{block}"
    );
    let reason = block["reason"].as_str().expect("reason");
    assert!(
        reason.starts_with("taken over from 'short' (expected to start in ") && reason.contains("by 'general'"),
        "{reason}"
    );
    kill(short, Signal::SIGCONT).expect("SIGCONT");
    assert_eq!(first_short.await.expect("task").1["x_layad"]["pool"], "short");
    assert_eq!(long.await.expect("task").1["x_layad"]["pool"], "general");
    let (short_pool, general_pool) = (
        pool_health(&server, "short").await,
        pool_health(&server, "general").await,
    );
    assert_eq!(short_pool["routed"]["taken_by_others"], 1, "{short_pool}");
    assert_eq!(general_pool["routed"]["taken_from_others"], 1, "{general_pool}");
    let metrics = get(server.addr, "/metrics").await.expect("metrics").text();
    assert!(
        metrics.contains(r#"layad_taken_over_total{pool="general",direction="in"} 1"#),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batched_answers_agree_with_upstream() {
    let config = r#"
[server]
request_timeout = "60s"

[[pool]]
name = "batching"
device = "cpu"
workers = 1
threads = 1
batch_wait = "30ms"
"#;
    let mut server = Server::start(config, &[]);
    server.wait_ready(Duration::from_secs(120)).await;
    let golden = goldens(Upstream::default(), "cases.json");
    let cases: Vec<(String, Value)> = golden["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .filter(|c| {
            c["status"] == 200 && c["checkpoint"] == "english" && c["rows"].as_array().is_some_and(|r| !r.is_empty())
        })
        .filter(|c| {
            c["name"]
                .as_str()
                .is_some_and(|name| deliberate_difference(name, Upstream::default()).is_none())
        })
        .filter_map(|c| {
            let response = serde_json::from_str(c["response"].as_str()?).ok()?;
            Some((c["body"].as_str()?.to_owned(), response))
        })
        .collect();
    assert!(cases.len() >= 20, "{} cases", cases.len());
    let addr = server.addr;
    let answers = futures_join(cases.iter().map(|(body, _)| {
        let body = body.clone();
        async move { post_json(addr, "/v1/systemone", body.as_bytes()).await.expect("post") }
    }))
    .await;
    let mut batched = 0;
    for ((_, upstream), response) in cases.iter().zip(answers) {
        assert_eq!(response.status, 200, "{}", response.text());
        let mut ours = response.json();
        let block = ours.as_object_mut().and_then(|o| o.remove("x_layad")).expect("x_layad");
        if block["batch_rows"].as_u64() > Some(1) {
            batched += 1;
        }
        let problems = json_differences(&ours, upstream);
        assert!(problems.is_empty(), "{problems:?}");
    }
    assert!(batched > 0, "no request shared a forward pass");
    let health = health(&server).await;
    assert!(health["pools"][0]["batches"]["forwards"].as_u64() > Some(0), "{health}");
}

/// Runs the futures concurrently (one task each) and returns their outputs in order.
async fn futures_join<F>(futures: impl Iterator<Item = F>) -> Vec<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    let tasks: Vec<_> = futures.map(tokio::spawn).collect();
    let mut out = Vec::new();
    for task in tasks {
        out.push(task.await.expect("task"));
    }
    out
}

fn one_pool(workers: u32) -> String {
    format!(
        r#"
[server]
request_timeout = "60s"

[[pool]]
name = "cpu"
device = "cpu"
workers = {workers}
threads = 1
"#
    )
}

/// Keeps sending requests until stopped; counts answers and failures.
fn load(server: &Server, stop: Arc<AtomicBool>) -> (tokio::task::JoinHandle<()>, Arc<AtomicUsize>, Arc<AtomicUsize>) {
    let (ok, failed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (addr, body) = (server.addr, five_questions());
    let counters = (Arc::clone(&ok), Arc::clone(&failed));
    let task = tokio::spawn(async move {
        let mut clients = tokio::task::JoinSet::new();
        for _ in 0..4 {
            let (stop, body, ok, failed) = (
                Arc::clone(&stop),
                body.clone(),
                Arc::clone(&counters.0),
                Arc::clone(&counters.1),
            );
            clients.spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    match post_json(addr, "/v1/systemone", body.as_bytes()).await {
                        Ok(r) if r.status == 200 => {
                            ok.fetch_add(1, Ordering::Relaxed);
                        }
                        other => {
                            // What failed goes to stderr: a count alone cannot say why.
                            eprintln!("load: request failed: {other:?}");
                            failed.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            });
        }
        while clients.join_next().await.is_some() {}
    });
    (task, ok, failed)
}

/// A directory holding a `layad-worker-gpu` that waits half a second before it runs the real one:
/// a worker on the tiny fixture checkpoints is otherwise ready within one `/health` poll, too soon
/// to be seen starting.
fn slow_starting_workers() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    let real = layad_system_tests::bin_dir().join("layad-worker-gpu");
    let script = format!("#!/bin/sh\nsleep 0.5\nexec '{}' \"$@\"\n", real.display());
    let binary = dir.path().join("layad-worker-gpu");
    std::fs::write(&binary, script).expect("write the slow worker");
    std::fs::set_permissions(&binary, std::os::unix::fs::PermissionsExt::from_mode(0o755)).expect("chmod");
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reloads_add_workers_after_warmup_remove_them_without_loss_and_refuse_broken_files() {
    let slow = slow_starting_workers();
    let one_pool = |workers| {
        format!(
            "[workers]\nbinary_dir = {:?}\n{}",
            slow.path().display().to_string(),
            one_pool(workers)
        )
    };
    let mut server = Server::start(&one_pool(1), &[]);
    server.wait_ready(Duration::from_secs(120)).await;
    let config = server.dir.path().join("layad.toml");
    let stop = Arc::new(AtomicBool::new(false));
    let (clients, ok, failed) = load(&server, Arc::clone(&stop));

    // Scale up: the new worker is shown, but never as ready before its warm-up is reported.
    std::fs::write(&config, one_pool(2)).expect("write config");
    let (reloaded, output) = server.reload(&config);
    assert!(reloaded, "{output}");
    assert!(output.contains("pool cpu: 1 → 2 workers"), "{output}");
    let start = Instant::now();
    let mut seen_starting = false;
    loop {
        let health = health(&server).await;
        let workers = health["pools"][0]["workers"].as_array().expect("workers").clone();
        if let Some(new) = workers.iter().find(|w| w["id"] == "cpu/1") {
            let warm = new["warmup"].as_array().is_some_and(|w| !w.is_empty());
            match new["state"].as_str() {
                Some("ready") => {
                    assert!(warm, "ready before its warm-up was reported: {new}");
                    break;
                }
                _ => {
                    assert!(!warm, "{new}");
                    seen_starting = true;
                }
            }
        }
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "the new worker never became ready"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(seen_starting, "the new worker was listed while it started");

    // Scale down under load: the removed worker drains; no request fails.
    std::fs::write(&config, one_pool(1)).expect("write config");
    kill(Pid::from_raw(server.pid() as i32), Signal::SIGHUP).expect("SIGHUP");
    let start = Instant::now();
    loop {
        let health = health(&server).await;
        if health["pools"][0]["workers"].as_array().map(Vec::len) == Some(1) {
            assert_eq!(health["reload"]["ok"], true, "{health}");
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "worker cpu/1 never left: {health}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let served_before = ok.load(Ordering::Relaxed);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        ok.load(Ordering::Relaxed) > served_before,
        "still serving with one worker: {} failed; {}\n{}",
        failed.load(Ordering::Relaxed),
        health(&server).await,
        server.log()
    );

    // Any other change replaces the pool: the new one warms up while the old one serves.
    std::fs::write(
        &config,
        one_pool(1).replace("threads = 1", "threads = 1\nbatch_wait = \"1ms\""),
    )
    .expect("write");
    let (reloaded, output) = server.reload(&config);
    assert!(reloaded, "{output}");
    assert!(output.contains("pool cpu: replaced"), "{output}");
    let start = Instant::now();
    loop {
        let health = health(&server).await;
        let pools = health["pools"].as_array().expect("pools");
        if pools.len() == 1 && pools[0]["workers"][0]["state"] == "ready" {
            break;
        }
        assert!(pools.len() <= 2, "{health}");
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "the old pool never left: {health}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // A broken file changes nothing and says why, both from `layad reload` and on SIGHUP.
    std::fs::write(&config, format!("{}\nworkerz = 3\n", one_pool(3))).expect("write config");
    let (reloaded, output) = server.reload(&config);
    assert!(!reloaded, "{output}");
    assert!(output.contains("workerz"), "{output}");
    kill(Pid::from_raw(server.pid() as i32), Signal::SIGHUP).expect("SIGHUP");
    let start = Instant::now();
    let health = loop {
        let health = health(&server).await;
        if health["reload"]["ok"] == false {
            break health;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "{health}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        health["reload"]["error"].as_str().expect("error").contains("workerz"),
        "{health}"
    );
    assert_eq!(health["pools"][0]["workers"].as_array().map(Vec::len), Some(1));

    stop.store(true, Ordering::Relaxed);
    clients.await.expect("clients");
    assert_eq!(failed.load(Ordering::Relaxed), 0, "requests failed during the reloads");
}
