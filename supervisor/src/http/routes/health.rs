//! `/health` (what runs where, truthfully), `/livez` (the process answers) and `/readyz` (every
//! served checkpoint has a ready worker). Never authenticated, like upstream's `/health`.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use laya::routing::CheckpointName;
use serde_json::{Map, Value, json};

use layad_proto::pb::CheckpointParity;

use crate::http::app::App;
use crate::http::response::json_response;
use crate::status::{BackendStatus, ClassWaits, PoolStatus, WorkerState, WorkerStatus};

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

fn worker_json(worker: &WorkerStatus) -> Value {
    let checkpoints: Vec<Value> = worker
        .checkpoints
        .iter()
        .map(|c| json!({"name": c.name.as_str(), "revision": c.revision, "sha256": c.sha256}))
        .collect();
    let warmup: Vec<Value> = worker
        .warmup
        .iter()
        .map(|w| {
            json!({"checkpoint": w.checkpoint, "shape": w.shape, "rows": w.rows,
                   "tokens_per_row": w.tokens_per_row, "steady_ms": w.steady_ms})
        })
        .collect();
    json!({
        "id": worker.id,
        "pid": worker.pid,
        "state": worker.state.as_str(),
        "device": worker.device,
        "dtype": worker.dtype,
        "cpu_kernels": worker.cpu_kernels,
        "gpu": worker.gpu.as_ref().map(|g| json!({"name": g.name, "total_memory_bytes": g.total_memory_bytes,
                                                  "compute_capability": g.compute_capability, "tf32": g.tf32})),
        "device_fallback": worker.device_fallback,
        "checkpoints": checkpoints,
        "restarts": worker.restarts,
        "last_exit": worker.last_exit,
        "last_error": worker.last_error,
        "stderr_tail": worker.stderr_tail,
        "warmup": warmup,
        "parity_gate": worker.parity_gate.iter().map(parity_json).collect::<Vec<_>>(),
        // Idle unload: a worker "unloaded" holds no checkpoint in memory (`checkpoints` says what
        // it loads again); `last_reload_ms` is what waking it cost the request that did.
        "unloads": worker.unloads,
        "last_reload_ms": worker.last_reload_ms,
    })
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
        "routed": {
            "preferred": pool.routed.preferred,
            "spilled_in": pool.routed.spilled,
            "fallback": pool.routed.fallback,
            "spilled_out": pool.spilled_out,
            "taken_from_others": pool.taken.0,
            "taken_by_others": pool.taken.1,
        },
        "batches": {"forwards": pool.batches.0, "jobs": pool.batches.1},
        "queue_wait_ms": waits_json(&pool.waits),
        "workers": pool.workers.iter().map(worker_json).collect::<Vec<_>>(),
    })
}

/// `GET /health`: always 200 (use `/readyz` as the probe); `status`, version, the checkpoints
/// the supervisor opened, and every pool and worker as the backend reports them. Like upstream
/// 0.4.x, a server that requires a key tells a caller without it only `{"status":"ok"}`: the
/// rest names checkpoints, revisions and the host's devices.
pub async fn health(State(app): State<Arc<App>>, headers: HeaderMap) -> Response {
    if app.decisions.upstream().is_0_4() && app.admission.authorize(&headers).is_err() {
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
