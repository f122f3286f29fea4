//! Why a fetch failed: every variant names the file, URL or setting involved, so the message alone
//! tells the user what to fix.

use std::path::PathBuf;

/// Why checkpoints could not be fetched.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// Downloads are forbidden (`HF_HUB_OFFLINE` or `--offline`) and the cache lacks a checkpoint.
    #[error(
        "offline mode (HF_HUB_OFFLINE or --offline) forbids downloading {names}, which the Hugging Face cache at {cache} does not hold; unset HF_HUB_OFFLINE and run `layad fetch {names}`, or copy a cache that has it",
        cache = cache.display()
    )]
    Offline {
        /// The missing checkpoints, space separated, as `layad fetch` takes them.
        names: String,
        /// The cache that was searched.
        cache: PathBuf,
    },
    /// The cache holds the checkpoint's repo but in a state that cannot be read (offline mode).
    #[error(transparent)]
    Cache(#[from] laya::checkpoint::CheckpointError),
    /// No cache directory could be worked out.
    #[error("no Hugging Face cache directory: set HF_HUB_CACHE or HF_HOME (HOME is not set either)")]
    NoCacheDir,
    /// `HF_ENDPOINT` is not an http(s) URL.
    #[error("HF_ENDPOINT {0:?} is not an http:// or https:// URL")]
    BadEndpoint(String),
    /// The HTTP client could not be built (TLS set-up).
    #[error("cannot set up the HTTP client: {0}")]
    Client(String),
    /// The request did not get an answer: DNS, connection, TLS, timeout, or a connection cut.
    #[error("{url}: {detail}")]
    Transport {
        /// What was requested.
        url: String,
        /// The error and its causes, outermost first.
        detail: String,
    },
    /// The server answered with an error status.
    #[error("{url}: HTTP {status}{hint}")]
    Status {
        /// What was requested.
        url: String,
        /// The status code.
        status: u16,
        /// What the status probably means here (starts with "; " when present).
        hint: String,
    },
    /// The server answered, but not the way the Hugging Face Hub does.
    #[error("{url}: {problem}")]
    BadResponse {
        /// What was requested.
        url: String,
        /// What is wrong with the answer.
        problem: String,
    },
    /// The repo at this commit lacks a file the checkpoint needs.
    #[error("{repo} at commit {revision} has no {path}; a Laya checkpoint needs it")]
    NotInRepo {
        /// The repo, e.g. `convaiinnovations/laya`.
        repo: String,
        /// The commit that was listed.
        revision: String,
        /// The file's path in the repo.
        path: String,
    },
    /// The downloaded bytes do not hash to what the Hub announced; the partial file was deleted.
    #[error(
        "{file}: {algorithm} of the downloaded bytes is {actual} but the Hub announced {expected}; the download was deleted, run the fetch again"
    )]
    Checksum {
        /// The file's path in the repo.
        file: String,
        /// `SHA-256` (LFS files) or `git blob SHA-1` (small files).
        algorithm: &'static str,
        /// The hash the Hub announced (its ETag).
        expected: String,
        /// The hash of what arrived.
        actual: String,
    },
    /// A download ended with a different length than announced, after every retry.
    #[error("{file}: received {actual} bytes but the Hub announced {expected}")]
    Size {
        /// The file's path in the repo.
        file: String,
        /// The announced size.
        expected: u64,
        /// The size on disk.
        actual: u64,
    },
    /// A local file operation failed.
    #[error("{path}: {source}", path = path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The operating system's reason.
        source: std::io::Error,
    },
}

impl FetchError {
    /// A transport error with its whole cause chain (reqwest's own message omits the root cause).
    pub(crate) fn transport(url: &str, error: reqwest::Error) -> Self {
        let error = error.without_url();
        let mut detail = error.to_string();
        let mut source = std::error::Error::source(&error);
        while let Some(cause) = source {
            detail.push_str(": ");
            detail.push_str(&cause.to_string());
            source = cause.source();
        }
        FetchError::Transport {
            url: url.to_owned(),
            detail,
        }
    }

    /// An error status, with what it most likely means on the Hub.
    pub(crate) fn status(url: &str, status: reqwest::StatusCode) -> Self {
        let hint = match status.as_u16() {
            401 | 403 => "; the repo is private or gated, or the token is wrong: set HF_TOKEN to a token with access",
            404 => "; no such repo, revision or file (check HF_ENDPOINT)",
            429 => "; rate limited by the Hub, try again later (a token in HF_TOKEN raises the limit)",
            500..=599 => "; the Hub is having trouble, try again later",
            _ => "",
        };
        FetchError::Status {
            url: url.to_owned(),
            status: status.as_u16(),
            hint: hint.to_owned(),
        }
    }

    /// Whether trying the same request again may succeed (network trouble, server errors).
    pub(crate) fn is_transient(&self) -> bool {
        match self {
            FetchError::Transport { .. } => true,
            FetchError::Status { status, .. } => *status == 429 || *status >= 500,
            _ => false,
        }
    }

    /// An I/O error on `path`.
    pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.into();
        move |source| FetchError::Io { path, source }
    }
}
