//! The engine thread: one OS thread owns the engine (it is `Send`, not `Sync`), loads and warms it, then
//! runs forwards one batch at a time from a queue; async code reaches it through [`EngineRunner`].

use std::any::Any;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;

use crate::engine::{CheckedForward, Engine, EngineError, EngineInfo, RowOutput};
use crate::error::{HarnessError, LoadError};
use crate::pb;
use crate::rows::check_outputs;
use crate::warmup::{self, WarmupPolicy};

/// Batches that may wait for the engine thread; beyond it, callers wait to enqueue. The supervisor's
/// scheduler holds the real queue, so this only needs to cover a batch or two of prefetch.
const QUEUE_DEPTH: usize = 32;

/// What the engine thread reports once it is loaded and warm.
pub(crate) struct Started {
    /// The engine's description after warm-up.
    pub(crate) info: EngineInfo,
    pub(crate) warmup: Vec<pb::WarmupTiming>,
    /// `info.facts` as Describe sends them (`WorkerInfo.engine_facts`), encoded once.
    pub(crate) engine_facts: String,
}

/// The answer to one batch.
pub(crate) struct ForwardDone {
    pub(crate) outputs: Vec<RowOutput>,
    /// Wall time of the engine's forward call.
    pub(crate) device: Duration,
    /// Time the batch waited behind earlier ones.
    pub(crate) queued: Duration,
}

/// Why a batch got no outputs.
#[derive(Debug)]
pub(crate) enum RunError {
    /// The engine refused or failed this batch.
    Engine(EngineError),
    /// The engine thread is gone (it failed, or the worker is stopping).
    Stopped,
}

struct ForwardJob {
    forward: CheckedForward,
    enqueued: Instant,
    reply: oneshot::Sender<Result<ForwardDone, EngineError>>,
    /// The caller's span (its request ids): the engine thread logs the batch inside it.
    span: tracing::Span,
}

/// Handle that queues batches for the engine thread; the thread stops once it is dropped.
pub(crate) struct EngineRunner {
    jobs: mpsc::Sender<ForwardJob>,
}

impl EngineRunner {
    /// Queues one batch and waits for its answer.
    pub(crate) async fn forward(&self, forward: CheckedForward) -> Result<ForwardDone, RunError> {
        let (reply, answer) = oneshot::channel();
        let job = ForwardJob {
            forward,
            enqueued: Instant::now(),
            reply,
            span: tracing::Span::current(),
        };
        self.jobs.send(job).await.map_err(|_| RunError::Stopped)?;
        answer.await.map_err(|_| RunError::Stopped)?.map_err(RunError::Engine)
    }
}

/// Starts the engine thread: it runs `load`, sets the state to `warming`, warms up per `policy`, sends
/// [`Started`] (or the start-up error), then serves batches until the [`EngineRunner`] is dropped.
/// A panic in the engine fails the worker: the state becomes `failed` and `failed` is cancelled.
pub(crate) fn spawn<E, L>(
    load: L,
    policy: WarmupPolicy,
    status: watch::Sender<pb::WorkerStatus>,
    failed: CancellationToken,
) -> Result<(EngineRunner, oneshot::Receiver<Result<Started, HarnessError>>), HarnessError>
where
    E: Engine,
    L: FnOnce() -> Result<E, LoadError> + Send + 'static,
{
    let (jobs, queue) = mpsc::channel(QUEUE_DEPTH);
    let (started_tx, started_rx) = oneshot::channel();
    std::thread::Builder::new()
        .name("engine".into())
        .spawn(move || {
            let start = catch_unwind(AssertUnwindSafe(|| load_and_warm(load, &policy, &status)))
                .unwrap_or_else(|panic| Err(HarnessError::EngineFailed(panic_message("start-up", &*panic))));
            match start {
                Ok((engine, started)) => {
                    if started_tx.send(Ok(started)).is_ok() {
                        serve_batches(engine, queue, &status, &failed);
                    }
                }
                Err(error) => {
                    let _ = started_tx.send(Err(error));
                }
            }
        })
        .map_err(HarnessError::Runtime)?;
    Ok((EngineRunner { jobs }, started_rx))
}

fn load_and_warm<E, L>(
    load: L,
    policy: &WarmupPolicy,
    status: &watch::Sender<pb::WorkerStatus>,
) -> Result<(E, Started), HarnessError>
where
    E: Engine,
    L: FnOnce() -> Result<E, LoadError>,
{
    let loading = Instant::now();
    let mut engine = load().map_err(HarnessError::Load)?;
    let info = engine.describe();
    tracing::info!(
        state = "warming",
        load_ms = loading.elapsed().as_secs_f64() * 1e3,
        device = %info.device,
        dtype = %info.dtype,
        facts = ?info.facts,
        checkpoints = ?info.checkpoints.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(),
        "engine loaded; warming up"
    );
    status.send_replace(status_of(pb::WorkerState::Warming, None));
    let warming = Instant::now();
    let warmup = warmup::run(&mut engine, &warmup::plan(&info, policy), policy.runs)?;
    tracing::info!(
        warmup_ms = warming.elapsed().as_secs_f64() * 1e3,
        shapes = warmup.len(),
        "warm-up done"
    );
    // Described again: what an engine learns while warming (its parity gate, say) counts.
    let info = engine.describe();
    let engine_facts = pb::encode_engine_facts(&info.facts).map_err(HarnessError::Facts)?;
    Ok((
        engine,
        Started {
            info,
            warmup,
            engine_facts,
        },
    ))
}

fn serve_batches<E: Engine>(
    mut engine: E,
    mut queue: mpsc::Receiver<ForwardJob>,
    status: &watch::Sender<pb::WorkerStatus>,
    failed: &CancellationToken,
) {
    while let Some(job) = queue.blocking_recv() {
        if job.reply.is_closed() {
            // The caller went away while the batch waited; running it would only delay the next one.
            continue;
        }
        let _span = job.span.enter();
        let queued = job.enqueued.elapsed();
        let start = Instant::now();
        match catch_unwind(AssertUnwindSafe(|| engine.forward(&job.forward))) {
            Ok(result) => {
                let device = start.elapsed();
                let answer = result.and_then(|outputs| match check_outputs(job.forward.rows(), &outputs) {
                    Ok(()) => Ok(ForwardDone {
                        outputs,
                        device,
                        queued,
                    }),
                    Err(problem) => Err(EngineError::Internal(format!("{problem} (this is an engine bug)"))),
                });
                let _ = job.reply.send(answer);
            }
            Err(panic) => {
                let failure = panic_message("a forward", &*panic);
                tracing::error!(state = "failed", %failure, "engine panicked");
                status.send_replace(status_of(pb::WorkerState::Failed, Some(failure.clone())));
                let _ = job.reply.send(Err(EngineError::Internal(failure)));
                failed.cancel();
                return;
            }
        }
    }
}

fn panic_message(during: &str, panic: &(dyn Any + Send)) -> String {
    let detail = panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "no message".to_owned());
    format!("the engine panicked during {during}: {detail}")
}

/// The status a worker reports in `state`, with the failure that put it there.
pub(super) fn status_of(state: pb::WorkerState, failure: Option<String>) -> pb::WorkerStatus {
    pb::WorkerStatus {
        state: state as i32,
        failure,
    }
}
