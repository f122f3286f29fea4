//! Live reconfiguration: SIGHUP re-reads the configuration from the sources it was started with
//! and applies what can change while serving (pools, `[scheduling]`, the diagnostics block, and
//! extra checkpoints added to or removed from `[checkpoints.extra]` / `LAYA_EXTRA_MODELS`).
//!
//! An added extra checkpoint is opened (a missing file, a bad safetensors header or a wrong config
//! refuses the whole reload with the checkpoint and file named), the pools serving it are replaced
//! by pools whose workers load and warm it while the old ones keep serving, and only once a worker
//! has it ready does `model=` accept its name; a removed one stops being accepted at once, and the
//! pools that held it are replaced.
//!
//! [`plan`] works out what a reload does from the running and the new configuration alone, so each
//! rule is tested without processes; [`reload`] loads, plans, applies and records the outcome in
//! [`LiveSettings`], which `/health` and answers read. A configuration with errors changes nothing.

use std::sync::Arc;
use std::time::{Duration, Instant};

use laya::routing::CheckpointName;
use layad_config::{Config, ConfigError, PoolConfig, SchedulingConfig, Sources};

use crate::backend::Backend;
use crate::checkpoints::{Checkpoints, ServedCheckpoints};
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
    /// Extra checkpoints the new configuration serves and the running one does not.
    pub added: Vec<CheckpointName>,
    /// Extra checkpoints the running configuration serves and the new one does not.
    pub removed: Vec<CheckpointName>,
}

impl ReloadPlan {
    /// One line per change, e.g. `pool short: 1 → 2 workers`, for the log, `/health` and
    /// `layad reload`.
    pub fn changes(&self) -> Vec<String> {
        let mut changes: Vec<String> = self
            .added
            .iter()
            .map(|name| format!("checkpoint {}: added", name.as_str()))
            .chain(
                self.removed
                    .iter()
                    .map(|name| format!("checkpoint {}: removed", name.as_str())),
            )
            .collect();
        changes.extend(self.pools.iter().filter_map(PoolChange::describe));
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

/// What reloading from `running` to `loaded` does; `Err` when it cannot be applied while serving:
/// a built-in entry of `[checkpoints]` changed, or a checkpoint served before and after comes from
/// somewhere else (requests already prepared with its tokenizer could meet the other weights).
/// Extra checkpoints may come and go.
pub fn plan(running: &Config, loaded: &Config) -> Result<ReloadPlan, String> {
    let builtins = |c: &Config| {
        (
            c.checkpoints.english.clone(),
            c.checkpoints.multilingual.clone(),
            c.checkpoints.typed_decisions.clone(),
        )
    };
    if builtins(loaded) != builtins(running) {
        return Err("[checkpoints] changed for a built-in checkpoint; that needs a restart (layad serve)".to_owned());
    }
    let (before, after) = (running.served_checkpoints(), loaded.served_checkpoints());
    for (name, source) in &after {
        if let Some((_, old)) = before.iter().find(|(n, _)| n == name)
            && old != source
        {
            return Err(format!(
                "checkpoint '{}' would come from somewhere else; changing a served checkpoint's source needs a \
                 restart (layad serve), adding or removing one does not",
                name.as_str()
            ));
        }
    }
    let added: Vec<CheckpointName> = after
        .iter()
        .map(|(n, _)| *n)
        .filter(|n| !before.iter().any(|(b, _)| b == n))
        .collect();
    let removed: Vec<CheckpointName> = before
        .iter()
        .map(|(n, _)| *n)
        .filter(|n| !after.iter().any(|(a, _)| a == n))
        .collect();
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
        added,
        removed,
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

/// What a reload changes besides the configuration: the workers, the served checkpoint set and
/// the live switches.
pub struct Reloadable<'a> {
    /// The pools and their workers.
    pub workers: &'a Workers,
    /// The checkpoint set requests are prepared with.
    pub checkpoints: &'a Arc<ServedCheckpoints>,
    /// The switches answers and `/health` read.
    pub live: &'a LiveSettings,
}

/// Re-reads the configuration and applies it; `running` becomes the applied configuration.
pub fn reload(sources: &Sources, running: &mut Config, target: &Reloadable<'_>) -> Result<Vec<String>, String> {
    let live = target.live;
    let result = load_and_apply(sources, running, target);
    match &result {
        Ok(changes) if changes.is_empty() => tracing::info!("configuration reloaded: nothing changed"),
        Ok(changes) => tracing::info!(changes = %changes.join("; "), "configuration reloaded"),
        Err(error) => tracing::error!(%error, "reload refused; the running configuration stays"),
    }
    live.record(result.clone());
    result
}

fn load_and_apply(sources: &Sources, running: &mut Config, target: &Reloadable<'_>) -> Result<Vec<String>, String> {
    let (workers, live) = (target.workers, target.live);
    let loaded = Config::load(sources).map_err(|e: ConfigError| e.to_string())?;
    let plan = plan(running, &loaded)?;
    let current = target.checkpoints.current();
    let next = Arc::new(Checkpoints::reopen(&current, &loaded).map_err(|e| format!("reload refused: {e}"))?);
    // Removed checkpoints stop being accepted now; added ones once a worker has them warm.
    if !plan.removed.is_empty() {
        let kept: Vec<_> = current
            .iter()
            .filter(|(name, _)| !plan.removed.contains(name))
            .map(|(name, _)| name)
            .collect();
        target.checkpoints.replace(Arc::new(next.narrowed_to(&kept)));
    }
    if let Err(e) = workers.apply(&loaded, &next, &plan.pools) {
        target.checkpoints.replace(current);
        return Err(e.to_string());
    }
    if plan.added.is_empty() {
        target.checkpoints.replace(next);
    } else {
        let backend: Arc<dyn Backend> = workers.scheduler();
        tokio::spawn(publish_when_ready(
            backend,
            Arc::clone(target.checkpoints),
            next,
            plan.added.clone(),
            loaded.workers.startup_timeout,
        ));
    }
    if let Some(diagnostics) = plan.diagnostics {
        live.set_diagnostics(diagnostics);
    }
    for section in &plan.needs_restart {
        tracing::warn!("{section} changed; it takes effect only after a restart");
    }
    // Keep what runs: the sections a restart would apply stay as they were.
    // Checkpoints may only have come or gone (`plan` refuses anything else), which is applied.
    running.checkpoints = loaded.checkpoints;
    running.pools = loaded.pools;
    running.scheduling = loaded.scheduling;
    running.server.diagnostics = loaded.server.diagnostics;
    Ok(plan.changes())
}

/// Serves `next` once a ready worker holds every checkpoint in `added` (they were loaded and warmed
/// before the worker joined its pool), or after `timeout` (a worker that cannot load one keeps being
/// restarted and `/health` says why; the name is then accepted and answered 503 like any
/// checkpoint without a ready worker).
async fn publish_when_ready(
    backend: Arc<dyn Backend>,
    served: Arc<ServedCheckpoints>,
    next: Arc<Checkpoints>,
    added: Vec<CheckpointName>,
    timeout: Duration,
) {
    let started = Instant::now();
    loop {
        let status = backend.status();
        if added.iter().all(|name| status.servable(*name)) {
            break;
        }
        if started.elapsed() >= timeout {
            tracing::warn!("added checkpoints have no ready worker after {timeout:?}; accepting their names anyway");
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let names: Vec<&str> = added.iter().map(|n| n.as_str()).collect();
    served.replace(next);
    tracing::info!(checkpoints = %names.join(", "), "added checkpoints are served");
}

/// Reloads on every SIGHUP; never returns (drop it to stop listening).
pub async fn reload_task(sources: Sources, mut running: Config, target: Reloadable<'_>) -> std::convert::Infallible {
    match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
        Ok(mut hangups) => {
            while hangups.recv().await.is_some() {
                tracing::info!("SIGHUP received; reloading the configuration");
                let _ = reload(&sources, &mut running, &target);
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
        loaded.checkpoints.multilingual = CheckpointSource::Off;
        let refused = plan(&running, &loaded).expect_err("refused");
        assert!(refused.contains("[checkpoints] changed"), "{refused}");
    }

    fn extra(source: &str) -> layad_config::ExtraSource {
        layad_config::ExtraSource {
            source: source.to_owned(),
            subfolder: None,
        }
    }

    #[test]
    fn extra_checkpoints_come_and_go_and_replace_the_pools_that_serve_them() {
        let running = Config::default();
        let mut loaded = Config::default();
        loaded.checkpoints.extra.insert("Mine".into(), extra("/srv/mine"));
        let plan = plan(&running, &loaded).expect("plan");
        let mine = CheckpointName::register("mine").expect("name");
        assert_eq!((plan.added.as_slice(), plan.removed.as_slice()), (&[mine][..], &[][..]));
        assert_eq!(
            plan.changes(),
            ["checkpoint mine: added", "pool gpu: replaced (configuration changed)"]
        );
        let back = super::plan(&loaded, &running).expect("plan");
        assert_eq!(back.removed, [mine]);
        assert_eq!(
            back.changes(),
            ["checkpoint mine: removed", "pool gpu: replaced (configuration changed)"]
        );
        // The same extra from elsewhere, or a built-in re-pointed while served, needs a restart.
        let mut moved = loaded.clone();
        moved.checkpoints.extra.insert("Mine".into(), extra("/srv/other"));
        let refused = super::plan(&loaded, &moved).expect_err("refused");
        assert!(
            refused.contains("checkpoint 'mine' would come from somewhere else"),
            "{refused}"
        );
        let mut repointed = Config::default();
        repointed.checkpoints.extra.insert("en".into(), extra("/srv/ft"));
        let refused = super::plan(&running, &repointed).expect_err("refused");
        assert!(refused.contains("checkpoint 'english'"), "{refused}");
    }
}
