//! Logging set-up: `tracing` to stderr, human-readable or one JSON object per line, filtered by
//! `logging.filter`. Called once by the binary; library code only emits events.

use layad_config::{LogFormat, LoggingConfig};
use tracing_subscriber::EnvFilter;

use crate::error::LayadError;

/// Installs the global subscriber. Fails if the filter does not parse, naming `logging.filter`.
pub fn init_logging(config: &LoggingConfig) -> Result<(), LayadError> {
    let filter = EnvFilter::try_new(&config.filter).map_err(|e| LayadError::LogFilter {
        filter: config.filter.clone(),
        message: e.to_string(),
    })?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    // A second initialisation (tests) keeps the first subscriber; that is not an error here.
    let _ = match config.format {
        LogFormat::Pretty => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
    Ok(())
}
