//! An engine's facts reach `/health` without a line of code that names them: a fake engine behind
//! the real serving harness reports [`EngineFacts`], the supervisor reads its Describe through the
//! real client, admits the worker to a real [`Pool`], and the HTTP server renders that pool. Every
//! field of the facts, whatever fields the struct has when this runs, must appear in the worker's
//! record under its own name, with the engine's value, between `dtype` and `checkpoints`.

mod http_support;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use laya::routing::CheckpointName;
use layad::backend::{Backend, BackendError, Job, JobOutput};
use layad::pool::{Pool, WorkerReport};
use layad::status::BackendStatus;
use layad_config::{Config, PoolConfig};
use layad_proto::harness::{LoadError, serve};
use layad_proto::{
    CheckedForward, Engine, EngineError, EngineFacts, EngineInfo, GpuInfo, HarnessOptions, LoadedCheckpoint, RowOutput,
    StopReason, WarmupPolicy, WorkerClient,
};

/// Serves `english` on the CPU with one logit per marker, and describes itself with `facts`.
struct FactsEngine {
    facts: EngineFacts,
}

impl Engine for FactsEngine {
    fn describe(&self) -> EngineInfo {
        EngineInfo {
            device: "cpu".into(),
            dtype: "f32".into(),
            checkpoints: vec![LoadedCheckpoint {
                name: "english".into(),
                revision: Some("0123abcd".into()),
                weights_sha256: "sha-of-english".into(),
                vocab_size: 50,
                max_len: 32,
                warmup_len: 32,
            }],
            max_rows: 4,
            max_batch_tokens: 64,
            length_buckets: Vec::new(),
            parity: Vec::new(),
            facts: self.facts.clone(),
        }
    }

    fn forward(&mut self, forward: &CheckedForward) -> Result<Vec<RowOutput>, EngineError> {
        let rows = forward.rows();
        Ok(rows
            .iter()
            .map(|row| RowOutput {
                logits: vec![0.5; row.markers.len()],
                act_probabilities: vec![0.25, 0.75],
            })
            .collect())
    }
}

/// What `/health` shows: one real pool. This test renders status only; no job is ever sent.
struct PoolBackend {
    pool: Arc<Pool>,
}

impl Backend for PoolBackend {
    fn run(&self, job: Job) -> BoxFuture<'static, Result<JobOutput, BackendError>> {
        Box::pin(async move { Err(BackendError::CheckpointUnavailable(job.checkpoint)) })
    }

    fn status(&self) -> BackendStatus {
        BackendStatus {
            pools: vec![self.pool.status()],
        }
    }
}

fn options(socket: &Path) -> HarnessOptions {
    HarnessOptions {
        socket: socket.to_owned(),
        liveness_fd: None,
        requested_device: "cuda:0".into(),
        worker: "facts-worker 1.0".into(),
        warmup: WarmupPolicy {
            short_len: 4,
            multi_rows: 2,
            runs: 1,
        },
        spawn_nonce: String::new(),
    }
}

async fn connect(socket: &Path) -> WorkerClient {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match WorkerClient::connect_uds(socket).await {
            Ok(client) => return client,
            Err(error) if error.is_retryable() && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            Err(error) => panic!("cannot connect: {error}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_engine_fact_reaches_the_workers_health_record_as_the_engine_set_it() {
    // The fields there are today set to what no default gives, so a value lost on the way shows; a
    // field added later flows as its default (the key must still be there), so this test needs no
    // change for it.
    #[allow(
        clippy::needless_update,
        reason = "every field is set today; the update keeps this test unchanged when one is added"
    )]
    let facts = EngineFacts {
        cpu_kernels: Some("facts-test-kernels".into()),
        gpu: Some(GpuInfo {
            name: "Facts Test GPU".into(),
            total_memory_bytes: 12_345_678_901,
            compute_capability: Some((8, 9)),
            tf32: true,
        }),
        device_fallback: Some("cuda:0 unavailable (test); running on cpu".into()),
        ..EngineFacts::default()
    };
    let expected = serde_json::to_value(&facts).expect("facts serialize");
    let expected = expected.as_object().expect("facts are a JSON object");

    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("private").join("worker.sock");
    let engine_facts = facts.clone();
    let load = move || -> Result<FactsEngine, LoadError> { Ok(FactsEngine { facts: engine_facts }) };
    let (stop, stop_rx) = tokio::sync::mpsc::channel(1);
    let worker = tokio::spawn(serve(load, options(&socket), stop_rx));

    let client = connect(&socket).await;
    let info = client.describe().await.expect("describe");
    let report = WorkerReport::from_info(&info).expect("a worker report");
    let mut pool_config = PoolConfig::named("facts");
    pool_config.workers = 1;
    let pool = Pool::new(pool_config, vec![CheckpointName::English]);
    pool.admit(0, client, report);

    let mut config = Config::default();
    config.server.listen = "127.0.0.1:0".parse().expect("addr");
    let backend = Arc::new(PoolBackend { pool }) as Arc<dyn Backend>;
    let server = layad::Server::bind(&config, http_support::checkpoints(), backend)
        .await
        .expect("binds");
    let addr = server.local_addr().expect("local addr");
    let (shutdown, shutdown_rx) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(server.run(async {
        let _ = shutdown_rx.await;
    }));

    let health = http_support::send(addr, &http_support::Request::new("GET", "/health"))
        .await
        .json();
    let record = health["pools"][0]["workers"][0]
        .as_object()
        .unwrap_or_else(|| panic!("no worker record: {health}"));
    assert_eq!(record["state"], "ready", "{health}");
    for (key, value) in expected {
        assert_eq!(record.get(key), Some(value), "fact `{key}` in {health}");
    }
    // Flattened in place: after `dtype`, in the struct's order, before `checkpoints`.
    let keys: Vec<&str> = record.keys().map(String::as_str).collect();
    let dtype = keys.iter().position(|k| *k == "dtype").expect("dtype");
    let facts_keys: Vec<&str> = expected.keys().map(String::as_str).collect();
    assert_eq!(
        keys[dtype + 1..dtype + 1 + facts_keys.len()],
        facts_keys[..],
        "{keys:?}"
    );
    assert_eq!(keys[dtype + 1 + facts_keys.len()], "checkpoints", "{keys:?}");
    // The record keeps the shape `/health` has always had for a GPU.
    assert_eq!(record["gpu"]["compute_capability"], "8.9");

    let _ = shutdown.send(());
    serving.await.expect("server task");
    stop.send(StopReason::Terminate).await.expect("stop");
    worker.await.expect("join").expect("worker stops cleanly");
}
