//! When a worker process must stop: SIGTERM/SIGINT (drain, then exit), and the supervisor's death,
//! seen as end-of-file on the liveness pipe (macOS and Linux) or, on Linux, a parent-death signal.

use std::fs::OpenOptions;
use std::os::fd::RawFd;
use std::os::unix::fs::OpenOptionsExt;

use tokio::io::AsyncReadExt;
use tokio::net::unix::pipe;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::mpsc;

use crate::error::HarnessError;

/// Why a worker was asked to stop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// SIGTERM or SIGINT: finish what was accepted, then exit cleanly.
    Terminate,
    /// The supervisor died (liveness pipe closed, or parent-death signal with a new parent): exit now.
    SupervisorGone,
}

/// Installs every watcher and returns the channel on which they report. Must run inside the runtime.
pub(crate) fn watch_stop_signals(liveness_fd: Option<RawFd>) -> Result<mpsc::Receiver<StopReason>, HarnessError> {
    let (stop, reasons) = mpsc::channel(4);
    for (kind, name) in [
        (SignalKind::terminate(), "SIGTERM"),
        (SignalKind::interrupt(), "SIGINT"),
    ] {
        let mut signals = signal(kind).map_err(HarnessError::Signals)?;
        let stop = stop.clone();
        tokio::spawn(async move {
            while signals.recv().await.is_some() {
                tracing::info!(signal = name, "stop requested");
                if stop.send(StopReason::Terminate).await.is_err() {
                    break;
                }
            }
        });
    }
    if let Some(fd) = liveness_fd {
        let mut pipe = open_liveness_pipe(fd).map_err(|source| HarnessError::Liveness { fd, source })?;
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut buffer = [0u8; 64];
            // The supervisor never needs to write; anything it writes is ignored. End-of-file (every
            // write end closed) or an error both mean nobody holds the pipe for us any more.
            loop {
                match pipe.read(&mut buffer).await {
                    Ok(0) => break,
                    Ok(_) => continue,
                    Err(error) => {
                        tracing::warn!(%error, "liveness pipe failed");
                        break;
                    }
                }
            }
            // Stop first, log second: with the supervisor gone, nothing may stand between us and exit.
            let _ = stop.send(StopReason::SupervisorGone).await;
            tracing::warn!(fd, "liveness pipe closed: the supervisor is gone");
        });
    }
    #[cfg(target_os = "linux")]
    parent_death::watch(stop)?;
    Ok(reasons)
}

/// Opens the inherited descriptor `fd` through `/dev/fd`, which duplicates it without `unsafe` (the
/// workspace denies it). Non-blocking, so the open never waits for a writer of a pipe already orphaned.
fn open_liveness_pipe(fd: RawFd) -> std::io::Result<pipe::Receiver> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NONBLOCK)
        .open(format!("/dev/fd/{fd}"))?;
    pipe::Receiver::from_file(file)
}

/// PR_SET_PDEATHSIG, with its two caveats handled: the signal fires when the *thread* that forked the
/// worker exits (a supervisor thread pool may retire that thread while the supervisor lives on), so a
/// delivery only counts if our parent process changed; and a parent that died before we armed it is
/// not seen, which the liveness pipe covers.
#[cfg(target_os = "linux")]
mod parent_death {
    use nix::sys::signal::Signal;
    use tokio::signal::unix::{SignalKind, signal};
    use tokio::sync::mpsc;

    use super::StopReason;
    use crate::error::HarnessError;

    pub(super) fn watch(stop: mpsc::Sender<StopReason>) -> Result<(), HarnessError> {
        let parent = nix::unistd::getppid();
        // Handler first: SIGUSR1's default action would kill the worker on a spurious delivery.
        let mut deliveries = signal(SignalKind::user_defined1()).map_err(HarnessError::Signals)?;
        nix::sys::prctl::set_pdeathsig(Signal::SIGUSR1).map_err(|e| HarnessError::Signals(e.into()))?;
        tokio::spawn(async move {
            while deliveries.recv().await.is_some() {
                let now = nix::unistd::getppid();
                if now == parent {
                    tracing::debug!("parent-death signal with the same parent process: its forking thread exited");
                    continue;
                }
                tracing::warn!(parent = parent.as_raw(), now = now.as_raw(), "parent process died");
                let _ = stop.send(StopReason::SupervisorGone).await;
                break;
            }
        });
        Ok(())
    }
}
