//! The configuration's shape: every section and key, its type and its default, as serde structs.
//! `config/README.md` documents each key; `examples/defaults.toml` spells out every default.

use std::collections::BTreeMap;
use std::fmt;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use laya::output::OutputProfile;
use laya::routing::CheckpointName;
use laya::upstream::Upstream;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::duration;

/// The whole configuration of one `layad` process.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// `[server]`: the HTTP front.
    pub server: ServerConfig,
    /// `[checkpoints]`: which checkpoints are served and where their files are.
    pub checkpoints: CheckpointsConfig,
    /// `[[pool]]`: groups of identical workers on one device.
    #[serde(rename = "pool")]
    pub pools: Vec<PoolConfig>,
    /// `[scheduling]`: how requests are spread over the pools.
    pub scheduling: SchedulingConfig,
    /// `[workers]`: how worker processes are found, started and restarted.
    pub workers: WorkersConfig,
    /// `[logging]`: log format and filter.
    pub logging: LoggingConfig,
    /// `[compat]`: which upstream release layad answers like.
    pub compat: CompatConfig,
    /// The bearer key clients must send, from `LAYA_API_KEY` or `server.api_key_file`; never
    /// serialized, so printing the configuration cannot leak it.
    #[serde(skip)]
    pub api_key: Option<ApiKey>,
}

impl Default for Config {
    /// The embedded defaults: all three checkpoints from the Hugging Face cache, one pool of one
    /// GPU worker on device `auto`, bound to 127.0.0.1:8642.
    fn default() -> Self {
        Self {
            server: ServerConfig::default(),
            checkpoints: CheckpointsConfig::default(),
            pools: vec![PoolConfig::named("gpu")],
            scheduling: SchedulingConfig::default(),
            workers: WorkersConfig::default(),
            logging: LoggingConfig::default(),
            compat: CompatConfig::default(),
            api_key: None,
        }
    }
}

impl Config {
    /// The checkpoints this server answers with, with where each comes from: the built-ins in
    /// upstream's order (a `[checkpoints.extra]` entry under a built-in's name or alias re-points it,
    /// as upstream's `LAYA_EXTRA_MODELS` does), then the extra checkpoints by name. An extra entry
    /// whose name is invalid is left out here; validation reports it.
    pub fn served_checkpoints(&self) -> Vec<(CheckpointName, CheckpointSource)> {
        let extras = self.checkpoints.registered();
        let mut served: Vec<(CheckpointName, CheckpointSource)> = CheckpointName::ALL
            .into_iter()
            .map(|name| match extras.iter().find(|(n, _)| *n == name) {
                Some((_, extra)) => (name, CheckpointSource::Registered((*extra).clone())),
                None => (name, self.checkpoints.source(name).clone()),
            })
            .filter(|(_, source)| *source != CheckpointSource::Off)
            .collect();
        served.extend(
            extras
                .into_iter()
                .filter(|(name, _)| !name.is_builtin())
                .map(|(name, extra)| (name, CheckpointSource::Registered(extra.clone()))),
        );
        served
    }

    /// The checkpoints a pool runs: its `checkpoints` list, or every served checkpoint.
    pub fn pool_checkpoints(&self, pool: &PoolConfig) -> Vec<CheckpointName> {
        match &pool.checkpoints {
            Some(names) => names.clone(),
            None => self.served_checkpoints().into_iter().map(|(name, _)| name).collect(),
        }
    }
}

/// `[server]`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerConfig {
    /// Address and port to bind.
    pub listen: SocketAddr,
    /// Extra `Host` names accepted while bound to a loopback address (loopback names always are).
    pub allowed_hosts: Vec<String>,
    /// A file holding the API key (alternative to `LAYA_API_KEY`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_file: Option<PathBuf>,
    /// Largest request body in bytes, after decoding a `Content-Encoding`.
    pub max_body_bytes: usize,
    /// How long a client may take to send its whole body (408 after that).
    #[serde(with = "duration")]
    pub body_timeout: Duration,
    /// How long a request may wait for and run on a worker before it is answered 503.
    #[serde(with = "duration")]
    pub request_timeout: Duration,
    /// How long in-flight requests may take to finish after SIGTERM/SIGINT.
    #[serde(with = "duration")]
    pub shutdown_grace: Duration,
    /// Most open client connections. At the cap the oldest connection that has not sent a request
    /// head (or idles between requests) is closed for a new one; while all carry requests, further
    /// clients wait in the kernel's accept queue.
    pub max_connections: usize,
    /// Most connections one client address may hold (at most `max_connections`); past it the
    /// client's own oldest waiting connection is closed, or the new one when all carry requests.
    pub max_connections_per_client: usize,
    /// Upstream's `LAYA_AUTO_TASK`: route requests whose question ids match a typed-decisions
    /// workflow to the typed-decisions checkpoint.
    pub auto_task: bool,
    /// Append the `x_layad` block (pool, device, routing reason, queue and device time) to every
    /// answer, after upstream's keys; `false` gives bodies byte-for-byte like upstream's.
    pub diagnostics: bool,
    /// Upstream 0.4.15's `LAYA_MAX_CONCURRENT`: most decision requests (single or batch) past the
    /// bearer check at once; more are answered 503 `server busy, try again later` with
    /// `Retry-After: 1` at once. Absent: no such cap (the pools' bounded queues decide).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_concurrent: Option<u32>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from((Ipv4Addr::LOCALHOST, 8642)),
            allowed_hosts: Vec::new(),
            api_key_file: None,
            max_body_bytes: laya::request::MAX_BODY_BYTES,
            body_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(30),
            shutdown_grace: Duration::from_secs(30),
            max_connections: 512,
            max_connections_per_client: 256,
            auto_task: false,
            diagnostics: true,
            max_concurrent: None,
        }
    }
}

/// `[compat]`: the upstream contract.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompatConfig {
    /// The `laya[serve]` release whose answers, errors and routing layad reproduces.
    #[serde(with = "upstream_version")]
    pub upstream: Upstream,
    /// Where states without language evidence go (upstream's `LAYA_DEFAULT_MODEL`); absent = the
    /// release's own default (0.3.20 `english`, 0.4.15 `multilingual`).
    #[serde(default, skip_serializing_if = "Option::is_none", with = "checkpoint_name")]
    pub default_checkpoint: Option<CheckpointName>,
    /// Largest `max_len`/`head_max_len` a 0.4.x request may ask for (upstream's
    /// `LAYA_MAX_TOKEN_BUDGET`); at most the 8192 positions a worker prepares.
    pub max_token_budget: usize,
    /// The contract answers follow: `"laya"` (upstream's keys), `"jev-strict"` (0.4.15's
    /// `LAYA_JEV_STRICT` projection) or `"jev"` (the Jev wire contract; `laya::jev`).
    #[serde(default, with = "output_profile")]
    pub output: OutputProfile,
    /// Upstream 0.4.15's `LAYA_TOURNAMENT_GROUP` (0 = off, else 2–100): a choice with more options
    /// than this is answered by elimination in groups of this size, and choices of up to 255
    /// options are accepted. No effect under `upstream = "0.3.20"` (warned about).
    #[serde(default)]
    pub tournament_group: u32,
}

impl Default for CompatConfig {
    fn default() -> Self {
        Self {
            upstream: Upstream::default(),
            default_checkpoint: None,
            max_token_budget: laya::request::DEFAULT_MAX_TOKEN_BUDGET,
            output: OutputProfile::default(),
            tournament_group: 0,
        }
    }
}

/// `[checkpoints]`: one entry per published checkpoint.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckpointsConfig {
    /// Where `english` comes from.
    pub english: CheckpointSource,
    /// Where `multilingual` comes from.
    pub multilingual: CheckpointSource,
    /// Where `typed-decisions` comes from.
    #[serde(rename = "typed-decisions")]
    pub typed_decisions: CheckpointSource,
    /// `[checkpoints.extra]`: checkpoints of the operator's own, by name, in upstream's
    /// `LAYA_EXTRA_MODELS` syntax (a directory, a Hub repo id, or `[repo, subfolder]`). A built-in
    /// name or alias re-points that checkpoint.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub extra: BTreeMap<String, ExtraSource>,
    /// `[checkpoints.aliases]`: names of the operator's own for a checkpoint (`alias =
    /// "checkpoint"`), read wherever a request names one (`model`, `task`), in every profile —
    /// for instance the ids another Laya runtime's clients send. An alias must be a new name and
    /// name a built-in checkpoint (or one of upstream's aliases of it) or a `[checkpoints.extra]`
    /// entry; validation says which rule a bad one breaks.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub aliases: BTreeMap<String, String>,
}

impl Default for CheckpointsConfig {
    fn default() -> Self {
        Self {
            english: CheckpointSource::HfCache,
            multilingual: CheckpointSource::HfCache,
            typed_decisions: CheckpointSource::HfCache,
            extra: BTreeMap::new(),
            aliases: BTreeMap::new(),
        }
    }
}

impl CheckpointsConfig {
    /// The entry for one built-in checkpoint (`Off` for any other name: those live in `extra`).
    pub fn source(&self, name: CheckpointName) -> &CheckpointSource {
        match name {
            CheckpointName::English => &self.english,
            CheckpointName::Multilingual => &self.multilingual,
            CheckpointName::TypedDecisions => &self.typed_decisions,
            _ => &CheckpointSource::Off,
        }
    }

    /// The entry for one built-in checkpoint, to change it; `None` for any other name.
    pub fn source_mut(&mut self, name: CheckpointName) -> Option<&mut CheckpointSource> {
        match name {
            CheckpointName::English => Some(&mut self.english),
            CheckpointName::Multilingual => Some(&mut self.multilingual),
            CheckpointName::TypedDecisions => Some(&mut self.typed_decisions),
            _ => None,
        }
    }

    /// `[checkpoints.aliases]` as the router reads them: each alias's canonical key and the
    /// checkpoint it names; entries validation refuses are left out.
    pub fn alias_table(&self) -> Vec<(String, CheckpointName)> {
        let registered: Vec<CheckpointName> = self.registered().into_iter().map(|(n, _)| n).collect();
        self.aliases
            .iter()
            .filter_map(|(alias, target)| {
                let key = laya::routing::check_alias(alias, &registered).ok()?;
                let target = CheckpointName::from_name_or_alias(target)
                    .or_else(|| CheckpointName::register(target).ok().filter(|t| registered.contains(t)))?;
                Some((key, target))
            })
            .collect()
    }

    /// `[checkpoints.extra]` under canonical names (upstream's `canonical_name`: trimmed,
    /// lower-cased, aliases resolved), in name order; entries with an invalid name are left out.
    pub fn registered(&self) -> Vec<(CheckpointName, &ExtraSource)> {
        self.extra
            .iter()
            .filter_map(|(name, source)| CheckpointName::register(name).ok().map(|n| (n, source)))
            .collect()
    }
}

/// Where an extra checkpoint's files are, in upstream's `LAYA_EXTRA_MODELS` syntax: a local
/// checkpoint directory or a Hugging Face repo id (`"me/laya-ft"`), optionally with a subfolder
/// (`["me/laya-bundle", "legal"]`). Which of the two a string is, is decided when it is opened, as
/// upstream's `Agent` does: an existing path (or one written as a path) is a directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExtraSource {
    /// The repo id or directory.
    pub source: String,
    /// The subfolder inside it, if any.
    pub subfolder: Option<String>,
}

impl ExtraSource {
    /// Upstream's `_repo_str`: `repo/subfolder`, or `repo` (the `routing.repo` string).
    pub fn repo_string(&self) -> String {
        match self.subfolder.as_deref() {
            Some(sub) if !sub.is_empty() => format!("{}/{sub}", self.source),
            _ => self.source.clone(),
        }
    }
}

impl Serialize for ExtraSource {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match &self.subfolder {
            None => serializer.serialize_str(&self.source),
            Some(sub) => serializer.collect_seq([&self.source, sub]),
        }
    }
}

impl<'de> Deserialize<'de> for ExtraSource {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = ExtraSource;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str(r#"a checkpoint directory, a Hugging Face repo id, or a ["repo", "subfolder"] pair"#)
            }
            fn visit_str<E: serde::de::Error>(self, value: &str) -> Result<ExtraSource, E> {
                if value.trim().is_empty() {
                    return Err(E::invalid_value(serde::de::Unexpected::Str(value), &self));
                }
                Ok(ExtraSource {
                    source: value.to_owned(),
                    subfolder: None,
                })
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<ExtraSource, A::Error> {
                let source: String = seq
                    .next_element()?
                    .ok_or_else(|| serde::de::Error::invalid_length(0, &self))?;
                let subfolder: Option<Option<String>> = seq.next_element()?;
                if seq.next_element::<serde::de::IgnoredAny>()?.is_some() {
                    return Err(serde::de::Error::invalid_length(3, &self));
                }
                self.visit_str::<A::Error>(&source).map(|mut extra| {
                    extra.subfolder = subfolder.flatten().filter(|s| !s.is_empty());
                    extra
                })
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

/// Where a checkpoint's files are: `"hf"`, `"off"`, or a directory path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CheckpointSource {
    /// The Hugging Face cache (`HF_HUB_CACHE`, else `HF_HOME/hub`, else `~/.cache/huggingface/hub`).
    HfCache,
    /// A checkpoint directory (holding `rl_agent_config.json`, `model.safetensors`, …).
    Directory(PathBuf),
    /// Not served: requests routed to it are answered 503.
    Off,
    /// A checkpoint of the operator's own, or a built-in re-pointed by `[checkpoints.extra]`
    /// (never written in `[checkpoints]` itself: [`Config::served_checkpoints`] yields it).
    Registered(ExtraSource),
}

impl Serialize for CheckpointSource {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            CheckpointSource::HfCache => serializer.serialize_str("hf"),
            CheckpointSource::Off => serializer.serialize_str("off"),
            CheckpointSource::Directory(dir) => dir.serialize(serializer),
            CheckpointSource::Registered(extra) => extra.serialize(serializer),
        }
    }
}

impl<'de> Deserialize<'de> for CheckpointSource {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = CheckpointSource;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str(r#""hf" (the Hugging Face cache), "off", or a checkpoint directory"#)
            }
            fn visit_str<E: serde::de::Error>(self, value: &str) -> Result<CheckpointSource, E> {
                match value {
                    "hf" => Ok(CheckpointSource::HfCache),
                    "off" => Ok(CheckpointSource::Off),
                    "" => Err(E::invalid_value(serde::de::Unexpected::Str(value), &self)),
                    path => Ok(CheckpointSource::Directory(PathBuf::from(path))),
                }
            }
        }
        deserializer.deserialize_str(Visitor)
    }
}

/// `[[pool]]`: identical workers on one device sharing one queue.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolConfig {
    /// Unique name, used in `/health`, `/metrics` and logs.
    pub name: String,
    /// Which worker binary runs the pool's workers.
    #[serde(default)]
    pub worker: WorkerKind,
    /// Device the workers ask for.
    #[serde(default)]
    pub device: Device,
    /// Number of worker processes.
    #[serde(default = "PoolConfig::default_workers")]
    pub workers: u32,
    /// Compute threads per worker; 0 lets the workers share the cores (under a container's CPU
    /// quota, its whole CPUs: the supervisor's `process::cpu_quota`).
    #[serde(default)]
    pub threads: u32,
    /// Compute precision of the encoder; absent = [`PoolConfig::effective_dtype`]'s default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dtype: Option<Dtype>,
    /// Most rows in one forward pass.
    #[serde(default = "PoolConfig::default_max_rows")]
    pub max_rows: u32,
    /// Most tokens (sum of row lengths) in one forward pass.
    #[serde(default = "PoolConfig::default_max_batch_tokens")]
    pub max_batch_tokens: u32,
    /// Most requests waiting for a worker; beyond that requests are answered 503 with `Retry-After`.
    #[serde(default = "PoolConfig::default_queue_capacity")]
    pub queue_capacity: u32,
    /// The checkpoints this pool's workers load; absent = every served checkpoint.
    #[serde(default, skip_serializing_if = "Option::is_none", with = "checkpoint_list")]
    pub checkpoints: Option<Vec<CheckpointName>>,
    /// Most questions (rows) in one request this pool takes; absent = as many as `max_rows`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_questions: Option<u32>,
    /// Longest row (tokens) this pool takes; absent = what the workers accept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    /// Fixed row lengths: every row is padded to the smallest bucket that holds it (as a
    /// fixed-shape engine needs); rows longer than the largest go elsewhere. Empty = no buckets.
    #[serde(default)]
    pub buckets: Vec<u32>,
    /// How long a lone queued request may wait for others to share its forward pass.
    #[serde(default, with = "duration")]
    pub batch_wait: Duration,
    /// Upstream's `LAYA_IDLE_UNLOAD_SECONDS`: after this long with nothing queued or running, the
    /// pool's workers stop (their checkpoints leave memory) and the next request for the pool starts
    /// them again (load and warm) and waits for them. `"0s"` (the default) keeps them resident.
    #[serde(default, with = "duration", skip_serializing_if = "Duration::is_zero")]
    pub idle_unload: Duration,
    /// Refuse to run anywhere but on `device`: a `metal` or `cuda` pool whose device is missing
    /// does not fall back to the CPU (the default) but refuses to start, and `/health` names the
    /// pool and the reason (`degraded`). Only `gpu` pools asking for `metal` or `cuda`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub require_device: bool,
    /// Start the pool's workers unloaded: nothing is loaded until the first request routed to the
    /// pool, which starts and warms them and waits for them (the idle-unload path). What upstream
    /// does for a checkpoint missing from `LAYA_MODELS`, which layad gives a pool of this kind.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub start_unloaded: bool,
    /// `ane` pools: the directory of converted Core ML artifacts (`<dir>/<checkpoint>/L<bucket>/`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifacts: Option<PathBuf>,
    /// `ane` pools: what runs the converted graphs: `coreml` (the Neural Engine, macOS) or `candle`
    /// (the same graph contract on the CPU, anywhere; for checking the host side).
    #[serde(default)]
    pub executor: AneExecutor,
}

impl PoolConfig {
    /// A pool with this name and every other key at its default.
    pub fn named(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            worker: WorkerKind::default(),
            device: Device::default(),
            workers: Self::default_workers(),
            threads: 0,
            dtype: None,
            max_rows: Self::default_max_rows(),
            max_batch_tokens: Self::default_max_batch_tokens(),
            queue_capacity: Self::default_queue_capacity(),
            checkpoints: None,
            max_questions: None,
            max_tokens: None,
            buckets: Vec::new(),
            batch_wait: Duration::ZERO,
            idle_unload: Duration::ZERO,
            require_device: false,
            start_unloaded: false,
            artifacts: None,
            executor: AneExecutor::default(),
        }
    }

    /// The precision the workers are started with: `dtype` when given, else what the worker runs
    /// by default: f32 for `gpu` pools (as upstream on the CPU), f16 for `ane` pools (the precision
    /// of the Core ML graphs, which the candle executor then mirrors).
    pub fn effective_dtype(&self) -> Dtype {
        self.dtype.unwrap_or(match self.worker {
            WorkerKind::Gpu => Dtype::F32,
            WorkerKind::Ane => Dtype::F16,
        })
    }

    fn default_workers() -> u32 {
        1
    }

    fn default_max_rows() -> u32 {
        laya::limits::DEFAULT_MAX_ROWS
    }

    fn default_max_batch_tokens() -> u32 {
        laya::limits::DEFAULT_MAX_BATCH_TOKENS
    }

    fn default_queue_capacity() -> u32 {
        256
    }
}

/// Which worker binary a pool runs. What else differs between kinds is in the supervisor's
/// `worker_kind.rs`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WorkerKind {
    /// `layad-worker-gpu`: candle on Metal, CUDA or CPU.
    #[default]
    Gpu,
    /// `layad-worker-ane`: Core ML on the Apple Neural Engine (macOS only).
    Ane,
}

impl WorkerKind {
    /// Every kind.
    pub const ALL: [WorkerKind; 2] = [WorkerKind::Gpu, WorkerKind::Ane];

    /// The worker's executable name (without any platform suffix).
    pub fn binary_name(self) -> &'static str {
        match self {
            WorkerKind::Gpu => "layad-worker-gpu",
            WorkerKind::Ane => "layad-worker-ane",
        }
    }

    /// The config spelling: `gpu` or `ane`.
    pub fn as_str(self) -> &'static str {
        match self {
            WorkerKind::Gpu => "gpu",
            WorkerKind::Ane => "ane",
        }
    }
}

/// What runs an `ane` pool's converted graphs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AneExecutor {
    /// Core ML pinned to the CPU and Neural Engine (macOS only).
    #[default]
    Coreml,
    /// candle on the CPU, same graph contract (any platform).
    Candle,
}

impl AneExecutor {
    /// The config spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            AneExecutor::Coreml => "coreml",
            AneExecutor::Candle => "candle",
        }
    }
}

/// `[scheduling]`: how requests are spread over the pools and ordered inside each.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SchedulingConfig {
    /// Move a request from its preferred pool to another pool that can hold it when it would
    /// finish strictly earlier there (expected start from its queue position, plus its service
    /// estimate), and let an idle pool take such a request from another pool's queue.
    pub spill: bool,
    /// The order a pool serves its queue in.
    #[serde(default)]
    pub order: QueueOrder,
    /// With `order = "shortest-first"`: a queued request is passed by later, shorter ones only
    /// until it has waited this many times its own service estimate.
    #[serde(default = "SchedulingConfig::default_aging")]
    pub aging: f64,
}

impl SchedulingConfig {
    fn default_aging() -> f64 {
        10.0
    }
}

impl Default for SchedulingConfig {
    fn default() -> Self {
        Self {
            spill: true,
            order: QueueOrder::default(),
            aging: Self::default_aging(),
        }
    }
}

/// The order a pool serves its queue in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum QueueOrder {
    /// Shortest expected service first, each request by `enqueued + aging × its estimate` (earlier
    /// first), or earlier when its deadline needs it: short requests pass long ones, but never a
    /// long one that has already waited `aging` times its own estimate.
    #[default]
    ShortestFirst,
    /// First come, first served.
    Arrival,
}

impl QueueOrder {
    /// The config spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            QueueOrder::ShortestFirst => "shortest-first",
            QueueOrder::Arrival => "arrival",
        }
    }
}

/// The device a GPU worker asks for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Device {
    /// Metal on a Mac, CUDA when built with it and present, else CPU.
    #[default]
    Auto,
    /// The CPU.
    Cpu,
    /// Apple's Metal GPU.
    Metal,
    /// An NVIDIA GPU (needs a worker built with CUDA).
    Cuda,
}

impl Device {
    /// The config spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Device::Auto => "auto",
            Device::Cpu => "cpu",
            Device::Metal => "metal",
            Device::Cuda => "cuda",
        }
    }
}

/// Compute precision.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    /// 32-bit floats, as upstream computes on CPU.
    F32,
    /// 16-bit floats.
    F16,
    /// bfloat16.
    Bf16,
    /// `gpu` pools on the CPU only: the encoder's and the decision head's layer matrix products
    /// with int8 weights, served only after each checkpoint passes a parity gate against its
    /// float32 forward at load.
    Int8,
}

impl Dtype {
    /// The config spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Dtype::F32 => "f32",
            Dtype::F16 => "f16",
            Dtype::Bf16 => "bf16",
            Dtype::Int8 => "int8",
        }
    }
}

/// `[workers]`: settings shared by every worker process.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkersConfig {
    /// Directory holding the worker binaries; absent = the directory of the `layad` executable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub binary_dir: Option<PathBuf>,
    /// Directory for the workers' Unix sockets; absent = `$XDG_RUNTIME_DIR/layad`, else
    /// `<temp dir>/layad-<user id>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub socket_dir: Option<PathBuf>,
    /// Wait before the first restart of a worker that exited.
    #[serde(with = "duration")]
    pub restart_backoff_initial: Duration,
    /// Longest wait between restarts (the wait doubles up to this).
    #[serde(with = "duration")]
    pub restart_backoff_max: Duration,
    /// Restarts within `crash_loop_window` after which the pool is reported degraded.
    pub crash_loop_restarts: u32,
    /// The window `crash_loop_restarts` is counted in.
    #[serde(with = "duration")]
    pub crash_loop_window: Duration,
    /// How long a worker may take to load and warm up before it is killed and restarted.
    #[serde(with = "duration")]
    pub startup_timeout: Duration,
    /// How long a worker may take to exit after SIGTERM before it is killed.
    #[serde(with = "duration")]
    pub stop_timeout: Duration,
}

impl Default for WorkersConfig {
    fn default() -> Self {
        Self {
            binary_dir: None,
            socket_dir: None,
            restart_backoff_initial: Duration::from_millis(500),
            restart_backoff_max: Duration::from_secs(30),
            crash_loop_restarts: 5,
            crash_loop_window: Duration::from_secs(60),
            startup_timeout: Duration::from_secs(120),
            stop_timeout: Duration::from_secs(10),
        }
    }
}

impl WorkersConfig {
    /// Where the worker binaries are: `binary_dir`, else the directory of the running executable.
    pub fn binary_dir(&self) -> std::io::Result<PathBuf> {
        if let Some(dir) = &self.binary_dir {
            return Ok(dir.clone());
        }
        let exe = std::env::current_exe()?;
        Ok(exe.parent().map_or_else(|| PathBuf::from("."), Path::to_path_buf))
    }

    /// Where the worker sockets go: `socket_dir`, else `$XDG_RUNTIME_DIR/layad`, else
    /// `<temp dir>/layad-<user id>` (the process manager creates it private to the user).
    pub fn socket_dir(&self, runtime_dir: Option<&Path>, user_id: u32) -> PathBuf {
        match (&self.socket_dir, runtime_dir) {
            (Some(dir), _) => dir.clone(),
            (None, Some(runtime)) => runtime.join("layad"),
            (None, None) => std::env::temp_dir().join(format!("layad-{user_id}")),
        }
    }
}

/// `[logging]`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoggingConfig {
    /// Human-readable lines or one JSON object per line.
    pub format: LogFormat,
    /// A `tracing` filter: a level, or directives such as `info,layad=debug`.
    pub filter: String,
}

impl Default for LoggingConfig {
    fn default() -> Self {
        Self {
            format: LogFormat::Pretty,
            filter: "info".to_owned(),
        }
    }
}

/// How log lines look.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Pretty,
    /// One JSON object per line.
    Json,
}

/// The API key. Its `Debug` never shows the key, so logging a config cannot leak it.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey(String);

impl ApiKey {
    /// Wraps a key.
    pub fn new(key: impl Into<String>) -> Self {
        Self(key.into())
    }

    /// The key itself, for the comparison with a request's bearer token.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ApiKey(<redacted>)")
    }
}

/// `compat.upstream`: a release string such as `"0.4.15"`.
mod upstream_version {
    use laya::upstream::Upstream;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(upstream: &Upstream, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(upstream.as_str())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Upstream, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// `compat.output`: `"laya"`, `"jev-strict"` or `"jev"`.
mod output_profile {
    use laya::output::OutputProfile;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(output: &OutputProfile, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(output.as_str())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<OutputProfile, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// A canonical checkpoint name: a built-in, or (written exactly as registered, lower case) the
/// name of a `[checkpoints.extra]` entry, which validation then checks is served.
fn parse_checkpoint_name<E: serde::de::Error>(name: &str) -> Result<CheckpointName, E> {
    let expected =
        "one of \"english\", \"multilingual\", \"typed-decisions\" or the name of a [checkpoints.extra] entry";
    match CheckpointName::register(name) {
        Ok(checkpoint) if checkpoint.as_str() == name => Ok(checkpoint),
        _ => Err(E::invalid_value(serde::de::Unexpected::Str(name), &expected)),
    }
}

/// `compat.default_checkpoint`: one canonical checkpoint name, or absent.
mod checkpoint_name {
    use laya::routing::CheckpointName;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(name: &Option<CheckpointName>, serializer: S) -> Result<S::Ok, S::Error> {
        match name {
            Some(name) => serializer.serialize_str(name.as_str()),
            None => serializer.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<CheckpointName>, D::Error> {
        let name = String::deserialize(deserializer)?;
        super::parse_checkpoint_name(&name).map(Some)
    }
}

/// `pool.checkpoints`: a list of canonical checkpoint names.
mod checkpoint_list {
    use laya::routing::CheckpointName;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(names: &Option<Vec<CheckpointName>>, serializer: S) -> Result<S::Ok, S::Error> {
        match names {
            Some(names) => serializer.collect_seq(names.iter().map(|n| n.as_str())),
            None => serializer.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Vec<CheckpointName>>, D::Error> {
        let names = Vec::<String>::deserialize(deserializer)?;
        names
            .iter()
            .map(|name| super::parse_checkpoint_name(name))
            .collect::<Result<Vec<CheckpointName>, _>>()
            .map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_socket_dir_is_configured_else_under_the_runtime_dir_else_per_user_in_tmp() {
        let mut workers = WorkersConfig::default();
        let runtime = Path::new("/run/user/1000");
        assert_eq!(workers.socket_dir(Some(runtime), 1000), runtime.join("layad"));
        assert_eq!(workers.socket_dir(None, 1000), std::env::temp_dir().join("layad-1000"));
        workers.socket_dir = Some(PathBuf::from("/srv/layad/sockets"));
        assert_eq!(
            workers.socket_dir(Some(runtime), 1000),
            PathBuf::from("/srv/layad/sockets")
        );
    }

    #[test]
    fn the_binary_dir_defaults_to_the_running_executable() {
        let mut workers = WorkersConfig::default();
        let exe = std::env::current_exe().expect("exe");
        assert_eq!(workers.binary_dir().ok().as_deref(), exe.parent());
        workers.binary_dir = Some(PathBuf::from("/opt/layad/bin"));
        assert_eq!(workers.binary_dir().ok(), Some(PathBuf::from("/opt/layad/bin")));
    }

    #[test]
    fn the_api_key_never_shows_in_debug_output() {
        let key = ApiKey::new("hunter2");
        assert_eq!(format!("{key:?}"), "ApiKey(<redacted>)");
        assert_eq!(key.expose(), "hunter2");
    }
}
