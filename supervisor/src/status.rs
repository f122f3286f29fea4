//! What `/health`, `/readyz` and `/metrics` report: a snapshot of every pool and worker, as the
//! backend answers [`crate::backend::Backend::status`]. Plain data; the pools fill it in.

use std::time::Duration;

use laya::routing::CheckpointName;

use crate::pool::capabilities::Capabilities;

/// Every pool, for `/health`, `/readyz` and `/metrics`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BackendStatus {
    /// The configured pools, in configuration order.
    pub pools: Vec<PoolStatus>,
}

impl BackendStatus {
    /// Whether a request for `checkpoint` can be answered: some ready worker has it loaded, or a
    /// worker unloaded it on purpose (idle unload) and loads it again for the request.
    pub fn servable(&self, checkpoint: CheckpointName) -> bool {
        self.pools.iter().flat_map(|p| &p.workers).any(|w| {
            matches!(w.state, WorkerState::Ready | WorkerState::Unloaded)
                && w.checkpoints.iter().any(|c| c.name == checkpoint)
        })
    }
}

/// A coarse class of job shapes, for reporting queue waits per class in `/health` and `/metrics`:
/// one question or several, and the longest row's length band.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct JobClass {
    /// More than one question.
    pub multi: bool,
    /// Index into [`JobClass::BANDS`]; one past the end for longer rows.
    band: usize,
}

impl JobClass {
    /// Upper ends of the length bands, in tokens.
    pub const BANDS: [usize; 4] = [64, 128, 256, 512];

    /// The class of a job of `questions` questions whose longest row has `longest` tokens.
    pub fn of(questions: usize, longest: usize) -> Self {
        Self {
            multi: questions > 1,
            band: Self::BANDS
                .iter()
                .position(|&b| longest <= b)
                .unwrap_or(Self::BANDS.len()),
        }
    }

    /// The name in `/health` and `/metrics`: `single-64` (one question, rows of at most 64 tokens),
    /// `single-128` (65–128), `single-256`, `single-512`, `single-longer`, and `multi-…` likewise.
    pub fn name(self) -> &'static str {
        const SINGLE: [&str; 5] = ["single-64", "single-128", "single-256", "single-512", "single-longer"];
        const MULTI: [&str; 5] = ["multi-64", "multi-128", "multi-256", "multi-512", "multi-longer"];
        if self.multi {
            MULTI[self.band]
        } else {
            SINGLE[self.band]
        }
    }
}

/// One pool: identical workers on one device sharing a queue.
#[derive(Clone, Debug, PartialEq)]
pub struct PoolStatus {
    /// The pool's configured name.
    pub name: String,
    /// Which worker binary it runs (`gpu`, `ane`).
    pub worker_kind: String,
    /// The device the configuration asked for (`auto`, `cpu`, …); workers report what they use.
    pub device: String,
    /// The checkpoints the pool is configured to serve.
    pub checkpoints: Vec<CheckpointName>,
    /// Requests waiting for a worker.
    pub queue_depth: usize,
    /// Most requests that may wait.
    pub queue_capacity: usize,
    /// Jobs running on the pool's workers now.
    pub in_flight: usize,
    /// Why the pool is degraded (e.g. a crash loop), if it is.
    pub degraded: Option<String>,
    /// Why the pool cannot run at all on this machine (its worker reported its device missing).
    pub unavailable: Option<String>,
    /// Replaced or removed by a reload: takes no new jobs, finishes its queue, then stops.
    pub retiring: bool,
    /// What it takes: most questions, longest row, buckets (from config and the workers).
    pub capabilities: Capabilities,
    /// Expected time until a new job could start: queued and running work per ready worker.
    pub backlog: Duration,
    /// The device time of the jobs queued over the last second, alone, per ready worker and second:
    /// from 0.9 on the pool batches for throughput (`pool::queue::SATURATED`).
    pub offered_load: f64,
    /// Jobs placed here, by route (spilled = spilled in from another pool).
    pub routed: RouteCounts,
    /// Jobs that preferred this pool but spilled to another.
    pub spilled_out: u64,
    /// Copies of jobs run here as probes of a slowed device (their answers not used).
    pub probes: u64,
    /// Forward passes that carried more than one job, and the jobs they carried.
    pub batches: (u64, u64),
    /// Jobs this pool's idle workers took from other pools' queues, and jobs other pools took
    /// from this pool's queue.
    pub taken: (u64, u64),
    /// How long jobs waited for a worker here, per job class (classes seen so far).
    pub waits: Vec<ClassWaits>,
    /// How fast the pool's device runs now, relative to its normal speed.
    pub speed: SpeedStatus,
    /// The pool's workers.
    pub workers: Vec<WorkerStatus>,
}

/// The speed of a pool's device as the scheduler estimates it (the estimates' change detector).
#[derive(Clone, Debug, PartialEq)]
pub struct SpeedStatus {
    /// Measured device time over normal device time: 1 normally, 4 at a quarter of its speed.
    pub factor: f64,
    /// When the factor last changed, if it ever did.
    pub since: Option<std::time::SystemTime>,
    /// Why it changed, in words.
    pub why: Option<String>,
    /// Times it changed.
    pub changes: u64,
    /// Whether the scheduler treats the device as slowed: it gets jobs only where it finishes them
    /// first, and a probe now and then.
    pub slowed: bool,
}

impl Default for SpeedStatus {
    fn default() -> Self {
        Self {
            factor: 1.0,
            since: None,
            why: None,
            changes: 0,
            slowed: false,
        }
    }
}

/// Queue waits of one job class on one pool.
#[derive(Clone, Debug, PartialEq)]
pub struct ClassWaits {
    /// The class.
    pub class: JobClass,
    /// Jobs of the class a worker started here, ever.
    pub jobs: u64,
    /// Over the most recent jobs of the class (up to a window): how many, and their median, 99th
    /// percentile and longest wait.
    pub recent: usize,
    /// Median wait of the recent jobs.
    pub p50: Duration,
    /// 99th-percentile wait of the recent jobs (nearest rank).
    pub p99: Duration,
    /// Longest wait of the recent jobs.
    pub max: Duration,
}

/// One worker process.
#[derive(Clone, Debug, PartialEq)]
pub struct WorkerStatus {
    /// Stable id within the supervisor, e.g. `gpu-0`.
    pub id: String,
    /// The current process id, while one runs.
    pub pid: Option<u32>,
    /// Where it is in its life cycle.
    pub state: WorkerState,
    /// The device actually in use, once the worker reported it.
    pub device: Option<String>,
    /// The compute precision actually in use, once reported.
    pub dtype: Option<String>,
    /// The checkpoints it has loaded, as it reported them.
    pub checkpoints: Vec<LoadedCheckpoint>,
    /// How many times it was restarted.
    pub restarts: u64,
    /// How its last process ended (`exit status 1`, `killed by SIGKILL`), if one did.
    pub last_exit: Option<String>,
    /// The last error seen (start-up failure, RPC error), if any.
    pub last_error: Option<String>,
    /// The last lines its previous process wrote to stderr.
    pub stderr_tail: Vec<String>,
    /// Its warm-up, as reported when it became ready: (checkpoint, shape, rows, tokens per row,
    /// steady milliseconds). Empty until then.
    pub warmup: Vec<WarmupReport>,
    /// The parity gate it passed before it became ready, per checkpoint (workers that run a
    /// converted graph, such as `layad-worker-ane`); empty otherwise.
    pub parity_gate: Vec<layad_proto::pb::CheckpointParity>,
    /// What its engine tells operators (CPU kernels, GPU, why it fell back to another device, …),
    /// once reported: `/health` writes each field as it is, so a new one needs no code here.
    pub engine: layad_proto::EngineFacts,
    /// How many times idle unload stopped it.
    pub unloads: u64,
    /// After the last idle unload: how long loading and warming it again took, which is what the
    /// request that woke it waited for besides its own forward (milliseconds).
    pub last_reload_ms: Option<f64>,
}

impl WorkerStatus {
    /// The record of a worker slot that has not started a process yet.
    pub fn starting(id: String) -> Self {
        Self {
            id,
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
            engine: layad_proto::EngineFacts::default(),
            unloads: 0,
            last_reload_ms: None,
        }
    }
}

/// One warm-up shape a worker ran before it became ready.
#[derive(Clone, Debug, PartialEq)]
pub struct WarmupReport {
    /// The checkpoint.
    pub checkpoint: String,
    /// `short`, `longest`, `bucket`, `multi-row`.
    pub shape: String,
    /// Rows in the batch.
    pub rows: u32,
    /// Tokens per row.
    pub tokens_per_row: u32,
    /// Steady-state time in milliseconds.
    pub steady_ms: f64,
}

/// Jobs routed to a pool, by how.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RouteCounts {
    /// As the preferred pool.
    pub preferred: u64,
    /// Spilled in from another pool.
    pub spilled: u64,
    /// Taken because the preferred pool could not.
    pub fallback: u64,
}

/// A checkpoint a worker has loaded, from the worker's own report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoadedCheckpoint {
    /// Which checkpoint.
    pub name: CheckpointName,
    /// The snapshot commit it was loaded from, when known.
    pub revision: Option<String>,
    /// SHA-256 of the weights file that was loaded.
    pub sha256: String,
}

/// A worker's life-cycle state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WorkerState {
    /// First start: loading and warming up.
    Starting,
    /// Answering jobs.
    Ready,
    /// Its process ended; waiting for the back-off or starting again.
    Restarting,
    /// Finishing its jobs before stopping (shutdown).
    Draining,
    /// Stopped on purpose.
    Stopped,
    /// Given up on (crash loop) until the supervisor restarts.
    Failed,
    /// Stopped because its pool was idle for `idle_unload`: its checkpoints left memory; the next
    /// request for the pool starts it again (and waits for its load and warm-up).
    Unloaded,
}

impl WorkerState {
    /// The spelling in `/health` and `/metrics`.
    pub fn as_str(self) -> &'static str {
        match self {
            WorkerState::Starting => "starting",
            WorkerState::Ready => "ready",
            WorkerState::Restarting => "restarting",
            WorkerState::Draining => "draining",
            WorkerState::Stopped => "stopped",
            WorkerState::Failed => "failed",
            WorkerState::Unloaded => "unloaded",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use layad_config::PoolConfig;

    fn worker(state: WorkerState, checkpoints: &[CheckpointName]) -> WorkerStatus {
        WorkerStatus {
            pid: Some(1),
            state,
            device: Some("cpu".into()),
            dtype: Some("f32".into()),
            checkpoints: checkpoints
                .iter()
                .map(|&name| LoadedCheckpoint {
                    name,
                    revision: None,
                    sha256: "00".into(),
                })
                .collect(),
            ..WorkerStatus::starting("gpu-0".into())
        }
    }

    fn status(workers: Vec<WorkerStatus>) -> BackendStatus {
        BackendStatus {
            pools: vec![PoolStatus {
                name: "gpu".into(),
                worker_kind: "gpu".into(),
                device: "auto".into(),
                checkpoints: CheckpointName::ALL.to_vec(),
                queue_depth: 0,
                queue_capacity: 1,
                in_flight: 0,
                degraded: None,
                unavailable: None,
                retiring: false,
                capabilities: Capabilities::from_config(&PoolConfig::named("gpu")),
                backlog: Duration::ZERO,
                offered_load: 0.0,
                routed: RouteCounts::default(),
                spilled_out: 0,
                probes: 0,
                batches: (0, 0),
                taken: (0, 0),
                waits: Vec::new(),
                speed: SpeedStatus::default(),
                workers,
            }],
        }
    }

    #[test]
    fn a_checkpoint_is_servable_only_on_a_ready_worker_that_loaded_it() {
        let english = [CheckpointName::English];
        assert!(status(vec![worker(WorkerState::Ready, &english)]).servable(CheckpointName::English));
        assert!(!status(vec![worker(WorkerState::Ready, &english)]).servable(CheckpointName::Multilingual));
        assert!(!status(vec![worker(WorkerState::Starting, &english)]).servable(CheckpointName::English));
        assert!(!status(vec![worker(WorkerState::Draining, &english)]).servable(CheckpointName::English));
        assert!(!status(Vec::new()).servable(CheckpointName::English));
    }
}
