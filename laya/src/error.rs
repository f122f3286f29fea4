//! The errors more than one module returns, kept apart from all of them so that each module can
//! take them without importing the others: [`CheckpointError`] (opening a checkpoint: the configs,
//! the tokenizer and the weights each report one) and [`RequestError`] (a request refused with an
//! HTTP status and upstream's `detail`; parsing, Jev's model names and tournaments each return one),
//! with the Jev [`error_type`] of a refusal's status. Errors only one module returns live in it
//! (`prompt::PromptError`, `question::QuestionError`, `routing::RouteError`,
//! `tokenizer::TokenizeError`).

use std::path::PathBuf;

use serde_json::{Map, Value};

use crate::python_text::{Separators, py_json};
use crate::routing::RouteError;

/// Why a checkpoint could not be found or opened; every variant names the file or place.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// A file the checkpoint needs is absent.
    #[error("{path}: missing (a Laya checkpoint needs rl_agent_config.json, model.safetensors, encoder/config.json and tokenizer/)", path = path.display())]
    Missing {
        /// The absent file.
        path: PathBuf,
    },
    /// A file exists but could not be read.
    #[error("{path}: {source}", path = path.display())]
    Io {
        /// The unreadable file.
        path: PathBuf,
        /// The operating system's reason.
        source: std::io::Error,
    },
    /// A file was read but its content is wrong.
    #[error("{path}: {problem}", path = path.display())]
    Invalid {
        /// The malformed file.
        path: PathBuf,
        /// What is wrong with it.
        problem: String,
    },
    /// The checkpoint is in none of the places searched.
    #[error("checkpoint '{name}' not found; looked in {searched}")]
    NotFound {
        /// The checkpoint asked for.
        name: String,
        /// The places searched, human readable.
        searched: String,
    },
}

/// A request answered with an error status and upstream's `{"detail": ...}` text.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{status}: {detail}")]
pub struct RequestError {
    /// HTTP status code.
    pub status: u16,
    /// The `detail` text.
    pub detail: String,
    /// What kind of refusal it is, for the `jev` profile, which writes validation failures and other
    /// refusals in different shapes (`crate::jev::error_body`); upstream's shape ignores it.
    pub problem: Problem,
}

/// How the Jev wire contract classes a refusal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Problem {
    /// The body fails validation: FastAPI's 422 item, with where (`loc` after `"body"`: field
    /// names and question ids) and pydantic's error `type` (`missing`, `json_invalid`, …).
    Invalid {
        /// The path below `"body"`; empty for the body as a whole.
        loc: Vec<Value>,
        /// The error type.
        kind: &'static str,
    },
    /// Anything else (a size limit, an unknown model, a server state), with Jev's `error_type`.
    Refused {
        /// The Jev error type.
        error_type: &'static str,
    },
}

impl RequestError {
    /// An error with this status and detail. A 400 or 422 is a validation failure of the body as a
    /// whole (`value_error`) until [`at`](Self::at) says where; any other status is a refusal.
    pub fn new(status: u16, detail: impl Into<String>) -> Self {
        let problem = match status {
            400 | 422 => Problem::Invalid {
                loc: Vec::new(),
                kind: "value_error",
            },
            _ => Problem::Refused {
                error_type: error_type(status),
            },
        };
        Self {
            status,
            detail: detail.into(),
            problem,
        }
    }

    /// The same error as a validation failure of the field at `loc` (below `"body"`), of this kind.
    pub fn at(self, loc: &[&str], kind: &'static str) -> Self {
        Self {
            problem: Problem::Invalid {
                loc: loc.iter().map(|&part| Value::from(part)).collect(),
                kind,
            },
            ..self
        }
    }

    /// The same error as a refusal that is not about one field, with this Jev `error_type`.
    pub fn refused(self, error_type: &'static str) -> Self {
        Self {
            problem: Problem::Refused { error_type },
            ..self
        }
    }

    /// Routing's refusal (an unservable `model`, an unknown `task`), as upstream answers it.
    pub fn from_route(e: RouteError) -> Self {
        Self::new(e.status(), e.to_string())
    }

    /// Upstream's 500 for failures that are not the client's (`inference failed`).
    pub fn inference_failed() -> Self {
        Self::new(500, "inference failed")
    }

    /// The error body, `{"detail":"..."}`, as upstream writes it.
    pub fn body(&self) -> String {
        let mut body = Map::new();
        body.insert("detail".to_owned(), Value::from(self.detail.clone()));
        py_json(&Value::Object(body), Separators::Compact)
    }
}

/// The Jev `error_type` of a refusal with this status that is not a validation failure.
pub fn error_type(status: u16) -> &'static str {
    match status {
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found",
        405 => "method_not_allowed",
        408 => "request_timeout",
        413 => "request_too_large",
        415 => "unsupported_media_type",
        421 => "misdirected_request",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        500..=599 => "internal_error",
        _ => "invalid_request_error",
    }
}
