//! Live reconfiguration: SIGHUP re-reads the configuration from the sources it was started with
//! and applies what can change while serving (pools, spilling, the diagnostics block).
//!
//! A configuration with errors changes nothing; the old one keeps running. The outcome of the last
//! reload (and the switches it changes) live in [`LiveSettings`], which `/health` and answers read.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::SystemTime;

use layad_config::{Config, ConfigError, Sources};

use crate::process::Workers;

/// Settings a reload changes while serving, and how the last reload went.
#[derive(Debug)]
pub struct LiveSettings {
    diagnostics: AtomicBool,
    reloads: AtomicU64,
    last: Mutex<Option<ReloadOutcome>>,
}

/// The outcome of one reload, for `/health`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReloadOutcome {
    /// Reloads attempted since start, this one included.
    pub attempt: u64,
    /// When it happened.
    pub at: SystemTime,
    /// `Ok(changes applied)` or `Err(why nothing changed)`.
    pub result: Result<Vec<String>, String>,
}

impl LiveSettings {
    /// The live settings of `config`, before any reload.
    pub fn new(config: &Config) -> Self {
        Self {
            diagnostics: AtomicBool::new(config.server.diagnostics),
            reloads: AtomicU64::new(0),
            last: Mutex::new(None),
        }
    }

    /// Whether answers carry the `x_layad` block.
    pub fn diagnostics(&self) -> bool {
        self.diagnostics.load(Ordering::Relaxed)
    }

    /// How the last reload went, if there was one.
    pub fn last_reload(&self) -> Option<ReloadOutcome> {
        self.last.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn record(&self, result: Result<Vec<String>, String>) {
        let outcome = ReloadOutcome {
            attempt: self.reloads.fetch_add(1, Ordering::Relaxed) + 1,
            at: SystemTime::now(),
            result,
        };
        *self.last.lock().unwrap_or_else(|p| p.into_inner()) = Some(outcome);
    }
}

/// Keys a reload cannot apply, compared section by section: a change there is reported, not applied.
fn needs_restart(running: &Config, loaded: &Config) -> Vec<&'static str> {
    let mut server = loaded.server.clone();
    server.diagnostics = running.server.diagnostics;
    let mut changed = Vec::new();
    if server != running.server || loaded.api_key != running.api_key {
        changed.push("[server] (other than diagnostics)");
    }
    if loaded.workers != running.workers {
        changed.push("[workers]");
    }
    if loaded.logging != running.logging {
        changed.push("[logging]");
    }
    changed
}

/// Re-reads the configuration and applies it; `running` becomes the applied configuration.
pub fn reload(
    sources: &Sources,
    running: &mut Config,
    workers: &Workers,
    live: &LiveSettings,
) -> Result<Vec<String>, String> {
    let result = load_and_apply(sources, running, workers, live);
    match &result {
        Ok(changes) if changes.is_empty() => tracing::info!("configuration reloaded: nothing changed"),
        Ok(changes) => tracing::info!(changes = %changes.join("; "), "configuration reloaded"),
        Err(error) => tracing::error!(%error, "reload refused; the running configuration stays"),
    }
    live.record(result.clone());
    result
}

fn load_and_apply(
    sources: &Sources,
    running: &mut Config,
    workers: &Workers,
    live: &LiveSettings,
) -> Result<Vec<String>, String> {
    let loaded = Config::load(sources).map_err(|e: ConfigError| e.to_string())?;
    if loaded.checkpoints != running.checkpoints {
        // The supervisor opened the checkpoints' tokenizers at start; new ones need a restart.
        return Err("[checkpoints] changed; that needs a restart (layad serve)".to_owned());
    }
    let mut changes = workers.reload(&loaded).map_err(|e| e.to_string())?.changes;
    if loaded.scheduling != running.scheduling {
        changes.push(format!("scheduling.spill = {}", loaded.scheduling.spill));
    }
    if loaded.server.diagnostics != running.server.diagnostics {
        live.diagnostics.store(loaded.server.diagnostics, Ordering::Relaxed);
        changes.push(format!("server.diagnostics = {}", loaded.server.diagnostics));
    }
    for section in needs_restart(running, &loaded) {
        tracing::warn!("{section} changed; it takes effect only after a restart");
        changes.push(format!("{section} changed: needs a restart"));
    }
    // Keep what runs: the sections a restart would apply stay as they were.
    running.pools = loaded.pools;
    running.scheduling = loaded.scheduling;
    running.server.diagnostics = loaded.server.diagnostics;
    Ok(changes)
}

/// Reloads on every SIGHUP; never returns (drop it to stop listening).
pub async fn reload_on_sighup(
    sources: Sources,
    mut running: Config,
    workers: &Workers,
    live: &LiveSettings,
) -> std::convert::Infallible {
    match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
        Ok(mut hangups) => {
            while hangups.recv().await.is_some() {
                tracing::info!("SIGHUP received; reloading the configuration");
                let _ = reload(&sources, &mut running, workers, live);
            }
        }
        Err(error) => tracing::error!(%error, "cannot listen for SIGHUP; reload is unavailable"),
    }
    std::future::pending().await
}
