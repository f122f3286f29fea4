//! The worker protocol: `worker.proto` and its generated code, the engine trait every worker
//! implements, the serving harness every worker binary runs, and the supervisor's gRPC client.
//!
//! # Layout
//!
//! - [`pb`]: code generated from `worker.proto` (package `layad.worker.v1`) and its conversions to
//!   the engine types.
//! - [`engine`]: the synchronous [`Engine`] trait a worker's model implements, and [`EngineInfo`],
//!   every static fact it reports, with [`EngineFacts`], the part that flows into `/health` as it is.
//! - [`error`]: [`HarnessError`] and [`LoadError`], the errors of a worker's start-up and life.
//! - [`harness`]: runs an engine behind the protocol: load, warm up, bind the private Unix socket,
//!   serve one batch at a time, drain on SIGTERM, exit when the supervisor dies.
//! - [`client`]: [`WorkerClient`], the supervisor's cheap-to-clone handle on one worker socket.
//! - [`rows`]: the row contract: what one forward may hold, bucket choice, default limits.
//! - [`args`]: the command line every worker binary takes, written by the supervisor.
//! - [`logging`]: structured log lines on stderr for worker binaries.
//! - `warmup` (crate-private): the warm-up shapes.

pub mod args;
pub mod client;
pub mod engine;
pub mod error;
pub mod harness;
pub mod logging;
pub mod pb;
pub mod rows;
mod warmup;

pub use args::{WorkerArgs, user_cache_dir};
pub use client::{ClientError, ForwardResult, SpawnedWorker, WorkerClient};
pub use engine::{
    CheckedForward, Engine, EngineError, EngineFacts, EngineInfo, GpuInfo, LoadedCheckpoint, ParityReport,
    PlacementReport, Row, RowOutput,
};
pub use error::{EngineFactsError, HarnessError, LoadError};
pub use harness::{HarnessOptions, ServeOutcome, StopReason};
pub use pb::{PROTOCOL_VERSION, REQUEST_ID_METADATA};
pub use rows::{
    DEFAULT_MAX_BATCH_TOKENS, DEFAULT_MAX_ROWS, ForwardLimits, InvalidForward, RowLimits, bucket_for, check_and_forward,
};
pub use warmup::WarmupPolicy;

/// Exit status of a worker whose device or runtime does not exist on this machine (for example
/// `layad-worker-ane` without Core ML): not a crash, so the supervisor reports the pool unavailable
/// with the worker's last error line instead of restarting it. (BSD sysexits' `EX_UNAVAILABLE`.)
pub const EXIT_DEVICE_UNAVAILABLE: i32 = 69;

/// Exit status of a worker that refuses its command line as given (a precision its executor does
/// not run, an empty bucket list): the same arguments fail the same way every time, so the
/// supervisor reports the pool unavailable with the worker's last error line instead of restarting
/// it. (BSD sysexits' `EX_CONFIG`.)
pub const EXIT_CONFIG_REFUSED: i32 = 78;
