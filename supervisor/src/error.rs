//! [`LayadError`]: why `layad` could not start, one variant per start-up step, each naming what
//! to fix. Errors met while answering requests are `decisions::DecisionError` and `http::response::ApiError`.

use std::net::SocketAddr;

/// Why `layad` could not start.
#[derive(Debug, thiserror::Error)]
pub enum LayadError {
    /// The configuration is invalid.
    #[error(transparent)]
    Config(#[from] layad_config::ConfigError),
    /// A served checkpoint could not be found or opened.
    #[error(transparent)]
    Checkpoint(#[from] crate::checkpoints::OpenError),
    /// The listen address could not be bound.
    #[error("cannot listen on {addr} (server.listen): {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The operating system's reason.
        source: std::io::Error,
    },
    /// A checkpoint could not be downloaded (or is missing while offline).
    #[error(transparent)]
    Fetch(#[from] layad_hub::FetchError),
    /// The worker processes could not be started.
    #[error(transparent)]
    Workers(#[from] crate::process::WorkersError),
    /// The async runtime could not be created.
    #[error("cannot start the async runtime: {0}")]
    Runtime(std::io::Error),
    /// `logging.filter` is not a valid filter.
    #[error("logging.filter {filter:?}: {message}")]
    LogFilter {
        /// The filter as configured.
        filter: String,
        /// The parser's complaint.
        message: String,
    },
}
