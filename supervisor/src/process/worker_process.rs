//! One worker child process: how it is started (explicit arguments, a cleaned environment, its own
//! process group, a liveness pipe on stdin, stderr captured) and how it is stopped (SIGTERM, grace,
//! SIGKILL).
//!
//! The liveness pipe is the worker's stdin: the supervisor keeps the write end, so when the
//! supervisor dies — even by SIGKILL — the worker reads end-of-file and exits on its own.
//! The environment is cleared and only [`INHERITED_ENV`] (and variables starting with one of
//! [`INHERITED_PREFIXES`]) are passed on: everything a worker needs comes on its command line, and
//! secrets such as `LAYA_API_KEY` never reach a process that does not need them.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::process::{Child, ChildStderr, ChildStdin, Command};

/// Variables a worker keeps: what the C library, the dynamic loader, logging and the worker binaries
/// themselves read (`CACHE_DIRECTORY` — a systemd unit's `CacheDirectory=` —, `HOME` and
/// `XDG_CACHE_HOME` place the parity gate's kept reference and the Neural Engine worker's compiled
/// models: `layad_proto::user_cache_dir`).
pub const INHERITED_ENV: &[&str] = &[
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "LANG",
    "TZ",
    "TMPDIR",
    "XDG_CACHE_HOME",
    "CACHE_DIRECTORY",
    "RUST_LOG",
    "RUST_BACKTRACE",
    "RUST_LIB_BACKTRACE",
    "LD_LIBRARY_PATH",
    "DYLD_LIBRARY_PATH",
    "DYLD_FALLBACK_LIBRARY_PATH",
];

/// Families of variables a worker keeps: locale, and the settings of the device runtimes and thread
/// pools an engine may use (CUDA, candle, rayon, OpenMP, MKL, Metal).
pub const INHERITED_PREFIXES: &[&str] = &[
    "LC_", "CUDA_", "NVIDIA_", "CANDLE_", "RAYON_", "OMP_", "MKL_", "MTL_", "METAL_",
];

/// The part of `vars` a worker is started with.
pub fn worker_env(vars: impl IntoIterator<Item = (OsString, OsString)>) -> Vec<(OsString, OsString)> {
    vars.into_iter()
        .filter(|(name, _)| {
            name.to_str().is_some_and(|name| {
                INHERITED_ENV.contains(&name) || INHERITED_PREFIXES.iter().any(|p| name.starts_with(p))
            })
        })
        .collect()
}

/// Everything needed to start one worker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerSpec {
    /// The worker binary (`layad-worker-gpu`, `layad-worker-ane`).
    pub binary: PathBuf,
    /// Its command-line arguments, liveness, socket and nonce included.
    pub args: Vec<OsString>,
    /// The Unix socket it will bind once ready.
    pub socket: PathBuf,
    /// This start's nonce (also in `args`), which the worker's Describe must echo.
    pub nonce: String,
}

/// A running worker child. Dropping it kills the whole process group.
#[derive(Debug)]
pub struct WorkerProcess {
    child: Child,
    pid: u32,
    // Held open for the worker's lifetime: closing it (or our death) is the worker's exit signal.
    liveness: Option<ChildStdin>,
}

/// Why a worker could not be started.
#[derive(Debug, thiserror::Error)]
#[error("cannot start worker {binary}: {source}")]
pub struct SpawnError {
    /// The binary that failed to start.
    pub binary: PathBuf,
    /// The operating system's reason.
    pub source: std::io::Error,
}

impl WorkerProcess {
    /// Starts the worker in its own process group, returning it and its stderr for the log bridge.
    pub fn spawn(spec: &WorkerSpec) -> Result<(Self, ChildStderr), SpawnError> {
        let fail = |source| SpawnError {
            binary: spec.binary.clone(),
            source,
        };
        // A stale socket from a previous run of this worker would make the new one refuse to bind.
        match std::fs::remove_file(&spec.socket) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(fail(e)),
        }
        let mut child = Command::new(&spec.binary)
            .args(&spec.args)
            .env_clear()
            .envs(worker_env(std::env::vars_os()))
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            // Own group: a terminal's Ctrl-C reaches the supervisor, which then stops workers in order.
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .map_err(fail)?;
        let pid = child
            .id()
            .ok_or_else(|| fail(std::io::Error::other("exited before it could be observed")))?;
        let stderr = child
            .stderr
            .take()
            .ok_or_else(|| fail(std::io::Error::other("no stderr pipe")))?;
        let liveness = child.stdin.take();
        Ok((Self { child, pid, liveness }, stderr))
    }

    /// The worker's process id.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Waits for the worker to exit by itself.
    pub async fn wait(&mut self) -> std::io::Result<ExitStatus> {
        self.child.wait().await
    }

    /// Stops the worker: SIGTERM to its group (it finishes the batch in flight), then SIGKILL if it
    /// is still running after `grace`.
    pub async fn terminate(&mut self, grace: Duration) -> std::io::Result<ExitStatus> {
        if let Ok(Some(status)) = self.child.try_wait() {
            return Ok(status);
        }
        self.signal_group(Signal::SIGTERM);
        match tokio::time::timeout(grace, self.child.wait()).await {
            Ok(status) => status,
            Err(_) => {
                tracing::warn!(
                    pid = self.pid,
                    grace_ms = grace.as_millis() as u64,
                    "worker ignored SIGTERM; killing it"
                );
                self.signal_group(Signal::SIGKILL);
                self.child.wait().await
            }
        }
    }

    /// Kills the worker's whole group at once (no grace).
    pub fn kill(&mut self) {
        self.signal_group(Signal::SIGKILL);
    }

    fn signal_group(&self, signal: Signal) {
        let Ok(raw) = i32::try_from(self.pid) else { return };
        // ESRCH: the group is already gone, which is what we wanted.
        let _ = killpg(Pid::from_raw(raw), signal);
    }
}

impl Drop for WorkerProcess {
    fn drop(&mut self) {
        self.liveness.take();
        if matches!(self.child.try_wait(), Ok(None)) {
            self.signal_group(Signal::SIGKILL);
        }
    }
}

/// A readable description of how a worker ended: `exit status 1`, `killed by SIGKILL`.
pub fn describe_exit(status: &ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit status {code}"),
        (None, Some(signal)) => match Signal::try_from(signal) {
            Ok(s) => format!("killed by {s}"),
            Err(_) => format!("killed by signal {signal}"),
        },
        (None, None) => "ended without a status".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_api_key_and_other_settings_stay_with_the_supervisor() {
        let vars = [
            ("PATH", "/usr/bin"),
            ("LAYA_API_KEY", "secret"),
            ("LAYAD_SERVER__LISTEN", "0.0.0.0:1"),
            ("HF_TOKEN", "hf_secret"),
            ("LC_ALL", "C"),
            ("CUDA_VISIBLE_DEVICES", "1"),
            ("RUST_LOG", "debug"),
            ("AWS_SECRET_ACCESS_KEY", "x"),
        ]
        .map(|(k, v)| (OsString::from(k), OsString::from(v)));
        let kept: Vec<String> = worker_env(vars)
            .into_iter()
            .map(|(k, _)| k.to_string_lossy().into_owned())
            .collect();
        assert_eq!(kept, ["PATH", "LC_ALL", "CUDA_VISIBLE_DEVICES", "RUST_LOG"]);
    }
}
