//! layad, the supervisor: the HTTP front that answers Jev clients exactly like upstream
//! `laya[serve]==0.3.20`, in front of worker processes that run the model. [`run`] wires it.
//!
//! Layout, in the order a request meets the modules (docs/architecture.md follows one request
//! through them, file by file):
//! - [`http`]: the listener, request ids, the `Host` check, admission (key, body, encoding), the
//!   routes, and the one table from failures to HTTP answers;
//! - [`decisions`]: admitted body → Laya rows (off the reactor) → backend → answer text;
//! - [`backend`]: the seam between request handling and the workers: `Backend`, `Job`, `JobOutput`;
//! - [`scheduler`]: which pool runs a job (shape, backlog, spill) and why;
//! - [`pool`]: one pool's capabilities, queue state, estimates and the task per ready worker;
//! - [`process`]: worker processes: spawn, readiness, logs, restarts with backoff;
//! - [`worker_kind`]: what differs between worker kinds;
//! - [`status`]: what `/health`, `/readyz` and `/metrics` report;
//! - [`checkpoints`], [`live`], [`reload`]: the opened checkpoints, the settings a reload changes,
//!   and SIGHUP; [`reload_client`]: `layad reload` (which server, signal, outcome);
//! - [`metrics`], [`telemetry`], [`shutdown`], [`error`]: `/metrics`, logging, the signal future,
//!   start-up errors;
//! - [`cli`]: `layad serve|check|reload|fetch|service`; [`install`]: launchd and systemd services.

pub mod backend;
pub mod checkpoints;
pub mod cli;
pub mod decisions;
pub mod error;
pub mod http;
pub mod install;
pub mod live;
pub mod metrics;
pub mod pool;
pub mod process;
pub mod reload;
pub mod reload_client;
pub mod scheduler;
pub mod shutdown;
pub mod status;
pub mod telemetry;
pub mod worker_kind;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use layad_config::{CheckpointSource, Config, Sources};
use layad_hub::{FetchOptions, ProgressStyle};

use crate::backend::Backend;
use crate::checkpoints::Checkpoints;
use crate::error::LayadError;
use crate::process::Workers;
use crate::process::runtime_dir::{InstanceRecord, RuntimeDir};

pub use crate::http::server::{Server, ShutdownReport};

/// What [`run`] needs besides the configuration.
#[derive(Clone, Debug, Default)]
pub struct RunOptions {
    /// Where the configuration came from: SIGHUP re-reads it from there. `None`: no reloads.
    pub reload_from: Option<Sources>,
    /// Never download a missing checkpoint (`layad serve --offline`, or `HF_HUB_OFFLINE=1`).
    pub offline: bool,
}

/// Serves `config` until `shutdown` completes, then drains HTTP and stops every worker. In start-up
/// order: checkpoints (downloaded if missing, then opened), workers (they join their pools as they
/// become ready), the HTTP listener, then serving with reloads on SIGHUP.
pub async fn run(
    config: Config,
    options: RunOptions,
    shutdown: impl Future<Output = ()>,
) -> Result<ShutdownReport, LayadError> {
    // First: a socket directory that cannot be made private stops start-up before any download.
    let runtime_dir = RuntimeDir::create(&process::socket_base(&config))?;
    // The workers start loading before the supervisor hashes the weights for `/health` and
    // `/v1/models`: each worker reads and hashes the file itself, and on a full-size checkpoint
    // the supervisor's hash (seconds) would otherwise come before every worker's load.
    let mut checkpoints = open_checkpoints(&config, options.offline).await?;
    let workers = Workers::start(&config, &checkpoints, runtime_dir.path())?;
    let hashed = tokio::task::spawn_blocking(move || checkpoints.hash_weights().map(|()| checkpoints)).await;
    let checkpoints = match hashed {
        Ok(Ok(checkpoints)) => Arc::new(checkpoints),
        Ok(Err(error)) => {
            workers.stop().await;
            return Err(error.into());
        }
        Err(stopped) => {
            // The blocking pool's task ended without an answer (the runtime is shutting down).
            workers.stop().await;
            return Err(LayadError::Runtime(std::io::Error::other(format!(
                "hashing the checkpoints' weights: {stopped}"
            ))));
        }
    };
    for (name, checkpoint) in checkpoints.iter() {
        tracing::info!(
            checkpoint = name.as_str(),
            path = %checkpoint.location.dir.display(),
            revision = checkpoint.location.revision().unwrap_or("-"),
            sha256 = %checkpoint.weights.sha256,
            "checkpoint opened"
        );
    }
    let backend: Arc<dyn Backend> = workers.scheduler();
    tokio::spawn(announce_ready_task(
        config.server.listen,
        Arc::clone(&backend),
        Arc::clone(&checkpoints),
    ));
    let served = match Server::bind(&config, checkpoints, backend).await {
        Ok(server) => {
            if let Ok(addr) = server.local_addr() {
                tracing::info!(%addr, "listening; answering like laya[serve]=={}", config.compat.upstream);
                let record = InstanceRecord {
                    pid: std::process::id(),
                    listen: addr,
                    config: options
                        .reload_from
                        .as_ref()
                        .and_then(|s| s.file.as_ref())
                        .map(|file| std::fs::canonicalize(file).unwrap_or_else(|_| file.clone())),
                };
                if let Err(error) = runtime_dir.record(&record) {
                    tracing::warn!(%error, "cannot write the instance record; `layad reload` needs --listen");
                }
            }
            let live = server.live();
            let served_checkpoints = server.checkpoints();
            let reloads = async {
                match options.reload_from {
                    Some(sources) => {
                        let target = reload::Reloadable {
                            workers: &workers,
                            checkpoints: &served_checkpoints,
                            live: &live,
                        };
                        reload::reload_task(sources, config.clone(), target).await
                    }
                    None => std::future::pending::<std::convert::Infallible>().await,
                }
            };
            tokio::select! {
                report = server.run(shutdown) => Ok(report),
                never = reloads => match never {},
            }
        }
        Err(e) => Err(e),
    };
    // Whether HTTP stopped cleanly or failed to start, no worker may outlive us.
    workers.stop().await;
    drop(runtime_dir);
    let report = served?;
    tracing::info!(drained = report.drained, "stopped");
    Ok(report)
}

/// Downloads the checkpoints served from the Hugging Face cache that are missing (unless
/// `offline`), then opens every served checkpoint, not yet hashed ([`Checkpoints::hash_weights`]).
async fn open_checkpoints(config: &Config, offline: bool) -> Result<Checkpoints, LayadError> {
    let from_hub: Vec<_> = config
        .served_checkpoints()
        .into_iter()
        .filter(|(_, source)| *source == CheckpointSource::HfCache)
        .map(|(name, _)| name)
        .collect();
    if !from_hub.is_empty() {
        let mut fetch = FetchOptions::from_env()?;
        fetch.offline |= offline;
        fetch.progress = ProgressStyle::Log;
        layad_hub::ensure_cached(&from_hub, &fetch).await?;
    }
    Ok(Checkpoints::open_unhashed(config)?)
}

/// Logs one line once every served checkpoint has a ready worker: address, pools, devices,
/// checkpoints with revisions — what a person starting the service wants to see.
async fn announce_ready_task(listen: SocketAddr, backend: Arc<dyn Backend>, checkpoints: Arc<Checkpoints>) {
    let started = Instant::now();
    loop {
        let status = backend.status();
        if checkpoints.iter().all(|(name, _)| status.servable(name)) {
            let pools: Vec<String> = status
                .pools
                .iter()
                .map(|p| {
                    // A CPU worker's device reads `cpu/avx2`: which SIMD kernels it chose at start-up.
                    let mut devices: Vec<String> = p
                        .workers
                        .iter()
                        .filter_map(|w| match (&w.device, &w.engine.cpu_kernels) {
                            (Some(device), Some(kernels)) => Some(format!("{device}/{kernels}")),
                            (device, _) => device.clone(),
                        })
                        .collect();
                    devices.dedup();
                    format!("{} ({} x {})", p.name, p.workers.len(), devices.join("/"))
                })
                .collect();
            let served: Vec<String> = checkpoints
                .iter()
                .map(|(name, c)| format!("{}@{}", name.as_str(), c.location.revision().unwrap_or("local")))
                .collect();
            tracing::info!(
                "layad ready on http://{listen} in {:.1} s: pools {}; checkpoints {}",
                started.elapsed().as_secs_f64(),
                pools.join(", "),
                served.join(", ")
            );
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
