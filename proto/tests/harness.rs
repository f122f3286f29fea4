//! The serving harness and the client end to end, in one process, over a real Unix socket, with a
//! small deterministic engine standing in for a model (the real worker binary is tested in worker-gpu).

use std::path::{Path, PathBuf};
use std::sync::mpsc as std_mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use laya::question::QuestionType;
use layad_proto::harness::{LoadError, serve};
use layad_proto::pb::{self, WorkerState};
use layad_proto::{
    CheckedForward, ClientError, Engine, EngineError, EngineFacts, EngineInfo, HarnessError, HarnessOptions,
    LoadedCheckpoint, Row, RowOutput, ServeOutcome, SpawnedWorker, StopReason, WarmupPolicy, WorkerClient,
};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// Logit of a marker = the id under it / 10 + 100 × the checkpoint's index; act = [0.25, 0.75].
/// A batch whose first id is [`PANIC_ID`] panics and one whose first id is [`SLOW_ID`] takes
/// `slow_ms` (warm-up rows start with id 1); qtype 2 on `slow` is refused by the engine itself.
/// Each call's time span is recorded to show that calls never overlap.
struct ToyEngine {
    slow_ms: u64,
    calls: Arc<Mutex<Vec<(Instant, Instant)>>>,
    /// Answers one row short, to show what a broken engine does to the warm-up.
    broken: bool,
}

const CHECKPOINTS: [&str; 2] = ["toy", "slow"];
const PANIC_ID: u32 = 49;
const SLOW_ID: u32 = 48;

impl Engine for ToyEngine {
    fn describe(&self) -> EngineInfo {
        let checkpoint = |name: &str| LoadedCheckpoint {
            name: name.into(),
            revision: Some("0123abcd".into()),
            weights_sha256: format!("sha-of-{name}"),
            vocab_size: 50,
            max_len: 32,
            warmup_len: 32,
        };
        EngineInfo {
            device: "cpu".into(),
            dtype: "f32".into(),
            checkpoints: CHECKPOINTS.iter().map(|name| checkpoint(name)).collect(),
            max_rows: 4,
            max_batch_tokens: 64,
            length_buckets: vec![],
            parity: Vec::new(),
            facts: EngineFacts {
                cpu_kernels: Some("toy-simd".into()),
                ..EngineFacts::default()
            },
        }
    }

    fn forward(&mut self, forward: &CheckedForward) -> Result<Vec<RowOutput>, EngineError> {
        let (checkpoint, rows) = (forward.checkpoint(), forward.rows());
        let start = Instant::now();
        let index = CHECKPOINTS
            .iter()
            .position(|c| *c == checkpoint)
            .expect("harness checked the name");
        if rows[0].ids[0] == PANIC_ID {
            panic!("toy engine exploded");
        }
        if checkpoint == "slow" && rows.iter().any(|r| r.qtype == QuestionType::Noul) {
            return Err(EngineError::InvalidArgument(
                "the slow checkpoint has no noul head".into(),
            ));
        }
        if rows[0].ids[0] == SLOW_ID {
            std::thread::sleep(Duration::from_millis(self.slow_ms));
        }
        let mut outputs: Vec<RowOutput> = rows
            .iter()
            .map(|row| RowOutput {
                logits: row
                    .markers
                    .iter()
                    .map(|&m| row.ids[m as usize] as f32 / 10.0 + 100.0 * index as f32)
                    .collect(),
                act_probabilities: vec![0.25, 0.75],
            })
            .collect();
        if self.broken {
            outputs.pop();
        }
        self.calls.lock().expect("calls").push((start, Instant::now()));
        Ok(outputs)
    }
}

struct Worker {
    socket: PathBuf,
    stop: mpsc::Sender<StopReason>,
    task: JoinHandle<Result<ServeOutcome, HarnessError>>,
    calls: Arc<Mutex<Vec<(Instant, Instant)>>>,
    _dir: tempfile::TempDir,
}

fn options(socket: &Path) -> HarnessOptions {
    HarnessOptions {
        socket: socket.to_owned(),
        liveness_fd: None,
        requested_device: "cpu".into(),
        worker: "toy-worker 1.0".into(),
        warmup: WarmupPolicy {
            short_len: 4,
            multi_rows: 3,
            runs: 2,
        },
        spawn_nonce: "toy-nonce".into(),
    }
}

/// Starts a harness whose load closure first waits for `gate` (when given), then builds the engine.
fn start(slow_ms: u64, broken: bool, gate: Option<std_mpsc::Receiver<()>>) -> Worker {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("private").join("worker.sock");
    let calls = Arc::new(Mutex::new(Vec::new()));
    let engine_calls = calls.clone();
    let load = move || -> Result<ToyEngine, LoadError> {
        if let Some(gate) = gate {
            gate.recv()?;
        }
        Ok(ToyEngine {
            slow_ms,
            calls: engine_calls,
            broken,
        })
    };
    let (stop, stop_rx) = mpsc::channel(4);
    let task = tokio::spawn(serve(load, options(&socket), stop_rx));
    Worker {
        socket,
        stop,
        task,
        calls,
        _dir: dir,
    }
}

async fn connect(socket: &Path) -> WorkerClient {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match WorkerClient::connect_uds(socket).await {
            Ok(client) => return client,
            Err(error) if error.is_retryable() && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(5)).await
            }
            Err(error) => panic!("cannot connect: {error}"),
        }
    }
}

fn row(ids: Vec<u32>, markers: Vec<u32>) -> Row {
    Row {
        ids,
        markers,
        qtype: QuestionType::Choice,
    }
}

/// The generated gRPC client on `socket`, without [`WorkerClient`]'s typed rows.
async fn raw_client(socket: &Path) -> pb::worker_client::WorkerClient<tonic::transport::Channel> {
    let path = socket.to_owned();
    let channel = tonic::transport::Endpoint::try_from("http://worker.invalid")
        .expect("endpoint")
        .connect_with_connector(tower::service_fn(move |_| {
            let path = path.clone();
            async move {
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                    tokio::net::UnixStream::connect(path).await?,
                ))
            }
        }))
        .await
        .expect("connects");
    pb::worker_client::WorkerClient::new(channel)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binds_only_once_warm_and_describes_what_runs() {
    let (open_gate, gate) = std_mpsc::channel();
    let worker = start(0, false, Some(gate));
    tokio::time::sleep(Duration::from_millis(50)).await;
    // Still loading: no socket, so nothing to connect to, and the error says so and is retryable.
    assert!(!worker.socket.exists());
    let error = WorkerClient::connect_uds(&worker.socket).await.expect_err("not ready");
    assert!(
        matches!(error, ClientError::Connect { .. }) && error.is_retryable(),
        "{error}"
    );
    open_gate.send(()).expect("gate");

    let client = connect(&worker.socket).await;
    let info = client.describe().await.expect("describe");
    assert_eq!(info.state(), WorkerState::Ready);
    assert_eq!(info.protocol_version, layad_proto::PROTOCOL_VERSION);
    assert_eq!(info.pid, std::process::id());
    assert_eq!(
        (info.worker.as_str(), info.device.as_str(), info.dtype.as_str()),
        ("toy-worker 1.0", "cpu", "f32")
    );
    assert_eq!((info.requested_device.as_str(), info.device_mismatch), ("cpu", false));
    let names: Vec<&str> = info.checkpoints.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, CHECKPOINTS);
    assert_eq!(info.checkpoints[1].revision.as_deref(), Some("0123abcd"));
    assert_eq!(info.checkpoints[1].weights_sha256, "sha-of-slow");
    // The engine's facts arrive as the engine described them.
    assert_eq!(
        info.decode_engine_facts().expect("engine facts"),
        EngineFacts {
            cpu_kernels: Some("toy-simd".into()),
            ..EngineFacts::default()
        }
    );
    let capabilities = info.capabilities.expect("capabilities");
    assert_eq!(
        (
            capabilities.max_rows,
            capabilities.max_batch_tokens,
            capabilities.max_len
        ),
        (4, 64, 32)
    );
    // Every checkpoint was warmed on its two shapes, twice each (runs = 2), after one untimed first
    // forward; no row of the checkpoint's max_len (32) was run.
    assert_eq!(info.warmup.len(), 4);
    assert_eq!(worker.calls.lock().expect("calls").len(), 10);
    let shapes: Vec<(&str, &str, u32, u32)> = info
        .warmup
        .iter()
        .map(|w| (w.checkpoint.as_str(), w.shape.as_str(), w.rows, w.tokens_per_row))
        .collect();
    assert!(shapes.contains(&("toy", "short", 1, 4)), "{shapes:?}");
    assert!(!shapes.iter().any(|s| s.1 == "longest" || s.3 == 32), "{shapes:?}");
    assert!(shapes.contains(&("toy", "multi-row", 3, 4)), "{shapes:?}");
    assert!(info.warmup.iter().all(|w| w.first_ms >= 0.0 && w.steady_ms >= 0.0));
    let memory = info.memory.expect("memory");
    assert!(memory.peak_rss_bytes.is_some_and(|b| b > 0));

    let result = client
        .forward("toy", &[row(vec![1, 2, 30, 4], vec![2, 3]), row(vec![7], vec![0])])
        .await;
    let result = result.expect("forward");
    assert_eq!(result.outputs[0].logits, vec![3.0, 0.4]);
    assert_eq!(result.outputs[1].logits, vec![0.7]);
    assert_eq!(result.outputs[1].act_probabilities, vec![0.25, 0.75]);
    assert_eq!(client.describe().await.expect("describe").forwards_served, 1);
    worker.stop.send(StopReason::Terminate).await.expect("stop");
    let outcome = worker.task.await.expect("join").expect("serve");
    assert_eq!(outcome, ServeOutcome::Terminated { forwards_served: 1 });
    assert!(!worker.socket.exists(), "socket removed at exit");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_spawned_process_with_its_nonce_is_accepted() {
    let worker = start(0, false, None);
    let client = connect(&worker.socket).await;
    assert_eq!(client.describe().await.expect("describe").spawn_nonce, "toy-nonce");
    // The harness runs in this test process: its pid is the socket's peer.
    let ours = SpawnedWorker {
        pid: std::process::id(),
        nonce: "toy-nonce".into(),
    };
    WorkerClient::connect_spawned(&worker.socket, &ours)
        .await
        .expect("the spawned worker is accepted");
    let other_pid = SpawnedWorker {
        pid: std::process::id() + 1,
        ..ours.clone()
    };
    let error = WorkerClient::connect_spawned(&worker.socket, &other_pid)
        .await
        .expect_err("another pid");
    assert!(
        matches!(&error, ClientError::NotOurWorker { detail, .. }
            if detail == &format!("the process listening on it is pid {}, not the worker started as pid {}", std::process::id(), other_pid.pid)),
        "{error}"
    );
    assert!(!error.is_retryable());
    let other_nonce = SpawnedWorker {
        nonce: "another-nonce".into(),
        ..ours
    };
    let error = WorkerClient::connect_spawned(&worker.socket, &other_nonce)
        .await
        .expect_err("another nonce");
    assert!(
        matches!(&error, ClientError::NotOurWorker { detail, .. } if detail.contains("spawn nonce \"toy-nonce\"")),
        "{error}"
    );
    worker.stop.send(StopReason::Terminate).await.expect("stop");
    worker.task.await.expect("join").expect("serve");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_invalid_argument_and_the_worker_keeps_serving() {
    let worker = start(0, false, None);
    let client = connect(&worker.socket).await;
    let long = |n: u32| row((0..n).map(|i| i % 50).collect(), vec![0]);
    let cases: Vec<(&str, Vec<Row>, &str)> = vec![
        (
            "nope",
            vec![row(vec![1], vec![0])],
            "unknown checkpoint \"nope\"; this worker serves toy, slow",
        ),
        ("toy", vec![], "the forward has no rows"),
        (
            "toy",
            vec![row(vec![1], vec![0]); 5],
            "the forward has 5 rows; this worker takes at most 4",
        ),
        (
            "toy",
            vec![long(30), long(30), long(30)],
            "the forward has 90 tokens in all; this worker takes at most 64",
        ),
        (
            "toy",
            vec![long(33)],
            "row 0 has 33 tokens; checkpoint toy takes at most 32",
        ),
        (
            "toy",
            vec![row(vec![1], vec![0]), row(vec![], vec![])],
            "row 1 has no tokens",
        ),
        (
            "toy",
            vec![row(vec![1, 50], vec![0])],
            "row 0 position 1 has token id 50; checkpoint toy has 50 ids",
        ),
        (
            "toy",
            vec![row(vec![1, 2], vec![2])],
            "row 0 marker 0 is at position 2, outside the row (2 tokens)",
        ),
        ("toy", vec![row(vec![1, 2], vec![])], "row 0 has no markers"),
        (
            "toy",
            vec![row(vec![1, 2, 3], vec![1, 1])],
            "row 0 marker 1 is at position 1, not after the previous",
        ),
        // Refused by the engine itself, past the harness's generic checks.
        (
            "slow",
            vec![Row {
                ids: vec![1],
                markers: vec![0],
                qtype: QuestionType::Noul,
            }],
            "the slow checkpoint has no noul head",
        ),
    ];
    for (checkpoint, rows, expected) in cases {
        match client.forward(checkpoint, &rows).await {
            Err(ClientError::InvalidArgument(message)) => assert!(message.contains(expected), "{message}"),
            other => panic!("{checkpoint} {rows:?}: expected INVALID_ARGUMENT, got {other:?}"),
        }
        let good = client
            .forward("toy", &[row(vec![1, 20], vec![1])])
            .await
            .expect("still serving");
        assert_eq!(good.outputs[0].logits, vec![2.0]);
    }
    assert!(!ClientError::InvalidArgument(String::new()).is_retryable());
    // A typed row cannot carry an unknown question type, so send the wire message as another
    // implementation could: the harness refuses it while decoding, naming the row and the number.
    let mut raw = raw_client(&worker.socket).await;
    let message = |qtype| pb::Row {
        ids: vec![1, 20],
        markers: vec![1],
        qtype,
    };
    let refused = raw
        .forward(pb::ForwardRequest {
            checkpoint: "toy".into(),
            rows: vec![message(0), message(7)],
        })
        .await
        .expect_err("qtype 7 is refused");
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    assert_eq!(
        refused.message(),
        "row 1 has qtype 7; expected 0 (choice), 1 (score) or 2 (noul)"
    );
    let answered = raw
        .forward(pb::ForwardRequest {
            checkpoint: "toy".into(),
            rows: vec![message(2)],
        })
        .await
        .expect("still serving");
    assert_eq!(answered.into_inner().rows[0].logits, vec![2.0]);
    worker.stop.send(StopReason::Terminate).await.expect("stop");
    worker.task.await.expect("join").expect("serve");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_callers_get_their_own_answers_one_batch_at_a_time() {
    let worker = start(5, false, None);
    let client = connect(&worker.socket).await;
    let warmup_calls = worker.calls.lock().expect("calls").len();
    let tasks: Vec<_> = (0..24u32)
        .map(|i| {
            let client = client.clone();
            tokio::spawn(async move {
                let checkpoint = if i % 2 == 0 { "toy" } else { "slow" };
                let result = client
                    .forward(checkpoint, &[row(vec![SLOW_ID, i], vec![0, 1])])
                    .await
                    .expect("forward");
                let offset = if i % 2 == 0 { 0.0 } else { 100.0 };
                assert_eq!(result.outputs[0].logits, vec![4.8 + offset, i as f32 / 10.0 + offset]);
                result
            })
        })
        .collect();
    let mut queued = 0;
    for task in tasks {
        queued += u64::from(task.await.expect("join").queue_us > 0);
    }
    assert!(
        queued > 0,
        "24 concurrent batches on one engine thread must have waited for each other"
    );
    let mut calls = worker.calls.lock().expect("calls")[warmup_calls..].to_vec();
    assert_eq!(calls.len(), 24);
    calls.sort();
    assert!(calls.windows(2).all(|w| w[0].1 <= w[1].0), "engine calls overlapped");
    worker.stop.send(StopReason::Terminate).await.expect("stop");
    assert_eq!(
        worker.task.await.expect("join").expect("serve"),
        ServeOutcome::Terminated { forwards_served: 24 }
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_waits_for_forwards_in_flight_then_refuses_new_ones() {
    let worker = start(400, false, None);
    let client = connect(&worker.socket).await;
    let mut watch = client.watch().await.expect("watch");
    assert_eq!(
        watch.next().await.expect("first").expect("status").state(),
        WorkerState::Ready
    );
    let slow = {
        let client = client.clone();
        tokio::spawn(async move { client.forward("slow", &[row(vec![SLOW_ID], vec![0])]).await })
    };
    wait_for_in_flight(&client, 1).await;
    let drained = client.drain().await.expect("drain");
    let drained_at = Instant::now();
    let (_, forward_end) = *worker
        .calls
        .lock()
        .expect("calls")
        .last()
        .expect("the slow forward ran");
    assert!(
        forward_end <= drained_at,
        "drain answered before the forward in flight had run"
    );
    assert_eq!(
        slow.await.expect("join").expect("forward").outputs[0].logits,
        vec![104.8]
    );
    assert_eq!(drained.forwards_served, 1);
    assert_eq!(
        watch.next().await.expect("change").expect("status").state(),
        WorkerState::Draining
    );
    let refused = client
        .forward("toy", &[row(vec![1], vec![0])])
        .await
        .expect_err("draining");
    assert!(
        matches!(&refused, ClientError::Unavailable(m) if m == "worker is draining"),
        "{refused}"
    );
    assert!(refused.is_retryable());
    worker.stop.send(StopReason::Terminate).await.expect("stop");
    worker.task.await.expect("join").expect("serve");
    assert!(watch.next().await.is_none(), "watch ends when the worker stops");
}

async fn wait_for_in_flight(client: &WorkerClient, n: u32) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while client.describe().await.expect("describe").forwards_in_flight < n {
        assert!(Instant::now() < deadline, "forwards never arrived");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminate_answers_every_accepted_forward_and_supervisor_gone_does_not_wait() {
    let worker = start(300, false, None);
    let client = connect(&worker.socket).await;
    let forwards: Vec<_> = (0..3)
        .map(|_| {
            let client = client.clone();
            tokio::spawn(async move { client.forward("slow", &[row(vec![SLOW_ID], vec![0])]).await })
        })
        .collect();
    wait_for_in_flight(&client, 3).await;
    worker.stop.send(StopReason::Terminate).await.expect("stop");
    // A second SIGTERM changes nothing.
    worker.stop.send(StopReason::Terminate).await.expect("stop");
    for forward in forwards {
        assert_eq!(
            forward.await.expect("join").expect("answered").outputs[0].logits,
            vec![104.8]
        );
    }
    assert_eq!(
        worker.task.await.expect("join").expect("serve"),
        ServeOutcome::Terminated { forwards_served: 3 }
    );
    assert!(!worker.socket.exists());

    let worker = start(5_000, false, None);
    let client = connect(&worker.socket).await;
    let stuck = tokio::spawn(async move { client.forward("slow", &[row(vec![SLOW_ID], vec![0])]).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let asked = Instant::now();
    worker.stop.send(StopReason::SupervisorGone).await.expect("stop");
    assert_eq!(
        worker.task.await.expect("join").expect("serve"),
        ServeOutcome::SupervisorGone
    );
    assert!(asked.elapsed() < Duration::from_secs(1), "took {:?}", asked.elapsed());
    assert!(!worker.socket.exists());
    stuck.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_engine_fails_the_worker_and_says_why() {
    let worker = start(300, false, None);
    let client = connect(&worker.socket).await;
    let mut watch = client.watch().await.expect("watch");
    assert_eq!(
        watch.next().await.expect("first").expect("status").state(),
        WorkerState::Ready
    );
    // Queue a batch behind a slow one, then make the engine panic on the batch in between.
    let slow = {
        let client = client.clone();
        tokio::spawn(async move { client.forward("slow", &[row(vec![SLOW_ID], vec![0])]).await })
    };
    wait_for_in_flight(&client, 1).await;
    let boom = {
        let client = client.clone();
        tokio::spawn(async move { client.forward("toy", &[row(vec![PANIC_ID], vec![0])]).await })
    };
    wait_for_in_flight(&client, 2).await;
    let queued = {
        let client = client.clone();
        tokio::spawn(async move { client.forward("toy", &[row(vec![2], vec![0])]).await })
    };
    wait_for_in_flight(&client, 3).await;
    slow.await
        .expect("join")
        .expect("the batch before the panic is answered");
    match boom.await.expect("join") {
        Err(ClientError::Worker {
            code: tonic::Code::Internal,
            message,
        }) => {
            assert!(
                message.contains("panicked during a forward: toy engine exploded"),
                "{message}"
            )
        }
        other => panic!("expected INTERNAL, got {other:?}"),
    }
    let queued = queued.await.expect("join").expect_err("the engine is gone");
    assert!(queued.is_retryable(), "{queued}");
    let failed = watch.next().await.expect("change").expect("status");
    assert_eq!(failed.state(), WorkerState::Failed);
    assert!(failed.failure.expect("failure").contains("toy engine exploded"));
    match worker.task.await.expect("join") {
        Err(HarnessError::EngineFailed(message)) => assert!(message.contains("toy engine exploded"), "{message}"),
        other => panic!("expected EngineFailed, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_up_failures_name_their_step_and_never_bind() {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("private").join("worker.sock");
    let (_stop, stop_rx) = mpsc::channel(1);
    let load = || -> Result<ToyEngine, LoadError> { Err("checkpoint /nowhere has no config.json".into()) };
    let error = serve(load, options(&socket), stop_rx).await.expect_err("load fails");
    assert_eq!(
        error.to_string(),
        "loading the engine: checkpoint /nowhere has no config.json"
    );
    assert!(!socket.exists());

    let broken = start(0, true, None);
    match broken.task.await.expect("join") {
        Err(error @ HarnessError::Warmup { .. }) => assert_eq!(
            error.to_string(),
            "warm-up of checkpoint toy on shape short (1×4 tokens) failed: engine returned 0 outputs for 1 rows"
        ),
        other => panic!("expected a warm-up error, got {other:?}"),
    }
    assert!(!broken.socket.exists());

    let (open_gate, gate) = std_mpsc::channel::<()>();
    let waiting = start(0, false, Some(gate));
    waiting.stop.send(StopReason::Terminate).await.expect("stop");
    let outcome = waiting.task.await.expect("join").expect("serve");
    assert_eq!(outcome, ServeOutcome::StoppedBeforeReady(StopReason::Terminate));
    assert!(!waiting.socket.exists());
    drop(open_gate);
}

/// A worker from another protocol revision, or without the v1 service at all.
struct ForeignWorker {
    revision: Option<u32>,
}

#[tonic::async_trait]
impl pb::worker_server::Worker for ForeignWorker {
    async fn describe(
        &self,
        _: tonic::Request<pb::DescribeRequest>,
    ) -> Result<tonic::Response<pb::WorkerInfo>, tonic::Status> {
        match self.revision {
            Some(protocol_version) => Ok(tonic::Response::new(pb::WorkerInfo {
                protocol_version,
                ..Default::default()
            })),
            None => Err(tonic::Status::unimplemented("unknown service layad.worker.v1.Worker")),
        }
    }

    async fn forward(
        &self,
        _: tonic::Request<pb::ForwardRequest>,
    ) -> Result<tonic::Response<pb::ForwardReply>, tonic::Status> {
        Err(tonic::Status::unimplemented("foreign"))
    }

    type WatchStream = futures::stream::Empty<Result<pb::WorkerStatus, tonic::Status>>;

    async fn watch(
        &self,
        _: tonic::Request<pb::WatchRequest>,
    ) -> Result<tonic::Response<Self::WatchStream>, tonic::Status> {
        Err(tonic::Status::unimplemented("foreign"))
    }

    async fn drain(
        &self,
        _: tonic::Request<pb::DrainRequest>,
    ) -> Result<tonic::Response<pb::DrainReply>, tonic::Status> {
        Err(tonic::Status::unimplemented("foreign"))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_of_another_protocol_revision_is_refused() {
    for (revision, expected) in [
        (
            Some(layad_proto::PROTOCOL_VERSION + 1),
            "speaks layad.worker.v1 revision 3; this supervisor speaks layad.worker.v1 revision 2",
        ),
        (None, "does not implement layad.worker.v1.Worker"),
    ] {
        let dir = tempfile::tempdir().expect("tempdir");
        let socket = dir.path().join("foreign.sock");
        let listener = tokio::net::UnixListener::bind(&socket).expect("bind");
        let server = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(pb::worker_server::WorkerServer::new(ForeignWorker { revision }))
                .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener)),
        );
        let error = WorkerClient::connect_uds(&socket).await.expect_err("refused");
        assert!(matches!(error, ClientError::VersionMismatch { .. }), "{error}");
        assert!(error.to_string().contains(expected), "{error}");
        assert!(!error.is_retryable());
        server.abort();
    }
}
