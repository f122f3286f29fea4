//! A pool: identical workers on one device behind one bounded queue. Ready workers pull jobs from
//! the queue (work-conserving: nobody waits behind a slow worker while another idles).
//!
//! Workers that take more than one row per forward pack queued jobs of the same checkpoint into one
//! pass (dynamic batching) within the pool's row and padded-token limits. A job whose worker dies
//! before answering goes back to the front of the queue once (decisions are pure, so a retry is
//! safe); a job whose client went away is dropped when it reaches the front. The pool also keeps
//! its service-time estimates and the backlog the scheduler compares pools by.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use laya::decision::RowOutput;
use laya::prompt::Row;
use laya::routing::CheckpointName;
use layad_config::{PoolConfig, WorkerKind};
use layad_proto::EngineRow;
use layad_proto::client::{ClientError, WorkerClient};
use tokio::sync::{Notify, oneshot};
use tokio_util::sync::CancellationToken;

use crate::backend::{
    BackendError, Capabilities, Job, JobOutput, PoolStatus, Route, RouteCounts, WarmupReport, WorkerState, WorkerStatus,
};
use crate::estimate::{ForwardShape, ServiceModel, WarmupPoint};

/// How many times a job may be started on a worker: once, plus one retry after a worker death.
const MAX_ATTEMPTS: u32 = 2;

/// Most padding a batch may add, as a share of the tokens its jobs would run alone.
const MAX_PADDING: f64 = 0.25;

/// A job's own shape: what decides which pools can hold it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JobShape {
    /// Questions, one row each.
    pub questions: usize,
    /// Tokens in the longest row.
    pub longest: usize,
}

impl JobShape {
    /// The shape of `rows`.
    pub fn of(rows: &[Row]) -> Self {
        Self {
            questions: rows.len(),
            longest: rows.iter().map(|r| r.ids.len()).max().unwrap_or(0),
        }
    }
}

impl Capabilities {
    /// What the configuration allows, before any worker reported its own limits. A Neural Engine
    /// pool runs one row per forward, so it never takes more than one question.
    pub fn from_config(config: &PoolConfig) -> Self {
        let max_rows = if config.worker == WorkerKind::Ane {
            1
        } else {
            config.max_rows as usize
        };
        Self {
            max_questions: config.max_questions.map_or(max_rows, |q| q as usize).min(max_rows),
            max_rows,
            max_len: config.max_tokens.map(|t| t as usize),
            buckets: config.buckets.iter().map(|&b| b as usize).collect(),
            max_batch_tokens: config.max_batch_tokens as usize,
        }
    }

    /// Narrowed by a worker's own limits (Describe). A worker with fixed buckets keeps only the
    /// configured ones it has (all of its own when none are configured).
    pub fn narrowed_by(&self, worker: &layad_proto::pb::Capabilities) -> Self {
        let max_rows = self.max_rows.min(worker.max_rows as usize).max(1);
        let max_len = match (self.max_len, worker.max_len as usize) {
            (limit, 0) => limit,
            (Some(limit), own) => Some(limit.min(own)),
            (None, own) => Some(own),
        };
        let own: Vec<usize> = worker.length_buckets.iter().map(|&b| b as usize).collect();
        let buckets = match (self.buckets.is_empty(), own.is_empty()) {
            (_, true) => self.buckets.clone(),
            (true, false) => own,
            (false, false) => self.buckets.iter().copied().filter(|b| own.contains(b)).collect(),
        };
        Self {
            max_questions: self.max_questions.min(max_rows),
            max_rows,
            max_len,
            buckets,
            max_batch_tokens: self.max_batch_tokens.min(worker.max_batch_tokens as usize),
        }
    }

    /// The length a row of `longest` tokens runs at: its bucket, or itself without buckets; `None`
    /// when it is too long for this pool.
    pub fn padded_len(&self, longest: usize) -> Option<usize> {
        let padded = if self.buckets.is_empty() {
            longest
        } else {
            *self.buckets.iter().find(|&&b| b >= longest)?
        };
        self.max_len.is_none_or(|max| longest <= max).then_some(padded)
    }

    /// The forward a job of `shape` needs here, or why this pool cannot hold it.
    pub fn holds(&self, shape: JobShape) -> Result<ForwardShape, String> {
        if shape.questions > self.max_questions {
            return Err(format!("takes at most {} question(s)", self.max_questions));
        }
        let Some(padded_len) = self.padded_len(shape.longest) else {
            let longest = self
                .buckets
                .last()
                .copied()
                .into_iter()
                .chain(self.max_len)
                .min()
                .unwrap_or_default();
            return Err(format!("takes rows of at most {longest} tokens"));
        };
        let forward = ForwardShape {
            rows: shape.questions,
            padded_len,
        };
        if forward.rows * forward.padded_len > self.max_batch_tokens {
            return Err(format!(
                "runs at most {} padded tokens per forward",
                self.max_batch_tokens
            ));
        }
        Ok(forward)
    }

    /// How specialised the pool is: fewer questions, then shorter rows, first.
    pub fn specialisation(&self) -> (usize, usize) {
        let longest = self.buckets.last().copied().into_iter().chain(self.max_len).min();
        (self.max_questions, longest.unwrap_or(usize::MAX))
    }

    /// `1 question, 128 tokens` for reasons and `/health`.
    pub fn describe(&self) -> String {
        let questions = if self.max_questions == 1 {
            "1 question".to_owned()
        } else {
            format!("{} questions", self.max_questions)
        };
        match self.specialisation().1 {
            usize::MAX => questions,
            longest => format!("{questions} of {longest} tokens"),
        }
    }
}

struct Queued {
    job: Job,
    forward: ForwardShape,
    estimate: Duration,
    enqueued: Instant,
    attempts: u32,
    /// Run alone: a batch it was part of failed, and only a lone run tells whose fault it was.
    solo: bool,
    reply: oneshot::Sender<Result<JobOutput, BackendError>>,
}

/// A worker admitted to the pool.
struct ReadyWorker {
    checkpoints: Vec<CheckpointName>,
    capabilities: Capabilities,
}

#[derive(Default)]
struct State {
    queue: VecDeque<Queued>,
    /// Jobs on a worker now.
    in_flight: usize,
    /// Per busy worker: when its forward started and how long it was expected to take.
    running: BTreeMap<usize, (Instant, Duration)>,
    workers: BTreeMap<usize, WorkerStatus>,
    ready: BTreeMap<usize, ReadyWorker>,
    degraded: Option<String>,
    unavailable: Option<String>,
    retiring: bool,
    model: ServiceModel,
    routed: RouteCounts,
    spilled_out: u64,
    batches: (u64, u64),
}

impl State {
    /// Queued work plus what running forwards still need, per ready worker.
    fn backlog(&self) -> Option<Duration> {
        let ready = self.ready.len();
        if ready == 0 {
            return None;
        }
        let now = Instant::now();
        let queued: Duration = self.queue.iter().map(|q| q.estimate).sum();
        let running: Duration = self
            .running
            .values()
            .map(|(started, estimate)| estimate.saturating_sub(now.duration_since(*started)))
            .sum();
        Some((queued + running) / ready as u32)
    }
}

/// What the scheduler needs to know about one pool for one job.
#[derive(Clone, Debug)]
pub struct PoolView {
    /// The pool's name.
    pub name: String,
    /// What it takes.
    pub capabilities: Capabilities,
    /// The forward the job would need here, or why it cannot hold it.
    pub holds: Result<ForwardShape, String>,
    /// Ready workers that have the job's checkpoint loaded.
    pub ready: usize,
    /// Why the pool cannot run on this machine, if so.
    pub unavailable: Option<String>,
    /// Backlog plus the job's service estimate: when it would finish here (`None`: no ready worker).
    pub expected: Option<Duration>,
    /// A ready worker for the job's checkpoint is free and nothing waits: it would start at once.
    pub idle: bool,
    /// The job's service estimate alone.
    pub service: Duration,
}

/// One pool of identical workers and its queue.
pub struct Pool {
    config: PoolConfig,
    checkpoints: Vec<CheckpointName>,
    configured: Capabilities,
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
            configured: Capabilities::from_config(&config),
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

    /// The pool's name.
    pub fn name(&self) -> &str {
        &self.config.name
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves plain data behind; keep serving with it.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Whether the pool is configured to serve `checkpoint`.
    pub fn serves(&self, checkpoint: CheckpointName) -> bool {
        self.checkpoints.contains(&checkpoint)
    }

    /// The checkpoints the pool is configured to serve.
    pub fn checkpoints(&self) -> &[CheckpointName] {
        &self.checkpoints
    }

    fn capabilities_of(&self, state: &State) -> Capabilities {
        // Workers of a pool are identical; the first ready one speaks for all.
        state
            .ready
            .values()
            .next()
            .map_or_else(|| self.configured.clone(), |w| w.capabilities.clone())
    }

    /// How this pool would take a job of `shape` on `checkpoint`.
    pub fn view(&self, checkpoint: CheckpointName, shape: JobShape) -> PoolView {
        let state = self.lock();
        let capabilities = self.capabilities_of(&state);
        let holds = capabilities.holds(shape);
        let service = holds
            .as_ref()
            .map_or(Duration::ZERO, |forward| state.model.estimate(checkpoint, *forward));
        let ready = state
            .ready
            .values()
            .filter(|w| w.checkpoints.contains(&checkpoint))
            .count();
        let expected = if ready == 0 {
            None
        } else {
            state.backlog().map(|backlog| backlog + service)
        };
        let busy = state.running.len();
        let idle = ready > busy && state.queue.is_empty();
        PoolView {
            name: self.config.name.clone(),
            capabilities,
            holds,
            ready,
            unavailable: state.unavailable.clone(),
            expected,
            idle,
            service,
        }
    }

    /// Whether the pool takes new jobs: not retiring.
    pub fn accepting(&self) -> bool {
        !self.lock().retiring
    }

    /// Whether every worker slot has a ready worker (a replacement pool is ready to take over).
    pub fn fully_ready(&self) -> bool {
        self.lock().ready.len() >= self.config.workers as usize
    }

    /// Whether nothing is queued or running (a retiring pool may stop).
    pub fn idle(&self) -> bool {
        let state = self.lock();
        state.queue.is_empty() && state.in_flight == 0
    }

    /// Stops taking new jobs; queued ones still run (reload replaced or removed the pool).
    pub fn set_retiring(&self) {
        self.lock().retiring = true;
    }

    /// Queues a job placed here by the scheduler, or refuses it at once when the queue is full.
    pub fn enqueue(
        &self,
        job: Job,
        forward: ForwardShape,
        route: Route,
    ) -> Result<oneshot::Receiver<Result<JobOutput, BackendError>>, BackendError> {
        let (reply, receiver) = oneshot::channel();
        {
            let mut state = self.lock();
            if state.queue.len() >= self.config.queue_capacity as usize {
                return Err(BackendError::Overloaded {
                    retry_after: Duration::from_secs(1),
                });
            }
            let estimate = state.model.estimate(job.checkpoint, forward);
            match route {
                Route::Preferred => state.routed.preferred += 1,
                Route::Spilled => state.routed.spilled += 1,
                Route::Fallback => state.routed.fallback += 1,
            }
            state.queue.push_back(Queued {
                job,
                forward,
                estimate,
                enqueued: Instant::now(),
                attempts: 0,
                solo: false,
                reply,
            });
        }
        self.notify.notify_waiters();
        Ok(receiver)
    }

    /// Counts a job that preferred this pool but went elsewhere.
    pub fn count_spilled_out(&self) {
        self.lock().spilled_out += 1;
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
            warmup: Vec::new(),
            parity_gate: Vec::new(),
            cpu_kernels: None,
        });
        update(report);
    }

    /// Forgets slot `index` (scaled down by a reload).
    pub fn remove_worker(&self, index: usize) {
        self.lock().workers.remove(&index);
    }

    /// Marks the pool degraded (or healthy again with `None`).
    pub fn set_degraded(&self, reason: Option<String>) {
        self.lock().degraded = reason;
    }

    /// Marks the pool unable to run on this machine (its worker said its device is missing).
    pub fn set_unavailable(&self, reason: String) {
        self.lock().unavailable = Some(reason);
    }

    /// Admits a ready worker: it pulls jobs until `retired` is cancelled (the job in flight still
    /// finishes) or until `dead` is (the process is gone: the job in flight goes back to the queue).
    pub fn admit(
        self: &Arc<Self>,
        index: usize,
        client: WorkerClient,
        info: &layad_proto::pb::WorkerInfo,
        retired: CancellationToken,
        dead: CancellationToken,
    ) {
        let checkpoints: Vec<CheckpointName> = info
            .checkpoints
            .iter()
            .filter_map(|c| CheckpointName::from_name_or_alias(&c.name))
            .collect();
        let capabilities = match &info.capabilities {
            Some(own) => self.configured.narrowed_by(own),
            None => self.configured.clone(),
        };
        let warmup = warmup_points(info);
        {
            let mut state = self.lock();
            state.model.seed(warmup);
            state.ready.insert(
                index,
                ReadyWorker {
                    checkpoints: checkpoints.clone(),
                    capabilities: capabilities.clone(),
                },
            );
        }
        self.notify.notify_waiters();
        let pool = Arc::clone(self);
        tokio::spawn(async move {
            pool.serve_worker(index, &client, &checkpoints, &capabilities, &retired, &dead)
                .await;
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

    /// Answers, without a forward, queued jobs whose client left or whose deadline passed.
    fn drop_abandoned(state: &mut State) {
        let now = Instant::now();
        state.queue.retain_mut(|q| !q.reply.is_closed());
        while let Some(pos) = state.queue.iter().position(|q| q.job.deadline <= now) {
            if let Some(q) = state.queue.remove(pos) {
                let _ = q.reply.send(Err(BackendError::DeadlineExpired));
            }
        }
    }

    /// Takes the next batch this worker can run: the oldest job for a checkpoint it serves, plus
    /// (when the worker takes several rows) later jobs of the same checkpoint that fit beside it.
    /// `None` when the oldest job could still gain company within the pool's `batch_wait`.
    fn take_batch(
        &self,
        state: &mut State,
        checkpoints: &[CheckpointName],
        limits: &Capabilities,
    ) -> Option<Vec<Queued>> {
        let first = state
            .queue
            .iter()
            .position(|q| checkpoints.contains(&q.job.checkpoint))?;
        let (checkpoint, solo) = (state.queue[first].job.checkpoint, state.queue[first].solo);
        let mut members = vec![first];
        let own = |f: ForwardShape| f.rows * f.padded_len;
        let head = state.queue[first].forward;
        let (mut rows, mut padded_len, mut needed) = (head.rows, head.padded_len, own(head));
        if !solo && limits.max_rows > 1 {
            for (pos, q) in state.queue.iter().enumerate().skip(first + 1) {
                if q.job.checkpoint != checkpoint || q.solo {
                    continue;
                }
                let len = padded_len.max(q.forward.padded_len);
                let total = rows + q.forward.rows;
                // Every row runs at the batch's length: padding short rows to a long one costs more
                // than running them apart (a CPU forward's time grows with its tokens), so a job joins
                // only while the batch stays within MAX_PADDING of the tokens its jobs need alone.
                let within_padding = (total * len) as f64 <= (needed + own(q.forward)) as f64 * (1.0 + MAX_PADDING);
                if total <= limits.max_rows && total * len <= limits.max_batch_tokens && within_padding {
                    members.push(pos);
                    (rows, padded_len, needed) = (total, len, needed + own(q.forward));
                }
            }
        }
        let room_left = rows < limits.max_rows && !solo;
        let waited = state.queue[first].enqueued.elapsed();
        if room_left && waited < self.config.batch_wait {
            return None;
        }
        // Remove from the back so earlier positions stay valid.
        let mut batch: Vec<Queued> = members
            .iter()
            .rev()
            .filter_map(|&pos| state.queue.remove(pos))
            .collect();
        batch.reverse();
        Some(batch)
    }

    /// Waits for the next batch this worker can run.
    async fn next_batch(
        &self,
        checkpoints: &[CheckpointName],
        limits: &Capabilities,
        stop: &CancellationToken,
    ) -> Option<Vec<Queued>> {
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            // Register before looking, so a job queued between the look and the wait still wakes us.
            notified.as_mut().enable();
            let mut wake_after = Duration::from_millis(250);
            {
                let mut state = self.lock();
                Self::drop_abandoned(&mut state);
                match self.take_batch(&mut state, checkpoints, limits) {
                    Some(batch) => {
                        state.in_flight += batch.len();
                        return Some(batch);
                    }
                    None => {
                        // A job waiting for company: look again when its wait is over.
                        if let Some(q) = state.queue.iter().find(|q| checkpoints.contains(&q.job.checkpoint)) {
                            wake_after = self.config.batch_wait.saturating_sub(q.enqueued.elapsed());
                        }
                    }
                }
            }
            tokio::select! {
                () = &mut notified => {}
                () = stop.cancelled() => return None,
                // Deadlines of waiting jobs must be enforced even when nothing else happens.
                () = tokio::time::sleep(wake_after) => {}
            }
        }
    }

    async fn serve_worker(
        &self,
        index: usize,
        client: &WorkerClient,
        checkpoints: &[CheckpointName],
        limits: &Capabilities,
        retired: &CancellationToken,
        dead: &CancellationToken,
    ) {
        let worker = format!("{}/{index}", self.config.name);
        while let Some(mut batch) = self.next_batch(checkpoints, limits, retired).await {
            let checkpoint = batch[0].job.checkpoint;
            let forward = ForwardShape {
                rows: batch.iter().map(|q| q.job.rows.len()).sum(),
                padded_len: batch.iter().map(|q| q.forward.padded_len).max().unwrap_or(0),
            };
            let rows: Vec<EngineRow> = batch
                .iter()
                .flat_map(|q| &q.job.rows)
                .map(|r| EngineRow {
                    ids: r.ids.clone(),
                    markers: r.markers.clone(),
                    qtype: r.qtype as u32,
                })
                .collect();
            let started = Instant::now();
            {
                let mut state = self.lock();
                let estimate = state.model.estimate(checkpoint, forward);
                state.running.insert(index, (started, estimate));
                if batch.len() > 1 {
                    state.batches.0 += 1;
                    state.batches.1 += batch.len() as u64;
                }
            }
            for q in &mut batch {
                q.attempts += 1;
            }
            let result = tokio::select! {
                result = client.forward(checkpoint.as_str(), &rows) => result,
                // The process manager saw the worker exit: treat it like a lost connection.
                () = dead.cancelled() => Err(ClientError::Unavailable("worker process exited".to_owned())),
            };
            {
                let mut state = self.lock();
                state.in_flight -= batch.len();
                state.running.remove(&index);
                if let Ok(answer) = &result {
                    state
                        .model
                        .observe(checkpoint, forward, Duration::from_micros(answer.device_us));
                }
            }
            match result {
                Ok(answer) => {
                    let device = self
                        .lock()
                        .workers
                        .get(&index)
                        .and_then(|w| w.device.clone())
                        .unwrap_or_default();
                    let mut outputs = answer.outputs.into_iter().map(|o| RowOutput {
                        act_probability: o.act_probabilities.first().copied().unwrap_or(f32::NAN),
                        logits: o.logits,
                    });
                    for q in batch {
                        let own: Vec<RowOutput> = outputs.by_ref().take(q.job.rows.len()).collect();
                        let output = JobOutput {
                            outputs: own,
                            pool: self.config.name.clone(),
                            worker: worker.clone(),
                            device: device.clone(),
                            queue_wait: started.duration_since(q.enqueued),
                            device_time: Duration::from_micros(answer.device_us),
                            batch_rows: forward.rows,
                            // The scheduler fills in how and why it chose this pool.
                            route: Route::Preferred,
                            reason: String::new(),
                        };
                        let _ = q.reply.send(Ok(output));
                    }
                }
                Err(error) if error.is_retryable() => {
                    let mut state = self.lock();
                    for q in batch.into_iter().rev() {
                        if q.attempts < MAX_ATTEMPTS {
                            tracing::warn!(worker, request_id = %q.job.request_id, %error, "worker lost a job; retrying it on another worker");
                            state.queue.push_front(q);
                        } else {
                            tracing::error!(worker, request_id = %q.job.request_id, %error, "job lost its worker twice");
                            let _ = q.reply.send(Err(BackendError::Failed(error.to_string())));
                        }
                    }
                    drop(state);
                    self.notify.notify_waiters();
                    // This worker is gone; the process manager restarts it.
                    return;
                }
                Err(error) if batch.len() > 1 => {
                    // One job of the batch may have been refused for all: run each alone.
                    tracing::warn!(worker, %error, jobs = batch.len(), "a batched forward failed; running its jobs one by one");
                    let mut state = self.lock();
                    for mut q in batch.into_iter().rev() {
                        q.solo = true;
                        q.attempts -= 1;
                        state.queue.push_front(q);
                    }
                }
                Err(error) => {
                    for q in batch {
                        tracing::error!(worker, request_id = %q.job.request_id, %error, "worker failed a job");
                        let _ = q.reply.send(Err(BackendError::Failed(error.to_string())));
                    }
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
            unavailable: state.unavailable.clone(),
            retiring: state.retiring,
            capabilities: self.capabilities_of(&state),
            backlog: state.backlog().unwrap_or_default(),
            routed: state.routed,
            spilled_out: state.spilled_out,
            batches: state.batches,
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

/// The warm-up timings a worker reported, as estimate seeds.
fn warmup_points(info: &layad_proto::pb::WorkerInfo) -> Vec<WarmupPoint> {
    info.warmup
        .iter()
        .filter_map(|w| {
            Some(WarmupPoint {
                checkpoint: CheckpointName::from_name_or_alias(&w.checkpoint)?,
                shape: ForwardShape {
                    rows: w.rows as usize,
                    padded_len: w.tokens_per_row as usize,
                },
                steady_ms: w.steady_ms,
            })
        })
        .collect()
}

/// The warm-up timings a worker reported, for `/health`.
pub fn warmup_reports(info: &layad_proto::pb::WorkerInfo) -> Vec<WarmupReport> {
    info.warmup
        .iter()
        .map(|w| WarmupReport {
            checkpoint: w.checkpoint.clone(),
            shape: w.shape.clone(),
            rows: w.rows,
            tokens_per_row: w.tokens_per_row,
            steady_ms: w.steady_ms,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn general() -> Capabilities {
        Capabilities::from_config(&PoolConfig::named("general"))
    }

    fn short() -> Capabilities {
        let mut config = PoolConfig::named("short");
        config.max_questions = Some(1);
        config.max_tokens = Some(128);
        Capabilities::from_config(&config)
    }

    fn shape(questions: usize, longest: usize) -> JobShape {
        JobShape { questions, longest }
    }

    #[test]
    fn a_short_pool_holds_one_short_question_only() {
        assert!(short().holds(shape(1, 128)).is_ok());
        assert_eq!(
            short().holds(shape(2, 40)).expect_err("two questions"),
            "takes at most 1 question(s)"
        );
        assert_eq!(
            short().holds(shape(1, 129)).expect_err("129 tokens"),
            "takes rows of at most 128 tokens"
        );
        assert!(general().holds(shape(4, 500)).is_ok());
        assert!(short().specialisation() < general().specialisation());
    }

    #[test]
    fn buckets_pad_rows_and_bound_their_length() {
        let mut config = PoolConfig::named("bucketed");
        config.buckets = vec![64, 96, 128];
        let caps = Capabilities::from_config(&config);
        let padded = |longest| caps.holds(shape(1, longest)).map(|f| f.padded_len);
        assert_eq!(padded(1), Ok(64));
        assert_eq!(padded(64), Ok(64));
        assert_eq!(padded(65), Ok(96));
        assert_eq!(padded(128), Ok(128));
        assert!(padded(129).is_err());
        // Padded tokens count against the forward budget.
        config.max_batch_tokens = 200;
        let caps = Capabilities::from_config(&config);
        assert!(caps.holds(shape(3, 65)).is_err());
        assert!(caps.holds(shape(3, 64)).is_ok());
    }

    /// A queued job of one row per entry of `lengths`.
    fn queued(checkpoint: CheckpointName, lengths: &[usize]) -> Queued {
        let rows: Vec<Row> = lengths
            .iter()
            .map(|&len| Row {
                ids: vec![1; len],
                markers: vec![0],
                qtype: laya::question::QuestionType::Noul,
            })
            .collect();
        let shape = JobShape::of(&rows);
        Queued {
            forward: ForwardShape {
                rows: shape.questions,
                padded_len: shape.longest,
            },
            job: Job {
                request_id: format!("{lengths:?}"),
                checkpoint,
                rows,
                deadline: Instant::now() + Duration::from_secs(60),
            },
            estimate: Duration::ZERO,
            enqueued: Instant::now(),
            attempts: 0,
            solo: false,
            reply: oneshot::channel().0,
        }
    }

    #[test]
    fn batches_take_same_checkpoint_jobs_of_similar_length_only() {
        let pool = Pool::new(PoolConfig::named("general"), CheckpointName::ALL.to_vec());
        let english = CheckpointName::English;
        let mut state = State::default();
        for job in [
            queued(english, &[60]),
            queued(CheckpointName::Multilingual, &[60]),
            queued(english, &[384]),
            queued(english, &[64, 50]),
            queued(english, &[70]),
        ] {
            state.queue.push_back(job);
        }
        let limits = Capabilities::from_config(pool.config());
        let batch = pool
            .take_batch(&mut state, &CheckpointName::ALL, &limits)
            .expect("a batch");
        let ids: Vec<&str> = batch.iter().map(|q| q.job.request_id.as_str()).collect();
        // 384 tokens would pad the others sixfold; 70 pads 4 rows of <= 64 by less than a quarter.
        assert_eq!(ids, ["[60]", "[64, 50]", "[70]"]);
        let left: Vec<&str> = state.queue.iter().map(|q| q.job.request_id.as_str()).collect();
        assert_eq!(left, ["[60]", "[384]"], "the rest keeps its order");
        // One row per forward: no batching.
        let mut one_row = limits.clone();
        one_row.max_rows = 1;
        let batch = pool
            .take_batch(&mut state, &CheckpointName::ALL, &one_row)
            .expect("a batch");
        assert_eq!(batch.len(), 1);
    }

    #[test]
    fn a_worker_narrows_what_the_configuration_allows() {
        let mut config = PoolConfig::named("ane");
        config.worker = WorkerKind::Ane;
        config.buckets = vec![64, 128];
        let configured = Capabilities::from_config(&config);
        assert_eq!(
            configured.max_questions, 1,
            "a Neural Engine pool runs one row per forward"
        );
        let own = layad_proto::pb::Capabilities {
            max_rows: 1,
            max_batch_tokens: 128,
            max_len: 128,
            length_buckets: vec![64, 96, 128],
        };
        let narrowed = configured.narrowed_by(&own);
        assert_eq!(narrowed.buckets, [64, 128]);
        assert_eq!(narrowed.max_len, Some(128));
        assert_eq!(narrowed.max_batch_tokens, 128);
        // Without configured buckets the worker's own apply.
        assert_eq!(general().narrowed_by(&own).buckets, [64, 96, 128]);
        assert_eq!(general().narrowed_by(&own).max_questions, 1);
    }
}
