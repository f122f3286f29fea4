//! Shared by the `http_*` tests: the fixture checkpoints, a backend that answers with upstream's
//! recorded logits, and an in-process server on an ephemeral loopback port. They speak to it with
//! the tests' one raw HTTP/1.1 client, `layad_system_tests::http`.
#![allow(dead_code, unused_imports)] // each test binary uses a different part of this module

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use futures::future::BoxFuture;
use laya::checkpoint::{Checkpoint, find_in_hf_cache};
use laya::decision::RowOutput;
use laya::routing::CheckpointName;
use layad::backend::{Backend, BackendError, Job, JobOutput, PoolAnswer, Route};
use layad::checkpoints::Checkpoints;
use layad::pool::capabilities::Capabilities;
use layad::status::{
    BackendStatus, ClassWaits, JobClass, LoadedCheckpoint, PoolStatus, RouteCounts, SpeedStatus, WorkerState,
    WorkerStatus,
};
use layad_config::{Config, PoolConfig};
use layad_proto::EngineFacts;
use layad_system_tests::goldens::{fixture_json, fixtures_dir};
pub use layad_system_tests::http::{Framing, Request, Response, send};
use serde_json::Value;

fn open_fixture_checkpoints(names: impl Iterator<Item = CheckpointName>) -> Arc<Checkpoints> {
    let cache = fixtures_dir().join("hf-cache/hub");
    let opened = names
        .map(|name| {
            let location = find_in_hf_cache(&cache, name).unwrap_or_else(|e| panic!("{e}"));
            (name, Checkpoint::open(location).unwrap_or_else(|e| panic!("{e}")))
        })
        .collect();
    Arc::new(Checkpoints::from_opened(opened))
}

/// The three fixture checkpoints, opened once per test binary.
pub fn checkpoints() -> Arc<Checkpoints> {
    static OPENED: OnceLock<Arc<Checkpoints>> = OnceLock::new();
    Arc::clone(OPENED.get_or_init(|| open_fixture_checkpoints(CheckpointName::ALL.into_iter())))
}

/// The fixture checkpoints but one, as a server with that checkpoint `"off"` has them.
pub fn checkpoints_except(off: CheckpointName) -> Arc<Checkpoints> {
    open_fixture_checkpoints(CheckpointName::ALL.into_iter().filter(|n| *n != off))
}

fn numbers<T>(v: &Value, f: impl Fn(&Value) -> T) -> Vec<T> {
    v.as_array().expect("list").iter().map(f).collect()
}

type RowKey = (CheckpointName, Vec<u32>, Vec<u32>);

/// Answers every row with the logits upstream recorded for the same checkpoint, ids and markers
/// (cases.json), and softmax(action_logits)[0] as the act probability. Rows it does not know get
/// zeros and are counted in `misses`.
pub struct GoldenBackend {
    rows: HashMap<RowKey, RowOutput>,
    /// Rows answered with zeros because no golden row matched.
    pub misses: AtomicUsize,
    /// Jobs run.
    pub jobs: AtomicUsize,
    /// Whether the one worker reports ready.
    pub ready: AtomicBool,
    /// Answer every job with this error instead, when set.
    pub fail_with: Mutex<Option<BackendError>>,
    /// Wait this long before answering a job.
    pub delay: Mutex<Duration>,
}

impl GoldenBackend {
    pub fn new() -> Self {
        // Both releases' goldens: rows that only 0.4.x builds (option orders, longer rows) too.
        let goldens = [
            fixture_json("goldens/cases.json"),
            fixture_json("goldens-0.4.15/cases.json"),
        ];
        let mut rows = HashMap::new();
        for case in goldens.iter().flat_map(|g| g["cases"].as_array().expect("cases")) {
            let Some(checkpoint) = case["checkpoint"].as_str().and_then(CheckpointName::from_name_or_alias) else {
                continue;
            };
            for row in case["rows"].as_array().expect("rows") {
                let action: Vec<f32> = numbers(&row["action_logits"], |x| x.as_f64().expect("number") as f32);
                let output = RowOutput {
                    logits: numbers(&row["logits"], |x| x.as_f64().expect("number") as f32),
                    act_probabilities: laya::answer::softmax_f32(&action),
                };
                let ids = numbers(&row["ids"], |x| x.as_u64().expect("id") as u32);
                let markers = numbers(&row["markers"], |x| x.as_u64().expect("marker") as u32);
                rows.insert((checkpoint, ids, markers), output);
            }
        }
        Self {
            rows,
            misses: AtomicUsize::new(0),
            jobs: AtomicUsize::new(0),
            ready: AtomicBool::new(true),
            fail_with: Mutex::new(None),
            delay: Mutex::new(Duration::ZERO),
        }
    }
}

impl Backend for GoldenBackend {
    fn run(&self, job: Job) -> BoxFuture<'static, Result<JobOutput, BackendError>> {
        self.jobs.fetch_add(1, Ordering::SeqCst);
        let failure = self.fail_with.lock().expect("lock").clone();
        let delay = *self.delay.lock().expect("lock");
        let outputs: Vec<RowOutput> = job
            .rows
            .iter()
            .map(|row| {
                let key = (job.checkpoint, row.ids.clone(), row.markers.clone());
                self.rows.get(&key).cloned().unwrap_or_else(|| {
                    self.misses.fetch_add(1, Ordering::SeqCst);
                    RowOutput {
                        logits: vec![0.0; row.markers.len()],
                        act_probabilities: vec![0.5, 0.5],
                    }
                })
            })
            .collect();
        Box::pin(async move {
            // tokio's timer has millisecond ticks: even a zero sleep would cost one.
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            if let Some(error) = failure {
                return Err(error);
            }
            Ok(JobOutput {
                answer: PoolAnswer {
                    outputs,
                    pool: "gpu".into(),
                    worker: "gpu-0".into(),
                    device: "cpu".into(),
                    queue_wait: Duration::from_micros(5),
                    device_time: Duration::from_micros(700),
                    batch_rows: 1,
                    taken_over: None,
                },
                route: Route::Preferred,
                reason: "'gpu' is the only pool".into(),
            })
        })
    }

    fn status(&self) -> BackendStatus {
        let ready = self.ready.load(Ordering::SeqCst);
        let checkpoints = checkpoints();
        let worker = WorkerStatus {
            id: "gpu-0".into(),
            pid: Some(4242),
            state: if ready {
                WorkerState::Ready
            } else {
                WorkerState::Starting
            },
            device: ready.then(|| "cpu".to_owned()),
            dtype: ready.then(|| "f32".to_owned()),
            checkpoints: if ready {
                checkpoints
                    .iter()
                    .map(|(name, c)| LoadedCheckpoint {
                        name,
                        revision: c.location.revision().map(str::to_owned),
                        sha256: c.weights.sha256.clone(),
                    })
                    .collect()
            } else {
                Vec::new()
            },
            restarts: 2,
            last_exit: Some("killed by SIGKILL".into()),
            last_error: None,
            stderr_tail: vec!["worker: bye".into()],
            warmup: Vec::new(),
            parity_gate: Vec::new(),
            engine: EngineFacts {
                cpu_kernels: ready.then(|| "avx2".to_owned()),
                device_fallback: ready.then(|| "cuda:0 unavailable (no CUDA device); running on cpu".to_owned()),
                ..EngineFacts::default()
            },
            unloads: 0,
            last_reload_ms: None,
        };
        BackendStatus {
            pools: vec![PoolStatus {
                name: "gpu".into(),
                worker_kind: "gpu".into(),
                device: "auto".into(),
                checkpoints: CheckpointName::ALL.to_vec(),
                queue_depth: 3,
                queue_capacity: 256,
                in_flight: 1,
                degraded: None,
                unavailable: None,
                retiring: false,
                capabilities: Capabilities::from_config(&PoolConfig::named("gpu")),
                backlog: Duration::from_millis(3),
                offered_load: 0.9312,
                routed: RouteCounts::default(),
                spilled_out: 0,
                probes: 0,
                batches: (0, 0),
                taken: (2, 0),
                waits: vec![ClassWaits {
                    class: JobClass::of(1, 60),
                    jobs: 5,
                    recent: 5,
                    p50: Duration::from_micros(1500),
                    p99: Duration::from_millis(12),
                    max: Duration::from_millis(12),
                }],
                speed: SpeedStatus {
                    factor: 4.0,
                    since: Some(std::time::UNIX_EPOCH + Duration::from_secs(1_800_000_000)),
                    why: Some("the last 2 forwards took 4.1× and 3.9× their normal time".to_owned()),
                    changes: 1,
                    slowed: true,
                },
                workers: vec![worker],
            }],
        }
    }
}

/// A server running in this process until dropped or shut down.
pub struct TestServer {
    pub addr: SocketAddr,
    pub backend: Arc<GoldenBackend>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    pub task: tokio::task::JoinHandle<layad::ShutdownReport>,
}

impl TestServer {
    /// Starts on 127.0.0.1 with an ephemeral port and the defaults, changed by `adjust`.
    pub async fn start(adjust: impl FnOnce(&mut Config)) -> Self {
        Self::start_with(checkpoints(), adjust).await
    }

    /// Like [`TestServer::start`], answering with these checkpoints.
    pub async fn start_with(checkpoints: Arc<Checkpoints>, adjust: impl FnOnce(&mut Config)) -> Self {
        let mut config = Config::default();
        config.server.listen = "127.0.0.1:0".parse().expect("addr");
        // Most tests compare bodies with upstream's byte for byte; the ones about the
        // diagnostics block turn it back on.
        config.server.diagnostics = false;
        adjust(&mut config);
        let backend = Arc::new(GoldenBackend::new());
        let server = layad::Server::bind(&config, checkpoints, Arc::clone(&backend) as Arc<dyn Backend>)
            .await
            .expect("binds");
        let addr = server.local_addr().expect("local addr");
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(server.run(async {
            let _ = rx.await;
        }));
        Self {
            addr,
            backend,
            shutdown: Some(tx),
            task,
        }
    }

    /// Sends the shutdown signal (the server then drains).
    pub fn begin_shutdown(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }

    pub async fn post(&self, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Response {
        send(self.addr, &Request::new("POST", path).headers(headers).body(body)).await
    }

    pub async fn get(&self, path: &str, headers: &[(&str, &str)]) -> Response {
        send(self.addr, &Request::new("GET", path).headers(headers)).await
    }
}
