//! `POST /v1/systemone`: admission (auth, declared size, encoding, streamed body), the decision,
//! then the answer or the error's answer, with its timings for `Server-Timing` and its outcome for
//! `/metrics`.

use std::sync::Arc;

use axum::extract::{Extension, Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use crate::decisions::Timings;
use crate::http::app::App;
use crate::http::middleware::RequestContext;
use crate::http::response::ApiError;
use crate::http::response::json_text_response;

/// The decision endpoint, in upstream's order: auth → declared size → body → JSON → … → answer.
pub async fn systemone(
    State(app): State<Arc<App>>,
    Extension(context): Extension<RequestContext>,
    request: Request,
) -> Response {
    let (mut response, checkpoint, pool, timings) = match app.admission.admit(request).await {
        Err(refused) => (refused.into_response(), None, None, Timings::default()),
        Ok(admitted) => {
            let outcome = app
                .decisions
                .answer(admitted.json, admitted.prepare_started, &context.id)
                .await;
            let response = match outcome.result {
                Ok(body) => json_text_response(StatusCode::OK, body),
                Err(e) => ApiError::from(e).into_response(),
            };
            (response, outcome.checkpoint, outcome.pool, outcome.timings)
        }
    };
    app.metrics.record_decision(
        response.status().as_u16(),
        checkpoint,
        pool.as_deref(),
        context.started.elapsed(),
        &timings,
    );
    response.extensions_mut().insert(timings);
    response
}
