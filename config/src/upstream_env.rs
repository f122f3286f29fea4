//! Upstream `laya-serve`'s environment (`LAYA_*`), read the way `laya[serve]==0.4.15` reads it, so
//! that a `laya-serve` unit file's environment starts layad with the same meaning.
//!
//! Precedence: built-in defaults < TOML file < `LAYA_*` < `LAYAD_*` < flags. A `LAYA_*` variable
//! replaces what the file says (it is the operator's newer, more specific word, as it is for
//! upstream, which has no file), and a `LAYAD_*` variable or a flag for the same key replaces it
//! (layad's own spelling is the more deliberate one); an overridden `LAYA_*` variable is warned
//! about. Each variable that is used yields a [`Note`] the supervisor logs at start-up; one without
//! a layad meaning yields a warning saying why.
//!
//! Parsing follows upstream: blank values mean unset; a bad `LAYA_PORT`, `LAYA_LOG_LEVEL`,
//! `LAYA_DEFAULT_MODEL` or `LAYA_MODELS` refuses to start (upstream exits), while the numeric knobs
//! upstream falls back on (`LAYA_THREADS`, `LAYA_MAX_CONCURRENT`, `LAYA_MAX_TOKEN_BUDGET`,
//! `LAYA_BODY_READ_TIMEOUT`, `LAYA_TOURNAMENT_GROUP`) keep the lower layer's value with a warning.

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use laya::output::OutputProfile;
use laya::python_text::py_repr_str;
use laya::routing::{CheckpointName, unknown_model_name};

use crate::error::Problem;
use crate::schema::{CheckpointSource, Config, Device, ExtraSource, PoolConfig, WorkerKind};

/// How loud a note is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NoteLevel {
    /// The variable was applied.
    Info,
    /// The variable changes nothing (no layad meaning, overridden, or a value upstream also
    /// ignores).
    Warn,
}

/// What layad made of one upstream variable, for the start-up log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Note {
    /// The variable, e.g. `LAYA_PORT`.
    pub variable: &'static str,
    /// Info or warning.
    pub level: NoteLevel,
    /// What happened, e.g. `LAYA_PORT=8000: server.listen = 127.0.0.1:8000`.
    pub message: String,
}

/// Variables with no layad meaning, and why.
const WITHOUT_MEANING: [(&str, &str); 10] = [
    (
        "LAYA_MAX_LOADED",
        "layad keeps every served checkpoint resident in its workers",
    ),
    (
        "LAYA_MAX_BATCH_TOKENS",
        "each state of a batch is its own job; a pool's max_batch_tokens bounds one forward pass",
    ),
    (
        "LAYA_ROOT_PATH",
        "layad serves no documentation routes, which is all upstream's root path changes",
    ),
    ("LAYA_CPU_AMP", "set pool.dtype instead (\"bf16\", \"f16\", \"int8\")"),
    ("LAYA_CUDA_AMP", "set pool.dtype instead (\"f16\", \"bf16\")"),
    ("LAYA_MPS_AMP_MIN_ROWS", "set pool.dtype instead (\"f16\")"),
    (
        "LAYA_REVISION",
        "layad serves the files in the cache or directory configured in [checkpoints]; /health reports their revision",
    ),
    (
        "LAYA_SHA256_DIGESTS",
        "layad reports each served file's SHA-256 in /health instead of checking a list",
    ),
    (
        "LAYA_INDUCTOR_CACHE_DIR",
        "the workers run candle kernels; there is no torch.compile cache",
    ),
    (
        "LAYA_COMPILE_WARMUP",
        "the workers run candle kernels and warm every checkpoint before they serve",
    ),
];

/// What [`apply`] needs to know about the layers above the file: whether `LAYAD_*` or a flag set
/// a key, and then its origin (`environment variable LAYAD_SERVER__LISTEN`, `flag --listen`).
pub trait Overrides {
    /// The origin of `path` when a `LAYAD_*` variable or a flag set it.
    fn overridden(&self, path: &[&str]) -> Option<String>;
}

/// Upstream 0.4.15's `_env_bool`: unset or blank → `None`; `1/true/yes/on` (any case, stripped) →
/// true; anything else false.
fn env_bool(value: &str) -> Option<bool> {
    let v = value.trim();
    (!v.is_empty()).then(|| matches!(v.to_ascii_lowercase().as_str(), "1" | "true" | "yes" | "on"))
}

/// Collects notes and problems while applying.
struct Applier<'a> {
    config: &'a mut Config,
    overrides: &'a dyn Overrides,
    notes: Vec<Note>,
    problems: Vec<Problem>,
}

impl Applier<'_> {
    fn info(&mut self, variable: &'static str, message: String) {
        self.notes.push(Note {
            variable,
            level: NoteLevel::Info,
            message,
        });
    }

    fn warn(&mut self, variable: &'static str, message: String) {
        self.notes.push(Note {
            variable,
            level: NoteLevel::Warn,
            message,
        });
    }

    fn problem(&mut self, key: &str, variable: &'static str, message: String) {
        self.problems.push(Problem {
            key: key.to_owned(),
            origin: format!("environment variable {variable}"),
            message,
        });
    }

    /// True (and a warning) when a higher layer set `path`.
    fn shadowed(&mut self, variable: &'static str, value: &str, path: &[&str]) -> bool {
        match self.overrides.overridden(path) {
            Some(origin) => {
                self.warn(
                    variable,
                    format!(
                        "{variable}={value} is not used: {origin} sets {} and wins over LAYA_*",
                        path.join(".")
                    ),
                );
                true
            }
            None => false,
        }
    }
}

/// Applies the upstream variables set in `env` to `config` (already holding defaults < file <
/// `LAYAD_*` < flags), under the precedence in the module docs. Returns what to log and what
/// refuses the configuration.
pub fn apply(
    config: &mut Config,
    env: &dyn Fn(&str) -> Option<String>,
    overrides: &dyn Overrides,
) -> (Vec<Note>, Vec<Problem>) {
    let mut a = Applier {
        config,
        overrides,
        notes: Vec::new(),
        problems: Vec::new(),
    };
    let set = |name: &str| env(name).filter(|v| !v.trim().is_empty());

    listen(&mut a, set("LAYA_HOST"), set("LAYA_PORT"));
    if let Some(value) = set("LAYA_DEVICE") {
        device(&mut a, &value);
    }
    if let Some(value) = set("LAYA_THREADS") {
        threads(&mut a, &value);
    }
    // Before LAYA_MODELS and LAYA_DEFAULT_MODEL, which may name the checkpoints it registers.
    if let Some(value) = set("LAYA_EXTRA_MODELS") {
        extra_models(&mut a, &value);
    }
    if let Some(value) = set("LAYA_MODELS") {
        models(&mut a, &value);
    }
    if let Some(value) = set("LAYA_PRELOAD") {
        preload(&mut a, &value);
    }
    if let Some(value) = set("LAYA_AUTO_TASK") {
        let on = env_bool(&value).unwrap_or(false);
        if !a.shadowed("LAYA_AUTO_TASK", &value, &["server", "auto_task"]) {
            a.config.server.auto_task = on;
            a.info(
                "LAYA_AUTO_TASK",
                format!("LAYA_AUTO_TASK={value}: server.auto_task = {on}"),
            );
        }
    }
    if let Some(value) = set("LAYA_LOG_LEVEL") {
        log_level(&mut a, &value);
    }
    if let Some(value) = set("LAYA_DEFAULT_MODEL") {
        default_model(&mut a, &value);
    }
    if let Some(value) = set("LAYA_JEV_STRICT") {
        jev_strict(&mut a, &value);
    }
    if let Some(value) = set("LAYA_TOURNAMENT_GROUP") {
        tournament_group(&mut a, &value);
    }
    if let Some(value) = set("LAYA_MAX_TOKEN_BUDGET") {
        max_token_budget(&mut a, &value);
    }
    if let Some(value) = set("LAYA_BODY_READ_TIMEOUT") {
        body_read_timeout(&mut a, &value);
    }
    if let Some(value) = set("LAYA_MAX_CONCURRENT") {
        max_concurrent(&mut a, &value);
    }
    if let Some(value) = set("LAYA_IDLE_UNLOAD_SECONDS") {
        idle_unload(&mut a, &value);
    }
    if set("LAYA_API_KEY").is_some() {
        // The key itself is read (and never shown) by `load::api_key`.
        a.info(
            "LAYA_API_KEY",
            "LAYA_API_KEY is set: POST /v1/systemone, /v1/systemone/batch and /v1/models require it as a bearer key"
                .into(),
        );
    }
    for (variable, why) in WITHOUT_MEANING {
        if let Some(value) = set(variable) {
            a.warn(variable, format!("{variable}={value} has no effect in layad: {why}"));
        }
    }
    (a.notes, a.problems)
}

/// `LAYA_HOST` / `LAYA_PORT` → `server.listen`. Each replaces its half of the lower layer's
/// address; the other half stays (layad's default host is loopback, upstream's 0.0.0.0: a unit
/// that sets only `LAYA_PORT` keeps layad's safer bind, and says so).
fn listen(a: &mut Applier, host: Option<String>, port: Option<String>) {
    if host.is_none() && port.is_none() {
        return;
    }
    let shown = [("LAYA_HOST", &host), ("LAYA_PORT", &port)]
        .iter()
        .filter_map(|(n, v)| v.as_ref().map(|v| format!("{n}={}", v.trim())))
        .collect::<Vec<_>>()
        .join(" ");
    let mut addr = a.config.server.listen;
    let mut ok = true;
    if let Some(raw) = &port {
        // `_resolve_port`: int after strip, 1–65535, else exit with this text.
        match raw.trim().parse::<u32>() {
            Ok(p @ 1..=65535) => addr.set_port(p as u16),
            _ => {
                ok = false;
                a.problem(
                    "server.listen",
                    "LAYA_PORT",
                    format!("invalid LAYA_PORT {}: must be an integer 1-65535", py_repr_str(raw)),
                );
            }
        }
    }
    if let Some(raw) = &host {
        let text = raw.trim();
        let bare = text.strip_prefix('[').and_then(|t| t.strip_suffix(']')).unwrap_or(text);
        let ip = if bare.eq_ignore_ascii_case("localhost") {
            Some(IpAddr::V4(Ipv4Addr::LOCALHOST))
        } else {
            bare.parse::<IpAddr>().ok()
        };
        match ip {
            Some(ip) => addr.set_ip(ip),
            None => {
                ok = false;
                a.problem(
                    "server.listen",
                    "LAYA_HOST",
                    format!(
                        "{} is not an IP address; layad binds addresses, not host names (\"0.0.0.0\", \"127.0.0.1\", \"::\")",
                        py_repr_str(raw)
                    ),
                );
            }
        }
    }
    if !ok {
        return;
    }
    let variable = if host.is_some() { "LAYA_HOST" } else { "LAYA_PORT" };
    if a.shadowed(variable, &shown, &["server", "listen"]) {
        return;
    }
    a.config.server.listen = addr;
    let note = if host.is_none() && !addr.ip().is_unspecified() {
        format!(
            "{shown}: server.listen = {addr} (layad binds {} unless LAYA_HOST or server.listen says otherwise; upstream's default was 0.0.0.0)",
            addr.ip()
        )
    } else {
        format!("{shown}: server.listen = {addr}")
    };
    a.info(variable, note);
}

/// `LAYA_DEVICE` → every `gpu` pool's `device` (torch's device strings: `cpu`, `cuda[:N]`, `mps`).
fn device(a: &mut Applier, value: &str) {
    let text = value.trim().to_ascii_lowercase();
    let (kind, index) = text
        .split_once(':')
        .map_or((text.as_str(), None), |(k, i)| (k, Some(i)));
    let device = match kind {
        "cpu" => Device::Cpu,
        "cuda" => Device::Cuda,
        "mps" => Device::Metal,
        "auto" => Device::Auto,
        _ => {
            a.problem(
                "pool.device",
                "LAYA_DEVICE",
                format!(
                    "{}: layad's workers run on \"cpu\", \"cuda\" or \"mps\" (Metal); set pool.device for anything else",
                    py_repr_str(value)
                ),
            );
            return;
        }
    };
    if index.is_some_and(|i| i != "0") {
        a.warn(
            "LAYA_DEVICE",
            format!(
                "LAYA_DEVICE={value}: layad's CUDA pools use the first visible GPU; select it with CUDA_VISIBLE_DEVICES"
            ),
        );
    }
    let mut applied = Vec::new();
    for i in 0..a.config.pools.len() {
        if a.config.pools[i].worker != WorkerKind::Gpu {
            continue;
        }
        let index = i.to_string();
        if a.shadowed("LAYA_DEVICE", value, &["pool", &index, "device"]) {
            continue;
        }
        a.config.pools[i].device = device;
        applied.push(a.config.pools[i].name.clone());
    }
    if !applied.is_empty() {
        a.info(
            "LAYA_DEVICE",
            format!(
                "LAYA_DEVICE={value}: device = \"{}\" in pool(s) {}",
                device.as_str(),
                applied.join(", ")
            ),
        );
    }
}

/// `LAYA_THREADS` → every `gpu` pool's `threads`; upstream ignores a value that is not an
/// integer > 0, and so does layad (with a warning).
fn threads(a: &mut Applier, value: &str) {
    let Some(n) = value.trim().parse::<u32>().ok().filter(|n| *n > 0) else {
        a.warn(
            "LAYA_THREADS",
            format!("LAYA_THREADS={value} is ignored (upstream too): give an integer > 0"),
        );
        return;
    };
    let mut applied = Vec::new();
    for i in 0..a.config.pools.len() {
        if a.config.pools[i].worker != WorkerKind::Gpu {
            continue;
        }
        let index = i.to_string();
        if a.shadowed("LAYA_THREADS", value, &["pool", &index, "threads"]) {
            continue;
        }
        a.config.pools[i].threads = n;
        applied.push(a.config.pools[i].name.clone());
    }
    if !applied.is_empty() {
        a.info(
            "LAYA_THREADS",
            format!(
                "LAYA_THREADS={value}: threads = {n} per worker in pool(s) {}",
                applied.join(", ")
            ),
        );
    }
}

/// `LAYA_MODELS` → which checkpoints load at start: the listed ones (names or aliases) load and warm
/// before serving; every other served checkpoint is served as upstream serves it, loaded on its
/// first request: it moves to a pool of its own that starts unloaded (`start_unloaded`, a copy of
/// the pool that served it, named `<pool>-<checkpoint>`), which that request starts and waits for.
/// A listed checkpoint that the lower layers turned "off" is served again (upstream serves what it
/// lists); one they turned "off" and that is not listed stays off (refused, 501). An unknown name
/// refuses to start, as upstream's preload raises.
fn models(a: &mut Applier, value: &str) {
    let mut listed = Vec::new();
    let registered = a.config.checkpoints.registered();
    let extra_names: Vec<CheckpointName> = registered.iter().map(|(n, _)| *n).collect();
    for name in value.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        let extra = || CheckpointName::register(name).ok().filter(|n| extra_names.contains(n));
        match CheckpointName::from_name_or_alias(name).or_else(extra) {
            Some(c) => {
                if !listed.contains(&c) {
                    listed.push(c);
                }
            }
            None => {
                a.problem("checkpoints", "LAYA_MODELS", unknown_model_name(name));
                return;
            }
        }
    }
    if listed.is_empty() {
        return;
    }
    for name in CheckpointName::ALL {
        if !listed.contains(&name) || a.shadowed("LAYA_MODELS", value, &["checkpoints", name.as_str()]) {
            continue;
        }
        if let Some(source) = a.config.checkpoints.source_mut(name)
            && *source == CheckpointSource::Off
        {
            *source = CheckpointSource::HfCache;
        }
    }
    // Each pool keeps the listed checkpoints it served; each unlisted one it served goes to a copy
    // of it that starts unloaded (a pool serving only unlisted ones starts unloaded itself).
    let served: Vec<CheckpointName> = a.config.served_checkpoints().into_iter().map(|(n, _)| n).collect();
    let mut on_demand = Vec::new();
    let mut pools = Vec::new();
    for (i, pool) in a.config.pools.clone().into_iter().enumerate() {
        let serves = a.config.pool_checkpoints(&pool);
        let (eager, lazy): (Vec<CheckpointName>, Vec<CheckpointName>) = serves
            .into_iter()
            .filter(|c| served.contains(c))
            .partition(|c| listed.contains(c));
        if lazy.is_empty() || a.shadowed("LAYA_MODELS", value, &["pool", &i.to_string(), "checkpoints"]) {
            pools.push(pool);
            continue;
        }
        if eager.is_empty() {
            on_demand.push(format!("{} (pool {})", names(&lazy), pool.name));
            pools.push(PoolConfig {
                start_unloaded: true,
                ..pool
            });
            continue;
        }
        pools.push(PoolConfig {
            checkpoints: Some(eager),
            ..pool.clone()
        });
        for checkpoint in &lazy {
            let name = format!("{}-{}", pool.name, checkpoint.as_str().replace('.', "-"));
            on_demand.push(format!("{} (pool {name})", checkpoint.as_str()));
            pools.push(PoolConfig {
                name,
                checkpoints: Some(vec![*checkpoint]),
                start_unloaded: true,
                ..pool.clone()
            });
        }
    }
    a.config.pools = pools;
    let mut message = format!("LAYA_MODELS={value}: {} load at start", names(&listed));
    if !on_demand.is_empty() {
        message.push_str(&format!(
            "; {} load on their first request, as upstream loads an unlisted checkpoint",
            on_demand.join(", ")
        ));
    }
    a.info("LAYA_MODELS", message);
}

/// `LAYA_PRELOAD` (default on): off, upstream loads every checkpoint on its first request, so every
/// pool starts unloaded (`start_unloaded`); on, nothing changes (layad loads before serving).
fn preload(a: &mut Applier, value: &str) {
    if env_bool(value).unwrap_or(true) {
        a.info(
            "LAYA_PRELOAD",
            format!("LAYA_PRELOAD={value}: the checkpoints load and warm before serving (layad's default)"),
        );
        return;
    }
    let mut applied = Vec::new();
    for i in 0..a.config.pools.len() {
        if a.shadowed("LAYA_PRELOAD", value, &["pool", &i.to_string(), "start_unloaded"]) {
            continue;
        }
        a.config.pools[i].start_unloaded = true;
        applied.push(a.config.pools[i].name.clone());
    }
    if !applied.is_empty() {
        a.info(
            "LAYA_PRELOAD",
            format!(
                "LAYA_PRELOAD={value}: start_unloaded = true in pool(s) {}: each loads on its first request, as upstream does",
                applied.join(", ")
            ),
        );
    }
}

/// Checkpoint names joined with ", ".
fn names(checkpoints: &[CheckpointName]) -> String {
    checkpoints.iter().map(|c| c.as_str()).collect::<Vec<_>>().join(", ")
}

/// `LAYA_EXTRA_MODELS` (a JSON object `{name: source}`, a source being a directory, a Hub repo id,
/// or a `[repo, subfolder]` pair) → `[checkpoints.extra]`, entry by entry over the file's. A value
/// that is not such an object, or a name upstream's `Router._add` refuses, refuses to start, as
/// upstream exits: a checkpoint silently missing would answer its requests with another one.
fn extra_models(a: &mut Applier, value: &str) {
    let refuse = |a: &mut Applier, message: String| {
        a.problem(
            "checkpoints.extra",
            "LAYA_EXTRA_MODELS",
            format!("invalid LAYA_EXTRA_MODELS: {message}"),
        );
    };
    let parsed: serde_json::Value = match serde_json::from_str(value.trim()) {
        Ok(parsed) => parsed,
        Err(error) => return refuse(a, format!("not a JSON object ({error})")),
    };
    let serde_json::Value::Object(entries) = parsed else {
        let kind = match parsed {
            serde_json::Value::Array(_) => "list",
            serde_json::Value::String(_) => "str",
            serde_json::Value::Number(ref n) if n.is_f64() => "float",
            serde_json::Value::Number(_) => "int",
            serde_json::Value::Bool(_) => "bool",
            _ => "NoneType",
        };
        return refuse(a, format!("a JSON object {{name: source}}, got {kind}"));
    };
    let mut applied = Vec::new();
    for (raw, source) in entries {
        let source = match source {
            serde_json::Value::String(s) if !s.trim().is_empty() => ExtraSource {
                source: s,
                subfolder: None,
            },
            serde_json::Value::Array(items) if !items.is_empty() && items.len() <= 2 && items[0].is_string() => {
                ExtraSource {
                    source: items[0].as_str().unwrap_or_default().to_owned(),
                    subfolder: items
                        .get(1)
                        .and_then(|s| s.as_str())
                        .filter(|s| !s.is_empty())
                        .map(str::to_owned),
                }
            }
            other => {
                let kind = if other.is_array() {
                    "a list that is not [repo, subfolder]"
                } else {
                    "not a string"
                };
                return refuse(
                    a,
                    format!(
                        "source for {} must be a repo id, a local path, or a [repo, subfolder] pair; got {kind}",
                        py_repr_str(&raw)
                    ),
                );
            }
        };
        let name = match CheckpointName::register(&raw) {
            Ok(name) => name,
            Err(why) => return refuse(a, why),
        };
        if a.shadowed("LAYA_EXTRA_MODELS", value, &["checkpoints", "extra", &raw]) {
            continue;
        }
        // One entry per canonical name: the variable's replaces the file's, however spelt.
        a.config
            .checkpoints
            .extra
            .retain(|key, _| CheckpointName::register(key).ok() != Some(name));
        applied.push(format!("{} = {}", name.as_str(), source.repo_string()));
        a.config.checkpoints.extra.insert(name.as_str().to_owned(), source);
    }
    if !applied.is_empty() {
        a.info(
            "LAYA_EXTRA_MODELS",
            format!("LAYA_EXTRA_MODELS: [checkpoints.extra] {}", applied.join(", ")),
        );
    }
}

/// `LAYA_IDLE_UNLOAD_SECONDS` (seconds, may be fractional) → every pool's `idle_unload`. As
/// upstream: not a finite number is warned about and leaves idle unload off; zero or less is off.
fn idle_unload(a: &mut Applier, value: &str) {
    let seconds = match value.trim().parse::<f64>() {
        Ok(s) if s.is_finite() => s.max(0.0),
        _ => {
            a.warn(
                "LAYA_IDLE_UNLOAD_SECONDS",
                format!(
                    "invalid LAYA_IDLE_UNLOAD_SECONDS {}; idle unload disabled",
                    py_repr_str(value)
                ),
            );
            0.0
        }
    };
    let window = Duration::from_secs_f64(seconds.min(1e9));
    let mut applied = Vec::new();
    for i in 0..a.config.pools.len() {
        let index = i.to_string();
        if a.shadowed("LAYA_IDLE_UNLOAD_SECONDS", value, &["pool", &index, "idle_unload"]) {
            continue;
        }
        a.config.pools[i].idle_unload = window;
        applied.push(a.config.pools[i].name.clone());
    }
    if !applied.is_empty() {
        a.info(
            "LAYA_IDLE_UNLOAD_SECONDS",
            format!(
                "LAYA_IDLE_UNLOAD_SECONDS={value}: idle_unload = {} in pool(s) {}",
                crate::duration::format(window),
                applied.join(", ")
            ),
        );
    }
}

/// `LAYA_LOG_LEVEL` (uvicorn's levels) → `logging.filter`.
fn log_level(a: &mut Applier, value: &str) {
    let level = value.trim().to_ascii_lowercase();
    let filter = match level.as_str() {
        "critical" | "error" => "error",
        "warning" => "warn",
        "info" => "info",
        "debug" => "debug",
        "trace" => "trace",
        _ => {
            a.problem(
                "logging.filter",
                "LAYA_LOG_LEVEL",
                format!(
                    "invalid LAYA_LOG_LEVEL {}: must be one of critical, debug, error, info, trace, warning",
                    py_repr_str(value.trim())
                ),
            );
            return;
        }
    };
    if !a.shadowed("LAYA_LOG_LEVEL", value, &["logging", "filter"]) {
        a.config.logging.filter = filter.to_owned();
        a.info(
            "LAYA_LOG_LEVEL",
            format!("LAYA_LOG_LEVEL={value}: logging.filter = \"{filter}\""),
        );
    }
}

/// `LAYA_DEFAULT_MODEL` → `compat.default_checkpoint`; an unknown name refuses to start.
fn default_model(a: &mut Applier, value: &str) {
    // A registered name is a valid default once registered (upstream: `canonical_name(raw) in
    // extra_models`); the refusal still lists only the built-ins, as upstream's does.
    let registered = || {
        CheckpointName::register(value)
            .ok()
            .filter(|n| a.config.checkpoints.registered().iter().any(|(r, _)| r == n))
    };
    let Some(name) = CheckpointName::from_name_or_alias(value).or_else(registered) else {
        a.problem(
            "compat.default_checkpoint",
            "LAYA_DEFAULT_MODEL",
            format!(
                "invalid LAYA_DEFAULT_MODEL {}: {}",
                py_repr_str(value.trim()),
                unknown_model_name(value)
            ),
        );
        return;
    };
    if !a.shadowed("LAYA_DEFAULT_MODEL", value, &["compat", "default_checkpoint"]) {
        a.config.compat.default_checkpoint = Some(name);
        a.info(
            "LAYA_DEFAULT_MODEL",
            format!(
                "LAYA_DEFAULT_MODEL={value}: compat.default_checkpoint = \"{}\"",
                name.as_str()
            ),
        );
    }
}

/// `LAYA_JEV_STRICT` → `compat.output` (0.4.15 only: 0.3.20 has no strict projection and ignores it).
fn jev_strict(a: &mut Applier, value: &str) {
    let on = env_bool(value).unwrap_or(false);
    if !a.config.compat.upstream.differences().jev_profiles {
        a.warn(
            "LAYA_JEV_STRICT",
            format!(
                "LAYA_JEV_STRICT={value} has no effect: compat.upstream = \"0.3.20\", which has no strict projection"
            ),
        );
        return;
    }
    let output = if on {
        OutputProfile::JevStrict
    } else {
        OutputProfile::Laya
    };
    if !a.shadowed("LAYA_JEV_STRICT", value, &["compat", "output"]) {
        a.config.compat.output = output;
        a.info(
            "LAYA_JEV_STRICT",
            format!("LAYA_JEV_STRICT={value}: compat.output = \"{output}\""),
        );
    }
}

/// `LAYA_TOURNAMENT_GROUP` → `compat.tournament_group`: 2–100, anything else is off (upstream's
/// `_resolve_tournament_group`).
fn tournament_group(a: &mut Applier, value: &str) {
    let group = value.trim().parse::<u32>().ok().filter(|n| (2..=100).contains(n));
    if group.is_none() {
        a.warn(
            "LAYA_TOURNAMENT_GROUP",
            format!(
                "LAYA_TOURNAMENT_GROUP={value} leaves tournament mode off (upstream too): give an integer from 2 to 100"
            ),
        );
    }
    if !a.shadowed("LAYA_TOURNAMENT_GROUP", value, &["compat", "tournament_group"]) {
        a.config.compat.tournament_group = group.unwrap_or(0);
        if let Some(group) = group {
            a.info(
                "LAYA_TOURNAMENT_GROUP",
                format!("LAYA_TOURNAMENT_GROUP={value}: compat.tournament_group = {group}"),
            );
        }
    }
}

/// `LAYA_MAX_TOKEN_BUDGET` → `compat.max_token_budget`; not an integer > 0 → ignored (upstream
/// falls back to 8192); above the 8192 positions a worker prepares → 8192.
fn max_token_budget(a: &mut Applier, value: &str) {
    let most = laya::request::DEFAULT_MAX_TOKEN_BUDGET;
    let Some(n) = value.trim().parse::<usize>().ok().filter(|n| *n > 0) else {
        a.warn(
            "LAYA_MAX_TOKEN_BUDGET",
            format!("LAYA_MAX_TOKEN_BUDGET={value} is ignored (upstream falls back to {most}): give an integer > 0"),
        );
        return;
    };
    if a.shadowed("LAYA_MAX_TOKEN_BUDGET", value, &["compat", "max_token_budget"]) {
        return;
    }
    if n > most {
        a.warn(
            "LAYA_MAX_TOKEN_BUDGET",
            format!("LAYA_MAX_TOKEN_BUDGET={value}: layad's workers hold rows of at most {most} tokens; compat.max_token_budget = {most}"),
        );
    } else {
        a.info(
            "LAYA_MAX_TOKEN_BUDGET",
            format!("LAYA_MAX_TOKEN_BUDGET={value}: compat.max_token_budget = {n}"),
        );
    }
    a.config.compat.max_token_budget = n.min(most);
}

/// `LAYA_BODY_READ_TIMEOUT` (seconds, a float) → `server.body_timeout`.
fn body_read_timeout(a: &mut Applier, value: &str) {
    let Some(seconds) = value.trim().parse::<f64>().ok().filter(|s| *s > 0.0 && s.is_finite()) else {
        a.warn(
            "LAYA_BODY_READ_TIMEOUT",
            format!("LAYA_BODY_READ_TIMEOUT={value} is ignored (upstream falls back to 10): give seconds > 0"),
        );
        return;
    };
    let Ok(timeout) = Duration::try_from_secs_f64(seconds) else {
        a.warn(
            "LAYA_BODY_READ_TIMEOUT",
            format!("LAYA_BODY_READ_TIMEOUT={value} is ignored: too long"),
        );
        return;
    };
    if !a.shadowed("LAYA_BODY_READ_TIMEOUT", value, &["server", "body_timeout"]) {
        a.config.server.body_timeout = timeout;
        a.info(
            "LAYA_BODY_READ_TIMEOUT",
            format!(
                "LAYA_BODY_READ_TIMEOUT={value}: server.body_timeout = {}",
                crate::duration::format(timeout)
            ),
        );
    }
}

/// `LAYA_MAX_CONCURRENT` → `server.max_concurrent`: at most N decision requests in progress,
/// more answered 503 at once, as upstream's admission cap does.
fn max_concurrent(a: &mut Applier, value: &str) {
    let Some(n) = value.trim().parse::<u32>().ok().filter(|n| *n > 0) else {
        a.warn(
            "LAYA_MAX_CONCURRENT",
            format!("LAYA_MAX_CONCURRENT={value} is ignored (upstream falls back to 16): give an integer > 0"),
        );
        return;
    };
    if !a.shadowed("LAYA_MAX_CONCURRENT", value, &["server", "max_concurrent"]) {
        a.config.server.max_concurrent = Some(n);
        a.info(
            "LAYA_MAX_CONCURRENT",
            format!("LAYA_MAX_CONCURRENT={value}: server.max_concurrent = {n}"),
        );
    }
}

/// The notes a configuration gets regardless of the environment: a tournament group that is set
/// (from the file or `LAYA_*`/`LAYAD_*`) under `compat.upstream = "0.3.20"`, whose server has no
/// tournament mode, so the group changes nothing there.
pub fn config_notes(config: &Config) -> Vec<Note> {
    let mut notes = Vec::new();
    if config.compat.tournament_group != 0 && !config.compat.upstream.differences().tournaments {
        notes.push(Note {
            variable: "LAYA_TOURNAMENT_GROUP",
            level: NoteLevel::Warn,
            message: format!(
                "compat.tournament_group = {} has no effect with compat.upstream = \"{}\": upstream 0.3.20 has no \
                 tournament mode, so a choice with more than {} options is still refused",
                config.compat.tournament_group,
                config.compat.upstream,
                laya::request::MAX_CHOICE_OPTIONS
            ),
        });
    }
    notes
}
