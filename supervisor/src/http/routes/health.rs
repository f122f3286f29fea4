//! `/health` (what runs where, truthfully), `/livez` (the process answers) and `/readyz` (every
//! served checkpoint has a ready worker). Never authenticated, like upstream's `/health`.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use laya::routing::CheckpointName;
use layad_proto::EngineFacts;
use layad_proto::pb::CheckpointParity;
use serde::Serialize;
use serde_json::{Map, Value, json};

use crate::http::app::App;
use crate::http::response::json_response;
use crate::status::{BackendStatus, ClassWaits, PoolStatus, SpeedStatus, WorkerState, WorkerStatus};

/// `GET /livez`: 200 while the process can answer HTTP.
pub async fn livez() -> Response {
    json_response(StatusCode::OK, &json!({"status": "ok"}))
}

/// The served checkpoints no ready worker has loaded.
fn unservable(app: &App, status: &BackendStatus) -> Vec<CheckpointName> {
    app.checkpoints
        .current()
        .iter()
        .map(|(name, _)| name)
        .filter(|name| !status.servable(*name))
        .collect()
}

/// `GET /readyz`: 200 once every served checkpoint has a ready worker, else 503 naming the rest.
pub async fn readyz(State(app): State<Arc<App>>) -> Response {
    let missing = unservable(&app, &app.backend.status());
    if missing.is_empty() {
        return json_response(StatusCode::OK, &json!({"status": "ready"}));
    }
    let names: Vec<&str> = missing.iter().map(|c| c.as_str()).collect();
    json_response(
        StatusCode::SERVICE_UNAVAILABLE,
        &json!({"status": "not ready", "waiting_for": names}),
    )
}

/// `ok`: everything servable and every worker ready; `degraded`: a pool reports a problem or a
/// worker is restarting or failed; `starting`: neither (workers still loading).
fn overall(status: &BackendStatus, missing: &[CheckpointName]) -> &'static str {
    let workers = || status.pools.iter().flat_map(|p| &p.workers);
    let troubled = status.pools.iter().any(|p| p.degraded.is_some())
        || workers().any(|w| matches!(w.state, WorkerState::Restarting | WorkerState::Failed));
    if troubled {
        "degraded"
    } else if missing.is_empty() && workers().all(|w| matches!(w.state, WorkerState::Ready | WorkerState::Unloaded)) {
        "ok"
    } else {
        "starting"
    }
}

/// One worker's record in `/health`. The engine's facts are flattened: each field of
/// [`EngineFacts`] appears under its own name after `dtype`, as the engine filled it, so a fact an
/// engine adds reaches this record without a line here.
#[derive(Serialize)]
struct WorkerRecord<'a> {
    id: &'a str,
    pid: Option<u32>,
    state: &'static str,
    device: Option<&'a str>,
    dtype: Option<&'a str>,
    #[serde(flatten)]
    engine: &'a EngineFacts,
    checkpoints: Vec<Value>,
    restarts: u64,
    last_exit: Option<&'a str>,
    last_error: Option<&'a str>,
    stderr_tail: &'a [String],
    warmup: Vec<Value>,
    parity_gate: Vec<Value>,
    // Idle unload: a worker "unloaded" holds no checkpoint in memory (`checkpoints` says what it
    // loads again); `last_reload_ms` is what waking it cost the request that did.
    unloads: u64,
    last_reload_ms: Option<f64>,
}

impl<'a> From<&'a WorkerStatus> for WorkerRecord<'a> {
    fn from(worker: &'a WorkerStatus) -> Self {
        WorkerRecord {
            id: &worker.id,
            pid: worker.pid,
            state: worker.state.as_str(),
            device: worker.device.as_deref(),
            dtype: worker.dtype.as_deref(),
            engine: &worker.engine,
            checkpoints: worker
                .checkpoints
                .iter()
                .map(|c| json!({"name": c.name.as_str(), "revision": c.revision, "sha256": c.sha256}))
                .collect(),
            restarts: worker.restarts,
            last_exit: worker.last_exit.as_deref(),
            last_error: worker.last_error.as_deref(),
            stderr_tail: &worker.stderr_tail,
            warmup: worker
                .warmup
                .iter()
                .map(|w| {
                    json!({"checkpoint": w.checkpoint, "shape": w.shape, "rows": w.rows,
                           "tokens_per_row": w.tokens_per_row, "steady_ms": w.steady_ms})
                })
                .collect(),
            parity_gate: worker.parity_gate.iter().map(parity_json).collect(),
            unloads: worker.unloads,
            last_reload_ms: worker.last_reload_ms,
        }
    }
}

/// How a worker's converted graphs agreed with upstream before it became ready.
fn parity_json(gate: &CheckpointParity) -> Value {
    let placement: Vec<Value> = gate
        .placement
        .iter()
        .map(|p| json!({"bucket": p.bucket, "fastest_ms": p.fastest_ms, "cpu_only_fastest_ms": p.cpu_only_fastest_ms, "ratio": p.ratio}))
        .collect();
    json!({
        "checkpoint": gate.checkpoint,
        "executor": gate.executor,
        "rows": gate.rows,
        "skipped_rows": gate.skipped_rows,
        "tolerance": gate.tolerance,
        "max_probability_diff": gate.max_probability_diff,
        "max_act_probability_diff": gate.max_act_probability_diff,
        "hard_mismatches": gate.hard_mismatches,
        "near_tie_flips": gate.near_tie_flips,
        "placement": placement,
    })
}

/// Per job class seen: jobs started here, and the median, 99th percentile and longest wait of the
/// most recent ones, in milliseconds.
fn waits_json(waits: &[ClassWaits]) -> Value {
    let ms = |d: Duration| (d.as_secs_f64() * 1e4).round() / 10.0;
    let classes: Map<String, Value> = waits
        .iter()
        .map(|w| {
            let summary =
                json!({"jobs": w.jobs, "recent": w.recent, "p50": ms(w.p50), "p99": ms(w.p99), "max": ms(w.max)});
            (w.class.name().to_owned(), summary)
        })
        .collect();
    Value::Object(classes)
}

/// The device's speed as the scheduler estimates it: the factor (measured over normal device time),
/// whether it counts as slowed, and when and why it last changed.
fn speed_json(speed: &SpeedStatus) -> Value {
    let since = speed
        .since
        .and_then(|at| at.duration_since(std::time::UNIX_EPOCH).ok())
        .map(|d| (d.as_secs_f64() * 1e3).round() / 1e3);
    json!({
        "factor": (speed.factor * 1e3).round() / 1e3,
        "slowed": speed.slowed,
        "since_unix": since,
        "why": speed.why,
        "changes": speed.changes,
    })
}

fn pool_json(pool: &PoolStatus) -> Value {
    let checkpoints: Vec<&str> = pool.checkpoints.iter().map(|c| c.as_str()).collect();
    json!({
        "name": pool.name,
        "worker": pool.worker_kind,
        "device": pool.device,
        "checkpoints": checkpoints,
        "queue_depth": pool.queue_depth,
        "queue_capacity": pool.queue_capacity,
        "in_flight": pool.in_flight,
        "degraded": pool.degraded,
        "unavailable": pool.unavailable,
        "retiring": pool.retiring,
        "takes": {
            "max_questions": pool.capabilities.max_questions,
            "max_tokens": pool.capabilities.max_len,
            "buckets": pool.capabilities.buckets,
            "max_rows": pool.capabilities.max_rows,
            "max_batch_tokens": pool.capabilities.max_batch_tokens,
        },
        "backlog_ms": (pool.backlog.as_secs_f64() * 1e4).round() / 10.0,
        "offered_load": (pool.offered_load * 100.0).round() / 100.0,
        "routed": {
            "preferred": pool.routed.preferred,
            "spilled_in": pool.routed.spilled,
            "fallback": pool.routed.fallback,
            "spilled_out": pool.spilled_out,
            "probes": pool.probes,
            "taken_from_others": pool.taken.0,
            "taken_by_others": pool.taken.1,
        },
        "batches": {"forwards": pool.batches.0, "jobs": pool.batches.1},
        "queue_wait_ms": waits_json(&pool.waits),
        "speed": speed_json(&pool.speed),
        "workers": pool.workers.iter().map(WorkerRecord::from).collect::<Vec<_>>(),
    })
}

/// `GET /health`: always 200 (use `/readyz` as the probe); `status`, version, the checkpoints
/// the supervisor opened, and every pool and worker as the backend reports them. Like upstream
/// 0.4.x, a server that requires a key tells a caller without it only `{"status":"ok"}`: the
/// rest names checkpoints, revisions and the host's devices.
pub async fn health(State(app): State<Arc<App>>, headers: HeaderMap) -> Response {
    if app.decisions.upstream().differences().health_brief_without_key && app.admission.authorize(&headers).is_err() {
        return json_response(StatusCode::OK, &json!({"status": "ok"}));
    }
    let status = app.backend.status();
    let missing = unservable(&app, &status);
    let served = app.checkpoints.current();
    let mut checkpoints = Map::new();
    for (name, checkpoint) in served.iter() {
        let mut entry = json!({
            "servable": !missing.contains(&name),
            "revision": checkpoint.location.revision(),
            "sha256": checkpoint.weights.sha256,
            "path": checkpoint.location.dir.display().to_string(),
        });
        // A checkpoint of the operator's own (or a re-pointed built-in) says where it came from,
        // as its answers' `routing.repo` does.
        if !name.is_builtin() || served.registry().repo(name) != name.repo() {
            entry["extra"] = json!(true);
            entry["source"] = json!(served.registry().repo(name));
        }
        checkpoints.insert(name.as_str().to_owned(), entry);
    }
    // `loaded` keeps upstream's key for scripts that read it: the checkpoints that can answer now.
    let loaded: Vec<&str> = served
        .iter()
        .map(|(name, _)| name)
        .filter(|name| !missing.contains(name))
        .map(CheckpointName::as_str)
        .collect();
    let reload = app.live.last_reload().map(|r| {
        let at =
            r.at.duration_since(std::time::UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64());
        match r.result {
            Ok(changes) => json!({"attempt": r.attempt, "at_unix": at, "ok": true, "changes": changes}),
            Err(error) => json!({"attempt": r.attempt, "at_unix": at, "ok": false, "error": error}),
        }
    });
    let body = json!({
        "status": overall(&status, &missing),
        "version": env!("CARGO_PKG_VERSION"),
        "pid": std::process::id(),
        "reload": reload,
        "loaded": loaded,
        "checkpoints": checkpoints,
        "pools": status.pools.iter().map(pool_json).collect::<Vec<_>>(),
    });
    json_response(StatusCode::OK, &body)
}
