//! Worker processes: starting and stopping them, bridging their logs, and keeping each worker slot
//! alive with restarts and backoff. [`Workers::start`] assembles pools, scheduler and manager.

pub mod logs;
pub mod manager;
pub mod worker_process;

use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use layad_config::Config;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::backend::BackendError;
use crate::decide::Checkpoints;
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
}

/// The running worker side: pools, their scheduler, and one supervising task per worker slot.
pub struct Workers {
    scheduler: Arc<Scheduler>,
    stop: CancellationToken,
    tasks: JoinSet<()>,
}

/// Creates `dir` private to this user (0700), or checks that an existing one is.
fn private_dir(dir: &Path) -> Result<(), WorkersError> {
    let fail = |reason: String| WorkersError::SocketDir {
        dir: dir.to_path_buf(),
        reason,
    };
    match std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) => return Err(fail(e.to_string())),
    }
    let mode = std::fs::metadata(dir)
        .map_err(|e| fail(e.to_string()))?
        .permissions()
        .mode()
        & 0o777;
    if mode & 0o077 != 0 {
        // Another user could reach the workers' sockets: tighten it rather than refuse to start.
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| fail(format!("mode {mode:o} is not private and cannot be changed: {e}")))?;
    }
    Ok(())
}

impl Workers {
    /// Starts every configured worker for the opened `checkpoints`; they join their pools as they
    /// become ready. Must run inside the tokio runtime.
    pub fn start(config: &Config, checkpoints: &Checkpoints) -> Result<Self, WorkersError> {
        let binary_dir = config.workers.binary_dir().map_err(WorkersError::BinaryDir)?;
        for pool in &config.pools {
            let binary = binary_dir.join(pool.worker.binary_name());
            if !binary.is_file() {
                return Err(WorkersError::MissingBinary(binary));
            }
        }
        let runtime_dir = std::env::var_os("XDG_RUNTIME_DIR")
            .filter(|d| !d.is_empty())
            .map(PathBuf::from);
        let socket_dir = config
            .workers
            .socket_dir(runtime_dir.as_deref(), nix::unistd::getuid().as_raw());
        private_dir(&socket_dir)?;
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
        let pools: Vec<Arc<Pool>> = config
            .pools
            .iter()
            .map(|p| Pool::new(p.clone(), config.pool_checkpoints(p)))
            .collect();
        let stop = CancellationToken::new();
        let tasks = manager::start(settings, &pools, stop.clone());
        Ok(Self {
            scheduler: Arc::new(Scheduler::new(pools)),
            stop,
            tasks,
        })
    }

    /// The scheduler, which is the HTTP side's backend.
    pub fn scheduler(&self) -> Arc<Scheduler> {
        Arc::clone(&self.scheduler)
    }

    /// Stops every worker (drain, SIGTERM, grace, SIGKILL) and answers what is still queued.
    pub async fn stop(mut self) {
        self.stop.cancel();
        while self.tasks.join_next().await.is_some() {}
        for pool in self.scheduler.pools() {
            pool.fail_queued(|| BackendError::Failed("layad is shutting down".to_owned()));
        }
    }
}
