//! Shared by the `http_*` tests: the fixture checkpoints, a backend that answers with upstream's
//! recorded logits, an in-process server on an ephemeral loopback port, and a raw HTTP/1.1 client.
#![allow(dead_code)] // each test binary uses a different part of this module

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use futures::future::BoxFuture;
use laya::checkpoint::{Checkpoint, find_in_hf_cache};
use laya::decision::RowOutput;
use laya::routing::CheckpointName;
use layad::backend::{
    Backend, BackendError, BackendStatus, Capabilities, Job, JobOutput, LoadedCheckpoint, PoolStatus, Route,
    RouteCounts, WorkerState, WorkerStatus,
};
use layad::decide::Checkpoints;
use layad_config::{Config, PoolConfig};
use layad_system_tests::goldens::{fixture_json, fixtures_dir};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

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
        let golden = fixture_json("goldens/cases.json");
        let mut rows = HashMap::new();
        for case in golden["cases"].as_array().expect("cases") {
            let Some(checkpoint) = case["checkpoint"].as_str().and_then(CheckpointName::from_name_or_alias) else {
                continue;
            };
            for row in case["rows"].as_array().expect("rows") {
                let action: Vec<f32> = numbers(&row["action_logits"], |x| x.as_f64().expect("number") as f32);
                let output = RowOutput {
                    logits: numbers(&row["logits"], |x| x.as_f64().expect("number") as f32),
                    act_probability: laya::answer::softmax_f32(&action)[0],
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
                        act_probability: 0.5,
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
                outputs,
                pool: "gpu".into(),
                worker: "gpu-0".into(),
                device: "cpu".into(),
                queue_wait: Duration::from_micros(5),
                device_time: Duration::from_micros(700),
                batch_rows: 1,
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
            cpu_kernels: ready.then(|| "avx2".to_owned()),
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
                routed: RouteCounts::default(),
                spilled_out: 0,
                batches: (0, 0),
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

/// How a test request's body goes on the wire.
#[derive(Clone, Debug)]
pub enum Framing {
    /// `Content-Length` of the real body (unless a header already declares one).
    Length,
    /// `Transfer-Encoding: chunked`, in chunks of this many bytes, terminated.
    Chunked(usize),
    /// Chunked, but the terminating chunk is never sent and the connection stays open.
    ChunkedUnfinished(usize),
}

/// A raw HTTP/1.1 request.
#[derive(Clone, Debug)]
pub struct Request {
    pub method: String,
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    pub framing: Framing,
    /// Send no `Host` header.
    pub no_host: bool,
}

impl Request {
    pub fn new(method: &str, path: &str) -> Self {
        Self {
            method: method.into(),
            path: path.into(),
            headers: Vec::new(),
            body: Vec::new(),
            framing: Framing::Length,
            no_host: false,
        }
    }

    pub fn headers(mut self, headers: &[(&str, &str)]) -> Self {
        self.headers
            .extend(headers.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        self
    }

    pub fn body(mut self, body: &[u8]) -> Self {
        self.body = body.to_vec();
        self
    }

    pub fn framing(mut self, framing: Framing) -> Self {
        self.framing = framing;
        self
    }

    fn has(&self, name: &str) -> bool {
        self.headers.iter().any(|(k, _)| k.eq_ignore_ascii_case(name))
    }

    /// The bytes to write.
    fn wire(&self, addr: SocketAddr) -> Vec<u8> {
        let mut head = format!("{} {} HTTP/1.1\r\n", self.method, self.path);
        if !self.no_host && !self.has("host") {
            head.push_str(&format!("Host: {addr}\r\n"));
        }
        head.push_str("Connection: close\r\n");
        for (k, v) in &self.headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        let mut out = Vec::new();
        match self.framing {
            Framing::Length => {
                if !self.has("content-length") && (!self.body.is_empty() || self.method != "GET") {
                    head.push_str(&format!("Content-Length: {}\r\n", self.body.len()));
                }
                head.push_str("\r\n");
                out.extend_from_slice(head.as_bytes());
                out.extend_from_slice(&self.body);
            }
            Framing::Chunked(size) | Framing::ChunkedUnfinished(size) => {
                head.push_str("Transfer-Encoding: chunked\r\n\r\n");
                out.extend_from_slice(head.as_bytes());
                for chunk in self.body.chunks(size.max(1)) {
                    out.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
                    out.extend_from_slice(chunk);
                    out.extend_from_slice(b"\r\n");
                }
                if matches!(self.framing, Framing::Chunked(_)) {
                    out.extend_from_slice(b"0\r\n\r\n");
                }
            }
        }
        out
    }
}

/// A parsed response.
#[derive(Clone, Debug)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.text()))
    }

    /// The `detail` of an error body.
    pub fn detail(&self) -> String {
        self.json()["detail"].as_str().unwrap_or_default().to_owned()
    }
}

/// Sends `request` on a new connection and reads one response (without waiting for the server to
/// read the whole body: the writer runs alongside). Panics after 20 s.
pub async fn send(addr: SocketAddr, request: &Request) -> Response {
    tokio::time::timeout(Duration::from_secs(20), exchange(addr, request))
        .await
        .unwrap_or_else(|_| panic!("no response within 20 s to {} {}", request.method, request.path))
}

async fn exchange(addr: SocketAddr, request: &Request) -> Response {
    let stream = TcpStream::connect(addr).await.expect("connects");
    let (mut reader, mut writer) = stream.into_split();
    let wire = request.wire(addr);
    let writer_task = tokio::spawn(async move {
        // The server may answer and close before reading everything; that is what some tests check.
        let _ = writer.write_all(&wire).await;
        // Dropping the write half would half-close the socket, which hyper takes as the client
        // leaving: keep it open until the response has been read (the task is aborted then).
        std::future::pending::<()>().await;
        drop(writer);
    });
    let response = read_response(&mut reader).await;
    writer_task.abort();
    response
}

async fn read_response(reader: &mut (impl AsyncReadExt + Unpin)) -> Response {
    let mut buffer = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    let head_end = loop {
        if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            break end;
        }
        let n = reader.read(&mut chunk).await.expect("reads the response head");
        assert!(
            n > 0,
            "connection closed before a response: {:?}",
            String::from_utf8_lossy(&buffer)
        );
        buffer.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buffer[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let status_line = lines.next().expect("status line");
    let status: u16 = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("bad status line {status_line:?}"));
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let mut body = buffer[head_end + 4..].to_vec();
    let length = headers
        .iter()
        .find(|(k, _)| k == "content-length")
        .and_then(|(_, v)| v.parse::<usize>().ok());
    match length {
        Some(length) => {
            while body.len() < length {
                let n = reader.read(&mut chunk).await.expect("reads the body");
                assert!(n > 0, "connection closed inside the body");
                body.extend_from_slice(&chunk[..n]);
            }
            body.truncate(length);
        }
        None => {
            while let Ok(n) = reader.read(&mut chunk).await {
                if n == 0 {
                    break;
                }
                body.extend_from_slice(&chunk[..n]);
            }
        }
    }
    Response { status, headers, body }
}
