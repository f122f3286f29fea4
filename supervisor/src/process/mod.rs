//! Worker processes: starting and stopping them, bridging their logs, and keeping each worker slot
//! alive with restarts and backoff. [`Workers::start`] assembles pools, scheduler and manager;
//! [`Workers::apply`] carries out a reload's [`PoolChange`]s.
//!
//! Layout: [`manager`] (one `supervise_task` per worker slot), [`worker_process`] (one child process:
//! spawn with a cleaned environment and a fresh nonce, stop), [`logs`] (its stderr into our log),
//! [`backoff`] (restart delays, crash loops), [`cpu_quota`] (threads per worker under a container's
//! CPU limit), [`runtime_dir`] (this instance's private socket directory and the record `layad
//! reload` finds it by), [`nonce`] (fresh random identifiers).

pub mod backoff;
pub mod cpu_quota;
pub mod logs;
pub mod manager;
pub mod nonce;
pub mod runtime_dir;
pub mod worker_process;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use laya::routing::CheckpointName;
use layad_config::{Config, PoolConfig};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::backend::BackendError;
use crate::checkpoints::Checkpoints;
use crate::pool::Pool;
use crate::scheduler::Scheduler;
use manager::ManagerSettings;

/// Why the workers could not be started.
#[derive(Debug, thiserror::Error)]
pub enum WorkersError {
    /// The directory of the worker binaries is unknown.
    #[error("cannot find the worker binaries (workers.binary_dir): {0}")]
    BinaryDir(std::io::Error),
    /// A configured worker binary does not exist.
    #[error("worker binary {0} not found; build it (cargo build --bins) or set workers.binary_dir")]
    MissingBinary(PathBuf),
    /// The private socket directory cannot be created or is not private.
    #[error("socket directory {dir} (workers.socket_dir): {reason}")]
    SocketDir {
        /// The directory.
        dir: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A worker's socket path would be longer than Unix sockets allow.
    #[error(
        "worker socket {0} would be longer than the {MAX_SOCKET_PATH} bytes Unix sockets allow; set a shorter \
         workers.socket_dir (or pool name)"
    )]
    SocketPathTooLong(PathBuf),
}

/// Longest socket path, in bytes: `sun_path` holds 104 bytes on macOS (108 on Linux), NUL included.
pub const MAX_SOCKET_PATH: usize = 103;

/// Where the instance directories go: `workers.socket_dir`, else `$XDG_RUNTIME_DIR/layad`, else
/// `<temp dir>/layad-<uid>`.
pub fn socket_base(config: &Config) -> PathBuf {
    let runtime_dir = std::env::var_os("XDG_RUNTIME_DIR")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from);
    config
        .workers
        .socket_dir(runtime_dir.as_deref(), nix::unistd::geteuid().as_raw())
}

/// The running worker side: pools, their scheduler, and one supervising task per worker slot.
pub struct Workers {
    inner: Arc<Inner>,
}

struct Inner {
    scheduler: Arc<Scheduler>,
    settings: Arc<ManagerSettings>,
    /// Cancelled at shutdown; every slot's token is a child of it.
    stop: CancellationToken,
    /// The pools the configuration has now, plus those a reload is retiring.
    pools: Mutex<Vec<RunningPool>>,
    /// Tells apart the worker sockets of a pool and of the pool a reload replaces it with.
    generation: AtomicU64,
}

/// One pool with its slots.
struct RunningPool {
    pool: Arc<Pool>,
    generation: u64,
    slots: Vec<Slot>,
}

/// One worker slot's supervising task and what stops it.
struct Slot {
    stop: CancellationToken,
    task: JoinHandle<()>,
}

/// What a reload does to one pool.
#[derive(Clone, Debug, PartialEq)]
pub enum PoolChange {
    /// Nothing changed.
    Keep {
        /// The pool.
        name: String,
    },
    /// Only `workers` changed: slots start or stop (after draining).
    Scale {
        /// The pool.
        name: String,
        /// Workers before.
        from: u32,
        /// Workers after.
        to: u32,
    },
    /// A new pool: it starts.
    Add {
        /// Its configuration.
        pool: PoolConfig,
        /// The checkpoints it serves.
        checkpoints: Vec<CheckpointName>,
    },
    /// Other settings changed: a new pool warms up while the old one serves, then the old one
    /// finishes its queue and stops.
    Replace {
        /// The new configuration.
        pool: PoolConfig,
        /// The checkpoints it serves.
        checkpoints: Vec<CheckpointName>,
    },
    /// The pool is gone from the configuration: it finishes its queue and stops.
    Remove {
        /// The pool.
        name: String,
    },
}

impl PoolChange {
    /// The change in words (`pool short: 1 → 2 workers`); `None` for [`PoolChange::Keep`].
    pub fn describe(&self) -> Option<String> {
        match self {
            PoolChange::Keep { .. } => None,
            PoolChange::Scale { name, from, to } => Some(format!("pool {name}: {from} → {to} workers")),
            PoolChange::Add { pool, .. } => Some(format!("pool {}: added", pool.name)),
            PoolChange::Replace { pool, .. } => Some(format!("pool {}: replaced (configuration changed)", pool.name)),
            PoolChange::Remove { name } => Some(format!("pool {name}: removed")),
        }
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, Vec<RunningPool>> {
        self.pools.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts slots `from..to` of `running`.
    fn start_slots(&self, running: &mut RunningPool, from: usize, to: usize) {
        for index in from..to {
            let stop = self.stop.child_token();
            let task = tokio::spawn(manager::supervise_task(
                Arc::clone(&self.settings),
                Arc::clone(&running.pool),
                index,
                running.generation,
                stop.clone(),
            ));
            running.slots.push(Slot { stop, task });
        }
    }

    /// A new pool with all its slots starting.
    fn start_pool(&self, config: &PoolConfig, checkpoints: Vec<CheckpointName>) -> RunningPool {
        let mut running = RunningPool {
            pool: Pool::new(config.clone(), checkpoints),
            generation: self.generation.fetch_add(1, Ordering::Relaxed),
            slots: Vec::new(),
        };
        self.start_slots(&mut running, 0, config.workers as usize);
        running
    }

    /// Hands the scheduler the current pool list.
    fn publish(&self) {
        let pools = self.lock().iter().map(|r| Arc::clone(&r.pool)).collect();
        self.scheduler.set_pools(pools);
    }
}

/// Stops `slots` (each drains its worker first) and waits for them.
async fn stop_slots(slots: Vec<Slot>) {
    for slot in &slots {
        slot.stop.cancel();
    }
    for slot in slots {
        let _ = slot.task.await;
    }
}

/// Stops the `removed` slots of `pool`, the first of them being slot `from` (each drains its worker
/// first), then forgets their records.
async fn scale_down_task(pool: Arc<Pool>, removed: Vec<Slot>, from: usize) {
    let to = from + removed.len();
    stop_slots(removed).await;
    for index in from..to {
        pool.remove_worker(index);
    }
}

/// Retires `old` once `successor` (if any) is fully ready: it stops taking jobs, finishes its
/// queue, then its workers stop and it leaves the scheduler.
async fn retire_task(inner: Arc<Inner>, old: Arc<Pool>, successor: Option<Arc<Pool>>) {
    if let Some(new) = successor {
        let waiting_since = std::time::Instant::now();
        // Until the successor can take the load, the old pool keeps serving.
        while !new.fully_ready() && waiting_since.elapsed() < inner.settings.startup_timeout {
            tokio::select! {
                () = tokio::time::sleep(std::time::Duration::from_millis(50)) => {}
                () = inner.stop.cancelled() => return,
            }
        }
    }
    old.set_retiring();
    while !old.idle() {
        tokio::select! {
            () = tokio::time::sleep(std::time::Duration::from_millis(20)) => {}
            () = inner.stop.cancelled() => return,
        }
    }
    let slots = {
        let mut pools = inner.lock();
        let Some(pos) = pools.iter().position(|r| Arc::ptr_eq(&r.pool, &old)) else {
            return;
        };
        pools.remove(pos).slots
    };
    inner.publish();
    stop_slots(slots).await;
    tracing::info!(pool = old.name(), "retired pool stopped");
}

impl Workers {
    /// Starts every configured worker for the opened `checkpoints`, with their sockets in
    /// `socket_dir` (this instance's private directory); they join their pools as they become
    /// ready. Must run inside the tokio runtime.
    pub fn start(config: &Config, checkpoints: &Checkpoints, socket_dir: &Path) -> Result<Self, WorkersError> {
        let binary_dir = config.workers.binary_dir().map_err(WorkersError::BinaryDir)?;
        check_binaries(config, &binary_dir)?;
        check_socket_paths(config, socket_dir)?;
        let socket_dir = socket_dir.to_owned();
        let checkpoint_dirs = checkpoints
            .iter()
            .map(|(name, c)| (name, c.location.dir.clone()))
            .collect();
        let settings = Arc::new(ManagerSettings::from_config(
            config,
            binary_dir,
            socket_dir,
            checkpoint_dirs,
        ));
        let inner = Arc::new(Inner {
            scheduler: Arc::new(Scheduler::new(Vec::new(), config.scheduling.clone())),
            settings,
            stop: CancellationToken::new(),
            pools: Mutex::new(Vec::new()),
            generation: AtomicU64::new(0),
        });
        let started: Vec<RunningPool> = config
            .pools
            .iter()
            .map(|p| inner.start_pool(p, config.pool_checkpoints(p)))
            .collect();
        *inner.lock() = started;
        inner.publish();
        Ok(Self { inner })
    }

    /// The scheduler, which is the HTTP side's backend.
    pub fn scheduler(&self) -> Arc<Scheduler> {
        Arc::clone(&self.inner.scheduler)
    }

    /// Applies a reload to the pools: `changes` (see [`crate::reload::plan`]) in the order of the
    /// new configuration `loaded`, whose `[scheduling]` also takes effect. Returns at once;
    /// workers join as they become ready. Nothing changes when a worker binary is missing.
    pub fn apply(
        &self,
        loaded: &Config,
        checkpoints: &Checkpoints,
        changes: &[PoolChange],
    ) -> Result<(), WorkersError> {
        let inner = &self.inner;
        check_binaries(loaded, &inner.settings.binary_dir)?;
        check_socket_paths(loaded, &inner.settings.socket_dir)?;
        inner.settings.set_checkpoint_dirs(
            checkpoints
                .iter()
                .map(|(name, c)| (name, c.location.dir.clone()))
                .collect(),
        );
        inner.settings.set_pools(loaded);
        inner.scheduler.set_scheduling(loaded.scheduling.clone());
        let mut retirements = Vec::new();
        {
            let mut pools = inner.lock();
            // The running pool of this name that takes jobs (a retiring one may share its name).
            let take = |pools: &mut Vec<RunningPool>, name: &str| {
                let pos = pools.iter().position(|r| r.pool.name() == name && r.pool.accepting())?;
                Some(pools.remove(pos))
            };
            let mut next: Vec<RunningPool> = Vec::new();
            for change in changes {
                match change {
                    PoolChange::Add { pool, checkpoints } => next.push(inner.start_pool(pool, checkpoints.clone())),
                    PoolChange::Replace { pool, checkpoints } => {
                        let successor = inner.start_pool(pool, checkpoints.clone());
                        if let Some(running) = take(&mut pools, &pool.name) {
                            retirements.push((Arc::clone(&running.pool), Some(Arc::clone(&successor.pool))));
                            // The old pool stays in the list (and serving) until its successor is ready.
                            next.push(running);
                        }
                        next.push(successor);
                    }
                    PoolChange::Scale { name, to, .. } => {
                        let Some(mut running) = take(&mut pools, name) else {
                            continue;
                        };
                        let (have, want) = (running.slots.len(), *to as usize);
                        if want > have {
                            inner.start_slots(&mut running, have, want);
                        } else if want < have {
                            let removed: Vec<Slot> = running.slots.drain(want..).collect();
                            tokio::spawn(scale_down_task(Arc::clone(&running.pool), removed, want));
                        }
                        next.push(running);
                    }
                    PoolChange::Keep { name } => next.extend(take(&mut pools, name)),
                    PoolChange::Remove { name } => {
                        if let Some(running) = take(&mut pools, name) {
                            retirements.push((Arc::clone(&running.pool), None));
                            next.push(running);
                        }
                    }
                }
            }
            // Pools already retiring stay until their queues are done.
            next.append(&mut pools);
            *pools = next;
        }
        inner.publish();
        for (old, successor) in retirements {
            tokio::spawn(retire_task(Arc::clone(inner), old, successor));
        }
        Ok(())
    }

    /// Stops every worker (drain, SIGTERM, grace, SIGKILL) and answers what is still queued.
    pub async fn stop(self) {
        self.inner.stop.cancel();
        let slots: Vec<Slot> = self.inner.lock().iter_mut().flat_map(|r| r.slots.drain(..)).collect();
        stop_slots(slots).await;
        for pool in self.inner.scheduler.pools() {
            pool.fail_queued(|| BackendError::Lost("layad is shutting down".to_owned()));
        }
    }
}

/// Every configured worker binary must exist.
fn check_binaries(config: &Config, binary_dir: &Path) -> Result<(), WorkersError> {
    for pool in &config.pools {
        let binary = binary_dir.join(pool.worker.binary_name());
        if !binary.is_file() {
            return Err(WorkersError::MissingBinary(binary));
        }
    }
    Ok(())
}

/// Every pool's worker sockets must fit in a Unix socket address (reloads included: the generation
/// and index get six and three digits of room).
fn check_socket_paths(config: &Config, socket_dir: &Path) -> Result<(), WorkersError> {
    for pool in &config.pools {
        let longest = socket_dir.join(manager::socket_name(&pool.name, 999_999, 999));
        if longest.as_os_str().len() > MAX_SOCKET_PATH {
            return Err(WorkersError::SocketPathTooLong(longest));
        }
    }
    Ok(())
}
