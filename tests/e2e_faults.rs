//! Process faults for real: workers are SIGKILLed every few seconds while 32 clients keep sending
//! requests, and no request is lost — every one is answered 200 with upstream's answer. A worker that
//! exits saying it cannot run here (device unavailable, configuration refused) is not restarted.
//! A pool whose workers all die at once answers what it lost with a retryable 503, never a 500.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use laya::upstream::Upstream;
use layad_proto::{EXIT_CONFIG_REFUSED, EXIT_DEVICE_UNAVAILABLE};
use layad_system_tests::goldens::goldens;
use layad_system_tests::{Server, get, json_differences, post_json};

const CONFIG: &str = r#"
[server]
request_timeout = "60s"
diagnostics = false   # answers compared with upstream's

[[pool]]
name = "cpu"
device = "cpu"
workers = 2
threads = 1
queue_capacity = 256

[workers]
restart_backoff_initial = "100ms"
"#;

const CLIENTS: usize = 32;
const DURATION: Duration = Duration::from_secs(20);
const KILL_EVERY: Duration = Duration::from_secs(3);

/// Golden requests small enough to keep the load going: (body, upstream response).
fn workload() -> Vec<(String, serde_json::Value)> {
    let golden = goldens(Upstream::default(), "cases.json");
    golden["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .filter(|c| c["status"] == 200 && c["rows"].as_array().is_some_and(|r| !r.is_empty() && r.len() <= 2))
        .filter_map(|c| {
            let response = serde_json::from_str(c["response"].as_str()?).ok()?;
            Some((c["body"].as_str()?.to_owned(), response))
        })
        .take(24)
        .collect()
}

/// Pids of the workers `/health` reports as running.
async fn worker_pids(server: &Server) -> Vec<i32> {
    let Ok(health) = get(server.addr, "/health").await else {
        return Vec::new();
    };
    let health = health.json();
    let mut pids = Vec::new();
    for pool in health["pools"].as_array().into_iter().flatten() {
        for worker in pool["workers"].as_array().into_iter().flatten() {
            if let Some(pid) = worker["pid"].as_i64().filter(|_| worker["state"] == "ready") {
                pids.push(pid as i32);
            }
        }
    }
    pids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killing_workers_under_load_loses_no_request() {
    let mut server = Server::start(CONFIG, &[]);
    server.wait_ready(Duration::from_secs(120)).await;
    let workload = Arc::new(workload());
    assert!(workload.len() >= 10, "not enough small golden cases");
    let stop = Arc::new(AtomicBool::new(false));
    let answered = Arc::new(AtomicUsize::new(0));
    let addr = server.addr;

    let mut clients = Vec::new();
    for client in 0..CLIENTS {
        let (workload, stop, answered) = (Arc::clone(&workload), Arc::clone(&stop), Arc::clone(&answered));
        clients.push(tokio::spawn(async move {
            let mut failures = Vec::new();
            let mut i = client;
            while !stop.load(Ordering::Relaxed) {
                let (body, upstream) = &workload[i % workload.len()];
                i += 1;
                match post_json(addr, "/v1/systemone", body.as_bytes()).await {
                    Ok(r) if r.status == 200 => {
                        let problems = json_differences(&r.json(), upstream);
                        if !problems.is_empty() {
                            failures.push(problems.join("; "));
                        }
                        answered.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(r) => failures.push(format!("status {}: {}", r.status, r.text())),
                    Err(e) => failures.push(format!("transport error: {e}")),
                }
            }
            failures
        }));
    }

    let start = Instant::now();
    let mut kills = 0;
    while start.elapsed() < DURATION {
        tokio::time::sleep(KILL_EVERY).await;
        if let Some(pid) = worker_pids(&server).await.first() {
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(*pid), nix::sys::signal::Signal::SIGKILL)
                .expect("kill worker");
            kills += 1;
        }
    }
    stop.store(true, Ordering::Relaxed);
    let mut failures = Vec::new();
    for client in clients {
        failures.extend(client.await.expect("client task"));
    }
    let answered = answered.load(Ordering::Relaxed);
    println!("{answered} requests answered while {kills} workers were killed");
    assert!(kills >= 4, "only {kills} workers were killed");
    assert!(
        failures.is_empty(),
        "{} requests failed, e.g. {:?}\n{}",
        failures.len(),
        &failures[..failures.len().min(5)],
        server.log()
    );
    assert!(answered > CLIENTS, "only {answered} requests were answered");

    // The restarts are visible in /health and /metrics.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let health = get(server.addr, "/health").await.expect("health").json();
    let restarts: u64 = health["pools"][0]["workers"]
        .as_array()
        .expect("workers")
        .iter()
        .map(|w| w["restarts"].as_u64().unwrap_or(0))
        .sum();
    assert!(
        restarts >= kills as u64,
        "/health counts {restarts} restarts for {kills} kills: {health}"
    );
    let metrics = get(server.addr, "/metrics").await.expect("metrics").text();
    let counted: f64 = metrics
        .lines()
        .filter(|l| l.starts_with("layad_worker_restarts_total"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert!(
        counted >= kills as f64,
        "/metrics counts {counted} restarts for {kills} kills:\n{metrics}"
    );
    assert_eq!(
        server.terminate(Duration::from_secs(60)).code(),
        Some(0),
        "{}",
        server.log()
    );
}

/// Every worker of the pool SIGKILLed at once, under load: a job whose retry lands on the other
/// dying worker has nothing left to run it. That is the server's loss, not the request's fault: it
/// answers 503 with `Retry-After` (a client or balancer asks again; decisions are pure), never a
/// 500, and the pool serves again once its workers are back.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pool_whose_workers_all_die_at_once_answers_retryable_503s_not_500s() {
    let mut server = Server::start(CONFIG, &[]);
    server.wait_ready(Duration::from_secs(120)).await;
    let workload = Arc::new(workload());
    let stop = Arc::new(AtomicBool::new(false));
    let addr = server.addr;
    let mut clients = Vec::new();
    for client in 0..CLIENTS {
        let (workload, stop) = (Arc::clone(&workload), Arc::clone(&stop));
        clients.push(tokio::spawn(async move {
            let (mut answered, mut refusals) = (0usize, Vec::new());
            let mut i = client;
            while !stop.load(Ordering::Relaxed) {
                let (body, _) = &workload[i % workload.len()];
                i += 1;
                match post_json(addr, "/v1/systemone", body.as_bytes()).await {
                    Ok(r) if r.status == 200 => answered += 1,
                    Ok(r) => refusals.push((r.status, r.header("retry-after").is_some(), r.text())),
                    Err(e) => refusals.push((0, false, format!("transport error: {e}"))),
                }
            }
            (answered, refusals)
        }));
    }
    let mut kills = 0;
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let pids = worker_pids(&server).await;
        for pid in &pids {
            // Both at once: whichever job is retried finds the other worker dying too.
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(*pid), nix::sys::signal::Signal::SIGKILL);
        }
        kills += pids.len();
        server.wait_ready(Duration::from_secs(60)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, Ordering::Relaxed);
    let (mut answered, mut refusals) = (0, Vec::new());
    for client in clients {
        let (a, r) = client.await.expect("client task");
        answered += a;
        refusals.extend(r);
    }
    println!(
        "{answered} answered, {} refused while {kills} workers were killed",
        refusals.len()
    );
    assert!(kills >= 4, "only {kills} workers were killed");
    let wrong: Vec<_> = refusals
        .iter()
        .filter(|(status, retry_after, _)| *status != 503 || !retry_after)
        .collect();
    assert!(
        wrong.is_empty(),
        "not a retryable 503: {:?}\n{}",
        &wrong[..wrong.len().min(5)],
        server.log()
    );
    assert!(answered > CLIENTS, "only {answered} requests were answered");
    // Serving again after the last restart.
    let (body, _) = &workload[0];
    let after = post_json(addr, "/v1/systemone", body.as_bytes())
        .await
        .expect("request");
    assert_eq!(after.status, 200, "{}", after.text());
}

/// Starts layad with one pool whose worker binary is a script that logs an error line as the real
/// workers do and exits with `code`, counting its starts; returns `/health` once the pool is
/// reported unavailable or its worker restarted three times, a second later, and the start count.
async fn a_worker_exiting_with(code: i32) -> (serde_json::Value, usize) {
    let fake = tempfile::tempdir().expect("tempdir");
    let starts = fake.path().join("starts");
    let script = format!(
        "#!/bin/sh\necho start >> '{}'\necho '{{\"level\":\"ERROR\",\"fields\":{{\"message\":\"layad-worker-gpu failed\",\"error\":\"refuses with {code}\"}}}}' >&2\nexit {code}\n",
        starts.display()
    );
    let binary = fake.path().join("layad-worker-gpu");
    std::fs::write(&binary, script).expect("write fake worker");
    std::fs::set_permissions(&binary, std::os::unix::fs::PermissionsExt::from_mode(0o755)).expect("chmod");
    let config = "[[pool]]\nname = \"only\"\ndevice = \"cpu\"\n\n[workers]\nrestart_backoff_initial = \"100ms\"\n";
    let binary_dir = fake.path().display().to_string();
    let mut server = Server::start(config, &[("LAYAD_WORKERS__BINARY_DIR", &binary_dir)]);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(response) = get(server.addr, "/health").await {
            let health = response.json();
            let pool = &health["pools"][0];
            if pool["unavailable"].is_string() || pool["workers"][0]["restarts"].as_u64() >= Some(3) {
                break;
            }
        }
        assert!(Instant::now() < deadline, "no outcome within 60 s:\n{}", server.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Long enough for several restarts at 100 ms backoff, had there been any.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let health = get(server.addr, "/health").await.expect("health").json();
    let count = std::fs::read_to_string(&starts).unwrap_or_default().lines().count();
    assert_eq!(
        server.terminate(Duration::from_secs(30)).code(),
        Some(0),
        "{}",
        server.log()
    );
    (health, count)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_cannot_run_here_is_not_restarted_and_the_pool_says_why() {
    for code in [EXIT_CONFIG_REFUSED, EXIT_DEVICE_UNAVAILABLE] {
        let (health, starts) = a_worker_exiting_with(code).await;
        let pool = &health["pools"][0];
        assert_eq!(starts, 1, "exit {code} must not be restarted: {health}");
        assert_eq!(
            pool["unavailable"].as_str(),
            Some(format!("layad-worker-gpu failed: refuses with {code}").as_str()),
            "{health}"
        );
        assert_eq!(pool["workers"][0]["state"], "failed", "{health}");
        assert_eq!(pool["workers"][0]["restarts"], 0, "{health}");
    }
    // The control: any other failure is a crash, restarted with backoff.
    let (health, starts) = a_worker_exiting_with(1).await;
    assert!(starts >= 4, "exit 1 is restarted: {starts} starts, {health}");
    assert!(health["pools"][0]["unavailable"].is_null(), "{health}");
}
