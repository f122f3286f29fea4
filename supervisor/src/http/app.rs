//! What every handler shares: admission, the decisions, the backend's status, the opened
//! checkpoints, the metrics and the live settings. Built once by `server`.

use std::sync::Arc;

use crate::backend::Backend;
use crate::checkpoints::ServedCheckpoints;
use crate::decisions::Decisions;
use crate::http::admission::Admission;
use crate::live::LiveSettings;
use crate::metrics::Metrics;

/// What every handler shares.
pub struct App {
    /// Auth and body checks for the authenticated routes.
    pub admission: Admission,
    /// Turns admitted bodies into answers.
    pub decisions: Decisions,
    /// The workers, for `/health` and `/readyz`.
    pub backend: Arc<dyn Backend>,
    /// The served checkpoints (a reload may swap the set), for `/v1/models` and readiness.
    pub checkpoints: Arc<ServedCheckpoints>,
    /// The exported metrics.
    pub metrics: Metrics,
    /// What a reload changes while serving, and how the last reload went.
    pub live: Arc<LiveSettings>,
}
