//! The HTTP front: the axum router, the connection loop with graceful shutdown, and one module
//! per endpoint group; the wire contract is upstream `laya[serve]==0.3.20`'s (see docs/http-api.md).
//!
//! Layout: [`server`] (bind, accept, drain, the router and shared state), `middleware` (request id,
//! `Host` check, `Server-Timing`), [`routes`] (the endpoints).

mod middleware;
pub mod routes;
pub mod server;

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use laya::python_text::{Separators, py_json};
use serde_json::Value;

pub use middleware::RequestContext;
pub use server::{App, Server, ShutdownReport};

/// A JSON answer rendered as Starlette renders it (compact, non-ASCII kept), `application/json`.
pub(crate) fn json_response(status: StatusCode, value: &Value) -> Response {
    json_text_response(status, py_json(value, Separators::Compact))
}

/// A JSON answer whose text is already rendered.
pub(crate) fn json_text_response(status: StatusCode, text: String) -> Response {
    let mut response = (status, text).into_response();
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}
