//! The process manager: one supervising task per worker slot that spawns the worker, waits until it
//! answers as ready, admits it to its pool, follows its state, and restarts it with backoff.
//!
//! Restarts double their delay up to a cap and start over once a worker has run for a while; a slot
//! that crashes too often within the configured window marks its pool degraded, with the reason.
//! A worker binds its socket only once it is ready; from then on its `Watch` stream tells the slot
//! when it stops serving (draining, failed), before its process exits. It is admitted only once it
//! has proved it is the process this slot started: the socket's peer pid is the child's and its
//! Describe echoes the nonce given for this start; anything else answering there is never used.
//!
//! Idle unload (`pool.idle_unload`, upstream's `LAYA_IDLE_UNLOAD_SECONDS`) is a stop and a start of
//! the same slot: once its pool has had nothing queued or running for the window, the slot drains
//! and stops its worker as on shutdown (the process exit is what certainly returns the weights'
//! memory, on any device), marks it `unloaded`, and starts it again when a job is queued for the
//! pool; that job waits in the queue while the new worker loads and warms, as a request does while a
//! crashed worker restarts. No RPC to drop one checkpoint: the pool is the unit that goes idle, and a
//! new process is the one path that already loads and warms a worker before it serves.
//!
//! A pool with `start_unloaded` (what `LAYA_MODELS` gives a checkpoint it does not list, which
//! upstream loads on first use) takes the same path from the start: its slots begin `unloaded`
//! and start their workers when the first job is queued for the pool.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use futures::StreamExt;
use laya::routing::CheckpointName;
use layad_config::Config;
use layad_proto::client::{ClientError, WorkerClient};
use layad_proto::logging::LogFormat;
use layad_proto::{EXIT_CONFIG_REFUSED, EXIT_DEVICE_UNAVAILABLE, SpawnedWorker, WorkerArgs, pb};
use tokio_util::sync::CancellationToken;

use crate::pool::worker_task::worker_task;
use crate::pool::{Pool, WorkerReport};
use crate::process::backoff::Backoff;
use crate::process::cpu_quota::{self, CpuQuota};
use crate::process::logs::{LogTags, StderrTail, stderr_task};
use crate::process::worker_process::{WorkerProcess, WorkerSpec, describe_exit};
use crate::status::{LoadedCheckpoint, WorkerState};
use crate::worker_kind;

/// How often a starting worker's socket is tried: it appears once the worker is ready.
const CONNECT_EVERY: Duration = Duration::from_millis(50);

/// Settings shared by every slot.
#[derive(Debug)]
pub struct ManagerSettings {
    /// Directory of the worker binaries.
    pub binary_dir: PathBuf,
    /// Private directory for worker sockets.
    pub socket_dir: PathBuf,
    /// Checkpoint directories by name, as resolved at start-up; a reload that adds or removes
    /// extra checkpoints replaces the list (the directories of the others never change while
    /// serving, so a worker of a pool being replaced restarts on the same files).
    checkpoint_dirs: RwLock<Vec<(CheckpointName, PathBuf)>>,
    /// The restart policy every slot starts from.
    pub backoff: Backoff,
    /// How long a worker may take to load and warm before it is killed and restarted.
    pub startup_timeout: Duration,
    /// How long a worker may take to finish after SIGTERM.
    pub stop_timeout: Duration,
    /// Threads per worker for CPU pools with `threads = 0` under a CPU quota (a container's
    /// limit), so that their workers together fit it; 0 = no quota, each worker sizes itself.
    /// A reload recomputes it for the workers it starts (it may change how many share the quota).
    quota_threads: AtomicU32,
}

impl ManagerSettings {
    /// Settings from the configuration and the resolved checkpoint directories.
    pub fn from_config(
        config: &Config,
        binary_dir: PathBuf,
        socket_dir: PathBuf,
        checkpoint_dirs: Vec<(CheckpointName, PathBuf)>,
    ) -> Self {
        let settings = Self {
            binary_dir,
            socket_dir,
            checkpoint_dirs: RwLock::new(checkpoint_dirs),
            backoff: Backoff::new(&config.workers),
            startup_timeout: config.workers.startup_timeout,
            stop_timeout: config.workers.stop_timeout,
            quota_threads: AtomicU32::new(0),
        };
        settings.set_pools(config);
        settings
    }

    /// Sizes the threads of CPU workers with `threads = 0` for the pools of `config` (at start-up
    /// and on a reload) from this process's CPU quota, if it has one.
    pub fn set_pools(&self, config: &Config) {
        let threads = CpuQuota::current().and_then(|quota| {
            let threads = cpu_quota::threads_per_worker(&config.pools, quota.whole_cpus())?;
            tracing::info!(
                quota_cpus = quota.cpus,
                cgroup = ?quota.version,
                threads_per_worker = threads,
                "CPU quota: workers of CPU pools with threads = 0 share it"
            );
            Some(threads)
        });
        self.quota_threads.store(threads.unwrap_or(0), Ordering::Relaxed);
    }

    /// The directories workers started from now on load (a reload's new checkpoint set).
    pub fn set_checkpoint_dirs(&self, dirs: Vec<(CheckpointName, PathBuf)>) {
        *self.checkpoint_dirs.write().unwrap_or_else(|p| p.into_inner()) = dirs;
    }
}

/// The file name of a worker's socket. `generation` tells apart the sockets of a pool and the pool a
/// reload is replacing it with, which run side by side for a while.
pub(crate) fn socket_name(pool: &str, generation: u64, index: usize) -> String {
    format!("{pool}-{generation}-{index}.sock")
}

/// The command line of one start of a worker: the arguments every worker takes (with this start's
/// `nonce`), then its kind's own.
fn worker_spec(settings: &ManagerSettings, pool: &Pool, index: usize, generation: u64, nonce: String) -> WorkerSpec {
    let (served, config) = (pool.checkpoints(), pool.config());
    let socket = settings.socket_dir.join(socket_name(&config.name, generation, index));
    let common = WorkerArgs {
        socket: socket.clone(),
        checkpoints: settings
            .checkpoint_dirs
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|(name, _)| served.contains(name))
            .map(|(name, dir)| (name.as_str().to_owned(), dir.clone()))
            .collect(),
        device: config.device.as_str().to_owned(),
        dtype: config.effective_dtype().as_str().to_owned(),
        threads: match (config.threads, settings.quota_threads.load(Ordering::Relaxed)) {
            (0, 0) => None,
            (0, quota) => Some(quota as usize),
            (set, _) => Some(set as usize),
        },
        max_rows: config.max_rows,
        max_batch_tokens: config.max_batch_tokens,
        length_buckets: config.buckets.clone(),
        // The worker's stdin: see `WorkerProcess`.
        liveness_fd: Some(0),
        log_format: LogFormat::Json,
        spawn_nonce: Some(nonce.clone()),
    };
    let mut args = common.to_args();
    args.extend((worker_kind::spec(config.worker).extra_args)(config));
    WorkerSpec {
        binary: settings.binary_dir.join(config.worker.binary_name()),
        args,
        socket,
        nonce,
    }
}

/// A worker's state updates, from the moment it answers on its socket.
type States = futures::stream::BoxStream<'static, Result<pb::WorkerStatus, ClientError>>;

/// Tries the socket until the worker `spawned` answers and its state stream says ready; returns the
/// client, its Describe answer and the rest of the stream. `Err` when something else answers there
/// (another process, or a Describe without this start's nonce): that never becomes ready.
async fn wait_ready(socket: &Path, spawned: &SpawnedWorker) -> Result<(WorkerClient, WorkerReport, States), String> {
    loop {
        match WorkerClient::connect_spawned(socket, spawned).await {
            Ok(client) => {
                if let Ok(states) = client.watch().await {
                    let mut states: States = states.boxed();
                    if let Some(Ok(first)) = states.next().await
                        && first.state() == pb::WorkerState::Ready
                        && let Ok(info) = client.describe().await
                    {
                        // Its answer is read once, here; one that breaks the protocol is refused.
                        let report = WorkerReport::from_info(&info).map_err(|e| e.to_string())?;
                        return Ok((client, report, states));
                    }
                }
            }
            Err(refused @ ClientError::NotOurWorker { .. }) => return Err(refused.to_string()),
            Err(_) => {}
        }
        tokio::time::sleep(CONNECT_EVERY).await;
    }
}

/// Why a worker process ended without being asked to.
enum Failure {
    /// It crashed or failed to start before it became ready: restart it.
    Crashed(String),
    /// It died after it had joined its pool, having served that long: restart it.
    Died { reason: String, served_for: Duration },
    /// It exited with [`EXIT_DEVICE_UNAVAILABLE`] (its device does not exist here) or
    /// [`EXIT_CONFIG_REFUSED`] (it refused its arguments): restarting cannot help.
    Unavailable(String),
}

/// Why a worker process ended without failing.
enum Ended {
    /// The slot was told to stop.
    Stopped,
    /// Its pool was idle for `idle_unload`: start it again on demand.
    Unloaded,
}

/// Waits until a job is queued for `pool` (or `stop`): then an unloaded worker starts again.
async fn demand(pool: &Pool, stop: &CancellationToken) {
    let seen = pool.jobs_queued();
    loop {
        if pool.jobs_queued() != seen || !pool.idle() {
            return;
        }
        tokio::select! {
            () = tokio::time::sleep(Duration::from_millis(10)) => {}
            () = stop.cancelled() => return,
        }
    }
}

/// One slot's life: spawn, admit when ready, watch, restart with backoff, until `stop` is
/// cancelled; then it stops the worker (drain, SIGTERM, grace, SIGKILL) and returns.
pub async fn supervise_task(
    settings: Arc<ManagerSettings>,
    pool: Arc<Pool>,
    index: usize,
    generation: u64,
    stop: CancellationToken,
) {
    let id = format!("{}/{index}", pool.config().name);
    let mut backoff = settings.backoff.clone();
    let mut restarts = 0u64;
    // Set while the slot starts again after an idle unload: when that began.
    let mut reloading: Option<Instant> = None;
    if pool.config().start_unloaded {
        // As after an idle unload, from the start: the first job queued for the pool starts it.
        // The record names what it will load, so `/readyz` and routing count it as servable.
        let loads: Vec<LoadedCheckpoint> = pool
            .checkpoints()
            .iter()
            .map(|&name| LoadedCheckpoint {
                name,
                revision: None,
                sha256: String::new(),
            })
            .collect();
        pool.update_worker(index, |w| {
            w.state = WorkerState::Unloaded;
            w.checkpoints = loads;
        });
        tracing::info!(worker = %id, "pool starts unloaded: its worker starts on the first request for it");
        demand(&pool, &stop).await;
        if stop.is_cancelled() {
            pool.update_worker(index, |w| w.state = WorkerState::Stopped);
            return;
        }
        tracing::info!(worker = %id, "first request for the pool: loading the worker");
        reloading = Some(Instant::now());
    }
    loop {
        if stop.is_cancelled() {
            pool.update_worker(index, |w| w.state = WorkerState::Stopped);
            return;
        }
        let failure = match crate::process::nonce::random_hex(16) {
            Err(e) => Err(Failure::Crashed(format!("no random bytes for the worker's nonce: {e}"))),
            Ok(nonce) => {
                let spec = worker_spec(&settings, &pool, index, generation, nonce);
                run_once(&settings, &pool, index, &spec, &stop, reloading.take()).await
            }
        };
        let (failure, served_for) = match failure {
            Ok(Ended::Stopped) => return,
            Ok(Ended::Unloaded) => {
                pool.update_worker(index, |w| {
                    w.state = WorkerState::Unloaded;
                    w.pid = None;
                    w.unloads += 1;
                });
                tracing::info!(worker = %id, "pool idle: worker unloaded until the next request");
                demand(&pool, &stop).await;
                if stop.is_cancelled() {
                    pool.update_worker(index, |w| w.state = WorkerState::Stopped);
                    return;
                }
                tracing::info!(worker = %id, "request for an idle pool: loading the worker again");
                reloading = Some(Instant::now());
                continue;
            }
            Err(Failure::Crashed(failure)) => (failure, Duration::ZERO),
            Err(Failure::Died { reason, served_for }) => (reason, served_for),
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
        let restart = backoff.failed(served_for, Instant::now());
        tracing::warn!(worker = %id, %failure, restart_in_ms = restart.delay.as_millis() as u64, "worker stopped; restarting it");
        pool.update_worker(index, |w| {
            w.state = WorkerState::Restarting;
            w.restarts = restarts;
            w.last_error = Some(failure.clone());
        });
        if restart.crash_loop {
            let window = settings.backoff.window().as_secs();
            pool.set_degraded(Some(format!(
                "worker {id} restarted {} times in {window} s; last: {failure}",
                restart.recent_failures
            )));
        }
        tokio::select! {
            () = tokio::time::sleep(restart.delay) => {}
            () = stop.cancelled() => {}
        }
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
    reloading: Option<Instant>,
) -> Result<Ended, Failure> {
    let (mut process, stderr) = WorkerProcess::spawn(spec).map_err(|e| Failure::Crashed(e.to_string()))?;
    let pid = process.pid();
    let tail = StderrTail::default();
    let tags = LogTags {
        pool: pool.config().name.clone(),
        worker: format!("{}/{index}", pool.config().name),
        pid,
    };
    let logs = tokio::spawn(stderr_task(stderr, tags, tail.clone()));
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

    let spawned = SpawnedWorker {
        pid,
        nonce: spec.nonce.clone(),
    };
    let ready = tokio::select! {
        ready = tokio::time::timeout(settings.startup_timeout, wait_ready(&spec.socket, &spawned)) => ready,
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
            return Ok(Ended::Stopped);
        }
    };
    let (client, report, mut states) = match ready {
        Ok(Ok(ready)) => ready,
        Ok(Err(refused)) => {
            tracing::error!(pid, %refused, "refusing what answers at the worker's socket; stopping the worker");
            process.kill();
            let status = process.wait().await;
            let _ = logs.await;
            let reason = crashed(status, "");
            return Err(Failure::Crashed(format!("{refused}; killed: {reason}")));
        }
        Err(_) => {
            process.kill();
            let status = process.wait().await;
            let _ = logs.await;
            let reason = crashed(status, "");
            let timeout = settings.startup_timeout.as_secs();
            return Err(Failure::Crashed(format!(
                "not ready within {timeout} s (startup_timeout); killed: {reason}"
            )));
        }
    };

    let worker = format!("{}/{index}", pool.config().name);
    if report.device_mismatch {
        tracing::warn!(%worker, requested = %report.requested_device, device = %report.device, "worker runs on another device than configured");
    }
    tracing::info!(%worker, pid, device = %report.device, dtype = %report.dtype, facts = ?report.engine, "worker ready");
    let (retired, dead) = (CancellationToken::new(), CancellationToken::new());
    // Whatever happens below, the serving task must not outlive this process.
    let _retired_guard = retired.clone().drop_guard();
    let _dead_guard = dead.clone().drop_guard();
    let admitted = pool.admit(index, client.clone(), report);
    if let Some(started) = reloading {
        let ms = started.elapsed().as_secs_f64() * 1e3;
        tracing::info!(%worker, reload_ms = ms, "worker loaded again after idle unload");
        pool.update_worker(index, |w| w.last_reload_ms = Some((ms * 1e3).round() / 1e3));
    }
    let serving_since = Instant::now();
    let idle_unload = pool.config().idle_unload;
    let idle = async {
        if idle_unload.is_zero() {
            std::future::pending::<()>().await;
        }
        pool.idle_for(idle_unload).await;
    };
    tokio::pin!(idle);
    let mut serving_task = tokio::spawn(worker_task(Arc::clone(pool), admitted, retired.clone(), dead.clone()));

    let mut serving = true;
    let (ended, why) = loop {
        tokio::select! {
            status = process.wait() => {
                pool.retire(index);
                dead.cancel();
                let _ = logs.await;
                return Err(Failure::Died {
                    reason: crashed(status, "while serving"),
                    served_for: serving_since.elapsed(),
                });
            }
            () = stop.cancelled() => break (Ended::Stopped, "(stopped)"),
            () = &mut idle, if serving => break (Ended::Unloaded, "(idle unload)"),
            update = states.next(), if serving => {
                let failure = match update {
                    Some(Ok(status)) if status.state() == pb::WorkerState::Ready => continue,
                    Some(Ok(status)) => {
                        let state = status.state().label();
                        status.failure.unwrap_or_else(|| format!("worker is {state}"))
                    }
                    Some(Err(error)) => error.to_string(),
                    None => "worker stopped serving".to_owned(),
                };
                // It takes no new jobs; the one it runs finishes or is retried when the process exits.
                serving = false;
                pool.retire(index);
                retired.cancel();
                tracing::warn!(%worker, %failure, "worker left the pool");
                pool.update_worker(index, |w| w.last_error = Some(failure));
            }
        }
    };
    // Stopped or unloaded: out of the pool (its task takes no batch from now on), let the worker
    // answer what it already accepted, then stop it.
    pool.retire(index);
    retired.cancel();
    // The batch its task took just before may still be on its way to the worker: it must arrive
    // before the drain, which would refuse it, and long before the exit, which would cut it off
    // mid-call. Both waits share the one stop timeout.
    let finish_by = tokio::time::Instant::now() + settings.stop_timeout;
    let _ = tokio::time::timeout_at(finish_by, &mut serving_task).await;
    let _ = tokio::time::timeout_at(finish_by, client.drain()).await;
    let status = process.terminate(settings.stop_timeout).await;
    dead.cancel();
    let _ = logs.await;
    crashed(status, why);
    Ok(ended)
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
