//! A pool: identical workers on one device behind one bounded queue. Ready workers pull jobs from
//! the queue (work-conserving: nobody waits behind a slow worker while another idles), and with
//! spill on, an idle worker also takes jobs it would finish sooner from its peers' queues.
//!
//! Layout: [`capabilities`] (what the pool takes), [`queue`] (its plain [`State`]: queue in service
//! order, batches, expected starts, what a peer may take), [`order`] (the service order and the
//! start-time model), [`estimate`] (service-time estimates), [`waits`] (queue waits per job class),
//! [`worker_task`] (one task per ready worker: batch → forward → answers). This module is the
//! handle that ties them: [`Pool`] locks the state, wakes the worker tasks, admits the workers the
//! process manager reports ready (which then runs their [`worker_task`]), and reports status.

pub mod capabilities;
pub mod estimate;
pub mod order;
pub mod queue;
pub mod waits;
pub mod worker_task;

use std::sync::{Arc, Mutex, MutexGuard, RwLock, Weak};
use std::time::{Duration, Instant};

use laya::routing::CheckpointName;
use layad_config::PoolConfig;
use layad_proto::client::WorkerClient;
use layad_proto::{EngineFacts, EngineFactsError, pb};
use tokio::sync::Notify;

use crate::backend::{BackendError, Job, Route};
use crate::pool::capabilities::{Capabilities, ForwardShape, JobShape};
use crate::pool::estimate::WarmupPoint;
use crate::pool::order::QueuePolicy;
use crate::pool::queue::{Answer, Entry, ReadyWorker, State};
use crate::status::{LoadedCheckpoint, PoolStatus, SpeedStatus, WarmupReport, WorkerState, WorkerStatus};

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
    /// When the job would start here, from its place in the service order (`None`: no ready
    /// worker).
    pub start: Option<Duration>,
    /// Its expected start plus its service estimate: when it would finish here.
    pub expected: Option<Duration>,
    /// It would start at once.
    pub idle: bool,
    /// The job's service estimate alone.
    pub service: Duration,
    /// That estimate rests on forwards measured here (else it is a guess from the warm-up).
    pub measured: bool,
    /// The pool's device is slowed and due a probe ([`State::probe_due`]).
    pub probe: bool,
    /// The device's speed as measured over its normal speed (1: normal).
    pub speed: f64,
    /// That speed is markedly slower than normal ([`estimate::Speed::slowed`]).
    pub slowed: bool,
}

/// Least time between two probes of a slowed pool: a trickle of a few jobs a second, so that its
/// recovery is seen within a second.
pub const PROBE_EVERY: Duration = Duration::from_millis(250);

/// A ready worker's Describe answer, read once: what it runs, what it takes, how fast it warmed.
#[derive(Clone, Debug, PartialEq)]
pub struct WorkerReport {
    /// Device actually in use.
    pub device: String,
    /// Device asked for, and whether the one in use does not satisfy it.
    pub requested_device: String,
    /// Whether `device` does not satisfy `requested_device`.
    pub device_mismatch: bool,
    /// Precision in use.
    pub dtype: String,
    /// Checkpoints it loaded (names the supervisor does not know are left out).
    pub checkpoints: Vec<LoadedCheckpoint>,
    /// Its own limits of one forward.
    pub capabilities: Option<pb::Capabilities>,
    /// Its warm-up timings.
    pub warmup: Vec<WarmupReport>,
    /// The parity gate it passed, per checkpoint.
    pub parity_gate: Vec<pb::CheckpointParity>,
    /// What its engine tells operators, decoded once here and shown in `/health` as it is.
    pub engine: EngineFacts,
}

impl WorkerReport {
    /// Reads a Describe answer; fails only when its engine facts do not decode (a protocol error).
    pub fn from_info(info: &pb::WorkerInfo) -> Result<Self, EngineFactsError> {
        Ok(Self {
            device: info.device.clone(),
            requested_device: info.requested_device.clone(),
            device_mismatch: info.device_mismatch,
            dtype: info.dtype.clone(),
            checkpoints: info
                .checkpoints
                .iter()
                .filter_map(|c| {
                    Some(LoadedCheckpoint {
                        name: CheckpointName::known(&c.name)?,
                        revision: c.revision.clone(),
                        sha256: c.weights_sha256.clone(),
                    })
                })
                .collect(),
            capabilities: info.capabilities.clone(),
            warmup: info
                .warmup
                .iter()
                .map(|w| WarmupReport {
                    checkpoint: w.checkpoint.clone(),
                    shape: w.shape.clone(),
                    rows: w.rows,
                    tokens_per_row: w.tokens_per_row,
                    steady_ms: w.steady_ms,
                })
                .collect(),
            parity_gate: info.parity_gate.clone().map(|g| g.checkpoints).unwrap_or_default(),
            engine: info.decode_engine_facts()?,
        })
    }

    /// The warm-up timings as estimate seeds.
    fn warmup_points(&self) -> Vec<WarmupPoint> {
        self.warmup
            .iter()
            .filter_map(|w| {
                Some(WarmupPoint {
                    checkpoint: CheckpointName::known(&w.checkpoint)?,
                    shape: ForwardShape {
                        rows: w.rows as usize,
                        padded_len: w.tokens_per_row as usize,
                    },
                    steady_ms: w.steady_ms,
                })
            })
            .collect()
    }
}

/// A worker admitted to a pool, as its [`worker_task`] needs it.
#[derive(Clone, Debug)]
pub struct AdmittedWorker {
    /// Its slot in the pool.
    pub index: usize,
    /// Its gRPC handle.
    pub client: WorkerClient,
    /// The device it reported.
    pub device: String,
    /// The checkpoints it loaded.
    pub checkpoints: Vec<CheckpointName>,
    /// What it takes in one forward.
    pub limits: Capabilities,
}

/// One pool of identical workers and its queue.
pub struct Pool {
    config: PoolConfig,
    checkpoints: Vec<CheckpointName>,
    configured: Capabilities,
    state: Mutex<State>,
    /// Wakes the worker tasks: a job was queued or re-queued, or a worker left.
    notify: Notify,
    /// The pools whose queues this pool's idle workers may take from (none with spill off).
    peers: RwLock<Vec<Weak<Pool>>>,
    /// Jobs ever queued here: idle unload's clock restarts whenever it moves.
    queued: std::sync::atomic::AtomicU64,
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
            peers: RwLock::new(Vec::new()),
            queued: std::sync::atomic::AtomicU64::new(0),
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

    /// How this pool would take a job of `shape` on `checkpoint`, answered by `deadline`, were it
    /// queued now in `policy`'s order.
    pub fn view(
        &self,
        checkpoint: CheckpointName,
        shape: JobShape,
        policy: &QueuePolicy,
        deadline: Instant,
    ) -> PoolView {
        let state = self.lock();
        let capabilities = self.capabilities_of(&state);
        let holds = capabilities.holds(shape);
        let service = holds
            .as_ref()
            .map_or(Duration::ZERO, |forward| state.model.estimate(checkpoint, *forward));
        let measured = holds
            .as_ref()
            .is_ok_and(|forward| state.model.measured(checkpoint, *forward));
        let ready = state
            .ready
            .values()
            .filter(|w| w.checkpoints.contains(&checkpoint))
            .count();
        let start = if ready == 0 {
            None
        } else {
            state.start_for(policy.priority(Instant::now(), service, deadline))
        };
        PoolView {
            name: self.config.name.clone(),
            capabilities,
            holds,
            ready,
            unavailable: state.unavailable.clone(),
            start,
            expected: start.map(|start| start + service),
            idle: start == Some(Duration::ZERO),
            service,
            measured,
            probe: state.probe_due(start, service, PROBE_EVERY, Instant::now()),
            speed: state.model.speed().factor,
            slowed: state.model.speed().slowed(),
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

    /// How many jobs were ever queued here (idle unload watches it move).
    pub fn jobs_queued(&self) -> u64 {
        self.queued.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Resolves once the pool has had nothing queued or running, and no job queued, for `window`
    /// (idle unload); checked every quarter window (10 ms to 1 s).
    pub async fn idle_for(&self, window: Duration) {
        let every = (window / 4).clamp(Duration::from_millis(10), Duration::from_secs(1));
        let (mut seen, mut since) = (self.jobs_queued(), Instant::now());
        loop {
            tokio::time::sleep(every).await;
            let now = self.jobs_queued();
            if now != seen || !self.idle() {
                (seen, since) = (now, Instant::now());
            } else if since.elapsed() >= window {
                return;
            }
        }
    }

    /// Stops taking new jobs; queued ones still run (reload replaced or removed the pool).
    pub fn set_retiring(&self) {
        self.lock().retiring = true;
    }

    /// Queues a job the scheduler placed here by `route` (`None`: a copy run as a probe of a slowed
    /// device), in `policy`'s order, or refuses it at once when the queue is full. The receiver gets the answer; dropping it withdraws the job.
    pub fn enqueue(
        &self,
        job: Job,
        forward: ForwardShape,
        route: Option<Route>,
        policy: &QueuePolicy,
    ) -> Result<Answer, BackendError> {
        let receiver = self
            .lock()
            .push(job, forward, route, self.config.queue_capacity as usize, policy)?;
        self.queued.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.notify.notify_waiters();
        // An idle worker of a peer may take it if this pool cannot start it soon.
        self.notify_peers();
        Ok(receiver)
    }

    /// Sets the pools whose queues this pool's idle workers may take from.
    pub fn set_peers(&self, peers: Vec<Weak<Pool>>) {
        *self.peers.write().unwrap_or_else(|p| p.into_inner()) = peers;
        // A worker idling now may find work in its new peers' queues.
        self.notify.notify_waiters();
    }

    fn peers(&self) -> Vec<Arc<Pool>> {
        let peers = self.peers.read().unwrap_or_else(|p| p.into_inner());
        peers.iter().filter_map(Weak::upgrade).collect()
    }

    /// Wakes the idle workers of every pool that may take from this one.
    fn notify_peers(&self) {
        for peer in self.peers() {
            peer.notify.notify_waiters();
        }
    }

    /// For an idle `worker` of this pool: jobs it holds from a peer's queue that it would finish
    /// strictly earlier than the peer (see [`State::take_for_peer`]), recorded as started here.
    fn take_from_peers(&self, worker: &AdmittedWorker) -> Option<Vec<Entry>> {
        // This pool's estimates, copied so that no two pools' locks are ever held at once.
        let model = {
            let state = self.lock();
            if state.retiring || !state.ready.contains_key(&worker.index) {
                return None;
            }
            state.model.clone()
        };
        for peer in self.peers() {
            let taken = peer.lock().take_for_peer(
                peer.name(),
                &worker.checkpoints,
                &worker.limits,
                |checkpoint, forward| model.estimate(checkpoint, forward),
                |checkpoint, forward| model.measured(checkpoint, forward),
            );
            if let Some(batch) = taken {
                let mut state = self.lock();
                state.taken.0 += batch.len() as u64;
                state.begin(worker.index, &batch);
                return Some(batch);
            }
        }
        None
    }

    /// Counts a job that preferred this pool but went elsewhere.
    pub fn count_spilled_out(&self) {
        self.lock().spilled_out += 1;
    }

    /// Updates the health record of slot `index` through `update`.
    pub fn update_worker(&self, index: usize, update: impl FnOnce(&mut WorkerStatus)) {
        update(self.record(&mut self.lock(), index));
    }

    /// The health record of slot `index`, created on first use.
    fn record<'a>(&self, state: &'a mut State, index: usize) -> &'a mut WorkerStatus {
        state
            .workers
            .entry(index)
            .or_insert_with(|| WorkerStatus::starting(format!("{}/{index}", self.config.name)))
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

    /// Admits the ready worker of slot `index`, as its Describe `report` says it is: its record
    /// shows it ready and it is in rotation. The caller runs its [`worker_task`], which pulls jobs.
    pub fn admit(&self, index: usize, client: WorkerClient, report: WorkerReport) -> AdmittedWorker {
        let checkpoints: Vec<CheckpointName> = report.checkpoints.iter().map(|c| c.name).collect();
        let capabilities = match &report.capabilities {
            Some(own) => self.configured.narrowed_by(own),
            None => self.configured.clone(),
        };
        let device = report.device.clone();
        {
            // One lock: the worker is in rotation exactly when its record says ready.
            let mut state = self.lock();
            state.model.seed(report.warmup_points());
            state.ready.insert(
                index,
                ReadyWorker {
                    checkpoints: checkpoints.clone(),
                    capabilities: capabilities.clone(),
                },
            );
            let record = self.record(&mut state, index);
            record.state = WorkerState::Ready;
            record.device = Some(report.device);
            record.dtype = Some(report.dtype);
            record.checkpoints = report.checkpoints;
            record.warmup = report.warmup;
            record.parity_gate = report.parity_gate;
            record.engine = report.engine;
        }
        self.notify.notify_waiters();
        AdmittedWorker {
            index,
            client,
            device,
            checkpoints,
            limits: capabilities,
        }
    }

    /// Takes the worker out of rotation (it died, failed or is being stopped); its current job, if
    /// any, is retried by its worker task.
    pub fn retire(&self, index: usize) {
        self.lock().ready.remove(&index);
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
            offered_load: state.offered_load(Instant::now()),
            routed: state.routed,
            probes: state.probes,
            spilled_out: state.spilled_out,
            batches: state.batches,
            taken: state.taken,
            waits: state.waits.summary(),
            speed: {
                let speed = state.model.speed();
                SpeedStatus {
                    factor: speed.factor,
                    // The change as wall-clock time, for people and scrapers.
                    since: speed
                        .since
                        .and_then(|at| std::time::SystemTime::now().checked_sub(at.elapsed())),
                    why: speed.why.clone(),
                    changes: speed.changes,
                    slowed: speed.slowed(),
                }
            },
            workers: state.workers.values().cloned().collect(),
        }
    }

    /// Answers every queued job with `error` (used at shutdown once the grace period is over).
    pub fn fail_queued(&self, error: impl Fn() -> BackendError) {
        let drained = self.lock().take_all();
        for q in drained {
            let _ = q.reply.send(Err(error()));
        }
    }
}
