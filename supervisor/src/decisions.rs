//! One decision, from an admitted JSON body to the answer text: parse, route and tokenize off the
//! async reactor, run the rows on the backend within the request's deadline, then render the
//! answers byte for byte as upstream does. Knows nothing of HTTP; its errors say what went wrong
//! and `http::response` turns them into answers.
//!
//! Preparation is CPU and memory work proportional to the body (at most `server.max_body_bytes`;
//! tokenization is bounded by what a row can hold): at most one request per core prepares at once,
//! the others wait for a turn within their deadline.
//!
//! A batch (`POST /v1/systemone/batch`) is prepared in one turn, then each state's rows are their
//! own job, all submitted at once so the scheduler spreads them over pools and workers like any
//! other requests; the batch has one deadline, fails as a whole on the first job refused, and its
//! results are rendered in request order.
//!
//! Tournament mode (`[compat] tournament_group`, upstream 0.4.15's `LAYA_TOURNAMENT_GROUP`) drives
//! `laya::tournament`'s pure steps here: each elimination round is one request of group questions,
//! prepared and run as a job like any other, then the final call; all within the one deadline. A
//! batch plays one tournament per state, all at once.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use laya::batch::{BatchRequest, parse_batch_body_in, render_batch};
use laya::checkpoint::Checkpoint;
use laya::decision::{
    DecisionOptions, PreparedDecision, RowOutput, prepare_in, prepare_routed, project, respond, respond_unprojected,
    route_request,
};
use laya::output::OutputProfile;
use laya::python_text::{Separators, py_json};
use laya::request::{DecisionRequest, RequestError, parse_body_in};
use laya::routing::CheckpointName;
use laya::routing::RoutingDecision;
use laya::tournament::{self, Tournament};
use serde_json::{Map, Value, json};
use tokio::sync::Semaphore;

use crate::backend::{Backend, BackendError, Job, JobOutput};
use crate::checkpoints::{Checkpoints, ServedCheckpoints};
use crate::live::LiveSettings;
use crate::status::JobClass;

/// Where the time of one decision went (the `Server-Timing` header and the histograms).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Timings {
    /// Host work before the worker: decoding, parsing, routing, validation, tokenization.
    pub prepare: Option<Duration>,
    /// Waiting for a worker.
    pub queue: Option<Duration>,
    /// The worker's forward pass.
    pub device: Option<Duration>,
    /// The job's class (question count and length band): the queue wait is recorded under it.
    pub class: Option<JobClass>,
    /// From preparing to the rendered answer: 0.4.x reports it on every 200 as
    /// `Server-Timing: inference;dur=…` and `X-Inference-Time-Ms`.
    pub inference: Option<Duration>,
}

/// Why a decision produced no answer.
#[derive(Debug, thiserror::Error)]
pub enum DecisionError {
    /// The request is not one upstream would answer (its status and detail, as upstream's).
    #[error("{}", .0.detail)]
    Request(#[from] RequestError),
    /// The backend did not run it (busy, deadline, no capable or ready pool, worker failure).
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// A bug: preparing the request panicked, or a routed checkpoint is not open.
    #[error("{0}")]
    Internal(String),
}

/// The outcome of one decision, with what is known about it even when it failed.
#[derive(Debug)]
pub struct Outcome {
    /// The answer's JSON text, or why there is none.
    pub result: Result<String, DecisionError>,
    /// The checkpoint it was routed to, once routing happened.
    pub checkpoint: Option<CheckpointName>,
    /// The pool that ran it, once one did.
    pub pool: Option<String>,
    /// Where the time went.
    pub timings: Timings,
}

/// The outcome of one batch.
#[derive(Debug)]
pub struct BatchOutcome {
    /// The answer's JSON text, or why there is none.
    pub result: Result<String, DecisionError>,
    /// How many states it carried, once parsed.
    pub states: usize,
    /// Where the time went: `queue` is the longest wait of its jobs, `device` their summed device
    /// time.
    pub timings: Timings,
    /// Each job's pool, class, queue wait and device time, for the per-pool histograms.
    pub jobs: Vec<(String, JobClass, Duration, Duration)>,
}

/// Turns admitted bodies into answers.
#[derive(Clone)]
pub struct Decisions {
    /// The served set; each request is prepared and answered with the set current when it began.
    checkpoints: Arc<ServedCheckpoints>,
    backend: Arc<dyn Backend>,
    options: DecisionOptions,
    request_timeout: Duration,
    live: Arc<LiveSettings>,
    /// Turns to prepare a request: one per core.
    preparing: Arc<Semaphore>,
}

/// How many requests prepare at once: the cores (parsing and tokenizing use one each).
fn preparation_turns() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get())
}

impl Decisions {
    /// Decisions answered with these checkpoints and this backend, each within `request_timeout`.
    pub fn new(
        checkpoints: Arc<ServedCheckpoints>,
        backend: Arc<dyn Backend>,
        options: DecisionOptions,
        request_timeout: Duration,
        live: Arc<LiveSettings>,
    ) -> Self {
        Self {
            checkpoints,
            backend,
            options,
            request_timeout,
            live,
            preparing: Arc::new(Semaphore::new(preparation_turns())),
        }
    }

    /// The upstream release these decisions answer like.
    pub fn upstream(&self) -> laya::upstream::Upstream {
        self.options.upstream
    }

    /// Answers the request whose (decoded) body is `json`. `prepare_started` is when host work on it
    /// began (its body's decoding), so that the prepare timing covers all of it.
    pub async fn answer(&self, json: Bytes, prepare_started: Instant, request_id: &str) -> Outcome {
        let deadline = prepare_started + self.request_timeout;
        let mut outcome = Outcome {
            result: Err(DecisionError::Internal("not prepared".to_owned())),
            checkpoint: None,
            pool: None,
            timings: Timings::default(),
        };
        let checkpoints = self.checkpoints.current();
        let set = Arc::clone(&checkpoints);
        let options = self.options;
        let prepared = self
            .prepare_off_reactor(deadline, request_id, move || {
                let request = parse_body_in(&json, options.upstream, options.output, options.limits, set.registry())?;
                if let Some(tournament) = plan_tournament(&request.questions, options)? {
                    return Ok(Err((request, tournament)));
                }
                prepare_in(&request, |name| set.get(name), options, set.registry()).map(Ok)
            })
            .await;
        outcome.timings.prepare = Some(prepare_started.elapsed());
        let prepared = match prepared {
            Ok(prepared) => prepared,
            Err(e) => {
                outcome.result = Err(e);
                return outcome;
            }
        };
        match prepared {
            Ok(prepared) => {
                outcome.checkpoint = Some(prepared.checkpoint());
                outcome.result = self
                    .run(&prepared, &checkpoints, request_id, deadline, &mut outcome)
                    .await;
            }
            Err((request, tournament)) => {
                let played = self.play(request, tournament, request_id, deadline).await;
                outcome.result = played.map(|played| {
                    outcome.checkpoint = played.checkpoint;
                    if let Some(last) = &played.last {
                        outcome.pool = Some(last.answer.pool.clone());
                    }
                    let timings = &mut outcome.timings;
                    for (_, class, queue, device) in &played.jobs {
                        timings.class = Some(*class);
                        timings.queue = Some(timings.queue.unwrap_or_default() + *queue);
                        timings.device = Some(timings.device.unwrap_or_default() + *device);
                    }
                    py_json(&played.body, Separators::Compact)
                });
            }
        }
        if outcome.result.is_ok() && options.upstream.differences().inference_timing {
            outcome.timings.inference = Some(prepare_started.elapsed());
        }
        outcome
    }

    /// Runs `work` (JSON parsing and tokenizing: CPU work) off the reactor in one of the
    /// preparation turns, waiting for a turn no later than `deadline`.
    async fn prepare_off_reactor<T, E>(
        &self,
        deadline: Instant,
        request_id: &str,
        work: impl FnOnce() -> Result<T, E> + Send + 'static,
    ) -> Result<T, DecisionError>
    where
        T: Send + 'static,
        E: Into<DecisionError> + Send + 'static,
    {
        let turn = tokio::time::timeout_at(
            tokio::time::Instant::from_std(deadline),
            Arc::clone(&self.preparing).acquire_owned(),
        )
        .await
        .map_err(|_| BackendError::DeadlineExpired)?
        .map_err(|_| BackendError::DeadlineExpired)?;
        let prepared = tokio::task::spawn_blocking(move || {
            let _turn = turn;
            work()
        })
        .await;
        match prepared {
            Ok(result) => result.map_err(Into::into),
            Err(join) => {
                tracing::error!(request_id, error = %join, "preparing the request panicked");
                Err(DecisionError::Internal(format!(
                    "preparing the request panicked: {join}"
                )))
            }
        }
    }

    /// Answers a batch whose (decoded) body is `json` (upstream 0.4.15's route; the caller refuses
    /// it under 0.3.20). One deadline for the whole batch, from `prepare_started`.
    pub async fn answer_batch(&self, json: Bytes, prepare_started: Instant, request_id: &str) -> BatchOutcome {
        let deadline = prepare_started + self.request_timeout;
        let mut outcome = BatchOutcome {
            result: Err(DecisionError::Internal("not prepared".to_owned())),
            states: 0,
            timings: Timings::default(),
            jobs: Vec::new(),
        };
        let checkpoints = self.checkpoints.current();
        let set = Arc::clone(&checkpoints);
        let options = self.options;
        let prepared = self
            .prepare_off_reactor(deadline, request_id, move || {
                let batch = parse_batch_body_in(&json, options.output, options.limits, set.registry())?;
                // A batch shares one question set, so whether it is narrowed is decided once.
                if let Some(tournament) = plan_tournament(&batch.questions, options)? {
                    return Ok(Err((batch, tournament)));
                }
                prepare_batch(&batch, &set, options).map(Ok)
            })
            .await;
        outcome.timings.prepare = Some(prepare_started.elapsed());
        let prepared = match prepared {
            Ok(prepared) => prepared,
            Err(e) => {
                outcome.result = Err(e);
                return outcome;
            }
        };
        outcome.result = match prepared {
            Ok(prepared) => {
                outcome.states = prepared.len();
                self.run_batch(&prepared, &checkpoints, request_id, deadline, &mut outcome)
                    .await
            }
            Err((batch, tournament)) => {
                outcome.states = batch.states.len();
                self.play_batch(&batch, &tournament, request_id, deadline, &mut outcome)
                    .await
            }
        };
        if outcome.result.is_ok() {
            outcome.timings.inference = Some(prepare_started.elapsed());
        }
        outcome
    }

    /// Submits every state's rows as its own job at once, waits for all of them by `deadline`
    /// (the first refusal or failure ends the batch and withdraws the rest), and renders the
    /// results in request order.
    async fn run_batch(
        &self,
        prepared: &[PreparedDecision],
        checkpoints: &Checkpoints,
        request_id: &str,
        deadline: Instant,
        outcome: &mut BatchOutcome,
    ) -> Result<String, DecisionError> {
        let runs = prepared
            .iter()
            .enumerate()
            .map(|(i, p)| self.run_job(p, checkpoints, format!("{request_id}/{i}"), deadline));
        let ran = all_in_order(runs).await?;
        let mut results = Vec::with_capacity(prepared.len());
        for (p, ran) in prepared.iter().zip(ran) {
            if let Some((output, class)) = &ran.output {
                let answer = &output.answer;
                outcome
                    .jobs
                    .push((answer.pool.clone(), *class, answer.queue_wait, answer.device_time));
                let timings = &mut outcome.timings;
                timings.queue = Some(timings.queue.map_or(answer.queue_wait, |q| q.max(answer.queue_wait)));
                timings.device = Some(timings.device.unwrap_or_default() + answer.device_time);
            }
            let mut body = respond(p, ran.checkpoint, ran.outputs())?;
            self.add_diagnostics(&mut body, p.output, ran.output.as_ref().map(|(o, _)| o));
            results.push(body);
        }
        Ok(render_batch(results))
    }

    /// One tournament per state, all at once (upstream plays them one after the other; the
    /// answers are the same), rendered in request order; the first failure in request order ends the
    /// batch.
    async fn play_batch(
        &self,
        batch: &BatchRequest,
        tournament: &Tournament,
        request_id: &str,
        deadline: Instant,
        outcome: &mut BatchOutcome,
    ) -> Result<String, DecisionError> {
        let plays = (0..batch.states.len()).filter_map(|i| {
            let request = batch.request(i)?;
            Some(self.play(request, tournament.clone(), format!("{request_id}/{i}"), deadline))
        });
        let played = all_in_order(plays).await?;
        let mut results = Vec::with_capacity(played.len());
        for play in played {
            for (pool, class, queue, device) in play.jobs {
                let timings = &mut outcome.timings;
                timings.queue = Some(timings.queue.map_or(queue, |q| q.max(queue)));
                timings.device = Some(timings.device.unwrap_or_default() + device);
                outcome.jobs.push((pool, class, queue, device));
            }
            results.push(play.body);
        }
        Ok(render_batch(results))
    }

    /// Answers `request` by elimination: each round of `tournament` is a request of group
    /// questions, prepared and run as a job; then the final call, whose body takes the rounds'
    /// results (`Tournament::merge`) before the output profile.
    async fn play(
        &self,
        request: DecisionRequest,
        mut tournament: Tournament,
        request_id: impl AsRef<str>,
        deadline: Instant,
    ) -> Result<Played, DecisionError> {
        let request_id = request_id.as_ref();
        let mut played = Played {
            body: Value::Null,
            checkpoint: None,
            jobs: Vec::new(),
            last: None,
        };
        let mut input_tokens = 0;
        let mut round_number = 0;
        while let Some(round) = tournament.next_round() {
            let call = DecisionRequest {
                questions: round.questions.clone(),
                ..request.clone()
            };
            let id = format!("{request_id}/round{round_number}");
            let (body, _) = self.call(call, &id, deadline, &mut played).await?;
            input_tokens += input_tokens_of(&body);
            let answers = body
                .get("answers")
                .and_then(Value::as_object)
                .cloned()
                .unwrap_or_default();
            tournament.advance(&round, &answers)?;
            round_number += 1;
        }
        let call = DecisionRequest {
            questions: tournament.final_questions(),
            ..request
        };
        let (body, output) = self.call(call, request_id, deadline, &mut played).await?;
        input_tokens += input_tokens_of(&body);
        let mut body = project(self.options.output, tournament.merge(body, input_tokens, true));
        self.add_diagnostics(&mut body, self.options.output, output.as_ref());
        played.body = body;
        played.last = output;
        Ok(played)
    }

    /// One call of a tournament: `request` prepared off the reactor (in a preparation turn), its
    /// rows run as a job by `deadline`, its unprojected body.
    async fn call(
        &self,
        request: DecisionRequest,
        request_id: &str,
        deadline: Instant,
        played: &mut Played,
    ) -> Result<(Map<String, Value>, Option<JobOutput>), DecisionError> {
        let checkpoints = self.checkpoints.current();
        let set = Arc::clone(&checkpoints);
        let options = self.options;
        let prepared = self
            .prepare_off_reactor(deadline, request_id, move || {
                prepare_in(&request, |name| set.get(name), options, set.registry())
            })
            .await?;
        played.checkpoint = Some(prepared.checkpoint());
        let ran = self.run_job(&prepared, &checkpoints, request_id, deadline).await?;
        if let Some((output, class)) = &ran.output {
            let answer = &output.answer;
            played
                .jobs
                .push((answer.pool.clone(), *class, answer.queue_wait, answer.device_time));
        }
        let body = respond_unprojected(&prepared, ran.checkpoint, ran.outputs())?;
        Ok((body, ran.output.map(|(output, _)| output)))
    }

    /// The job-running step every answer shares: the checkpoint `prepared` was routed to (open,
    /// else a bug), and its rows run on the backend as job `request_id` by `deadline`, the
    /// request's one deadline. No rows, no job: upstream answers an empty `questions` without a
    /// forward pass.
    async fn run_job<'c>(
        &self,
        prepared: &PreparedDecision,
        checkpoints: &'c Checkpoints,
        request_id: impl AsRef<str>,
        deadline: Instant,
    ) -> Result<Ran<'c>, DecisionError> {
        let request_id = request_id.as_ref();
        let checkpoint = checkpoints.get(prepared.checkpoint()).ok_or_else(|| {
            DecisionError::Internal(format!(
                "checkpoint '{}' was routed to but is not open",
                prepared.checkpoint().as_str()
            ))
        })?;
        if prepared.rows.is_empty() {
            return Ok(Ran {
                checkpoint,
                output: None,
            });
        }
        let job = Job {
            request_id: request_id.to_owned(),
            checkpoint: prepared.checkpoint(),
            rows: Arc::clone(&prepared.rows),
            deadline,
        };
        let class = job.class();
        let output = self.run_by_deadline(job, request_id, deadline).await?;
        Ok(Ran {
            checkpoint,
            output: Some((output, class)),
        })
    }

    /// Adds the `x_layad` block of `output` (where the job ran, why, where its time went) to
    /// `body`, when diagnostics are on and `profile` keeps keys the contract does not define: a
    /// strict Jev client rejects those, so `jev-strict` and `jev` answers carry no `x_layad`
    /// whatever `server.diagnostics` says.
    fn add_diagnostics(&self, body: &mut Value, profile: OutputProfile, output: Option<&JobOutput>) {
        if self.live.diagnostics()
            && profile.keeps_extra_keys()
            && let (Some(output), Some(object)) = (output, body.as_object_mut())
        {
            object.insert("x_layad".to_owned(), diagnostics_block(output));
        }
    }

    /// Runs `job` on the backend by `deadline`, the request's one deadline: when it passes,
    /// dropping the run withdraws the job from whatever queue holds it.
    async fn run_by_deadline(&self, job: Job, request_id: &str, deadline: Instant) -> Result<JobOutput, DecisionError> {
        let run = self.backend.run(job);
        match tokio::time::timeout_at(tokio::time::Instant::from_std(deadline), run).await {
            Ok(Ok(output)) => Ok(output),
            Ok(Err(e)) => {
                if let BackendError::Failed(reason) | BackendError::Lost(reason) = &e {
                    tracing::error!(request_id, %reason, "inference failed");
                }
                Err(e.into())
            }
            Err(_) => Err(BackendError::DeadlineExpired.into()),
        }
    }

    /// Runs the rows (if any) by `deadline` and renders the answer.
    async fn run(
        &self,
        prepared: &PreparedDecision,
        checkpoints: &Checkpoints,
        request_id: &str,
        deadline: Instant,
        outcome: &mut Outcome,
    ) -> Result<String, DecisionError> {
        let ran = self.run_job(prepared, checkpoints, request_id, deadline).await?;
        if let Some((output, class)) = &ran.output {
            outcome.timings.class = Some(*class);
            outcome.pool = Some(output.answer.pool.clone());
            outcome.timings.queue = Some(output.answer.queue_wait);
            outcome.timings.device = Some(output.answer.device_time);
        }
        let mut body = respond(prepared, ran.checkpoint, ran.outputs())?;
        self.add_diagnostics(&mut body, prepared.output, ran.output.as_ref().map(|(o, _)| o));
        Ok(py_json(&body, Separators::Compact))
    }
}

/// One job's run ([`Decisions::run_job`]): the open checkpoint it was routed to and, when it had
/// rows, the backend's output and the job's class.
struct Ran<'c> {
    checkpoint: &'c Checkpoint,
    output: Option<(JobOutput, JobClass)>,
}

impl Ran<'_> {
    /// One output per row (none without rows).
    fn outputs(&self) -> &[RowOutput] {
        self.output.as_ref().map_or(&[], |(o, _)| &o.answer.outputs)
    }
}

/// What a tournament produced: the answer body (in the output profile), the final call's
/// checkpoint and job, and every job's pool, class, queue wait and device time.
struct Played {
    body: Value,
    checkpoint: Option<CheckpointName>,
    jobs: Vec<(String, JobClass, Duration, Duration)>,
    last: Option<JobOutput>,
}

/// The tournament `questions` play under `options`, if any: only 0.4.x answers by elimination.
fn plan_tournament(
    questions: &Map<String, Value>,
    options: DecisionOptions,
) -> Result<Option<Tournament>, RequestError> {
    if !options.upstream.differences().tournaments || options.tournament_group == 0 {
        return Ok(None);
    }
    tournament::plan(questions, options.tournament_group)
}

/// One call's `usage.input_tokens` (0 when absent).
fn input_tokens_of(body: &Map<String, Value>) -> u64 {
    body.get("usage")
        .and_then(|u| u.get("input_tokens"))
        .and_then(Value::as_u64)
        .unwrap_or(0)
}

/// Every state of a batch routed (in order: routing refusals come first, as upstream routes the
/// whole batch before it validates questions), then validated and tokenized.
fn prepare_batch(
    batch: &BatchRequest,
    checkpoints: &Checkpoints,
    options: DecisionOptions,
) -> Result<Vec<PreparedDecision>, RequestError> {
    let requests: Vec<_> = (0..batch.states.len()).filter_map(|i| batch.request(i)).collect();
    let routes: Vec<RoutingDecision> = requests
        .iter()
        .map(|r| route_request(r, options, checkpoints.registry()))
        .collect::<Result<_, _>>()?;
    requests
        .iter()
        .zip(routes)
        .map(|(r, routing)| prepare_routed(r, routing, |name| checkpoints.get(name), options))
        .collect()
}

/// The `x_layad` object: where the job ran, why there, and where its time went.
fn diagnostics_block(output: &JobOutput) -> Value {
    // Three decimals of a millisecond: enough to compare, short enough to read.
    let ms = |d: Duration| (d.as_secs_f64() * 1e6).round() / 1e3;
    let answer = &output.answer;
    json!({
        "pool": answer.pool,
        "worker": answer.worker,
        "device": answer.device,
        "route": output.route.as_str(),
        "reason": output.reason,
        "queue_ms": ms(answer.queue_wait),
        "device_ms": ms(answer.device_time),
        "batch_rows": answer.batch_rows,
    })
}

/// Runs `futures` at once and returns their outputs in order, or, as soon as every earlier one has
/// finished, the error of the first one *in order* that failed: the error a batch reports is the
/// one upstream, which answers the states one after the other, would report, whatever finished
/// first. Returning early drops the rest, which withdraws their jobs.
async fn all_in_order<T, E, F>(futures: impl IntoIterator<Item = F>) -> Result<Vec<T>, E>
where
    F: std::future::Future<Output = Result<T, E>>,
{
    use futures::stream::{FuturesUnordered, StreamExt};
    let mut pending: FuturesUnordered<_> = futures
        .into_iter()
        .enumerate()
        .map(|(i, future)| async move { (i, future.await) })
        .collect();
    let mut slots: Vec<Option<Result<T, E>>> = (0..pending.len()).map(|_| None).collect();
    // Every slot before `settled` holds an output.
    let mut settled = 0;
    while let Some((i, result)) = pending.next().await {
        slots[i] = Some(result);
        while let Some(slot) = slots.get_mut(settled) {
            match slot {
                None => break,
                Some(Ok(_)) => settled += 1,
                Some(Err(_)) => {
                    if let Some(Err(e)) = slot.take() {
                        return Err(e);
                    }
                }
            }
        }
    }
    slots.into_iter().flatten().collect()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::all_in_order;

    async fn after(ms: u64, result: Result<u32, &'static str>) -> Result<u32, &'static str> {
        tokio::time::sleep(Duration::from_millis(ms)).await;
        result
    }

    #[tokio::test]
    async fn outputs_come_in_order_whatever_finishes_first() {
        let futures = vec![after(30, Ok(0)), after(0, Ok(1)), after(10, Ok(2))];
        assert_eq!(all_in_order(futures).await, Ok(vec![0, 1, 2]));
    }

    #[tokio::test]
    async fn the_first_error_in_order_wins_over_an_earlier_finished_one() {
        let futures = vec![after(0, Ok(0)), after(30, Err("second")), after(0, Err("third"))];
        assert_eq!(all_in_order(futures).await, Err("second"));
    }

    #[tokio::test]
    async fn an_error_returns_without_waiting_for_later_ones() {
        let started = std::time::Instant::now();
        let futures = vec![after(0, Err("first")), after(5_000, Ok(1))];
        assert_eq!(all_in_order(futures).await, Err("first"));
        assert!(started.elapsed() < Duration::from_secs(4));
    }
}
