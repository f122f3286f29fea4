//! `POST /v1/systemone`: admission (auth, declared size, encoding, streamed body), the decision,
//! then the answer, with its timings for `Server-Timing` and its outcome for `/metrics`.

use std::sync::Arc;

use axum::extract::{Extension, Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use crate::decide::Decided;
use crate::http::json_text_response;
use crate::http::middleware::RequestContext;
use crate::http::server::App;

/// The decision endpoint, in upstream's order: auth → declared size → body → JSON → … → answer.
pub async fn systemone(
    State(app): State<Arc<App>>,
    Extension(context): Extension<RequestContext>,
    request: Request,
) -> Response {
    let decided = decide(&app, &context, request).await;
    let mut response = match decided.result {
        Ok(body) => json_text_response(StatusCode::OK, body),
        Err(e) => e.into_response(),
    };
    app.metrics.record_decision(
        response.status().as_u16(),
        decided.checkpoint,
        decided.pool.as_deref(),
        context.started.elapsed(),
        &decided.timings,
    );
    response.extensions_mut().insert(decided.timings);
    response
}

async fn decide(app: &App, context: &RequestContext, request: Request) -> Decided {
    let (parts, body) = request.into_parts();
    if let Err(e) = app.admission.authorize(&parts.headers) {
        return Decided::rejected(e);
    }
    let encoding = match app.admission.check_headers(&parts.headers) {
        Ok(encoding) => encoding,
        Err(e) => return Decided::rejected(e),
    };
    let wire = match app.admission.read_body(body).await {
        Ok(wire) => wire,
        Err(e) => return Decided::rejected(e),
    };
    app.decider
        .decide(wire, encoding, app.admission.max_body_bytes(), &context.id)
        .await
}
