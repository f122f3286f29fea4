//! layad, the supervisor: the HTTP front that answers Jev clients exactly like upstream
//! `laya[serve]==0.3.20`, in front of a [`backend::Backend`] that runs the model on workers.
//!
//! Layout, in the order a request meets the modules:
//! - [`http`]: the listener, graceful shutdown, request ids, the `Host` check and the routes;
//! - [`admission`]: bearer key, body size (declared and streamed), `Content-Encoding`;
//! - [`decide`]: the opened checkpoints; body → Laya rows (off the reactor) → backend → answer;
//! - [`backend`]: the seam to the worker pool, and the status `/health` reports;
//! - [`scheduler`], [`pool`], [`estimate`]: which pool runs a job (shape, backlog, spill), each
//!   pool's bounded queue and batching, and its service-time estimates;
//! - [`reload`]: SIGHUP / `layad reload` applying a changed configuration while serving;
//! - [`process`]: the worker processes, their logs, restarts with backoff;
//! - [`error`]: start-up errors and the one table from failures to HTTP answers;
//! - [`metrics`], [`telemetry`], [`shutdown`]: `/metrics`, logging, the signal future;
//! - [`cli`]: `layad serve`, `layad check`, `layad reload`, `layad fetch`, `layad --version`;
//! - [`service`]: `layad service install|uninstall|status` (launchd, systemd).

pub mod admission;
pub mod backend;
pub mod cli;
pub mod decide;
pub mod error;
pub mod estimate;
pub mod http;
pub mod metrics;
pub mod pool;
pub mod process;
pub mod reload;
pub mod scheduler;
pub mod service;
pub mod shutdown;
pub mod telemetry;

pub use http::{Server, ShutdownReport};
