//! The seam between request handling and whatever runs the model: the [`Backend`] trait, the [`Job`]
//! it takes, what it answers and why it may not. The scheduler implements it; tests implement it
//! with recorded answers. What `status()` returns is in [`crate::status`].

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use laya::decision::RowOutput;
use laya::prompt::Row;
use laya::routing::CheckpointName;

use crate::status::{BackendStatus, JobClass};

/// Runs prompt rows on a worker and reports on the workers. Object-safe: the server holds an
/// `Arc<dyn Backend>`.
pub trait Backend: Send + Sync + 'static {
    /// Runs the rows of one request on a worker that serves `job.checkpoint`. Dropping the future
    /// (the client went away, or the request's deadline passed) withdraws the job if it has not
    /// started.
    fn run(&self, job: Job) -> BoxFuture<'static, Result<JobOutput, BackendError>>;

    /// A snapshot of every pool and worker, for `/health`, `/readyz` and `/metrics`.
    fn status(&self) -> BackendStatus;
}

/// The model work of one request.
#[derive(Clone, Debug, PartialEq)]
pub struct Job {
    /// The request's id (`x-request-id`), for logs on both sides.
    pub request_id: String,
    /// The checkpoint the rows were built for.
    pub checkpoint: CheckpointName,
    /// One row per question, in request order (never empty); the prepared request's own rows,
    /// shared, so a retried job still has them.
    pub rows: Arc<[Row]>,
    /// When the request stops waiting for the answer (`server.request_timeout` after it began).
    pub deadline: Instant,
}

impl Job {
    /// The job's class, for per-class queue waits.
    pub fn class(&self) -> JobClass {
        JobClass::of(
            self.rows.len(),
            self.rows.iter().map(|r| r.ids.len()).max().unwrap_or(0),
        )
    }
}

/// What a pool answered for a job: the outputs, and where and how they were computed.
#[derive(Clone, Debug, PartialEq)]
pub struct PoolAnswer {
    /// One output per row, same order.
    pub outputs: Vec<RowOutput>,
    /// The pool that ran it.
    pub pool: String,
    /// The worker that ran it.
    pub worker: String,
    /// The device the worker actually used (`cpu`, `metal`, `cuda:0`, `ane`).
    pub device: String,
    /// Time between queueing and a worker taking the job.
    pub queue_wait: Duration,
    /// Time the worker spent on the forward pass.
    pub device_time: Duration,
    /// Rows in that forward pass: more than the job's own when it shared the pass with others.
    pub batch_rows: usize,
    /// Set when an idle worker of this pool took the job from the queue of the pool it was placed
    /// in.
    pub taken_over: Option<TakenOver>,
}

/// A job an idle worker took from another pool's queue, where it would have finished later.
#[derive(Clone, Debug, PartialEq)]
pub struct TakenOver {
    /// The pool whose queue it was in.
    pub from: String,
    /// When it was then expected to start there, from the moment it was taken (`None`: no worker
    /// there was ready).
    pub would_start: Option<Duration>,
}

/// What the backend answers for a job: the pool's answer, and how and why the scheduler chose that
/// pool.
#[derive(Clone, Debug, PartialEq)]
pub struct JobOutput {
    /// What the pool computed.
    pub answer: PoolAnswer,
    /// How the scheduler chose the pool.
    pub route: Route,
    /// Why, in words (the `x_layad.reason` of the answer).
    pub reason: String,
}

/// How a job's pool was chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Route {
    /// The most specialised ready pool that can hold the job.
    Preferred,
    /// Another capable pool, where it was expected to finish strictly earlier.
    Spilled,
    /// The preferred pool is unavailable or has no ready worker; another capable pool took it.
    Fallback,
}

impl Route {
    /// The spelling in answers, `/health` and `/metrics`.
    pub fn as_str(self) -> &'static str {
        match self {
            Route::Preferred => "preferred",
            Route::Spilled => "spilled",
            Route::Fallback => "fallback",
        }
    }
}

/// Why a job was not run; each maps to one HTTP answer (see `http/response.rs`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BackendError {
    /// The pool's queue is full (503 with `Retry-After`).
    #[error("the queue is full; retry after {retry_after:?}")]
    Overloaded {
        /// How long the client should wait before retrying.
        retry_after: Duration,
    },
    /// The deadline passed before a worker answered (503).
    #[error("the deadline passed before a worker answered")]
    DeadlineExpired,
    /// No pool the job may go to is expected to finish it before its deadline: refused at once
    /// (503 with `Retry-After`) rather than left to time out.
    #[error("expected to finish in {expected:?}, {late:?} after the request's deadline")]
    TooLate {
        /// When it would finish at best, from now.
        expected: Duration,
        /// By how much that misses the deadline: how much the backlog must shrink first.
        late: Duration,
    },
    /// No ready worker serves the checkpoint right now (503).
    #[error("no ready worker serves checkpoint '{}'", .0.as_str())]
    CheckpointUnavailable(CheckpointName),
    /// Every pool serving the checkpoint is unavailable for good (its device is missing, its
    /// worker refused its configuration): 501 naming each pool's reason, no `Retry-After`.
    #[error("checkpoint '{}' cannot be served: {}", checkpoint.as_str(), reasons.join("; "))]
    CheckpointRefused {
        /// The checkpoint.
        checkpoint: CheckpointName,
        /// `'<pool>': <reason>` for each pool serving it.
        reasons: Vec<String>,
    },
    /// No pool of the running configuration can run the job's shape in one forward pass, so it
    /// never will (413 naming the limits, no `Retry-After`).
    #[error("{0}")]
    NoCapablePool(String),
    /// The worker failed on this job (500 `inference failed`); the text is logged, never sent.
    #[error("inference failed: {0}")]
    Failed(String),
    /// The job lost what was running it before an answer — its worker died on both attempts, or
    /// its pool or the server shut down — through no fault of its own: 503 with `Retry-After`,
    /// so a client or balancer asks again (decisions are pure: a repeat is safe). The text is
    /// logged, never sent.
    #[error("request lost before an answer: {0}")]
    Lost(String),
}
