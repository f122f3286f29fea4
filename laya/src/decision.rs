//! One decision request end to end on the host, in upstream's order: route, validate, build rows;
//! then, once a worker has produced logits, the answers and the response body.
//!
//! The two halves are separate so the supervisor can schedule the forward pass in between.

use serde_json::{Map, Value};

use crate::answer::answer;
use crate::checkpoint::Checkpoint;
use crate::prompt::{PromptError, Row, RowLimits, build_rows, input_tokens};
use crate::question::{Question, parse_questions};
use crate::request::{DecisionRequest, RequestError};
use crate::routing::{CheckpointName, RouteOptions, RouteRequest, RoutingDecision, resolve_model_field, route};
use crate::upstream::Upstream;

/// Host settings that change decisions.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DecisionOptions {
    /// Upstream's `LAYA_AUTO_TASK`: send requests whose question ids match a typed-decisions
    /// workflow to the typed-decisions checkpoint.
    pub auto_task: bool,
    /// The release layad answers like.
    pub upstream: Upstream,
    /// Upstream's `LAYA_DEFAULT_MODEL`: where states without language evidence go; `None` is the
    /// release's own default.
    pub default_checkpoint: Option<CheckpointName>,
}

/// A request that is ready for the model: where it goes and what rows to run.
#[derive(Clone, Debug, PartialEq)]
pub struct PreparedDecision {
    /// The routing decision (also echoed in the response).
    pub routing: RoutingDecision,
    /// The validated questions, in request order.
    pub questions: Vec<Question>,
    /// One row per question, same order. Empty when the request has no questions.
    pub rows: Vec<Row>,
}

impl PreparedDecision {
    /// The checkpoint the rows must run on.
    pub fn checkpoint(&self) -> CheckpointName {
        self.routing.checkpoint
    }
}

/// What the model returned for one row.
#[derive(Clone, Debug, PartialEq)]
pub struct RowOutput {
    /// Logits of the row's real options (one per marker).
    pub logits: Vec<f32>,
    /// Component 0 of the act head's softmax.
    pub act_probability: f32,
}

/// Routes the request and builds its rows with the chosen checkpoint's tokenizer.
/// `checkpoints` yields the opened checkpoint for a name, or `None` if it is not served.
pub fn prepare<'a>(
    request: &DecisionRequest,
    checkpoints: impl Fn(CheckpointName) -> Option<&'a Checkpoint>,
    options: DecisionOptions,
) -> Result<PreparedDecision, RequestError> {
    let route_error = |e: crate::routing::RouteError| RequestError::new(e.status(), e.to_string());
    let model = resolve_model_field(request.model.as_ref(), options.upstream).map_err(route_error)?;
    let ids: Vec<&str> = request.questions.keys().map(String::as_str).collect();
    let route_options = RouteOptions {
        upstream: options.upstream,
        auto_task: options.auto_task,
        default_checkpoint: options.default_checkpoint,
    };
    let route_request = RouteRequest {
        model,
        ..RouteRequest::default()
    };
    let routing = route(request.state.as_ref(), &ids, &route_request, &route_options).map_err(route_error)?;
    let checkpoint = checkpoints(routing.checkpoint).ok_or_else(|| {
        RequestError::new(
            503,
            format!(
                "checkpoint '{}' is not served by this server",
                routing.checkpoint.as_str()
            ),
        )
    })?;
    if request.questions.is_empty() {
        return Ok(PreparedDecision {
            routing,
            questions: Vec::new(),
            rows: Vec::new(),
        });
    }
    let questions = parse_questions(&request.questions).map_err(|e| RequestError::new(422, e.0))?;
    let limits = RowLimits {
        max_len: checkpoint.agent.max_len,
        head_max_len: checkpoint.agent.head_max_len,
    };
    let rows = build_rows(&checkpoint.tokenizer, limits, request.state.as_ref(), &questions).map_err(|e| match e {
        PromptError::OptionsDoNotFit { .. } => RequestError::new(422, e.to_string()),
        PromptError::Tokenizer(_) => {
            tracing::error!(error = %e, "tokenizer failed");
            RequestError::inference_failed()
        }
    })?;
    Ok(PreparedDecision {
        routing,
        questions,
        rows,
    })
}

/// The response object for a prepared request and the model's outputs (one per row, same order),
/// with upstream's keys in upstream's order.
pub fn respond(
    prepared: &PreparedDecision,
    checkpoint: &Checkpoint,
    outputs: &[RowOutput],
) -> Result<Value, RequestError> {
    if outputs.len() != prepared.rows.len() {
        tracing::error!(
            rows = prepared.rows.len(),
            outputs = outputs.len(),
            "model returned the wrong number of rows"
        );
        return Err(RequestError::inference_failed());
    }
    let mut answers = Map::new();
    for ((question, row), output) in prepared.questions.iter().zip(&prepared.rows).zip(outputs) {
        if output.logits.len() != row.markers.len() {
            tracing::error!(question = %question.id, markers = row.markers.len(), logits = output.logits.len(), "logit count does not match the row");
            return Err(RequestError::inference_failed());
        }
        answers.insert(
            question.id.clone(),
            answer(
                question,
                &output.logits,
                output.act_probability,
                &checkpoint.agent.temperatures,
            ),
        );
    }
    let mut usage = Map::new();
    usage.insert("input_tokens".to_owned(), Value::from(input_tokens(&prepared.rows)));
    usage.insert("output_tokens".to_owned(), Value::from(0));
    let mut body = Map::new();
    body.insert("model".to_owned(), Value::from("laya-rl-agent"));
    body.insert("answers".to_owned(), Value::Object(answers));
    body.insert("usage".to_owned(), Value::Object(usage));
    body.insert("routing".to_owned(), prepared.routing.to_json());
    Ok(Value::Object(body))
}
