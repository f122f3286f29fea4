//! A reload must not lose a request: the races of a worker leaving its pool, reproduced one at a
//! time with fake workers (a gRPC server over a Unix socket that the test controls) instead of
//! hoping a storm hits them. A worker whose connection breaks mid-call loses its job to another
//! worker, never fails it; a worker retired from its pool is sent nothing more, whatever is queued.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use laya::prompt::Row;
use laya::question::QuestionType;
use laya::routing::CheckpointName;
use layad::backend::{BackendError, Job, PoolAnswer};
use layad::pool::capabilities::{ForwardShape, JobShape};
use layad::pool::order::QueuePolicy;
use layad::pool::worker_task::worker_task;
use layad::pool::{Pool, WorkerReport};
use layad::status::LoadedCheckpoint;
use layad_config::PoolConfig;
use layad_proto::pb;
use layad_proto::{EngineFacts, PROTOCOL_VERSION, WorkerClient};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// What a fake worker does with a forward.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Forward {
    /// Answers it: one output per row.
    Answer,
    /// Closes every connection it has accepted while the call is in flight, as a worker whose
    /// process exits (or whose server goes away) under a call does, and never answers.
    CutMidCall,
}

/// A gRPC worker in this process: ready, serving English, doing `forward` with each forward.
struct FakeWorker {
    forward: Forward,
    /// Forward calls received.
    calls: Arc<AtomicUsize>,
    /// The request ids each forward carried in its metadata.
    request_ids: Arc<Mutex<Vec<Vec<String>>>>,
    /// A second handle on each accepted connection, to cut it from this side.
    connections: Arc<Mutex<Vec<std::os::unix::net::UnixStream>>>,
}

#[tonic::async_trait]
impl pb::worker_server::Worker for FakeWorker {
    async fn describe(
        &self,
        _: tonic::Request<pb::DescribeRequest>,
    ) -> Result<tonic::Response<pb::WorkerInfo>, tonic::Status> {
        Ok(tonic::Response::new(pb::WorkerInfo {
            protocol_version: PROTOCOL_VERSION,
            state: pb::WorkerState::Ready as i32,
            device: "cpu".into(),
            requested_device: "cpu".into(),
            dtype: "f32".into(),
            ..Default::default()
        }))
    }

    async fn forward(
        &self,
        request: tonic::Request<pb::ForwardRequest>,
    ) -> Result<tonic::Response<pb::ForwardReply>, tonic::Status> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let ids = request
            .metadata()
            .get_all(layad_proto::REQUEST_ID_METADATA)
            .iter()
            .filter_map(|id| id.to_str().ok().map(str::to_owned))
            .collect();
        self.request_ids.lock().expect("ids").push(ids);
        match self.forward {
            Forward::Answer => {
                let rows = request
                    .into_inner()
                    .rows
                    .iter()
                    .map(|row| pb::RowOutput {
                        logits: row.markers.iter().map(|&m| m as f32).collect(),
                        act_probabilities: vec![0.25, 0.75],
                    })
                    .collect();
                Ok(tonic::Response::new(pb::ForwardReply {
                    rows,
                    device_us: 1000,
                    queue_us: 0,
                }))
            }
            Forward::CutMidCall => {
                for connection in self.connections.lock().expect("connections").iter() {
                    let _ = connection.shutdown(std::net::Shutdown::Both);
                }
                std::future::pending().await
            }
        }
    }

    type WatchStream = futures::stream::Pending<Result<pb::WorkerStatus, tonic::Status>>;

    async fn watch(
        &self,
        _: tonic::Request<pb::WatchRequest>,
    ) -> Result<tonic::Response<Self::WatchStream>, tonic::Status> {
        Ok(tonic::Response::new(futures::stream::pending()))
    }

    async fn drain(
        &self,
        _: tonic::Request<pb::DrainRequest>,
    ) -> Result<tonic::Response<pb::DrainReply>, tonic::Status> {
        Ok(tonic::Response::new(pb::DrainReply { forwards_served: 0 }))
    }
}

/// A running fake worker and the client the pool uses to reach it.
struct Fake {
    client: WorkerClient,
    calls: Arc<AtomicUsize>,
    request_ids: Arc<Mutex<Vec<Vec<String>>>>,
    server: JoinHandle<()>,
    _dir: tempfile::TempDir,
}

async fn start_fake(forward: Forward) -> Fake {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("fake.sock");
    let listener = tokio::net::UnixListener::bind(&socket).expect("bind");
    let calls = Arc::new(AtomicUsize::new(0));
    let request_ids = Arc::new(Mutex::new(Vec::new()));
    let connections = Arc::new(Mutex::new(Vec::new()));
    let service = FakeWorker {
        forward,
        calls: Arc::clone(&calls),
        request_ids: Arc::clone(&request_ids),
        connections: Arc::clone(&connections),
    };
    let incoming = futures::stream::unfold((listener, connections), |(listener, connections)| async move {
        let accepted = listener.accept().await.and_then(|(stream, _)| {
            let stream = stream.into_std()?;
            connections.lock().expect("connections").push(stream.try_clone()?);
            tokio::net::UnixStream::from_std(stream)
        });
        Some((accepted, (listener, connections)))
    });
    let server = tokio::spawn(async move {
        let _ = tonic::transport::Server::builder()
            .add_service(pb::worker_server::WorkerServer::new(service))
            .serve_with_incoming(incoming)
            .await;
    });
    let client = WorkerClient::connect_uds(&socket)
        .await
        .expect("connect to the fake worker");
    Fake {
        client,
        calls,
        request_ids,
        server,
        _dir: dir,
    }
}

fn report() -> WorkerReport {
    WorkerReport {
        device: "cpu".into(),
        requested_device: "cpu".into(),
        device_mismatch: false,
        dtype: "f32".into(),
        checkpoints: vec![LoadedCheckpoint {
            name: CheckpointName::English,
            revision: None,
            sha256: String::new(),
        }],
        capabilities: None,
        warmup: Vec::new(),
        parity_gate: Vec::new(),
        engine: EngineFacts::default(),
    }
}

fn pool() -> Arc<Pool> {
    let mut config = PoolConfig::named("cpu");
    config.workers = 2;
    Pool::new(config, vec![CheckpointName::English])
}

/// Admits `fake` as slot `index` and runs its worker task, as the process manager does for a
/// worker that became ready; the tokens are its `retired` and `dead`.
fn serve(pool: &Arc<Pool>, index: usize, fake: &Fake) -> (JoinHandle<()>, CancellationToken, CancellationToken) {
    let admitted = pool.admit(index, fake.client.clone(), report());
    let (retired, dead) = (CancellationToken::new(), CancellationToken::new());
    let task = tokio::spawn(worker_task(Arc::clone(pool), admitted, retired.clone(), dead.clone()));
    (task, retired, dead)
}

fn job(request_id: &str) -> Job {
    Job {
        request_id: request_id.into(),
        checkpoint: CheckpointName::English,
        rows: vec![Row {
            ids: vec![101, 7, 8, 9, 102],
            markers: vec![1, 2],
            qtype: QuestionType::Noul,
        }]
        .into(),
        deadline: Instant::now() + Duration::from_secs(60),
    }
}

fn enqueue(pool: &Pool, job: Job) -> tokio::sync::oneshot::Receiver<Result<PoolAnswer, BackendError>> {
    let shape = JobShape::of(&job.rows);
    let forward = ForwardShape {
        rows: shape.questions,
        padded_len: shape.longest,
    };
    pool.enqueue(job, forward, None, &QueuePolicy::default())
        .expect("queued")
}

async fn until(what: &str, condition: impl Fn() -> bool) {
    let started = Instant::now();
    while !condition() {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_whose_worker_closes_its_connection_mid_call_is_answered_by_another_worker() {
    let pool = pool();
    let (cutting, answering) = (start_fake(Forward::CutMidCall).await, start_fake(Forward::Answer).await);
    // Only the worker that will break is ready when the job is queued: it takes it.
    let (cut_task, _retired, _dead) = serve(&pool, 0, &cutting);
    let answer = enqueue(&pool, job("lost-once"));
    until("the first worker to take the call", || {
        cutting.calls.load(Ordering::SeqCst) == 1
    })
    .await;
    // Its connection is gone mid-call: the job must go back to the queue, not fail.
    tokio::time::timeout(Duration::from_secs(10), cut_task)
        .await
        .expect("the worker task of a lost worker ends")
        .expect("join");
    let (_task, _retired, _dead) = serve(&pool, 1, &answering);
    let answer = tokio::time::timeout(Duration::from_secs(10), answer)
        .await
        .expect("answered")
        .expect("reply sent")
        .expect("the lost job is answered, not failed");
    assert_eq!(answer.worker, "cpu/1");
    assert_eq!(answer.outputs.len(), 1);
    assert_eq!(answer.outputs[0].logits, vec![1.0, 2.0]);
    assert_eq!(cutting.calls.load(Ordering::SeqCst), 1);
    assert_eq!(answering.calls.load(Ordering::SeqCst), 1);
    // Both forwards carried the job's request id, for the workers' log lines.
    for fake in [&cutting, &answering] {
        assert_eq!(*fake.request_ids.lock().expect("ids"), [["lost-once"]]);
    }
    cutting.server.abort();
    answering.server.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_lost_twice_is_a_retryable_loss_not_a_failure() {
    let pool = pool();
    let (first, second) = (
        start_fake(Forward::CutMidCall).await,
        start_fake(Forward::CutMidCall).await,
    );
    let (first_task, _retired, _dead) = serve(&pool, 0, &first);
    let answer = enqueue(&pool, job("lost-twice"));
    first_task.await.expect("join");
    let (_task, _retired2, _dead2) = serve(&pool, 1, &second);
    let answer = tokio::time::timeout(Duration::from_secs(10), answer)
        .await
        .expect("answered")
        .expect("reply sent");
    // The HTTP side answers `Lost` with 503 and `Retry-After`; `Failed` would be a 500.
    assert!(
        matches!(answer, Err(BackendError::Lost(_))),
        "a job whose workers' connections broke twice is lost, not failed: {answer:?}"
    );
    assert_eq!(
        first.calls.load(Ordering::SeqCst) + second.calls.load(Ordering::SeqCst),
        2
    );
    first.server.abort();
    second.server.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retired_worker_is_sent_nothing_more_though_jobs_are_queued_for_it() {
    let pool = pool();
    let (leaving, staying) = (start_fake(Forward::Answer).await, start_fake(Forward::Answer).await);
    let (leaving_task, retired, _dead) = serve(&pool, 0, &leaving);
    // Its task is idle, waiting for work. The process manager retires it (a reload scales the pool
    // down) and a job arrives before the task's own stop token is cancelled: the window in which a
    // worker being drained was sent a forward.
    tokio::time::sleep(Duration::from_millis(50)).await;
    pool.retire(0);
    let answer = enqueue(&pool, job("after-retire"));
    tokio::time::timeout(Duration::from_secs(10), leaving_task)
        .await
        .expect("a retired worker's task ends without its stop token")
        .expect("join");
    assert_eq!(leaving.calls.load(Ordering::SeqCst), 0, "a retired worker got a call");
    let (_task, _retired, _dead) = serve(&pool, 1, &staying);
    let answer = tokio::time::timeout(Duration::from_secs(10), answer)
        .await
        .expect("answered")
        .expect("reply sent")
        .expect("ok");
    assert_eq!(answer.worker, "cpu/1");
    drop(retired);
    leaving.server.abort();
    staying.server.abort();
}
