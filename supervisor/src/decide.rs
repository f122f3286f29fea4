//! One decision from an admitted body to the response text: decode, parse, route and tokenize off
//! the async reactor, run the rows on the backend, then answers rendered byte-for-byte as upstream.
//!
//! Also owns the checkpoints the supervisor opens at start-up (tokenizers, limits, temperatures).

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use laya::checkpoint::{Checkpoint, CheckpointError, Location, find_in_hf_cache, hf_hub_cache_dir};
use laya::decision::{DecisionOptions, PreparedDecision, prepare, respond};
use laya::python_text::{Separators, py_json};
use laya::request::parse_body;
use laya::routing::CheckpointName;
use layad_config::{CheckpointSource, Config};
use serde_json::{Value, json};

use crate::admission::ContentEncoding;
use crate::backend::{Backend, BackendError, Job, JobOutput, Route};
use crate::error::ApiError;
use crate::reload::LiveSettings;

/// Finds a checkpoint where the configuration says it is.
pub fn locate(name: CheckpointName, source: &CheckpointSource) -> Result<Location, CheckpointError> {
    match source {
        CheckpointSource::Directory(dir) => Ok(Location::from_path(dir)),
        CheckpointSource::HfCache => {
            let cache = hf_hub_cache_dir().ok_or_else(|| CheckpointError::NotFound {
                name: name.as_str().to_owned(),
                searched: "no Hugging Face cache: set HF_HUB_CACHE or HF_HOME (or HOME)".to_owned(),
            })?;
            find_in_hf_cache(&cache, name)
        }
        CheckpointSource::Off => Err(CheckpointError::NotFound {
            name: name.as_str().to_owned(),
            searched: "nowhere: it is \"off\" in [checkpoints]".to_owned(),
        }),
    }
}

/// The opened checkpoints the server answers with.
pub struct Checkpoints {
    opened: Vec<(CheckpointName, Checkpoint)>,
}

impl Checkpoints {
    /// Locates and opens every checkpoint `config` serves, reporting each one's outcome (for
    /// `layad check`, which shows them all rather than stopping at the first failure).
    pub fn open_each(config: &Config) -> Vec<(CheckpointName, Result<Checkpoint, CheckpointError>)> {
        config
            .served_checkpoints()
            .into_iter()
            .map(|(name, source)| (name, locate(name, source).and_then(Checkpoint::open)))
            .collect()
    }

    /// Opens every served checkpoint, failing on the first that does not open.
    pub fn open(config: &Config) -> Result<Self, crate::error::LayadError> {
        let mut opened = Vec::new();
        for (name, result) in Self::open_each(config) {
            let checkpoint = result.map_err(|source| crate::error::LayadError::Checkpoint {
                name: name.as_str(),
                source,
            })?;
            opened.push((name, checkpoint));
        }
        Ok(Self { opened })
    }

    /// Already opened checkpoints (tests, tools).
    pub fn from_opened(opened: Vec<(CheckpointName, Checkpoint)>) -> Self {
        Self { opened }
    }

    /// The checkpoint with this name, if served.
    pub fn get(&self, name: CheckpointName) -> Option<&Checkpoint> {
        self.opened.iter().find(|(n, _)| *n == name).map(|(_, c)| c)
    }

    /// The served checkpoints, in upstream's order of configuration.
    pub fn iter(&self) -> impl Iterator<Item = (CheckpointName, &Checkpoint)> {
        self.opened.iter().map(|(n, c)| (*n, c))
    }
}

/// Where the time of one decision went (the `Server-Timing` header and the histograms).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Timings {
    /// Host work before the worker: decoding, parsing, routing, validation, tokenization.
    pub prepare: Option<Duration>,
    /// Waiting for a worker.
    pub queue: Option<Duration>,
    /// The worker's forward pass.
    pub device: Option<Duration>,
}

/// The outcome of one decision, with what is known about it even when it failed.
#[derive(Debug)]
pub struct Decided {
    /// The response body (200) or the error.
    pub result: Result<String, ApiError>,
    /// The checkpoint it was routed to, once routing happened.
    pub checkpoint: Option<CheckpointName>,
    /// The pool that ran it, once one did.
    pub pool: Option<String>,
    /// How that pool was chosen, once one was.
    pub route: Option<Route>,
    /// Where the time went.
    pub timings: Timings,
}

impl Decided {
    /// A request refused before any Laya work (auth, size, encoding, body read).
    pub fn rejected(error: ApiError) -> Self {
        Self {
            result: Err(error),
            checkpoint: None,
            pool: None,
            route: None,
            timings: Timings::default(),
        }
    }
}

/// Turns admitted bodies into response bodies.
#[derive(Clone)]
pub struct Decider {
    checkpoints: Arc<Checkpoints>,
    backend: Arc<dyn Backend>,
    options: DecisionOptions,
    request_timeout: Duration,
    live: Arc<LiveSettings>,
}

impl Decider {
    /// A decider answering with these checkpoints and this backend.
    pub fn new(
        checkpoints: Arc<Checkpoints>,
        backend: Arc<dyn Backend>,
        options: DecisionOptions,
        request_timeout: Duration,
        live: Arc<LiveSettings>,
    ) -> Self {
        Self {
            checkpoints,
            backend,
            options,
            request_timeout,
            live,
        }
    }

    /// Decides one request whose body was read as `wire` with `encoding`.
    pub async fn decide(
        &self,
        wire: Bytes,
        encoding: ContentEncoding,
        max_body_bytes: usize,
        request_id: &str,
    ) -> Decided {
        let started = Instant::now();
        let deadline = started + self.request_timeout;
        let mut decided = Decided::rejected(ApiError::inference_failed());
        let checkpoints = Arc::clone(&self.checkpoints);
        let options = self.options;
        // Decoding, JSON parsing and tokenizing are CPU work: keep them off the reactor.
        let prepared = tokio::task::spawn_blocking(move || {
            let body = encoding.decode(wire, max_body_bytes)?;
            let request = parse_body(&body)?;
            Ok::<_, ApiError>(prepare(&request, |name| checkpoints.get(name), options)?)
        })
        .await;
        decided.timings.prepare = Some(started.elapsed());
        let prepared = match prepared {
            Ok(Ok(prepared)) => prepared,
            Ok(Err(e)) => {
                decided.result = Err(e);
                return decided;
            }
            Err(join) => {
                tracing::error!(request_id, error = %join, "preparing the request panicked");
                return decided;
            }
        };
        decided.checkpoint = Some(prepared.checkpoint());
        decided.result = self.answer(&prepared, request_id, deadline, &mut decided).await;
        decided
    }

    /// Runs the rows (if any) and renders the response.
    async fn answer(
        &self,
        prepared: &PreparedDecision,
        request_id: &str,
        deadline: Instant,
        decided: &mut Decided,
    ) -> Result<String, ApiError> {
        let checkpoint = self
            .checkpoints
            .get(prepared.checkpoint())
            .ok_or_else(ApiError::inference_failed)?;
        let mut diagnostics = None;
        let outputs = if prepared.rows.is_empty() {
            // Upstream answers an empty `questions` without a forward pass.
            Vec::new()
        } else {
            let job = Job {
                request_id: request_id.to_owned(),
                checkpoint: prepared.checkpoint(),
                rows: prepared.rows.clone(),
                deadline,
            };
            let run = self.backend.run(job);
            let output = match tokio::time::timeout_at(tokio::time::Instant::from_std(deadline), run).await {
                Ok(Ok(output)) => output,
                Ok(Err(e)) => {
                    if let BackendError::Failed(reason) = &e {
                        tracing::error!(request_id, %reason, "inference failed");
                    }
                    return Err(e.into());
                }
                Err(_) => return Err(BackendError::DeadlineExpired.into()),
            };
            decided.pool = Some(output.pool.clone());
            decided.route = Some(output.route);
            decided.timings.queue = Some(output.queue_wait);
            decided.timings.device = Some(output.device_time);
            diagnostics = Some(diagnostics_block(&output));
            output.outputs
        };
        let mut body = respond(prepared, checkpoint, &outputs)?;
        if self.live.diagnostics()
            && let (Some(block), Some(object)) = (diagnostics, body.as_object_mut())
        {
            object.insert("x_layad".to_owned(), block);
        }
        Ok(py_json(&body, Separators::Compact))
    }
}

/// The `x_layad` object: where the job ran, why there, and where its time went.
fn diagnostics_block(output: &JobOutput) -> Value {
    // Three decimals of a millisecond: enough to compare, short enough to read.
    let ms = |d: Duration| (d.as_secs_f64() * 1e6).round() / 1e3;
    json!({
        "pool": output.pool,
        "worker": output.worker,
        "device": output.device,
        "route": output.route.as_str(),
        "reason": output.reason,
        "queue_ms": ms(output.queue_wait),
        "device_ms": ms(output.device_time),
        "batch_rows": output.batch_rows,
    })
}
