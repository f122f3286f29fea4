//! The scheduler: sends each job to the pool that will start it soonest among the pools that serve
//! its checkpoint, and waits for the answer within the job's deadline.
//!
//! "Soonest" is the pool's load per ready worker (queued plus running jobs); a pool with no ready
//! worker is used only when no capable pool has one, so jobs wait for a restart rather than fail.

use std::sync::Arc;

use futures::future::BoxFuture;

use crate::backend::{Backend, BackendError, BackendStatus, Job, JobOutput};
use crate::pool::Pool;

/// Routes jobs to pools.
#[derive(Debug)]
pub struct Scheduler {
    pools: Vec<Arc<Pool>>,
}

impl Scheduler {
    /// A scheduler over `pools`.
    pub fn new(pools: Vec<Arc<Pool>>) -> Self {
        Self { pools }
    }

    /// The pools, in configuration order.
    pub fn pools(&self) -> &[Arc<Pool>] {
        &self.pools
    }
}

/// The pool a job for `job.checkpoint` goes to now, or `None` if no pool serves it.
fn choose<'a>(pools: &'a [Arc<Pool>], job: &Job) -> Option<&'a Arc<Pool>> {
    pools
        .iter()
        .filter(|p| p.serves(job.checkpoint))
        // `total_cmp` puts pools without ready workers (infinite load) last.
        .min_by(|a, b| a.load().total_cmp(&b.load()))
}

/// Queues `job` and waits for its answer, at most until its deadline.
async fn submit(pools: &[Arc<Pool>], job: Job) -> Result<JobOutput, BackendError> {
    let pool = choose(pools, &job).ok_or(BackendError::CheckpointUnavailable(job.checkpoint))?;
    let deadline = tokio::time::Instant::from_std(job.deadline);
    let answer = pool.enqueue(job)?;
    match tokio::time::timeout_at(deadline, answer).await {
        Ok(Ok(result)) => result,
        // The pool dropped the job without answering: it is shutting down.
        Ok(Err(_)) => Err(BackendError::Failed("the pool shut down before answering".to_owned())),
        // Dropping `answer` here withdraws the job: the pool skips it when it reaches the front.
        Err(_) => Err(BackendError::DeadlineExpired),
    }
}

impl Backend for Scheduler {
    fn run(&self, job: Job) -> BoxFuture<'static, Result<JobOutput, BackendError>> {
        let pools = self.pools.clone();
        Box::pin(async move { submit(&pools, job).await })
    }

    fn status(&self) -> BackendStatus {
        BackendStatus {
            pools: self.pools.iter().map(|p| p.status()).collect(),
        }
    }
}
