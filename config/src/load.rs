//! Loading: embedded defaults < TOML file < `LAYAD_*` environment < command-line flags (figment),
//! then upstream's `LAYA_*` variables applied under `LAYAD_*` and flags (`upstream_env`),
//! cross-key validation, relative paths, and the API key; every problem names key and origin.
//!
//! The environment is passed in rather than read here, so tests need not touch the process's.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use figment::providers::{Format, Toml};
use figment::value::{Dict, Map, Tag, Value};
use figment::{Figment, Metadata, Profile, Provider, Source};
use laya::routing::CheckpointName;

use crate::error::{ConfigError, Problem};
use crate::schema::{AneExecutor, ApiKey, CheckpointSource, Config, Device, Dtype, WorkerKind};
use crate::upstream_env::{self, Note, Overrides};

/// Prefix of the environment variables that override keys.
pub const ENV_PREFIX: &str = "LAYAD_";
/// Separator between nested keys in an environment variable name (`LAYAD_SERVER__LISTEN`).
pub const ENV_SEPARATOR: &str = "__";
/// The variable that names the config file (read by the CLI, not a key).
pub const CONFIG_FILE_VAR: &str = "LAYAD_CONFIG";
/// Upstream's API key variable, honoured as upstream does (set and non-empty = required).
pub const API_KEY_VAR: &str = "LAYA_API_KEY";

/// Where the configuration comes from, lowest precedence first after the embedded defaults.
#[derive(Clone, Debug, Default)]
pub struct Sources {
    /// The TOML file (`--config` / `LAYAD_CONFIG`); none = defaults and environment only.
    pub file: Option<PathBuf>,
    /// The environment, as `(name, value)` pairs; only `LAYAD_*` and upstream's `LAYA_*` are read.
    pub env: Vec<(String, String)>,
    /// Command-line flags, which override everything else.
    pub flags: Flags,
}

impl Sources {
    /// The process's own environment (variables that are not valid UTF-8 are skipped).
    pub fn with_process_env(file: Option<PathBuf>, flags: Flags) -> Self {
        let env = std::env::vars_os()
            .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
            .collect();
        Self { file, env, flags }
    }

    pub(crate) fn var(&self, name: &str) -> Option<&str> {
        self.env.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }
}

/// Keys that have their own command-line flag.
#[derive(Clone, Debug, Default)]
pub struct Flags {
    /// `--listen`: `server.listen`.
    pub listen: Option<SocketAddr>,
}

/// One configuration layer with a human name for error messages.
struct Layer {
    name: &'static str,
    data: Dict,
    key_name: fn(&[&str]) -> String,
}

impl Provider for Layer {
    fn metadata(&self) -> Metadata {
        let key_name = self.key_name;
        Metadata::named(self.name).interpolater(move |_: &Profile, keys: &[&str]| key_name(keys))
    }

    fn data(&self) -> figment::Result<Map<Profile, Dict>> {
        Ok(Profile::Default.collect(self.data.clone()))
    }
}

const DEFAULTS_NAME: &str = "built-in defaults";
const ENV_NAME: &str = "environment variable";
const FLAG_NAME: &str = "flag";

fn defaults_layer() -> Result<Layer, ConfigError> {
    let data = Value::serialize(Config::default())
        .ok()
        .and_then(Value::into_dict)
        .ok_or_else(|| {
            // Unreachable unless the schema stops serializing to a table; say so rather than panic.
            invalid("", DEFAULTS_NAME, "the built-in defaults do not serialize to a table")
        })?;
    Ok(Layer {
        name: DEFAULTS_NAME,
        data,
        key_name: |keys| keys.join("."),
    })
}

/// `LAYAD_SERVER__LISTEN=…` → `server.listen`. Values are read like figment's `Env` provider
/// (`true`, numbers, `[a, b]` arrays and `{k = v}` tables are typed; anything else is a string).
fn env_layer(sources: &Sources) -> Layer {
    let mut data = Dict::new();
    for (name, value) in &sources.env {
        let Some(rest) = name.strip_prefix(ENV_PREFIX) else {
            continue;
        };
        if name == CONFIG_FILE_VAR || rest.is_empty() {
            continue;
        }
        let mut key = rest.to_ascii_lowercase().replace(ENV_SEPARATOR, ".");
        // A variable name cannot hold `-`, so `TYPED_DECISIONS` stands for `typed-decisions`.
        if key == "checkpoints.typed_decisions" {
            key = "checkpoints.typed-decisions".to_owned();
        }
        let parsed: Value = match value.parse() {
            Ok(v) => v,
            Err(never) => match never {},
        };
        if let Some(nested) = figment::util::nest(&key, parsed).into_dict() {
            data = merge_dicts(data, nested);
        }
    }
    Layer {
        name: ENV_NAME,
        data,
        // A variable cannot address an array element: `pool[1].workers` came from `LAYAD_POOL`.
        key_name: |keys| {
            format!(
                "{ENV_PREFIX}{}",
                keys.iter()
                    .take_while(|k| k.parse::<usize>().is_err())
                    .map(|k| k.to_ascii_uppercase().replace('-', "_"))
                    .collect::<Vec<_>>()
                    .join(ENV_SEPARATOR)
            )
        },
    }
}

fn merge_dicts(mut into: Dict, from: Dict) -> Dict {
    for (key, value) in from {
        let merged = match (into.remove(&key), value) {
            (Some(Value::Dict(_, a)), Value::Dict(tag, b)) => Value::Dict(tag, merge_dicts(a, b)),
            (_, value) => value,
        };
        into.insert(key, merged);
    }
    into
}

fn flags_layer(flags: &Flags) -> Layer {
    let mut data = Dict::new();
    if let Some(listen) = flags.listen
        && let Some(server) = figment::util::nest("server.listen", Value::from(listen.to_string())).into_dict()
    {
        data = merge_dicts(data, server);
    }
    Layer {
        name: FLAG_NAME,
        data,
        key_name: |keys| match keys {
            ["server", "listen"] => "--listen".to_owned(),
            other => other.join("."),
        },
    }
}

fn invalid(key: &str, origin: &str, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid(vec![Problem {
        key: key.to_owned(),
        origin: origin.to_owned(),
        message: message.into(),
    }])
}

impl Config {
    /// Loads and checks the configuration from `sources` (see the crate docs for the order).
    pub fn load(sources: &Sources) -> Result<Config, ConfigError> {
        Self::load_with_notes(sources).map(|(config, _)| config)
    }

    /// [`Config::load`], plus what was made of upstream's `LAYA_*` variables (and settings that
    /// have no effect under the chosen upstream release), for the start-up log.
    pub fn load_with_notes(sources: &Sources) -> Result<(Config, Vec<Note>), ConfigError> {
        let mut figment = Figment::from(defaults_layer()?);
        if let Some(path) = &sources.file {
            // figment skips a missing file silently; a file the user named must exist.
            std::fs::metadata(path).map_err(|source| ConfigError::Unreadable {
                path: path.clone(),
                source,
            })?;
            figment = figment.merge(Toml::file_exact(path));
        }
        let figment = figment.merge(env_layer(sources)).merge(flags_layer(&sources.flags));
        let mut config: Config = figment
            .extract()
            .map_err(|e| ConfigError::Invalid(describe_figment_error(&figment, e)))?;
        let origins = Origins { figment: &figment };
        let var = |name: &str| sources.var(name).map(str::to_owned);
        let (mut notes, mut problems) = upstream_env::apply(&mut config, &var, &origins);
        problems.extend(validate(&config, &origins));
        resolve_relative_paths(&mut config, &origins);
        match api_key(&config, sources, &origins) {
            Ok(key) => config.api_key = key,
            Err(problem) => problems.push(problem),
        }
        notes.extend(upstream_env::config_notes(&config));
        if problems.is_empty() {
            Ok((config, notes))
        } else {
            Err(ConfigError::Invalid(problems))
        }
    }
}

/// Finds where the value at a key came from.
struct Origins<'a> {
    figment: &'a Figment,
}

impl Origins<'_> {
    /// The merged value at `path` (dict keys and array positions), if present.
    fn value(&self, path: &[&str]) -> Option<Value> {
        let mut value = Value::from(self.figment.data().ok()?.remove(&Profile::Default)?);
        for segment in path {
            value = match value {
                Value::Dict(_, mut dict) => dict.remove(*segment)?,
                Value::Array(_, mut items) => {
                    let index: usize = segment.parse().ok()?;
                    (index < items.len()).then(|| items.swap_remove(index))?
                }
                _ => return None,
            };
        }
        Some(value)
    }

    /// The metadata of the provider that set `path`, or of its nearest present parent.
    fn metadata(&self, path: &[&str]) -> Option<&Metadata> {
        (0..=path.len())
            .rev()
            .find_map(|len| self.value(&path[..len]))
            .and_then(|v| self.tag_metadata(v.tag()))
    }

    fn tag_metadata(&self, tag: Tag) -> Option<&Metadata> {
        self.figment.get_metadata(tag)
    }

    /// Human-readable origin of `path`: a file, `environment variable LAYAD_…`, `flag --listen`.
    fn describe(&self, path: &[&str]) -> String {
        self.metadata(path)
            .map_or_else(|| DEFAULTS_NAME.to_owned(), |md| describe_metadata(md, path))
    }

    /// The config file `path` came from, if it came from a file.
    fn file(&self, path: &[&str]) -> Option<PathBuf> {
        match &self.metadata(path)?.source {
            Some(Source::File(file)) => Some(file.clone()),
            _ => None,
        }
    }
}

impl Overrides for Origins<'_> {
    fn overridden(&self, path: &[&str]) -> Option<String> {
        let md = self.tag_metadata(self.value(path)?.tag())?;
        (md.name == ENV_NAME || md.name == FLAG_NAME).then(|| describe_metadata(md, path))
    }
}

fn describe_metadata(md: &Metadata, path: &[&str]) -> String {
    match (&md.source, md.name.as_ref()) {
        (Some(Source::File(file)), _) => file.display().to_string(),
        (_, DEFAULTS_NAME) => DEFAULTS_NAME.to_owned(),
        (_, name) => format!("{name} {}", md.interpolate(&Profile::Default, path)),
    }
}

/// `["pool", "1", "workers"]` → `pool[1].workers`.
fn dotted(path: &[&str]) -> String {
    let mut key = String::new();
    for segment in path {
        if segment.parse::<usize>().is_ok() {
            key.push_str(&format!("[{segment}]"));
        } else {
            if !key.is_empty() {
                key.push('.');
            }
            key.push_str(segment);
        }
    }
    key
}

fn describe_figment_error(figment: &Figment, error: figment::Error) -> Vec<Problem> {
    let origins = Origins { figment };
    error
        .into_iter()
        .map(|e| {
            let mut path: Vec<&str> = e.path.iter().map(String::as_str).collect();
            let message = match &e.kind {
                // figment's path already ends with the unknown key, but not with a missing one.
                figment::error::Kind::UnknownField(_, expected) => {
                    format!("unknown key; expected one of: {}", expected.join(", "))
                }
                figment::error::Kind::MissingField(field) => {
                    path.push(field);
                    "missing; this key is required".to_owned()
                }
                kind => kind.to_string(),
            };
            // The error's own metadata is the provider of the enclosing table, which for an
            // unknown key is often the defaults; the value itself knows its provider.
            let origin = match origins.value(&path).and_then(|v| origins.tag_metadata(v.tag())) {
                Some(md) => describe_metadata(md, &path),
                None => e
                    .metadata
                    .as_ref()
                    .map_or_else(|| DEFAULTS_NAME.to_owned(), |md| describe_metadata(md, &path)),
            };
            Problem {
                key: dotted(&path),
                origin,
                message,
            }
        })
        .collect()
}

/// Checks that involve more than one key, or ranges serde cannot express.
fn validate(config: &Config, origins: &Origins) -> Vec<Problem> {
    let mut problems = Vec::new();
    let mut report = |path: &[&str], message: String| {
        problems.push(Problem {
            key: dotted(path),
            origin: origins.describe(path),
            message,
        })
    };
    let server = &config.server;
    if server.max_body_bytes == 0 {
        report(&["server", "max_body_bytes"], "must be at least 1".into());
    }
    if server.max_concurrent == Some(0) {
        report(
            &["server", "max_concurrent"],
            "must be at least 1 (leave it out for no cap)".into(),
        );
    }
    if server.max_connections == 0 {
        report(&["server", "max_connections"], "must be at least 1".into());
    }
    if server.max_connections_per_client == 0 {
        report(&["server", "max_connections_per_client"], "must be at least 1".into());
    }
    for (key, value) in [
        ("body_timeout", server.body_timeout),
        ("request_timeout", server.request_timeout),
    ] {
        if value.is_zero() {
            report(&["server", key], "must be longer than 0s".into());
        }
    }
    for (i, host) in server.allowed_hosts.iter().enumerate() {
        if host.is_empty() || host.contains(|c: char| c.is_whitespace() || c == '/' || c == ',') {
            report(
                &["server", "allowed_hosts", &i.to_string()],
                format!(
                    "{host:?} is not a host name (write it as it appears in a Host header, e.g. \"layad.internal\")"
                ),
            );
        }
    }
    let budget = config.compat.max_token_budget;
    if !(1..=laya::request::DEFAULT_MAX_TOKEN_BUDGET).contains(&budget) {
        report(
            &["compat", "max_token_budget"],
            format!(
                "must be between 1 and {} (the positions a worker prepares), not {budget}",
                laya::request::DEFAULT_MAX_TOKEN_BUDGET
            ),
        );
    }

    let group = config.compat.tournament_group;
    if group != 0 && !(2..=100).contains(&group) {
        report(
            &["compat", "tournament_group"],
            format!("{group}: 0 (off) or a group size from 2 to 100, as upstream's LAYA_TOURNAMENT_GROUP"),
        );
    }
    let output = config.compat.output;
    if output != laya::output::OutputProfile::Laya && !config.compat.upstream.differences().jev_profiles {
        report(
            &["compat", "output"],
            format!(
                "\"{output}\" builds on upstream 0.4.15's LAYA_JEV_STRICT projection; 0.3.20 has none (use compat.upstream = \"0.4.15\")"
            ),
        );
    }

    let mut canonical: Vec<(CheckpointName, &str)> = Vec::new();
    for raw in config.checkpoints.extra.keys() {
        match CheckpointName::register(raw) {
            Err(why) => report(&["checkpoints", "extra", raw], why),
            Ok(name) => match canonical.iter().find(|(n, _)| *n == name) {
                Some((_, other)) => report(
                    &["checkpoints", "extra", raw],
                    format!("names the same checkpoint as {other:?} ({:?}); keep one", name.as_str()),
                ),
                None => canonical.push((name, raw)),
            },
        }
    }
    let registered: Vec<CheckpointName> = canonical.iter().map(|(n, _)| *n).collect();
    let mut alias_keys: Vec<(String, &str)> = Vec::new();
    for (alias, target) in &config.checkpoints.aliases {
        let path = ["checkpoints", "aliases", alias.as_str()];
        match laya::routing::check_alias(alias, &registered) {
            Err(why) => report(&path, why.to_string()),
            Ok(key) => {
                if let Some((_, other)) = alias_keys.iter().find(|(k, _)| *k == key) {
                    report(
                        &path,
                        format!("is the same alias as {other:?} (names are trimmed and lower-cased); keep one"),
                    );
                }
                alias_keys.push((key, alias.as_str()));
            }
        }
        let known = CheckpointName::from_name_or_alias(target)
            .or_else(|| CheckpointName::register(target).ok().filter(|t| registered.contains(t)));
        if known.is_none() {
            report(
                &path,
                format!(
                    "{target:?} is no checkpoint: name a built-in (\"english\", \"multilingual\", \"typed-decisions\" or one of upstream's aliases of them) or a [checkpoints.extra] entry"
                ),
            );
        }
    }
    let served = config.served_checkpoints();
    let is_served = |name: &CheckpointName| served.iter().any(|(n, _)| n == name);
    if let Some(default) = config.compat.default_checkpoint
        && !default.is_builtin()
        && !is_served(&default)
    {
        report(
            &["compat", "default_checkpoint"],
            format!(
                "{:?} is no built-in checkpoint and no [checkpoints.extra] entry",
                default.as_str()
            ),
        );
    }
    if served.is_empty() {
        report(
            &["checkpoints"],
            "every checkpoint is \"off\"; serve at least one".into(),
        );
    }
    if config.pools.is_empty() {
        report(&["pool"], "no [[pool]]; at least one pool is needed".into());
    }
    let mut names: Vec<&str> = Vec::new();
    for (i, pool) in config.pools.iter().enumerate() {
        let index = i.to_string();
        let key = |k: &'static str| [String::from("pool"), index.clone(), k.to_owned()];
        let mut report_pool = |k: &'static str, message: String| {
            let path = key(k);
            let path: Vec<&str> = path.iter().map(String::as_str).collect();
            report(&path, message);
        };
        if pool.name.is_empty()
            || !pool
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            report_pool(
                "name",
                format!(
                    "{:?}: use letters, digits, '-' and '_' only (it names sockets and metrics)",
                    pool.name
                ),
            );
        } else if names.contains(&pool.name.as_str()) {
            report_pool(
                "name",
                format!("{:?} is used by an earlier pool; names must be unique", pool.name),
            );
        }
        names.push(&pool.name);
        for (k, value) in [
            ("workers", pool.workers),
            ("max_rows", pool.max_rows),
            ("max_batch_tokens", pool.max_batch_tokens),
            ("queue_capacity", pool.queue_capacity),
        ] {
            if value == 0 {
                report_pool(k, "must be at least 1".into());
            }
        }
        if pool.worker == WorkerKind::Ane {
            if pool.device != Device::Auto {
                report_pool(
                    "device",
                    format!(
                        "{:?} does not apply to an \"ane\" pool; leave it \"auto\"",
                        pool.device.as_str()
                    ),
                );
            }
            match (pool.dtype, pool.executor) {
                (Some(Dtype::Int8), _) => report_pool(
                    "dtype",
                    "\"int8\" does not apply to an \"ane\" pool: it is the candle CPU engine's mode (worker = \"gpu\", device = \"cpu\"); the Neural Engine runs f16".into(),
                ),
                (Some(Dtype::Bf16), _) => report_pool(
                    "dtype",
                    "\"bf16\" does not apply to an \"ane\" pool: Core ML runs its graphs in f16; the candle executor takes \"f32\" or \"f16\"".into(),
                ),
                // The worker would refuse it at every start: catch it here, before any worker runs.
                (Some(Dtype::F32), AneExecutor::Coreml) => report_pool(
                    "dtype",
                    "\"f32\" does not apply to an \"ane\" pool with executor \"coreml\": its Core ML graphs compute in f16; leave dtype out (f16), or set executor = \"candle\" to run the graphs in f32 on the CPU".into(),
                ),
                _ => {}
            }
            if pool.artifacts.is_none() {
                report_pool(
                    "artifacts",
                    "missing; an \"ane\" pool needs the directory of its converted Core ML artifacts".into(),
                );
            }
        } else if pool.artifacts.is_some() {
            report_pool("artifacts", "applies only to pools with worker = \"ane\"".into());
        }
        if pool.require_device
            && !(pool.worker == WorkerKind::Gpu && matches!(pool.device, Device::Metal | Device::Cuda))
        {
            report_pool(
                "require_device",
                format!(
                    "applies to \"gpu\" pools with device = \"metal\" or \"cuda\" (the devices a worker can fall back from), not to a {:?} pool on device {:?}",
                    pool.worker.as_str(),
                    pool.device.as_str()
                ),
            );
        }
        if pool.worker == WorkerKind::Gpu
            && pool.dtype == Some(Dtype::Int8)
            && matches!(pool.device, Device::Metal | Device::Cuda)
        {
            report_pool(
                "dtype",
                format!(
                    "\"int8\" runs on the CPU only, not on device {:?}; use device = \"cpu\" (or \"auto\", which int8 runs on the CPU), or f16/bf16 on the GPU",
                    pool.device.as_str()
                ),
            );
        }
        for (k, value) in [("max_questions", pool.max_questions), ("max_tokens", pool.max_tokens)] {
            if value == Some(0) {
                report_pool(k, "must be at least 1".into());
            }
        }
        if pool.buckets.contains(&0) || pool.buckets.windows(2).any(|w| w[0] >= w[1]) {
            report_pool(
                "buckets",
                format!("{:?}: give positive lengths in increasing order", pool.buckets),
            );
        }
        if let Some(list) = &pool.checkpoints {
            if list.is_empty() {
                report_pool(
                    "checkpoints",
                    "empty; leave the key out to serve every checkpoint".into(),
                );
            }
            for (j, name) in list.iter().enumerate() {
                if list[..j].contains(name) {
                    report_pool("checkpoints", format!("{:?} is listed twice", name.as_str()));
                } else if !is_served(name) && name.is_builtin() {
                    report_pool(
                        "checkpoints",
                        format!("{:?} is \"off\" in [checkpoints]", name.as_str()),
                    );
                } else if !is_served(name) {
                    report_pool(
                        "checkpoints",
                        format!(
                            "{:?} is no built-in checkpoint and no [checkpoints.extra] entry",
                            name.as_str()
                        ),
                    );
                }
            }
        }
    }
    if !config.pools.is_empty() {
        for (name, _) in &served {
            let covered = config.pools.iter().any(|p| config.pool_checkpoints(p).contains(name));
            if !covered {
                // Only pools with an explicit `checkpoints` list can leave one out, so blame them.
                report(
                    &["pool"],
                    format!(
                        "{:?} is served (see [checkpoints]) but no [[pool]] lists it in its checkpoints",
                        name.as_str()
                    ),
                );
            }
        }
    }

    let aging = config.scheduling.aging;
    if !(1.0..=1000.0).contains(&aging) {
        report(
            &["scheduling", "aging"],
            format!("{aging}: give a multiple of a request's own service estimate from 1 to 1000"),
        );
    }

    let workers = &config.workers;
    if workers.restart_backoff_initial.is_zero() {
        report(&["workers", "restart_backoff_initial"], "must be longer than 0s".into());
    }
    if workers.restart_backoff_initial > workers.restart_backoff_max {
        report(
            &["workers", "restart_backoff_max"],
            format!(
                "{} is shorter than workers.restart_backoff_initial ({})",
                crate::duration::format(workers.restart_backoff_max),
                crate::duration::format(workers.restart_backoff_initial)
            ),
        );
    }
    if workers.crash_loop_restarts == 0 {
        report(&["workers", "crash_loop_restarts"], "must be at least 1".into());
    }
    for (key, value) in [
        ("crash_loop_window", workers.crash_loop_window),
        ("startup_timeout", workers.startup_timeout),
    ] {
        if value.is_zero() {
            report(&["workers", key], "must be longer than 0s".into());
        }
    }
    if config.logging.filter.trim().is_empty() {
        report(&["logging", "filter"], "empty; use a level such as \"info\"".into());
    }
    problems
}

/// A relative path is relative to the config file it was written in, else to the working directory.
fn resolve_relative_paths(config: &mut Config, origins: &Origins) {
    let cwd = std::env::current_dir().ok();
    let resolve = |path: &mut PathBuf, key: &[&str]| {
        if path.is_absolute() {
            return;
        }
        let base = origins
            .file(key)
            .and_then(|file| file.parent().map(Path::to_path_buf))
            .or_else(|| cwd.clone());
        if let Some(base) = base {
            *path = base.join(&*path);
        }
    };
    for name in CheckpointName::ALL {
        if let Some(CheckpointSource::Directory(dir)) = config.checkpoints.source_mut(name) {
            resolve(dir, &["checkpoints", name.as_str()]);
        }
    }
    if let Some(file) = &mut config.server.api_key_file {
        resolve(file, &["server", "api_key_file"]);
    }
    if let Some(dir) = &mut config.workers.binary_dir {
        resolve(dir, &["workers", "binary_dir"]);
    }
    if let Some(dir) = &mut config.workers.socket_dir {
        resolve(dir, &["workers", "socket_dir"]);
    }
    for (i, pool) in config.pools.iter_mut().enumerate() {
        if let Some(dir) = &mut pool.artifacts {
            resolve(dir, &["pool", &i.to_string(), "artifacts"]);
        }
    }
}

/// `LAYA_API_KEY` (set and non-empty, as upstream) or `server.api_key_file`, never both.
fn api_key(config: &Config, sources: &Sources, origins: &Origins) -> Result<Option<ApiKey>, Problem> {
    let from_env = sources.var(API_KEY_VAR).filter(|v| !v.is_empty());
    let key = ["server", "api_key_file"];
    let problem = |message: String| Problem {
        key: dotted(&key),
        origin: origins.describe(&key),
        message,
    };
    match (&config.server.api_key_file, from_env) {
        (None, None) => Ok(None),
        (None, Some(env)) => Ok(Some(ApiKey::new(env))),
        (Some(_), Some(_)) => Err(problem(format!("{API_KEY_VAR} is also set; give the key one way only"))),
        (Some(file), None) => {
            let text =
                std::fs::read_to_string(file).map_err(|e| problem(format!("cannot read {}: {e}", file.display())))?;
            // Editors add a final newline; a key never ends with one.
            let key = text
                .strip_suffix('\n')
                .map_or(text.as_str(), |k| k.strip_suffix('\r').unwrap_or(k));
            if key.is_empty() {
                return Err(problem(format!("{} is empty", file.display())));
            }
            Ok(Some(ApiKey::new(key)))
        }
    }
}
