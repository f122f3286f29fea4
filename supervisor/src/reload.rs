//! Live reconfiguration: SIGHUP re-reads the configuration from the sources it was started with
//! and applies what can change while serving (pools, `[scheduling]`, the diagnostics block).
//!
//! [`plan`] works out what a reload does from the running and the new configuration alone, so each
//! rule is tested without processes; [`reload`] loads, plans, applies and records the outcome in
//! [`LiveSettings`], which `/health` and answers read. A configuration with errors changes nothing.

use layad_config::{Config, ConfigError, PoolConfig, SchedulingConfig, Sources};

use crate::live::LiveSettings;
use crate::process::{PoolChange, Workers};

/// What a reload does.
#[derive(Clone, Debug, PartialEq)]
pub struct ReloadPlan {
    /// One entry per pool of the new configuration, in its order, then the pools it no longer has.
    pub pools: Vec<PoolChange>,
    /// The `[scheduling]` keys that changed, as `key = new value`.
    pub scheduling: Vec<String>,
    /// The new `server.diagnostics`, when it changed.
    pub diagnostics: Option<bool>,
    /// Sections that changed but take effect only after a restart.
    pub needs_restart: Vec<&'static str>,
}

impl ReloadPlan {
    /// One line per change, e.g. `pool short: 1 → 2 workers`, for the log, `/health` and
    /// `layad reload`.
    pub fn changes(&self) -> Vec<String> {
        let mut changes: Vec<String> = self.pools.iter().filter_map(PoolChange::describe).collect();
        changes.extend(self.scheduling.iter().cloned());
        if let Some(diagnostics) = self.diagnostics {
            changes.push(format!("server.diagnostics = {diagnostics}"));
        }
        for section in &self.needs_restart {
            changes.push(format!("{section} changed: needs a restart"));
        }
        changes
    }
}

/// What reloading from `running` to `loaded` does; `Err` when it cannot be applied while serving
/// (the checkpoints changed: the supervisor opened their tokenizers at start).
pub fn plan(running: &Config, loaded: &Config) -> Result<ReloadPlan, String> {
    if loaded.checkpoints != running.checkpoints {
        return Err("[checkpoints] changed; that needs a restart (layad serve)".to_owned());
    }
    let mut pools = Vec::new();
    for wanted in &loaded.pools {
        let checkpoints = loaded.pool_checkpoints(wanted);
        let Some(current) = running.pools.iter().find(|p| p.name == wanted.name) else {
            pools.push(PoolChange::Add {
                pool: wanted.clone(),
                checkpoints,
            });
            continue;
        };
        let same_but_size = PoolConfig {
            workers: current.workers,
            ..wanted.clone()
        } == *current
            && running.pool_checkpoints(current) == checkpoints;
        pools.push(if !same_but_size {
            PoolChange::Replace {
                pool: wanted.clone(),
                checkpoints,
            }
        } else if wanted.workers != current.workers {
            PoolChange::Scale {
                name: wanted.name.clone(),
                from: current.workers,
                to: wanted.workers,
            }
        } else {
            PoolChange::Keep {
                name: wanted.name.clone(),
            }
        });
    }
    for gone in running
        .pools
        .iter()
        .filter(|p| !loaded.pools.iter().any(|w| w.name == p.name))
    {
        pools.push(PoolChange::Remove {
            name: gone.name.clone(),
        });
    }
    Ok(ReloadPlan {
        pools,
        scheduling: scheduling_changes(&running.scheduling, &loaded.scheduling),
        diagnostics: (loaded.server.diagnostics != running.server.diagnostics).then_some(loaded.server.diagnostics),
        needs_restart: needs_restart(running, loaded),
    })
}

/// `scheduling.<key> = <new value>` for each key of `[scheduling]` that differs.
fn scheduling_changes(running: &SchedulingConfig, loaded: &SchedulingConfig) -> Vec<String> {
    let mut changes = Vec::new();
    if loaded.spill != running.spill {
        changes.push(format!("scheduling.spill = {}", loaded.spill));
    }
    if loaded.order != running.order {
        changes.push(format!("scheduling.order = {}", loaded.order.as_str()));
    }
    if loaded.aging != running.aging {
        changes.push(format!("scheduling.aging = {}", loaded.aging));
    }
    changes
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
    if loaded.compat != running.compat {
        changed.push("[compat]");
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
    let plan = plan(running, &loaded)?;
    workers.apply(&loaded, &plan.pools).map_err(|e| e.to_string())?;
    if let Some(diagnostics) = plan.diagnostics {
        live.set_diagnostics(diagnostics);
    }
    for section in &plan.needs_restart {
        tracing::warn!("{section} changed; it takes effect only after a restart");
    }
    // Keep what runs: the sections a restart would apply stay as they were.
    running.pools = loaded.pools;
    running.scheduling = loaded.scheduling;
    running.server.diagnostics = loaded.server.diagnostics;
    Ok(plan.changes())
}

/// Reloads on every SIGHUP; never returns (drop it to stop listening).
pub async fn reload_task(
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

#[cfg(test)]
mod tests {
    use super::*;
    use laya::routing::CheckpointName;
    use layad_config::CheckpointSource;

    fn two_pools() -> Config {
        let mut config = Config::default();
        let mut short = PoolConfig::named("short");
        short.max_questions = Some(1);
        config.pools.push(short);
        config
    }

    #[test]
    fn an_unchanged_configuration_changes_nothing() {
        let config = two_pools();
        let plan = plan(&config, &config).expect("plan");
        assert!(plan.changes().is_empty(), "{:?}", plan.changes());
        assert_eq!(
            plan.pools,
            [
                PoolChange::Keep { name: "gpu".into() },
                PoolChange::Keep { name: "short".into() }
            ]
        );
    }

    #[test]
    fn pools_are_scaled_replaced_added_and_removed_in_the_new_order() {
        let running = two_pools();
        let mut loaded = two_pools();
        loaded.pools[0].workers = 3;
        loaded.pools[1].max_tokens = Some(128);
        loaded.pools.insert(0, PoolConfig::named("extra"));
        let plan = plan(&running, &loaded).expect("plan");
        assert_eq!(
            plan.changes(),
            [
                "pool extra: added",
                "pool gpu: 1 → 3 workers",
                "pool short: replaced (configuration changed)"
            ]
        );
        // A pool the new configuration lacks is removed, after the ones it has.
        let plan = super::plan(&loaded, &running).expect("plan");
        assert_eq!(
            plan.changes(),
            [
                "pool gpu: 3 → 1 workers",
                "pool short: replaced (configuration changed)",
                "pool extra: removed"
            ]
        );
        // A changed size together with another change replaces the pool.
        let mut both = two_pools();
        both.pools[1].workers = 2;
        both.pools[1].dtype = Some(layad_config::Dtype::F16);
        assert!(matches!(
            &super::plan(&running, &both).expect("plan").pools[1],
            PoolChange::Replace { pool, .. } if pool.workers == 2
        ));
    }

    #[test]
    fn switches_apply_and_other_sections_wait_for_a_restart() {
        let running = Config::default();
        let mut loaded = Config::default();
        loaded.scheduling.spill = false;
        loaded.scheduling.order = layad_config::QueueOrder::Arrival;
        loaded.server.diagnostics = false;
        loaded.server.max_connections = 7;
        loaded.workers.stop_timeout = std::time::Duration::from_secs(1);
        let plan = plan(&running, &loaded).expect("plan");
        assert_eq!(plan.diagnostics, Some(false));
        assert_eq!(
            plan.changes(),
            [
                "scheduling.spill = false",
                "scheduling.order = arrival",
                "server.diagnostics = false",
                "[server] (other than diagnostics) changed: needs a restart",
                "[workers] changed: needs a restart"
            ]
        );
    }

    #[test]
    fn changed_checkpoints_are_refused() {
        let running = Config::default();
        let mut loaded = Config::default();
        *loaded.checkpoints.source_mut(CheckpointName::Multilingual) = CheckpointSource::Off;
        let refused = plan(&running, &loaded).expect_err("refused");
        assert!(refused.contains("[checkpoints] changed"), "{refused}");
    }
}
