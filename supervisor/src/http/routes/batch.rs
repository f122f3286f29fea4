//! `POST /v1/systemone/batch` (upstream 0.4.15; not routed under 0.3.20, which answers 404):
//! admission as for `/v1/systemone`, the batch's decisions, then the answer or the error's answer,
//! with its timings for `Server-Timing` and its outcome for `/metrics`.

use std::sync::Arc;

use axum::extract::{Extension, Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use crate::decisions::Timings;
use crate::http::app::App;
use crate::http::middleware::RequestContext;
use crate::http::response::{ApiError, json_text_response};

/// The batch endpoint: auth → in-progress cap → declared size → body → JSON → … → answers.
pub async fn batch(
    State(app): State<Arc<App>>,
    Extension(context): Extension<RequestContext>,
    request: Request,
) -> Response {
    let (mut response, timings, jobs) = match app.admission.admit(request).await {
        Err(refused) => (refused.into_response(), Timings::default(), Vec::new()),
        Ok(admitted) => {
            let outcome = app
                .decisions
                .answer_batch(admitted.json, admitted.prepare_started, &context.id)
                .await;
            let response = match outcome.result {
                Ok(body) => json_text_response(StatusCode::OK, body),
                Err(e) => ApiError::from(e).into_response(),
            };
            (response, outcome.timings, outcome.jobs)
        }
    };
    app.metrics
        .record_batch(response.status().as_u16(), timings.prepare, &jobs);
    response.extensions_mut().insert(timings);
    response
}
