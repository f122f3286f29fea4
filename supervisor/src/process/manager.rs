//! The process manager: one supervising task per worker slot that spawns the worker, waits until it
//! answers Describe as ready, admits it to its pool, watches it, and restarts it with backoff.
//!
//! Restarts double their delay up to a cap and start over once a worker has run for a while; a slot
//! that crashes too often within the configured window marks its pool degraded, with the reason.

use std::collections::VecDeque;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use laya::routing::CheckpointName;
use layad_config::{Config, WorkerKind};
use layad_proto::client::WorkerClient;
use layad_proto::{EXIT_CONFIG_REFUSED, EXIT_DEVICE_UNAVAILABLE, pb};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::backend::{LoadedCheckpoint, WorkerState};
use crate::pool::{Pool, warmup_reports};
use crate::process::logs::{LogTags, StderrTail, forward_stderr};
use crate::process::worker_process::{WorkerProcess, WorkerSpec, describe_exit};

/// A worker that has run this long without crashing resets its restart delay.
const STABLE_AFTER: Duration = Duration::from_secs(60);

/// Settings shared by every slot.
#[derive(Clone, Debug)]
pub struct ManagerSettings {
    /// Directory of the worker binaries.
    pub binary_dir: PathBuf,
    /// Private directory for worker sockets.
    pub socket_dir: PathBuf,
    /// Checkpoint directories by name, as resolved at start-up.
    pub checkpoint_dirs: Vec<(CheckpointName, PathBuf)>,
    /// First restart delay.
    pub backoff_initial: Duration,
    /// Longest restart delay.
    pub backoff_max: Duration,
    /// Restarts within `crash_loop_window` that mark the pool degraded.
    pub crash_loop_restarts: u32,
    /// Window for counting restarts.
    pub crash_loop_window: Duration,
    /// How long a worker may take to load and warm before it is killed and restarted.
    pub startup_timeout: Duration,
    /// How long a worker may take to finish after SIGTERM.
    pub stop_timeout: Duration,
}

impl ManagerSettings {
    /// Settings from the configuration and the resolved checkpoint directories.
    pub fn from_config(
        config: &Config,
        binary_dir: PathBuf,
        socket_dir: PathBuf,
        checkpoint_dirs: Vec<(CheckpointName, PathBuf)>,
    ) -> Self {
        let w = &config.workers;
        Self {
            binary_dir,
            socket_dir,
            checkpoint_dirs,
            backoff_initial: w.restart_backoff_initial,
            backoff_max: w.restart_backoff_max,
            crash_loop_restarts: w.crash_loop_restarts,
            crash_loop_window: w.crash_loop_window,
            startup_timeout: w.startup_timeout,
            stop_timeout: w.stop_timeout,
        }
    }
}

/// The command line of one worker. `generation` tells apart the sockets of a pool and the pool a
/// reload is replacing it with, which run side by side for a while.
fn worker_spec(settings: &ManagerSettings, pool: &Pool, index: usize, generation: u64) -> WorkerSpec {
    let (served, pool) = (pool.checkpoints(), pool.config());
    let socket = settings
        .socket_dir
        .join(format!("{}-{generation}-{index}.sock", pool.name));
    let mut args: Vec<OsString> = vec![
        "--socket".into(),
        socket.clone().into(),
        "--liveness-fd".into(),
        "0".into(),
    ];
    args.extend(["--log-format".into(), "json".into()]);
    for (name, dir) in settings
        .checkpoint_dirs
        .iter()
        .filter(|(name, _)| served.contains(name))
    {
        let mut arg = OsString::from(format!("{}=", name.as_str()));
        arg.push(dir);
        args.extend(["--checkpoint".into(), arg]);
    }
    args.extend([
        "--device".into(),
        pool.device.as_str().into(),
        "--dtype".into(),
        pool.effective_dtype().as_str().into(),
    ]);
    if pool.threads > 0 {
        args.extend(["--threads".into(), pool.threads.to_string().into()]);
    }
    args.extend(["--max-rows".into(), pool.max_rows.to_string().into()]);
    args.extend(["--max-batch-tokens".into(), pool.max_batch_tokens.to_string().into()]);
    if !pool.buckets.is_empty() {
        let buckets: Vec<String> = pool.buckets.iter().map(u32::to_string).collect();
        args.extend(["--length-buckets".into(), buckets.join(",").into()]);
    }
    if pool.worker == WorkerKind::Ane {
        if let Some(dir) = &pool.artifacts {
            args.extend(["--artifacts".into(), dir.clone().into_os_string()]);
        }
        args.extend(["--executor".into(), pool.executor.as_str().into()]);
    }
    WorkerSpec {
        binary: settings.binary_dir.join(pool.worker.binary_name()),
        args,
        socket,
    }
}

/// Starts the supervising task of slot `index` of `pool`: it keeps a worker running there until
/// `stop` is cancelled, then stops it (drain, SIGTERM, grace, SIGKILL) and returns.
pub fn spawn_slot(
    settings: Arc<ManagerSettings>,
    pool: Arc<Pool>,
    index: usize,
    generation: u64,
    stop: CancellationToken,
) -> JoinHandle<()> {
    tokio::spawn(async move { supervise(settings, pool, index, generation, stop).await })
}

/// Polls the socket until the worker answers Describe as ready.
async fn wait_ready(socket: &Path) -> (WorkerClient, pb::WorkerInfo) {
    loop {
        if socket.exists()
            && let Ok(client) = WorkerClient::connect_uds(socket).await
            && let Ok(info) = client.describe().await
            && info.state() == pb::WorkerState::Ready
        {
            return (client, info);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Why a worker process ended without being asked to.
enum Failure {
    /// It crashed or failed to start: restart it.
    Crashed(String),
    /// It exited with [`EXIT_DEVICE_UNAVAILABLE`] (its device does not exist here) or
    /// [`EXIT_CONFIG_REFUSED`] (it refused its arguments): restarting cannot help.
    Unavailable(String),
}

/// One slot's life: spawn, admit when ready, watch, restart with backoff, until `stop`.
async fn supervise(
    settings: Arc<ManagerSettings>,
    pool: Arc<Pool>,
    index: usize,
    generation: u64,
    stop: CancellationToken,
) {
    let spec = worker_spec(&settings, &pool, index, generation);
    let id = format!("{}/{index}", pool.config().name);
    let mut backoff = settings.backoff_initial;
    let mut crashes: VecDeque<Instant> = VecDeque::new();
    let mut restarts = 0u32;
    loop {
        if stop.is_cancelled() {
            pool.update_worker(index, |w| w.state = WorkerState::Stopped);
            return;
        }
        let started = Instant::now();
        let failure = match run_once(&settings, &pool, index, &spec, &stop).await {
            Ok(()) => return,
            Err(Failure::Crashed(failure)) => failure,
            Err(Failure::Unavailable(reason)) => {
                tracing::error!(worker = %id, %reason, "the worker cannot run here as configured; not restarting it");
                pool.update_worker(index, |w| {
                    w.state = WorkerState::Failed;
                    w.last_error = Some(reason.clone());
                });
                pool.set_unavailable(reason);
                stop.cancelled().await;
                return;
            }
        };
        if stop.is_cancelled() {
            pool.update_worker(index, |w| w.state = WorkerState::Stopped);
            return;
        }
        restarts += 1;
        let now = Instant::now();
        crashes.push_back(now);
        while crashes
            .front()
            .is_some_and(|t| now.duration_since(*t) > settings.crash_loop_window)
        {
            crashes.pop_front();
        }
        if started.elapsed() >= STABLE_AFTER {
            backoff = settings.backoff_initial;
        }
        tracing::warn!(worker = %id, %failure, restart_in_ms = backoff.as_millis() as u64, "worker stopped; restarting it");
        pool.update_worker(index, |w| {
            w.state = WorkerState::Restarting;
            w.restarts = u64::from(restarts);
            w.last_error = Some(failure.clone());
        });
        if crashes.len() as u32 >= settings.crash_loop_restarts {
            let window = settings.crash_loop_window.as_secs();
            pool.set_degraded(Some(format!(
                "worker {id} restarted {} times in {window} s; last: {failure}",
                crashes.len()
            )));
        }
        tokio::select! {
            () = tokio::time::sleep(backoff) => {}
            () = stop.cancelled() => {}
        }
        backoff = (backoff * 2).min(settings.backoff_max);
    }
}

/// Runs one worker process from spawn to exit. `Ok` when it was stopped on purpose; `Err` with a
/// readable reason when it failed to start or died.
async fn run_once(
    settings: &ManagerSettings,
    pool: &Arc<Pool>,
    index: usize,
    spec: &WorkerSpec,
    stop: &CancellationToken,
) -> Result<(), Failure> {
    let (mut process, stderr) = WorkerProcess::spawn(spec).map_err(|e| Failure::Crashed(e.to_string()))?;
    let pid = process.pid();
    let tail = StderrTail::default();
    let tags = LogTags {
        pool: pool.config().name.clone(),
        worker: format!("{}/{index}", pool.config().name),
        pid,
    };
    let logs = tokio::spawn(forward_stderr(stderr, tags, tail.clone()));
    pool.update_worker(index, |w| {
        w.pid = Some(pid);
        w.state = WorkerState::Starting;
    });
    let crashed = |status: std::io::Result<std::process::ExitStatus>, when: &str| -> String {
        let exit = status.map_or_else(|e| format!("unknown exit ({e})"), |s| describe_exit(&s));
        pool.update_worker(index, |w| {
            w.last_exit = Some(exit.clone());
            w.stderr_tail = tail.lines();
        });
        format!("{exit} {when}")
    };

    let ready = tokio::select! {
        ready = tokio::time::timeout(settings.startup_timeout, wait_ready(&spec.socket)) => ready,
        status = process.wait() => {
            let _ = logs.await;
            if let Some(what) = status.as_ref().ok().and_then(|s| will_not_start(s.code())) {
                let reason = last_error_message(&tail.lines()).unwrap_or_else(|| what.to_owned());
                crashed(status, "");
                return Err(Failure::Unavailable(reason));
            }
            return Err(Failure::Crashed(crashed(status, "before it became ready")));
        }
        () = stop.cancelled() => {
            let status = process.terminate(settings.stop_timeout).await;
            let _ = logs.await;
            crashed(status, "while starting (stopped)");
            return Ok(());
        }
    };
    let Ok((client, info)) = ready else {
        process.kill();
        let status = process.wait().await;
        let _ = logs.await;
        let reason = crashed(status, "");
        let timeout = settings.startup_timeout.as_secs();
        return Err(Failure::Crashed(format!(
            "not ready within {timeout} s (startup_timeout); killed: {reason}"
        )));
    };

    pool.update_worker(index, |w| {
        w.state = WorkerState::Ready;
        w.device = Some(info.device.clone());
        w.dtype = Some(info.dtype.clone());
        w.checkpoints = info
            .checkpoints
            .iter()
            .filter_map(|c| {
                let name = CheckpointName::from_name_or_alias(&c.name)?;
                Some(LoadedCheckpoint {
                    name,
                    revision: c.revision.clone(),
                    sha256: c.weights_sha256.clone(),
                })
            })
            .collect();
        w.warmup = warmup_reports(&info);
        w.parity_gate = info.parity_gate.clone().map(|g| g.checkpoints).unwrap_or_default();
    });
    if info.device_mismatch {
        tracing::warn!(worker = %format!("{}/{index}", pool.config().name), requested = %info.requested_device, device = %info.device, "worker runs on another device than configured");
    }
    tracing::info!(worker = %format!("{}/{index}", pool.config().name), pid, device = %info.device, dtype = %info.dtype, "worker ready");
    let (retired, dead) = (CancellationToken::new(), CancellationToken::new());
    // Whatever happens below, the serving task must not outlive this process.
    let _retired_guard = retired.clone().drop_guard();
    let _dead_guard = dead.clone().drop_guard();
    pool.admit(index, client.clone(), &info, retired.clone(), dead.clone());

    tokio::select! {
        status = process.wait() => {
            pool.retire(index);
            dead.cancel();
            let _ = logs.await;
            Err(Failure::Crashed(crashed(status, "while serving")))
        }
        () = stop.cancelled() => {
            pool.retire(index);
            retired.cancel();
            // Let the worker answer what it already accepted, then stop it.
            let _ = tokio::time::timeout(settings.stop_timeout, client.drain()).await;
            let status = process.terminate(settings.stop_timeout).await;
            dead.cancel();
            let _ = logs.await;
            crashed(status, "(stopped)");
            Ok(())
        }
    }
}

/// For an exit code that says restarting cannot help, what it means (the reason when the worker
/// logged none); `None` for a crash.
fn will_not_start(code: Option<i32>) -> Option<&'static str> {
    match code? {
        EXIT_DEVICE_UNAVAILABLE => Some("the worker reported its device unavailable"),
        EXIT_CONFIG_REFUSED => Some("the worker refused its configuration"),
        _ => None,
    }
}

/// The message of the last error a worker logged (its JSON lines), e.g. why its device is missing.
fn last_error_message(lines: &[String]) -> Option<String> {
    lines.iter().rev().find_map(|line| {
        let record: serde_json::Value = serde_json::from_str(line).ok()?;
        if record.get("level")?.as_str()? != "ERROR" {
            return None;
        }
        let fields = record.get("fields").unwrap_or(&record);
        let message = fields.get("message")?.as_str()?;
        Some(match fields.get("error").and_then(|e| e.as_str()) {
            Some(error) => format!("{message}: {error}"),
            None => message.to_owned(),
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reason_is_the_last_error_line_with_its_error_field() {
        let lines = [
            r#"{"level":"INFO","fields":{"message":"starting"}}"#.to_owned(),
            r#"{"level":"ERROR","fields":{"message":"cannot start","error":"Core ML is not available"}}"#.to_owned(),
            "thread 'main' panicked".to_owned(),
        ];
        assert_eq!(
            last_error_message(&lines).as_deref(),
            Some("cannot start: Core ML is not available")
        );
        assert_eq!(last_error_message(&lines[..1]), None);
    }

    #[test]
    fn device_and_configuration_refusals_are_not_restarted_and_crashes_are() {
        assert!(will_not_start(Some(EXIT_DEVICE_UNAVAILABLE)).is_some());
        assert!(will_not_start(Some(EXIT_CONFIG_REFUSED)).is_some());
        // A panic (101), a plain failure (1), a usage error (2) and a signal (no code) are retried.
        for code in [Some(101), Some(1), Some(2), None] {
            assert_eq!(will_not_start(code), None, "{code:?}");
        }
    }
}
