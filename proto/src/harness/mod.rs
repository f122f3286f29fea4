//! The serving harness every worker binary runs: load the engine, warm every checkpoint, bind the
//! private Unix socket only then, serve the protocol, and stop on SIGTERM or when the supervisor dies.
//!
//! Start-up is a sequence of named steps, each with its own [`HarnessError`] variant, so a worker that
//! fails to start says which step broke: socket directory, liveness pipe, load, warm-up, bind.
//! Order of a clean stop (SIGTERM): state `draining`, the socket file is removed and the listener
//! closed, every forward already accepted is answered, watch streams end, then [`serve`] returns.
//! When the supervisor is gone nobody waits for answers, so [`serve`] returns at once.

mod lifetime;
mod memory;
mod options;
mod runner;
mod service;
mod socket;

use std::process::ExitCode;
use std::sync::Arc;

use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::UnixListenerStream;
use tokio_util::sync::CancellationToken;

pub use crate::error::{HarnessError, LoadError};
pub use lifetime::StopReason;
pub use options::HarnessOptions;
use runner::status_of;

use crate::engine::Engine;
use crate::pb;

/// How the worker binary `binary` exits after [`run`]: success after a clean stop (saying so when the
/// supervisor is gone); otherwise the error is logged and the status is `code_of(&error)`.
pub fn exit_code(
    binary: &str,
    result: Result<ServeOutcome, HarnessError>,
    code_of: impl FnOnce(&HarnessError) -> u8,
) -> ExitCode {
    match result {
        Ok(outcome) => {
            if outcome == ServeOutcome::SupervisorGone {
                tracing::warn!("exiting: the supervisor is gone");
            }
            ExitCode::SUCCESS
        }
        Err(error) => {
            tracing::error!(%error, "{binary} failed");
            ExitCode::from(code_of(&error))
        }
    }
}

/// How [`serve`] ended without an error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServeOutcome {
    /// Asked to stop before the worker was ready; the socket was never bound.
    StoppedBeforeReady(StopReason),
    /// Stopped on request after answering every forward it had accepted.
    Terminated {
        /// Forwards answered successfully over the worker's life.
        forwards_served: u64,
    },
    /// The supervisor died; the worker stopped without waiting for forwards in flight.
    SupervisorGone,
}

/// True when `in_use` is what `requested` asked for: `auto` accepts any device, `cuda` accepts
/// `cuda:N`, anything else must match exactly.
pub fn device_satisfies(requested: &str, in_use: &str) -> bool {
    requested == "auto"
        || requested == in_use
        || in_use.strip_prefix(requested).is_some_and(|rest| rest.starts_with(':'))
}

/// Runs a worker process to its end: builds the async runtime, watches SIGTERM/SIGINT, the liveness
/// pipe and (Linux) the parent-death signal, then [`serve`]s. Call it once, from `main`.
pub fn run<E, L>(load: L, options: HarnessOptions) -> Result<ServeOutcome, HarnessError>
where
    E: Engine,
    L: FnOnce() -> Result<E, LoadError> + Send + 'static,
{
    let runtime = tokio::runtime::Builder::new_multi_thread()
        // Forwards run on the engine thread; the runtime only moves bytes, so two threads leave the
        // cores to the engine.
        .worker_threads(2)
        .thread_name("worker-rpc")
        .enable_all()
        .build()
        .map_err(HarnessError::Runtime)?;
    runtime.block_on(async {
        let stop = lifetime::watch_stop_signals(options.liveness_fd)?;
        serve(load, options, stop).await
    })
}

/// Serves one engine until a [`StopReason`] arrives on `stop` or the engine fails. A second reason
/// may follow the first: `SupervisorGone` during a `Terminate` drain abandons the drain. A closed
/// `stop` channel means no stop will come from there.
pub async fn serve<E, L>(
    load: L,
    options: HarnessOptions,
    mut stop: mpsc::Receiver<StopReason>,
) -> Result<ServeOutcome, HarnessError>
where
    E: Engine,
    L: FnOnce() -> Result<E, LoadError> + Send + 'static,
{
    let socket = socket::SocketPath::prepare(&options.socket)?;
    let (status, _) = watch::channel(status_of(pb::WorkerState::Loading, None));
    tracing::info!(state = "loading", socket = %options.socket.display(), pid = std::process::id(), "worker starting");
    let engine_failed = CancellationToken::new();
    let (runner, started) = runner::spawn(load, options.warmup.clone(), status.clone(), engine_failed.clone())?;

    let started = tokio::select! {
        started = started => started.map_err(|_| HarnessError::EngineFailed("engine thread stopped during start-up".into()))??,
        reason = next_stop(&mut stop) => {
            tracing::info!(?reason, "stopped before ready");
            return Ok(ServeOutcome::StoppedBeforeReady(reason));
        }
    };

    let (listener, bound) = socket.bind()?;
    let device_mismatch = !device_satisfies(&options.requested_device, &started.info.device);
    if device_mismatch {
        tracing::warn!(
            requested = %options.requested_device,
            in_use = %started.info.device,
            "the engine runs on another device than the one requested"
        );
    }
    let shared = Arc::new(service::Shared::new(
        &options,
        started,
        device_mismatch,
        runner,
        status.clone(),
    ));
    let stopping = shared.stopping.clone();
    let server = tonic::transport::Server::builder()
        .add_service(pb::worker_server::WorkerServer::new(service::WorkerService::new(
            shared.clone(),
        )))
        .serve_with_incoming_shutdown(UnixListenerStream::new(listener), stopping.clone().cancelled_owned());
    tokio::pin!(server);
    status.send_replace(status_of(pb::WorkerState::Ready, None));
    tracing::info!(state = "ready", socket = %options.socket.display(), "worker ready");

    let reason = tokio::select! {
        result = &mut server => {
            bound.remove();
            result?;
            return Err(HarnessError::EngineFailed("the gRPC server stopped on its own".into()));
        }
        reason = next_stop(&mut stop) => Ok(reason),
        () = engine_failed.cancelled() => Err(shared.failure().unwrap_or_else(|| "engine stopped".into())),
    };
    bound.remove();
    match reason {
        Ok(StopReason::SupervisorGone) => {
            tracing::warn!("supervisor gone; stopping without waiting for forwards in flight");
            Ok(ServeOutcome::SupervisorGone)
        }
        Ok(StopReason::Terminate) => {
            status.send_if_modified(|s| {
                let ready = s.state() == pb::WorkerState::Ready;
                if ready {
                    *s = status_of(pb::WorkerState::Draining, None);
                }
                ready
            });
            tracing::info!(
                state = "draining",
                in_flight = shared.in_flight(),
                "stopping: finishing forwards in flight"
            );
            stopping.cancel();
            loop {
                tokio::select! {
                    result = &mut server => {
                        result?;
                        break;
                    }
                    reason = next_stop(&mut stop) => if reason == StopReason::SupervisorGone {
                        tracing::warn!("supervisor gone while draining; stopping now");
                        return Ok(ServeOutcome::SupervisorGone);
                    },
                }
            }
            if engine_failed.is_cancelled() {
                let failure = shared.failure().unwrap_or_else(|| "engine stopped".into());
                tracing::error!(%failure, "the engine failed while draining");
                return Err(HarnessError::EngineFailed(failure));
            }
            let forwards_served = shared.forwards_served();
            tracing::info!(forwards_served, "worker stopped");
            Ok(ServeOutcome::Terminated { forwards_served })
        }
        Err(failure) => {
            tracing::error!(state = "failed", %failure, "engine failed; stopping");
            stopping.cancel();
            server.await?;
            Err(HarnessError::EngineFailed(failure))
        }
    }
}

/// The next stop request; never resolves once every sender is gone.
async fn next_stop(stop: &mut mpsc::Receiver<StopReason>) -> StopReason {
    match stop.recv().await {
        Some(reason) => reason,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::device_satisfies;

    #[test]
    fn a_fallback_is_a_mismatch_and_auto_never_is() {
        assert!(device_satisfies("auto", "cpu"));
        assert!(device_satisfies("auto", "cuda:0"));
        assert!(device_satisfies("cpu", "cpu"));
        assert!(device_satisfies("cuda", "cuda:1"));
        assert!(device_satisfies("cuda:1", "cuda:1"));
        assert!(device_satisfies("metal", "metal"));
        assert!(!device_satisfies("metal", "cpu"));
        assert!(!device_satisfies("cuda:1", "cuda:0"));
        assert!(!device_satisfies("cuda", "cpu"));
        assert!(!device_satisfies("cuda", "cudax"));
    }
}
