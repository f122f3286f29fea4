//! Settings a reload changes while serving (the switches answers and `/health` read) and how the
//! last reload went. Request handling reads them; only `reload` writes them.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::SystemTime;

use layad_config::Config;

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

    /// Turns the `x_layad` block on or off (reload).
    pub fn set_diagnostics(&self, on: bool) {
        self.diagnostics.store(on, Ordering::Relaxed);
    }

    /// How the last reload went, if there was one.
    pub fn last_reload(&self) -> Option<ReloadOutcome> {
        self.last.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Records the outcome of a reload attempt.
    pub fn record(&self, result: Result<Vec<String>, String>) {
        let outcome = ReloadOutcome {
            attempt: self.reloads.fetch_add(1, Ordering::Relaxed) + 1,
            at: SystemTime::now(),
            result,
        };
        *self.last.lock().unwrap_or_else(|p| p.into_inner()) = Some(outcome);
    }
}
