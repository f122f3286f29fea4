//! `layad::run` in-process, as the binary calls it but with the test's own shutdown future: real
//! worker processes on the fixture checkpoints, a decision answered, then the future completes and
//! `run` returns after draining HTTP and stopping every worker.

use std::time::Duration;

use laya::checkpoint::find_in_hf_cache;
use laya::routing::CheckpointName;
use layad::RunOptions;
use layad_config::{CheckpointSource, Config, Device};
use layad_system_tests::goldens::{fixtures_dir, golden_body};
use layad_system_tests::http::{get, post_json};
use layad_system_tests::{bin_dir, free_port, wait_until_ready};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_serves_until_its_shutdown_future_completes() {
    let sockets = tempfile::tempdir().expect("tempdir");
    let mut config = Config::default();
    config.server.listen = format!("127.0.0.1:{}", free_port()).parse().expect("addr");
    let cache = fixtures_dir().join("hf-cache/hub");
    for name in CheckpointName::ALL {
        let location = find_in_hf_cache(&cache, name).expect("fixture checkpoint");
        if let Some(source) = config.checkpoints.source_mut(name) {
            *source = CheckpointSource::Directory(location.dir);
        }
    }
    config.workers.binary_dir = Some(bin_dir().to_path_buf());
    config.workers.socket_dir = Some(sockets.path().join("sockets"));
    config.pools[0].device = Device::Cpu;
    config.pools[0].threads = 1;
    let addr = config.server.listen;

    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(layad::run(config, RunOptions::default(), async {
        let _ = stopped.await;
    }));
    assert!(wait_until_ready(addr, Duration::from_secs(120)).await, "not ready");
    let answer = post_json(
        addr,
        "/v1/systemone",
        golden_body("multi_five_questions_mixed").as_bytes(),
    )
    .await
    .expect("answer");
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(answer.json()["x_layad"]["pool"], "gpu", "{}", answer.text());
    let health = get(addr, "/health").await.expect("health").json();
    let pid = health["pools"][0]["workers"][0]["pid"].as_i64().expect("worker pid") as i32;

    let _ = stop.send(());
    let report = tokio::time::timeout(Duration::from_secs(60), server)
        .await
        .expect("run returns after its shutdown future")
        .expect("run task")
        .expect("run");
    assert!(report.drained && report.abandoned_connections == 0, "{report:?}");
    assert!(get(addr, "/livez").await.is_err(), "still listening");
    // The worker was stopped and reaped: its pid no longer exists.
    let worker = nix::unistd::Pid::from_raw(pid);
    assert!(
        nix::sys::signal::kill(worker, None).is_err(),
        "worker {pid} outlived run"
    );
}
