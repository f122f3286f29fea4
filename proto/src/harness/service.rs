//! The gRPC side of a worker: the generated `Worker` service implemented over the engine thread, with
//! the worker's shared state (status, forwards in flight and served, what Describe reports).

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use futures::Stream;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use super::memory;
use super::options::HarnessOptions;
use super::runner::{EngineRunner, RunError, Started, status_of};
use crate::engine::EngineError;
use crate::pb::{self, PROTOCOL_VERSION};
use crate::rows::ForwardLimits;

/// State shared by every request handler and the harness.
pub(crate) struct Shared {
    /// Current state; Watch streams follow it.
    status: watch::Sender<pb::WorkerStatus>,
    /// Forwards accepted and not yet answered; Drain waits for it to reach zero.
    in_flight: watch::Sender<u32>,
    forwards_served: AtomicU64,
    runner: EngineRunner,
    limits: ForwardLimits,
    /// Describe's answer without the parts that change (state, counters, memory).
    info: pb::WorkerInfo,
    /// Cancelled when the worker stops serving: ends Watch streams so the server can shut down.
    pub(crate) stopping: CancellationToken,
}

impl Shared {
    pub(crate) fn new(
        options: &HarnessOptions,
        started: Started,
        device_mismatch: bool,
        runner: EngineRunner,
        status: watch::Sender<pb::WorkerStatus>,
    ) -> Self {
        let engine = &started.info;
        let info = pb::WorkerInfo {
            protocol_version: PROTOCOL_VERSION,
            state: pb::WorkerState::Unspecified as i32,
            pid: std::process::id(),
            worker: options.worker.clone(),
            device: engine.device.clone(),
            requested_device: options.requested_device.clone(),
            device_mismatch,
            dtype: engine.dtype.clone(),
            checkpoints: engine.checkpoints.iter().map(pb::Checkpoint::from).collect(),
            capabilities: Some(pb::Capabilities {
                max_rows: engine.max_rows,
                max_batch_tokens: engine.max_batch_tokens,
                max_len: engine.checkpoints.iter().map(|c| c.max_len).max().unwrap_or(0),
                length_buckets: engine.length_buckets.clone(),
            }),
            warmup: started.warmup,
            memory: None,
            forwards_served: 0,
            forwards_in_flight: 0,
            failure: None,
            parity_gate: pb::ParityGate::from_reports(&engine.parity),
            spawn_nonce: options.spawn_nonce.clone(),
            engine_facts: started.engine_facts,
        };
        Shared {
            status,
            in_flight: watch::channel(0).0,
            forwards_served: AtomicU64::new(0),
            limits: ForwardLimits::from_info(engine),
            runner,
            info,
            stopping: CancellationToken::new(),
        }
    }

    /// Forwards accepted and not yet answered.
    pub(crate) fn in_flight(&self) -> u32 {
        *self.in_flight.borrow()
    }

    /// Forwards answered successfully so far.
    pub(crate) fn forwards_served(&self) -> u64 {
        self.forwards_served.load(Ordering::Relaxed)
    }

    /// Why the engine failed, once it has.
    pub(crate) fn failure(&self) -> Option<String> {
        self.status.borrow().failure.clone()
    }

    /// Counts a forward in flight until the guard drops.
    fn enter(&self) -> InFlightGuard<'_> {
        self.in_flight.send_modify(|n| *n += 1);
        InFlightGuard(&self.in_flight)
    }
}

struct InFlightGuard<'a>(&'a watch::Sender<u32>);

impl Drop for InFlightGuard<'_> {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n -= 1);
    }
}

/// The generated service trait, implemented over [`Shared`].
pub(crate) struct WorkerService {
    shared: Arc<Shared>,
}

impl WorkerService {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        WorkerService { shared }
    }
}

type StatusStream = Pin<Box<dyn Stream<Item = Result<pb::WorkerStatus, Status>> + Send>>;

#[tonic::async_trait]
impl pb::worker_server::Worker for WorkerService {
    async fn describe(&self, _: Request<pb::DescribeRequest>) -> Result<Response<pb::WorkerInfo>, Status> {
        let shared = &self.shared;
        let status = shared.status.borrow().clone();
        Ok(Response::new(pb::WorkerInfo {
            state: status.state,
            failure: status.failure,
            forwards_served: shared.forwards_served(),
            forwards_in_flight: shared.in_flight(),
            memory: Some(memory::current()),
            ..shared.info.clone()
        }))
    }

    async fn forward(&self, request: Request<pb::ForwardRequest>) -> Result<Response<pb::ForwardReply>, Status> {
        // Every line logged for this forward, here and on the engine thread, carries the ids of
        // the supervisor's jobs it runs.
        let request_ids: Vec<&str> = request
            .metadata()
            .get_all(pb::REQUEST_ID_METADATA)
            .iter()
            .filter_map(|id| id.to_str().ok())
            .collect();
        let span = tracing::info_span!("forward", request_id = %request_ids.join(","));
        tracing::Instrument::instrument(self.run_forward(request), span).await
    }

    type WatchStream = StatusStream;

    async fn watch(&self, _: Request<pb::WatchRequest>) -> Result<Response<StatusStream>, Status> {
        let updates = self.shared.status.subscribe();
        let stopping = self.shared.stopping.clone();
        Ok(Response::new(Box::pin(status_stream(updates, stopping))))
    }

    async fn drain(&self, _: Request<pb::DrainRequest>) -> Result<Response<pb::DrainReply>, Status> {
        let shared = &self.shared;
        shared.status.send_if_modified(|status| {
            let ready = status.state() == pb::WorkerState::Ready;
            if ready {
                *status = status_of(pb::WorkerState::Draining, None);
                tracing::info!(state = "draining", "drain requested");
            }
            ready
        });
        let mut in_flight = shared.in_flight.subscribe();
        // The sender lives in `shared`, which outlives this call, so waiting cannot fail.
        let _ = in_flight.wait_for(|&n| n == 0).await;
        Ok(Response::new(pb::DrainReply {
            forwards_served: shared.forwards_served(),
        }))
    }
}

impl WorkerService {
    /// One forward, inside its request ids' span.
    async fn run_forward(&self, request: Request<pb::ForwardRequest>) -> Result<Response<pb::ForwardReply>, Status> {
        let shared = &self.shared;
        // Enter before reading the state: Drain sets the state first and then waits for zero, so a
        // forward either sees `draining` or is counted and waited for.
        let _in_flight = shared.enter();
        let status = shared.status.borrow().clone();
        match status.state() {
            pb::WorkerState::Ready => {}
            pb::WorkerState::Failed => {
                let failure = status.failure.unwrap_or_default();
                return Err(Status::unavailable(format!("worker failed: {failure}")));
            }
            other => return Err(Status::unavailable(format!("worker is {}", other.label()))),
        }
        let request = request.into_inner();
        let checked = pb::decode_rows(request.rows).and_then(|rows| shared.limits.admit(request.checkpoint, rows));
        let forward = match checked {
            Ok(forward) => forward,
            Err(problem) => {
                tracing::warn!(%problem, "forward refused");
                return Err(Status::invalid_argument(problem.to_string()));
            }
        };
        let done = shared.runner.forward(forward).await.map_err(|error| match error {
            RunError::Engine(EngineError::InvalidArgument(message)) => {
                tracing::warn!(problem = %message, "forward refused by the engine");
                Status::invalid_argument(message)
            }
            RunError::Engine(EngineError::Internal(message)) => {
                tracing::error!(error = %message, "forward failed");
                Status::internal(message)
            }
            RunError::Stopped => Status::unavailable("the engine has stopped"),
        })?;
        shared.forwards_served.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(
            rows = done.outputs.len(),
            device_us = done.device.as_micros(),
            queue_us = done.queued.as_micros(),
            "forward answered"
        );
        Ok(Response::new(pb::ForwardReply {
            rows: done.outputs.into_iter().map(pb::RowOutput::from).collect(),
            device_us: done.device.as_micros().try_into().unwrap_or(u64::MAX),
            queue_us: done.queued.as_micros().try_into().unwrap_or(u64::MAX),
        }))
    }
}

/// The current status, then every change; once `stopping` is cancelled it sends the last change (if
/// it has not been sent) and ends, so that open Watch calls do not hold the server open.
fn status_stream(
    updates: watch::Receiver<pb::WorkerStatus>,
    stopping: CancellationToken,
) -> impl Stream<Item = Result<pb::WorkerStatus, Status>> + Send {
    futures::stream::unfold(
        (updates, stopping, true, false),
        |(mut updates, stopping, first, ended)| async move {
            if ended {
                return None;
            }
            if first {
                let current = updates.borrow_and_update().clone();
                return Some((Ok(current), (updates, stopping, false, false)));
            }
            tokio::select! {
                biased;
                changed = updates.changed() => {
                    changed.ok()?;
                    let current = updates.borrow_and_update().clone();
                    Some((Ok(current), (updates, stopping, false, false)))
                }
                () = stopping.cancelled() => {
                    if updates.has_changed().ok()? {
                        let last = updates.borrow_and_update().clone();
                        Some((Ok(last), (updates, stopping, false, true)))
                    } else {
                        None
                    }
                }
            }
        },
    )
}
