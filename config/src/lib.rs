//! layad's configuration: the TOML schema, layered as embedded defaults < TOML file < upstream's
//! `LAYA_*` variables < `LAYAD_*` environment variables < command-line flags, with errors that name
//! the key and where it came from.
//!
//! Layout:
//! - [`schema`]: every section and key with its type and default ([`Config`] and its parts);
//! - [`load`]: the layering ([`Sources`], [`Config::load`]), cross-key validation, relative paths
//!   and the API key (`LAYA_API_KEY` like upstream, or `server.api_key_file`);
//! - [`upstream_env`]: upstream `laya-serve`'s `LAYA_*` variables, between the file and `LAYAD_*`;
//! - [`duration`]: `"500ms"`/`"30s"`/`"2m"` values;
//! - [`error`]: [`ConfigError`] and its [`Problem`]s.
//!
//! Environment variables use `__` between nested keys: `LAYAD_SERVER__LISTEN=0.0.0.0:8642`,
//! `LAYAD_LOGGING__FORMAT=json`. Every key is documented in `config/README.md`.

pub mod duration;
pub mod error;
pub mod load;
pub mod schema;
pub mod upstream_env;

pub use error::{ConfigError, Problem};
pub use load::{Flags, Sources};
pub use schema::{
    AneExecutor, ApiKey, CheckpointSource, CheckpointsConfig, Config, Device, Dtype, ExtraSource, LogFormat,
    LoggingConfig, PoolConfig, QueueOrder, SchedulingConfig, ServerConfig, WorkerKind, WorkersConfig,
};
pub use upstream_env::{Note, NoteLevel};
