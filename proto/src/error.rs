//! The errors of a worker's life, kept apart from the harness steps that return them so that each
//! step (socket, lifetime, runner, warm-up) takes them without importing the harness:
//! [`HarnessError`] (why a worker could not start or stopped abnormally, one variant per step),
//! [`LoadError`] (what an engine's load closure returns) and [`EngineFactsError`] (a Describe whose
//! engine facts do not decode; `pb` returns it, the supervisor refuses the worker). The client's
//! errors are `client::ClientError`; an engine's are `engine::EngineError`.

use std::os::fd::RawFd;
use std::path::PathBuf;

/// Error a load closure may return; its message becomes part of [`HarnessError::Load`].
pub type LoadError = Box<dyn std::error::Error + Send + Sync>;

/// A worker's `WorkerInfo.engine_facts` is not the JSON of an `EngineFacts`: the worker breaks the
/// protocol (both ends are built from the same struct).
#[derive(Debug, thiserror::Error)]
#[error("engine_facts is not an engine's facts: {0}")]
pub struct EngineFactsError(#[from] serde_json::Error);

/// Why a worker could not start or stopped abnormally.
#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    /// The socket's directory is missing and cannot be created, or is not private.
    #[error("socket directory {dir}: {reason}")]
    SocketDir {
        /// The directory.
        dir: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The socket path cannot be used (another worker answers on it, or it is not a socket).
    #[error("socket {path}: {reason}")]
    Socket {
        /// The socket path.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The liveness pipe given on the command line cannot be watched.
    #[error("liveness pipe (fd {fd}): {source}")]
    Liveness {
        /// The file descriptor number.
        fd: RawFd,
        /// Why it cannot be used.
        source: std::io::Error,
    },
    /// Signal handlers or the parent-death signal could not be installed.
    #[error("installing signal handlers: {0}")]
    Signals(std::io::Error),
    /// The async runtime or the engine thread could not be started.
    #[error("starting the worker runtime: {0}")]
    Runtime(std::io::Error),
    /// The load closure failed (bad checkpoint, device not available, …).
    #[error("loading the engine: {0}")]
    Load(LoadError),
    /// A warm-up forward failed or returned outputs that do not match its rows.
    #[error("warm-up of checkpoint {checkpoint} on shape {shape} failed: {reason}")]
    Warmup {
        /// Checkpoint name.
        checkpoint: String,
        /// Shape name and size.
        shape: String,
        /// The engine's error or the output problem.
        reason: String,
    },
    /// The engine's facts could not be written as JSON for Describe (`WorkerInfo.engine_facts`).
    #[error("encoding the engine's facts: {0}")]
    Facts(serde_json::Error),
    /// The engine panicked or its thread stopped.
    #[error("engine failed: {0}")]
    EngineFailed(String),
    /// The gRPC server stopped with an error.
    #[error("gRPC server: {0}")]
    Server(#[from] tonic::transport::Error),
}
