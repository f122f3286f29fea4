//! Log lines of a worker binary: one line per event on stderr, JSON for the supervisor (which parses
//! and re-tags them) or the plain human format; `RUST_LOG` filters, `info` by default.

use std::str::FromStr;

use tracing_subscriber::EnvFilter;
use tracing_subscriber::filter::{FromEnvError, LevelFilter};

/// How log lines are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    /// One JSON object per line, event fields at the top level.
    Json,
    /// Human-readable lines without colours.
    Pretty,
}

impl LogFormat {
    /// The spelling on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            LogFormat::Json => "json",
            LogFormat::Pretty => "pretty",
        }
    }
}

impl FromStr for LogFormat {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "json" => Ok(LogFormat::Json),
            "pretty" => Ok(LogFormat::Pretty),
            other => Err(format!("unknown log format {other:?}; expected json or pretty")),
        }
    }
}

/// Why logging could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum LoggingError {
    /// `RUST_LOG` does not parse.
    #[error("RUST_LOG: {0}")]
    Filter(#[from] FromEnvError),
    /// A global subscriber was already installed.
    #[error("installing the log subscriber: {0}")]
    Install(String),
}

/// stderr that treats a reader that went away as success. The supervisor reads a worker's stderr; when
/// it dies, writes fail with EPIPE, and tracing-subscriber's debug builds report a failed write with
/// `eprintln!`, which panics on that same broken stderr — killing the task that was logging (such as
/// the one that noticed the supervisor was gone). Dropping the line is the only sensible thing left.
struct SupervisedStderr;

impl std::io::Write for SupervisedStderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match std::io::stderr().write(buf) {
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(buf.len()),
            other => other,
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match std::io::stderr().flush() {
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
            other => other,
        }
    }
}

/// Installs the global subscriber writing to stderr.
pub fn init_logging(format: LogFormat) -> Result<(), LoggingError> {
    let filter = EnvFilter::builder()
        .with_default_directive(LevelFilter::INFO.into())
        .from_env()?;
    let builder = tracing_subscriber::fmt()
        .with_writer(|| SupervisedStderr)
        .with_env_filter(filter)
        .with_ansi(false);
    let installed = match format {
        LogFormat::Json => builder.json().flatten_event(true).with_current_span(false).try_init(),
        LogFormat::Pretty => builder.try_init(),
    };
    installed.map_err(|e| LoggingError::Install(e.to_string()))
}
