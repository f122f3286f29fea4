//! One decision request end to end on the host, in upstream's order: route, validate, build rows;
//! then, once a worker has produced logits, the answers and the response body.
//!
//! The two halves are separate so the supervisor can schedule the forward pass in between.

use std::sync::Arc;

use serde_json::{Map, Value};

use crate::answer::{answer_in, temperature_bucket};
use crate::checkpoint::Checkpoint;
use crate::error::RequestError;
use crate::jev::jev_confidence;
use crate::output::OutputProfile;
use crate::prompt::{PromptError, Row, RowLimits, RowStats, build_rows, input_tokens};
use crate::python_text::{float_value, round4};
use crate::question::{Question, QuestionType, parse_questions_in};
use crate::request::{DecisionRequest, MinConfidence, RequestLimits};
use crate::routing::{CheckpointName, Registry, RouteOptions, RouteRequest, RoutingDecision, route};
use crate::upstream::Upstream;

/// Host settings that change decisions.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DecisionOptions {
    /// Whose contract to answer with.
    pub upstream: Upstream,
    /// Upstream's `LAYA_AUTO_TASK`: send requests whose question ids match a typed-decisions
    /// workflow to the typed-decisions checkpoint.
    pub auto_task: bool,
    /// The limits requests are checked against (0.4.x: the token budget, choice options).
    pub limits: RequestLimits,
    /// Upstream's `LAYA_DEFAULT_MODEL`: where states without language evidence go; `None` is the
    /// release's own default.
    pub default_checkpoint: Option<CheckpointName>,
    /// The shape answers leave in (`[compat] output`, upstream's `LAYA_JEV_STRICT`).
    pub output: OutputProfile,
    /// Upstream 0.4.15's `LAYA_TOURNAMENT_GROUP`: choices with more options than this are answered
    /// by elimination (`crate::tournament`); 0 is off.
    pub tournament_group: usize,
}

/// A request that is ready for the model: where it goes and what rows to run.
#[derive(Clone, Debug, PartialEq)]
pub struct PreparedDecision {
    /// The routing decision (also echoed in the response).
    pub routing: RoutingDecision,
    /// The validated questions, in request order.
    pub questions: Vec<Question>,
    /// One row per question, same order. Empty when the request has no questions. Shared, not
    /// copied, with the job that runs them: the token ids are copied once on their way to a
    /// worker, into the forward's message (`supervisor/src/pool/worker_task.rs`).
    pub rows: Arc<[Row]>,
    /// What building each row did (same order), for 0.4.x's `usage`.
    pub stats: Vec<RowStats>,
    /// The abstention threshold the request asked for (0.4.x).
    pub min_confidence: Option<MinConfidence>,
    /// Whose contract the answer follows.
    pub upstream: Upstream,
    /// The shape the answer leaves in.
    pub output: OutputProfile,
}

impl PreparedDecision {
    /// The checkpoint the rows must run on.
    pub fn checkpoint(&self) -> CheckpointName {
        self.routing.checkpoint
    }
}

/// What the model computed for one row: the one output type from every engine to the answer (the
/// workers' engines return it, the socket carries it, the supervisor hands it here unchanged).
#[derive(Clone, Debug, PartialEq)]
pub struct RowOutput {
    /// One logit per marker (the row's real options), float32, before any temperature.
    pub logits: Vec<f32>,
    /// Softmax of the act head, as the model computed it (length `n_act`).
    pub act_probabilities: Vec<f32>,
}

impl RowOutput {
    /// Upstream's `act_probability`: component 0 of the act head's softmax. NaN when the engine
    /// returned no act head (the worker contract refuses such an answer before it gets here).
    pub fn act_probability(&self) -> f32 {
        self.act_probabilities.first().copied().unwrap_or(f32::NAN)
    }
}

/// Routes the request and builds its rows with the chosen checkpoint's tokenizer.
/// `checkpoints` yields the opened checkpoint for a name, or `None` if it is not served.
pub fn prepare<'a>(
    request: &DecisionRequest,
    checkpoints: impl Fn(CheckpointName) -> Option<&'a Checkpoint>,
    options: DecisionOptions,
) -> Result<PreparedDecision, RequestError> {
    prepare_in(request, checkpoints, options, Registry::builtin_only())
}

/// [`prepare`] on a server that registered checkpoints of its own (`registry`).
pub fn prepare_in<'a>(
    request: &DecisionRequest,
    checkpoints: impl Fn(CheckpointName) -> Option<&'a Checkpoint>,
    options: DecisionOptions,
    registry: &Registry,
) -> Result<PreparedDecision, RequestError> {
    let routing = route_request(request, options, registry)?;
    prepare_routed(request, routing, checkpoints, options)
}

/// Where the request goes (routing's refusals: an unservable `model`, an unknown `task`). The batch
/// route routes every state before it validates questions, as upstream's `predict_batch` does.
pub fn route_request(
    request: &DecisionRequest,
    options: DecisionOptions,
    registry: &Registry,
) -> Result<RoutingDecision, RequestError> {
    let ids: Vec<&str> = request.questions.keys().map(String::as_str).collect();
    let route_options = RouteOptions {
        upstream: options.upstream,
        auto_task: options.auto_task,
        default_checkpoint: options.default_checkpoint,
        registry,
    };
    let controls = &request.controls;
    let route_request = RouteRequest {
        model: request.model,
        task: controls.task.as_ref(),
        lang: controls.lang.as_deref(),
        lang_guess: controls.lang_guess.as_deref(),
    };
    route(request.state.as_ref(), &ids, &route_request, &route_options).map_err(RequestError::from_route)
}

/// The refusal of a request routed to a checkpoint this server's configuration does not serve (it
/// is `"off"`): 501, since serving it is not something this server does, and no `Retry-After`,
/// since asking again cannot help until an operator changes the configuration. A checkpoint that is
/// served but whose workers are not loaded yet is never refused here: it is served on demand.
pub fn not_served(checkpoint: CheckpointName) -> RequestError {
    RequestError::new(
        501,
        format!(
            "checkpoint '{}' is turned off in this server's configuration; requests routed to it are refused \
             until an operator serves it (retrying will not help)",
            checkpoint.as_str()
        ),
    )
    // Under the `jev` profile, what Jev answers for a model it does not serve.
    .refused(crate::jev::UNKNOWN_MODEL_ERROR)
}

/// Validates the questions and builds the rows of a request already routed to `routing`.
pub fn prepare_routed<'a>(
    request: &DecisionRequest,
    routing: RoutingDecision,
    checkpoints: impl Fn(CheckpointName) -> Option<&'a Checkpoint>,
    options: DecisionOptions,
) -> Result<PreparedDecision, RequestError> {
    let checkpoint = checkpoints(routing.checkpoint).ok_or_else(|| not_served(routing.checkpoint))?;
    let upstream = options.upstream;
    let mut prepared = PreparedDecision {
        routing,
        questions: Vec::new(),
        rows: Arc::new([]),
        stats: Vec::new(),
        min_confidence: request.controls.min_confidence.clone(),
        upstream,
        output: options.output,
    };
    if request.questions.is_empty() {
        return Ok(prepared);
    }
    prepared.questions = parse_questions_in(&request.questions, upstream, options.output)
        .map_err(|e| RequestError::new(422, e.0).at(&["questions"], "value_error"))?;
    let limits = RowLimits {
        max_len: request.controls.max_len.unwrap_or(checkpoint.agent.max_len),
        head_max_len: request.controls.head_max_len.unwrap_or(checkpoint.agent.head_max_len),
    };
    let built = build_rows(
        &checkpoint.tokenizer,
        limits,
        request.state.as_ref(),
        &prepared.questions,
        upstream,
    )
    .map_err(|e| match e {
        PromptError::OptionsDoNotFit { .. } => RequestError::new(422, e.to_string()),
        PromptError::Tokenizer(_) => {
            tracing::error!(error = %e, "tokenizer failed");
            RequestError::inference_failed()
        }
    })?;
    prepared.rows = built.rows.into();
    prepared.stats = built.stats;
    Ok(prepared)
}

/// The response object for a prepared request and the model's outputs (one per row, same order),
/// with upstream's keys in upstream's order; under `jev-strict` and `jev`, their projection of it.
pub fn respond(
    prepared: &PreparedDecision,
    checkpoint: &Checkpoint,
    outputs: &[RowOutput],
) -> Result<Value, RequestError> {
    Ok(project(
        prepared.output,
        respond_unprojected(prepared, checkpoint, outputs)?,
    ))
}

/// The answer body in the given profile: the `laya` body as is, or its projection.
pub fn project(output: OutputProfile, body: Map<String, Value>) -> Value {
    Value::Object(output.project(body))
}

/// The response object before the output profile (the tournament merges its rounds into it).
pub fn respond_unprojected(
    prepared: &PreparedDecision,
    checkpoint: &Checkpoint,
    outputs: &[RowOutput],
) -> Result<Map<String, Value>, RequestError> {
    if outputs.len() != prepared.rows.len() {
        tracing::error!(
            rows = prepared.rows.len(),
            outputs = outputs.len(),
            "model returned the wrong number of rows"
        );
        return Err(RequestError::inference_failed());
    }
    let mut answers = Map::new();
    for ((question, row), output) in prepared.questions.iter().zip(prepared.rows.iter()).zip(outputs) {
        if output.logits.len() != row.markers.len() {
            tracing::error!(question = %question.id, markers = row.markers.len(), logits = output.logits.len(), "logit count does not match the row");
            return Err(RequestError::inference_failed());
        }
        let mut answer = answer_in(
            question,
            &output.logits,
            output.act_probability(),
            &checkpoint.agent.temperatures,
            prepared.upstream,
            prepared.output.precision(),
        );
        if let Value::Object(fields) = &mut answer {
            if let Some(threshold) = &prepared.min_confidence {
                gate(fields, threshold);
            }
            if prepared.upstream.differences().x_jev_confidence
                && let Some(jev) = jev_confidence(fields)
            {
                fields.insert("x_jev_confidence".to_owned(), float_value(round4(jev)));
            }
        }
        answers.insert(question.id.clone(), answer);
    }
    let mut body = Map::new();
    body.insert("model".to_owned(), Value::from("laya-rl-agent"));
    body.insert("answers".to_owned(), Value::Object(answers));
    body.insert("usage".to_owned(), Value::Object(usage(prepared)));
    body.insert("routing".to_owned(), prepared.routing.to_json());
    Ok(body)
}

/// The `usage` object: 0.3.20's two counts; 0.4.x adds what the rows kept of the state and, when
/// the head budget made options indistinguishable, which questions that happened to.
fn usage(prepared: &PreparedDecision) -> Map<String, Value> {
    let mut usage = Map::new();
    usage.insert("input_tokens".to_owned(), Value::from(input_tokens(&prepared.rows)));
    usage.insert("output_tokens".to_owned(), Value::from(0));
    if !prepared.upstream.differences().usage_details || prepared.stats.is_empty() {
        return usage;
    }
    let dropped = prepared.stats.iter().map(|s| s.state_tokens_dropped).max().unwrap_or(0);
    usage.insert("state_tokens".to_owned(), Value::from(prepared.stats[0].state_tokens));
    usage.insert("state_tokens_dropped".to_owned(), Value::from(dropped));
    usage.insert("truncated".to_owned(), Value::from(dropped > 0));
    let truncated: Vec<Value> = prepared
        .questions
        .iter()
        .zip(&prepared.stats)
        .filter(|(_, s)| s.state_tokens_dropped > 0)
        .map(|(q, _)| Value::from(q.id.clone()))
        .collect();
    usage.insert("truncated_questions".to_owned(), Value::Array(truncated));
    let collapsed: Map<String, Value> = prepared
        .questions
        .iter()
        .zip(&prepared.stats)
        .filter(|(_, s)| s.options_distinct < s.options)
        .map(|(q, s)| {
            let entry = Map::from_iter([
                ("total".to_owned(), Value::from(s.options)),
                ("distinct".to_owned(), Value::from(s.options_distinct)),
                (
                    "tokens_per_option".to_owned(),
                    s.tokens_per_option.map_or(Value::Null, Value::from),
                ),
            ]);
            (q.id.clone(), Value::Object(entry))
        })
        .collect();
    if !collapsed.is_empty() {
        usage.insert("options".to_owned(), Value::Object(collapsed));
    }
    usage
}

/// 0.4.x's abstention gate on one answer (`apply_confidence_gate`): `low_confidence` when its
/// `answer_confidence` is below the threshold of its bucket, then `abstention` and the threshold.
fn gate(answer: &mut Map<String, Value>, threshold: &MinConfidence) {
    let qtype = match answer.get("type").and_then(Value::as_str) {
        Some("choice") => QuestionType::Choice,
        Some("score") => QuestionType::Score,
        _ => QuestionType::Noul,
    };
    let k = answer
        .get("probabilities")
        .and_then(Value::as_object)
        .map_or(2, Map::len);
    let threshold = threshold.threshold(&temperature_bucket(qtype, k));
    let confidence = answer.get("answer_confidence").and_then(Value::as_f64);
    let state = match confidence {
        None => "unevaluated",
        Some(c) if c < threshold => {
            answer.insert("low_confidence".to_owned(), Value::Bool(true));
            "abstained"
        }
        Some(_) => "passed",
    };
    answer.insert("abstention".to_owned(), Value::from(state));
    answer.insert("abstention_threshold".to_owned(), float_value(threshold));
}
