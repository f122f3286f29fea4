//! A pool: identical workers on one device behind one bounded queue. Ready workers pull jobs from
//! the queue one at a time (work-conserving: nobody waits behind a slow worker while another idles).
//!
//! A job whose worker dies before answering goes back to the front of the queue once (decisions are
//! pure, so a retry is safe); a job whose client went away is dropped when it reaches the front.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use laya::decision::RowOutput;
use laya::routing::CheckpointName;
use layad_config::PoolConfig;
use layad_proto::EngineRow;
use layad_proto::client::{ClientError, WorkerClient};
use tokio::sync::{Notify, oneshot};
use tokio_util::sync::CancellationToken;

use crate::backend::{BackendError, Job, JobOutput, PoolStatus, WorkerState, WorkerStatus};

/// How many times a job may be started on a worker: once, plus one retry after a worker death.
const MAX_ATTEMPTS: u32 = 2;

struct Queued {
    job: Job,
    enqueued: Instant,
    attempts: u32,
    reply: oneshot::Sender<Result<JobOutput, BackendError>>,
}

#[derive(Default)]
struct State {
    queue: VecDeque<Queued>,
    in_flight: usize,
    workers: BTreeMap<usize, WorkerStatus>,
    ready: BTreeMap<usize, Vec<CheckpointName>>,
    degraded: Option<String>,
}

/// One pool of identical workers and its queue.
pub struct Pool {
    config: PoolConfig,
    checkpoints: Vec<CheckpointName>,
    state: Mutex<State>,
    notify: Notify,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("name", &self.config.name)
            .finish_non_exhaustive()
    }
}

impl Pool {
    /// An empty pool for `config` serving `checkpoints`; workers join through [`Pool::admit`].
    pub fn new(config: PoolConfig, checkpoints: Vec<CheckpointName>) -> Arc<Self> {
        Arc::new(Self {
            config,
            checkpoints,
            state: Mutex::new(State::default()),
            notify: Notify::new(),
        })
    }

    /// The pool's configuration.
    pub fn config(&self) -> &PoolConfig {
        &self.config
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves plain data behind; keep serving with it.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Queues a job, or refuses it at once when the queue is full.
    pub fn enqueue(&self, job: Job) -> Result<oneshot::Receiver<Result<JobOutput, BackendError>>, BackendError> {
        let (reply, receiver) = oneshot::channel();
        {
            let mut state = self.lock();
            if state.queue.len() >= self.config.queue_capacity as usize {
                return Err(BackendError::Overloaded {
                    retry_after: Duration::from_secs(1),
                });
            }
            state.queue.push_back(Queued {
                job,
                enqueued: Instant::now(),
                attempts: 0,
                reply,
            });
        }
        self.notify.notify_waiters();
        Ok(receiver)
    }

    /// Load per ready worker: queued plus running jobs, divided by ready workers (infinite with none).
    pub fn load(&self) -> f64 {
        let state = self.lock();
        let ready = state.ready.len();
        if ready == 0 {
            f64::INFINITY
        } else {
            (state.queue.len() + state.in_flight) as f64 / ready as f64
        }
    }

    /// Whether the pool is configured to serve `checkpoint`.
    pub fn serves(&self, checkpoint: CheckpointName) -> bool {
        self.checkpoints.contains(&checkpoint)
    }

    /// The checkpoints the pool is configured to serve.
    pub fn checkpoints(&self) -> &[CheckpointName] {
        &self.checkpoints
    }

    /// Updates the health record of slot `index` through `update`.
    pub fn update_worker(&self, index: usize, update: impl FnOnce(&mut WorkerStatus)) {
        let mut state = self.lock();
        let report = state.workers.entry(index).or_insert_with(|| WorkerStatus {
            id: format!("{}/{index}", self.config.name),
            pid: None,
            state: WorkerState::Starting,
            device: None,
            dtype: None,
            checkpoints: Vec::new(),
            restarts: 0,
            last_exit: None,
            last_error: None,
            stderr_tail: Vec::new(),
        });
        update(report);
    }

    /// Marks the pool degraded (or healthy again with `None`).
    pub fn set_degraded(&self, reason: Option<String>) {
        self.lock().degraded = reason;
    }

    /// Admits a ready worker: it pulls jobs until `retired` is cancelled (the job in flight still
    /// finishes) or until `dead` is (the process is gone: the job in flight goes back to the queue).
    pub fn admit(
        self: &Arc<Self>,
        index: usize,
        client: WorkerClient,
        checkpoints: Vec<CheckpointName>,
        retired: CancellationToken,
        dead: CancellationToken,
    ) {
        self.lock().ready.insert(index, checkpoints.clone());
        self.notify.notify_waiters();
        let pool = Arc::clone(self);
        tokio::spawn(async move {
            pool.serve_worker(index, &client, &checkpoints, &retired, &dead).await;
            pool.lock().ready.remove(&index);
            // The jobs this worker would have taken must not wait for it: wake the others.
            pool.notify.notify_waiters();
        });
    }

    /// Takes the worker out of rotation (it died or is being stopped); its current job, if any, is
    /// retried by its serving task.
    pub fn retire(&self, index: usize) {
        self.lock().ready.remove(&index);
    }

    /// Waits for the next job this worker can run: the oldest one for a checkpoint it serves.
    async fn next_job(&self, checkpoints: &[CheckpointName], stop: &CancellationToken) -> Option<Queued> {
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            // Register before looking, so a job queued between the look and the wait still wakes us.
            notified.as_mut().enable();
            {
                let mut state = self.lock();
                // Clients that left, or whose deadline passed, are answered here without a forward.
                let now = Instant::now();
                state.queue.retain_mut(|q| !q.reply.is_closed());
                while let Some(pos) = state.queue.iter().position(|q| q.job.deadline <= now) {
                    if let Some(q) = state.queue.remove(pos) {
                        let _ = q.reply.send(Err(BackendError::DeadlineExpired));
                    }
                }
                if let Some(pos) = state.queue.iter().position(|q| checkpoints.contains(&q.job.checkpoint)) {
                    let queued = state.queue.remove(pos);
                    state.in_flight += 1;
                    return queued;
                }
            }
            tokio::select! {
                () = &mut notified => {}
                () = stop.cancelled() => return None,
                // Deadlines of waiting jobs must be enforced even when nothing else happens.
                () = tokio::time::sleep(Duration::from_millis(250)) => {}
            }
        }
    }

    async fn serve_worker(
        &self,
        index: usize,
        client: &WorkerClient,
        checkpoints: &[CheckpointName],
        retired: &CancellationToken,
        dead: &CancellationToken,
    ) {
        let worker = format!("{}/{index}", self.config.name);
        while let Some(mut queued) = self.next_job(checkpoints, retired).await {
            let queue_wait = queued.enqueued.elapsed();
            let rows: Vec<EngineRow> = queued
                .job
                .rows
                .iter()
                .map(|r| EngineRow {
                    ids: r.ids.clone(),
                    markers: r.markers.clone(),
                    qtype: r.qtype as u32,
                })
                .collect();
            queued.attempts += 1;
            let result = tokio::select! {
                result = client.forward(queued.job.checkpoint.as_str(), &rows) => result,
                // The process manager saw the worker exit: treat it like a lost connection.
                () = dead.cancelled() => Err(ClientError::Unavailable("worker process exited".to_owned())),
            };
            self.lock().in_flight -= 1;
            match result {
                Ok(forward) => {
                    let outputs = forward
                        .outputs
                        .into_iter()
                        .map(|o| RowOutput {
                            logits: o.logits,
                            act_probability: o.act_probabilities.first().copied().unwrap_or(f32::NAN),
                        })
                        .collect();
                    let output = JobOutput {
                        outputs,
                        pool: self.config.name.clone(),
                        worker: worker.clone(),
                        device: self
                            .lock()
                            .workers
                            .get(&index)
                            .and_then(|w| w.device.clone())
                            .unwrap_or_default(),
                        queue_wait,
                        device_time: Duration::from_micros(forward.device_us),
                    };
                    let _ = queued.reply.send(Ok(output));
                }
                Err(error) if error.is_retryable() => {
                    if queued.attempts < MAX_ATTEMPTS {
                        tracing::warn!(worker, request_id = %queued.job.request_id, %error, "worker lost a job; retrying it on another worker");
                        self.lock().queue.push_front(queued);
                    } else {
                        tracing::error!(worker, request_id = %queued.job.request_id, %error, "job lost its worker twice");
                        let _ = queued.reply.send(Err(BackendError::Failed(error.to_string())));
                    }
                    // This worker is gone; the process manager restarts it.
                    return;
                }
                Err(error) => {
                    tracing::error!(worker, request_id = %queued.job.request_id, %error, "worker failed a job");
                    let _ = queued.reply.send(Err(BackendError::Failed(error.to_string())));
                }
            }
        }
    }

    /// A snapshot for health, readiness and metrics.
    pub fn status(&self) -> PoolStatus {
        let state = self.lock();
        PoolStatus {
            name: self.config.name.clone(),
            worker_kind: self.config.worker.as_str().to_owned(),
            device: self.config.device.as_str().to_owned(),
            checkpoints: self.checkpoints.clone(),
            queue_depth: state.queue.len(),
            queue_capacity: self.config.queue_capacity as usize,
            in_flight: state.in_flight,
            degraded: state.degraded.clone(),
            workers: state.workers.values().cloned().collect(),
        }
    }

    /// Answers every queued job with `error` (used at shutdown once the grace period is over).
    pub fn fail_queued(&self, error: impl Fn() -> BackendError) {
        let drained: Vec<Queued> = self.lock().queue.drain(..).collect();
        for q in drained {
            let _ = q.reply.send(Err(error()));
        }
    }
}
