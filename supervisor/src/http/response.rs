//! What every answer's body looks like: JSON rendered as upstream's Starlette renders it (compact,
//! non-ASCII kept, `application/json`), and [`ApiError`], the one place a failure becomes an HTTP
//! answer — a status, upstream's `{"detail": …}` and, for 503s, a `Retry-After` — with the one table
//! from request-handling errors ([`DecisionError`], [`BackendError`]) to those answers. Under
//! `[compat] output = "jev"` the frame ([`in_profile`]) rewrites every error answer in the Jev API's
//! shapes from the [`ApiError`] it carries.

use std::time::Duration;

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use laya::error::{Problem, RequestError};
use laya::output::OutputProfile;
use laya::python_text::{Separators, py_json};
use serde_json::{Map, Value};

use crate::backend::BackendError;
use crate::decisions::DecisionError;

/// A JSON answer rendered as Starlette renders it.
pub fn json_response(status: StatusCode, value: &Value) -> Response {
    json_text_response(status, py_json(value, Separators::Compact))
}

/// A JSON answer whose text is already rendered.
pub fn json_text_response(status: StatusCode, text: String) -> Response {
    let mut response = (status, text).into_response();
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// An HTTP error answer: status, upstream-style `detail`, and `Retry-After` when retrying helps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiError {
    /// The status code.
    pub status: StatusCode,
    /// The `detail` text.
    pub detail: String,
    /// Sent as `Retry-After` (whole seconds, at least 1).
    pub retry_after: Option<Duration>,
    /// What kind of refusal it is, for the `jev` profile's shapes: a request body's validation
    /// failure (from `laya`), else a refusal with the Jev `error_type` of its status.
    pub problem: Problem,
}

impl ApiError {
    /// An error with this status and detail: a refusal, not a validation failure (those come from
    /// `laya`'s [`RequestError`]s).
    pub fn new(status: StatusCode, detail: impl Into<String>) -> Self {
        Self {
            status,
            detail: detail.into(),
            retry_after: None,
            problem: Problem::Refused {
                error_type: laya::error::error_type(status.as_u16()),
            },
        }
    }

    /// FastAPI's 404.
    pub fn not_found() -> Self {
        Self::new(StatusCode::NOT_FOUND, "Not Found")
    }

    /// FastAPI's 405.
    pub fn method_not_allowed() -> Self {
        Self::new(StatusCode::METHOD_NOT_ALLOWED, "Method Not Allowed")
    }

    /// Upstream's 401 (no `WWW-Authenticate`, as upstream).
    pub fn unauthorized() -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "invalid or missing bearer token")
    }

    /// Upstream's 413 for a declared or streamed body over the cap.
    pub fn body_too_large() -> Self {
        Self::new(StatusCode::PAYLOAD_TOO_LARGE, "request body too large")
    }

    /// The slow-body 408 (the text of upstream 0.4.15, which added the same timeout).
    pub fn body_timeout() -> Self {
        Self::new(StatusCode::REQUEST_TIMEOUT, "request body was not received in time")
    }

    /// Upstream's 500 for failures that are not the client's.
    pub fn inference_failed() -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "inference failed")
    }

    /// A 503 the client should retry after `after`.
    pub fn unavailable(detail: impl Into<String>, after: Duration) -> Self {
        Self {
            retry_after: Some(after),
            ..Self::new(StatusCode::SERVICE_UNAVAILABLE, detail)
        }
    }
}

impl From<RequestError> for ApiError {
    fn from(e: RequestError) -> Self {
        // Every refusal of the request itself is permanent for this request and configuration
        // (a checkpoint turned off is a 501): none carries `Retry-After`.
        let status = StatusCode::from_u16(e.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        Self {
            problem: e.problem,
            ..Self::new(status, e.detail)
        }
    }
}

impl From<BackendError> for ApiError {
    /// The single table from backend failures to answers.
    fn from(e: BackendError) -> Self {
        match e {
            BackendError::Overloaded { retry_after } => Self::unavailable("server busy, try again later", retry_after),
            BackendError::TooLate { expected, late } => Self::unavailable(
                format!(
                    "server busy: this request would finish in about {:.1} s, after its timeout; try again later",
                    expected.as_secs_f64()
                ),
                late,
            ),
            BackendError::DeadlineExpired => Self::unavailable(
                "request timed out waiting for a worker; try again later",
                Duration::from_secs(1),
            ),
            // Permanent with the running configuration: every pool serving the checkpoint failed
            // in a way a restart cannot cure (its device is missing, or its worker refused its
            // configuration). 501 naming the reasons, without `Retry-After`.
            BackendError::CheckpointRefused { checkpoint, reasons } => Self::new(
                StatusCode::NOT_IMPLEMENTED,
                format!(
                    "checkpoint '{}' cannot be served by this server as configured: {}; retrying will not help",
                    checkpoint.as_str(),
                    reasons.join("; ")
                ),
            ),
            BackendError::CheckpointUnavailable(name) => Self::unavailable(
                format!("checkpoint '{}' has no ready worker; try again later", name.as_str()),
                Duration::from_secs(1),
            ),
            // Permanent with the running configuration: no pool can hold the job in one forward,
            // so retrying the same request can never succeed. 413 (RFC 9110 §15.5.14: content
            // larger than the server is able to process), without `Retry-After`, like upstream's
            // 413 for too many questions.
            BackendError::NoCapablePool(why) => Self::new(StatusCode::PAYLOAD_TOO_LARGE, why),
            BackendError::Failed(_) => Self::inference_failed(),
            BackendError::Lost(_) => Self::unavailable(
                "the worker running this request stopped before answering; try again",
                Duration::from_secs(1),
            ),
        }
    }
}

impl From<DecisionError> for ApiError {
    fn from(e: DecisionError) -> Self {
        match e {
            DecisionError::Request(e) => e.into(),
            DecisionError::Backend(e) => e.into(),
            DecisionError::Internal(_) => Self::inference_failed(),
        }
    }
}

impl IntoResponse for ApiError {
    /// Upstream's shape; the error itself rides along in the response's extensions so that the
    /// frame can write it in another profile's shape ([`in_profile`]).
    fn into_response(self) -> Response {
        let mut body = Map::new();
        body.insert("detail".to_owned(), Value::from(self.detail.clone()));
        let mut response = json_response(self.status, &Value::Object(body));
        if let Some(after) = self.retry_after {
            let secs = after.as_secs() + u64::from(after.subsec_nanos() > 0);
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs.max(1)));
        }
        response.extensions_mut().insert(self);
        response
    }
}

/// A finished answer in the server's output profile: under `jev`, an error answer is rewritten in
/// the Jev API's shape (`laya::jev::error_body`: FastAPI's 422 list for a body that fails
/// validation, `{"detail": {"error_type", "message"}}` otherwise), keeping its other headers
/// (`Retry-After`); every other answer, and every answer of the other profiles, passes unchanged.
pub fn in_profile(response: Response, output: OutputProfile) -> Response {
    if !output.is_jev() {
        return response;
    }
    let Some(error) = response.extensions().get::<ApiError>().cloned() else {
        return response;
    };
    let (status, body) = laya::jev::error_body(error.status.as_u16(), &error.detail, &error.problem);
    let (mut parts, _) = response.into_parts();
    parts.status = StatusCode::from_u16(status).unwrap_or(error.status);
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, axum::body::Body::from(py_json(&body, Separators::Compact)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use laya::routing::CheckpointName;

    #[test]
    fn transient_backend_failures_map_to_retryable_503s_and_failures_to_a_500() {
        let busy = ApiError::from(BackendError::Overloaded {
            retry_after: Duration::from_millis(2500),
        });
        assert_eq!(
            (busy.status, busy.detail.as_str()),
            (StatusCode::SERVICE_UNAVAILABLE, "server busy, try again later")
        );
        let response = busy.into_response();
        assert_eq!(response.headers()[header::RETRY_AFTER], "3");

        let late = ApiError::from(BackendError::TooLate {
            expected: Duration::from_millis(41_200),
            late: Duration::from_millis(11_200),
        });
        assert_eq!(late.status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(late.detail.contains("about 41.2 s"), "{}", late.detail);
        assert_eq!(late.into_response().headers()[header::RETRY_AFTER], "12");

        let down = ApiError::from(BackendError::CheckpointUnavailable(CheckpointName::Multilingual));
        assert_eq!(down.status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(down.detail.contains("'multilingual'"));
        assert_eq!(down.into_response().headers()[header::RETRY_AFTER], "1");

        let failed = ApiError::from(BackendError::Failed("device lost".into()));
        assert_eq!(
            (failed.status, failed.detail.as_str()),
            (StatusCode::INTERNAL_SERVER_ERROR, "inference failed")
        );
        assert!(failed.into_response().headers().get(header::RETRY_AFTER).is_none());

        let lost = ApiError::from(BackendError::Lost("worker process exited".into()));
        assert_eq!(lost.status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(lost.detail.contains("stopped before answering"), "{}", lost.detail);
        assert!(
            !lost.detail.contains("exited"),
            "the internal reason is logged, not sent"
        );
        assert_eq!(lost.into_response().headers()[header::RETRY_AFTER], "1");
    }

    #[test]
    fn a_job_no_pool_can_hold_is_a_413_without_retry_after() {
        let why = "no pool can run 40 questions of up to 900 tokens in one forward pass: 'gpu' runs at most 32768 padded tokens per forward";
        let refused = ApiError::from(BackendError::NoCapablePool(why.to_owned()));
        assert_eq!(
            (refused.status, refused.detail.as_str()),
            (StatusCode::PAYLOAD_TOO_LARGE, why)
        );
        assert!(refused.into_response().headers().get(header::RETRY_AFTER).is_none());
    }

    fn body_of(response: Response) -> (u16, Option<String>, serde_json::Value) {
        let status = response.status().as_u16();
        let retry = response
            .headers()
            .get(header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let bytes = body_bytes(response);
        (status, retry, serde_json::from_slice(&bytes).expect("json body"))
    }

    fn body_bytes(response: Response) -> Vec<u8> {
        let runtime = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
        runtime
            .block_on(axum::body::to_bytes(response.into_body(), usize::MAX))
            .expect("body")
            .to_vec()
    }

    #[test]
    fn only_the_jev_profile_rewrites_errors_and_keeps_their_headers() {
        let busy = || ApiError::unavailable("server busy, try again later", Duration::from_secs(2)).into_response();
        assert_eq!(
            body_of(in_profile(busy(), OutputProfile::JevStrict)),
            (
                503,
                Some("2".to_owned()),
                serde_json::json!({"detail": "server busy, try again later"})
            )
        );
        assert_eq!(
            body_of(in_profile(busy(), OutputProfile::Jev)),
            (
                503,
                Some("2".to_owned()),
                serde_json::json!({"detail": {"error_type": "overloaded_error", "message": "server busy, try again later"}})
            )
        );
        let invalid = ApiError::from(RequestError::new(400, "'state' is required").at(&["state"], "missing"));
        assert_eq!(
            body_of(in_profile(invalid.into_response(), OutputProfile::Jev)),
            (
                422,
                None,
                serde_json::json!({"detail": [{"loc": ["body", "state"], "msg": "'state' is required", "type": "missing"}]})
            )
        );
        // An answer that is not an error passes untouched.
        let ok = json_response(StatusCode::OK, &serde_json::json!({"answers": {}}));
        assert_eq!(
            body_of(in_profile(ok, OutputProfile::Jev)),
            (200, None, serde_json::json!({"answers": {}}))
        );
    }

    #[test]
    fn request_errors_keep_upstream_status_and_detail() {
        let e = ApiError::from(RequestError::new(413, "too many questions (65 > 64)"));
        assert_eq!(
            (e.status.as_u16(), e.detail.as_str()),
            (413, "too many questions (65 > 64)")
        );
    }
}
