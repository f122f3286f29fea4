//! What can be wrong with a configuration: an unreadable file, or problems that each name the key,
//! where its value came from (file, environment variable, flag) and what is wrong with it.

use std::fmt;
use std::path::PathBuf;

/// Why the configuration could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file given with `--config` could not be read.
    #[error("config file {path}: {source}", path = path.display())]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// The operating system's reason.
        source: std::io::Error,
    },
    /// One or more keys are unknown or have bad values.
    #[error("invalid configuration:\n{}", list(.0))]
    Invalid(Vec<Problem>),
}

impl ConfigError {
    /// The individual problems (empty for an unreadable file).
    pub fn problems(&self) -> &[Problem] {
        match self {
            ConfigError::Invalid(problems) => problems,
            ConfigError::Unreadable { .. } => &[],
        }
    }
}

fn list(problems: &[Problem]) -> String {
    problems.iter().map(|p| format!("  {p}")).collect::<Vec<_>>().join("\n")
}

/// One thing wrong with the configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// The key, dotted, with array positions in brackets: `server.listen`, `pool[1].workers`;
    /// empty when the problem is the file's syntax.
    pub key: String,
    /// Where the offending value came from: a file path, `environment variable LAYAD_…`,
    /// `flag --listen`, or `built-in defaults`.
    pub origin: String,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.key.is_empty() {
            write!(f, "{}: {}", self.origin, self.message)
        } else {
            write!(f, "{} (in {}): {}", self.key, self.origin, self.message)
        }
    }
}
