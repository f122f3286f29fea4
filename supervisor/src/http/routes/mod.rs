//! The endpoints, one module per group, and FastAPI's answers for everything else: 404
//! `Not Found`, and a 307 to the same path without its trailing slash when that path exists.

pub mod batch;
pub mod health;
pub mod metrics;
pub mod models;
pub mod systemone;

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::http::app::App;
use crate::http::response::ApiError;

/// The decision endpoint.
pub const SYSTEMONE: &str = "/v1/systemone";
/// The batch decision endpoint (upstream 0.4.15 only).
pub const BATCH: &str = "/v1/systemone/batch";
/// The Jev model list.
pub const MODELS: &str = "/v1/models";
/// Health report (JSON).
pub const HEALTH: &str = "/health";
/// Liveness probe.
pub const LIVEZ: &str = "/livez";
/// Readiness probe.
pub const READYZ: &str = "/readyz";
/// Prometheus metrics.
pub const METRICS: &str = "/metrics";

/// Every route path.
const ROUTES: [&str; 6] = [SYSTEMONE, MODELS, HEALTH, LIVEZ, READYZ, METRICS];

/// Unknown path: 404, or Starlette's `redirect_slashes` 307 when removing the trailing slash
/// names a route (the `Location` is absolute, built from the `Host` header as Starlette does).
pub async fn not_found(State(app): State<Arc<App>>, request: Request) -> Response {
    let path = request.uri().path();
    let batch = app.decisions.upstream().differences().batch_route;
    let Some(trimmed) = path
        .strip_suffix('/')
        .filter(|p| ROUTES.contains(p) || (batch && *p == BATCH))
    else {
        return ApiError::not_found().into_response();
    };
    let host = request
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("localhost");
    let query = request.uri().query().map(|q| format!("?{q}")).unwrap_or_default();
    let location = format!("http://{host}{trimmed}{query}");
    match HeaderValue::from_str(&location) {
        Ok(location) => (StatusCode::TEMPORARY_REDIRECT, [(header::LOCATION, location)]).into_response(),
        Err(_) => ApiError::not_found().into_response(),
    }
}
