//! `GET /metrics`: the Prometheus (OpenMetrics text) exposition of `crate::metrics`.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::http::app::App;
use crate::http::response::ApiError;

/// Renders every metric, reading the pools' state now.
pub async fn metrics(State(app): State<Arc<App>>) -> Response {
    match app.metrics.render() {
        Ok(text) => {
            let mut response = (StatusCode::OK, text).into_response();
            response.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static(crate::metrics::CONTENT_TYPE),
            );
            response
        }
        Err(e) => {
            tracing::error!(error = %e, "cannot render metrics");
            ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "metrics could not be rendered").into_response()
        }
    }
}
