//! One task per ready worker: wait for a batch it can run (from its own pool's queue or, when that
//! holds nothing for it, one it would finish sooner from a peer's), send it over gRPC, hand each job
//! its answer, and learn the device time. A job whose worker dies before answering goes back to the
//! queue once (decisions are pure, so a retry is safe).

use std::sync::Arc;
use std::time::{Duration, Instant};

use laya::decision::RowOutput;
use laya::prompt::Row;
use layad_proto::client::ClientError;
use tokio_util::sync::CancellationToken;

use crate::backend::{BackendError, PoolAnswer};
use crate::pool::queue::{Entry, forward_of};
use crate::pool::{AdmittedWorker, Pool};

/// How many times a job may be started on a worker: once, plus one retry after a worker death.
const MAX_ATTEMPTS: u32 = 2;

/// Longest a worker task sleeps without looking at the queue: withdrawn jobs leave it (and its
/// depth in `/health` falls) even when nothing else happens.
const LOOK_AGAIN: Duration = Duration::from_millis(250);

/// Pulls batches for `worker` until `retired` (finish the batch in flight, then stop) or `dead` (the
/// process is gone: the batch in flight goes back to the queue) is cancelled.
pub async fn worker_task(pool: Arc<Pool>, worker: AdmittedWorker, retired: CancellationToken, dead: CancellationToken) {
    let name = format!("{}/{}", pool.name(), worker.index);
    while let Some(batch) = next_batch(&pool, &worker, &retired).await {
        if !run_batch(&pool, &worker, &name, batch, &dead).await {
            // This worker is gone; the process manager restarts it.
            break;
        }
    }
    pool.lock().ready.remove(&worker.index);
    // The jobs this worker would have taken must not wait for it: wake the others.
    pool.notify.notify_waiters();
}

/// Waits for the next batch `worker` can run; `None` once `stop` is cancelled.
async fn next_batch(pool: &Pool, worker: &AdmittedWorker, stop: &CancellationToken) -> Option<Vec<Entry>> {
    let batch_wait = pool.config().batch_wait;
    loop {
        let notified = pool.notify.notified();
        tokio::pin!(notified);
        // Register before looking, so a job queued between the look and the wait still wakes us.
        notified.as_mut().enable();
        let waiting = {
            let mut state = pool.lock();
            // Retired (the process manager is stopping it, or a reload removes it): no new call,
            // whatever is queued. Checked under the lock `Pool::retire` takes.
            if !state.ready.contains_key(&worker.index) {
                return None;
            }
            state.drop_abandoned();
            if let Some(batch) = state.take_batch(worker.index, &worker.checkpoints, &worker.limits, batch_wait) {
                let left_behind = !state.queue.is_empty();
                drop(state);
                if left_behind {
                    // What still waits here starts later now: a peer's idle worker may take it.
                    pool.notify_peers();
                }
                return Some(batch);
            }
            state.batch_wait_left(&worker.checkpoints, batch_wait)
        };
        // Nothing here for this worker: take a peer's job it would finish sooner, if there is one.
        if waiting.is_none()
            && let Some(batch) = pool.take_from_peers(worker)
        {
            return Some(batch);
        }
        // A job waiting for company: look again when its wait is over.
        let wake_after = waiting.map_or(LOOK_AGAIN, |left| left.min(LOOK_AGAIN));
        tokio::select! {
            () = &mut notified => {}
            () = stop.cancelled() => return None,
            () = tokio::time::sleep(wake_after) => {}
        }
    }
}

/// Runs one batch and answers its jobs; false when the worker is lost (its jobs were re-queued or
/// failed) and its task must end.
async fn run_batch(
    pool: &Pool,
    worker: &AdmittedWorker,
    name: &str,
    mut batch: Vec<Entry>,
    dead: &CancellationToken,
) -> bool {
    let checkpoint = batch[0].job.checkpoint;
    let forward = forward_of(&batch);
    // The one copy of the token ids between the tokenizer and the socket: the jobs keep their rows
    // for a retry elsewhere, these move into the forward's message.
    let rows: Vec<Row> = batch.iter().flat_map(|q| q.job.rows.iter().cloned()).collect();
    // The batch was recorded as started (in flight, expected time) when it was taken.
    let started = Instant::now();
    for q in &mut batch {
        q.attempts += 1;
    }
    // The worker logs the forward under its jobs' request ids.
    let request_ids: Vec<&str> = batch.iter().map(|q| q.job.request_id.as_str()).collect();
    let result = tokio::select! {
        result = worker.client.forward_for(checkpoint.as_str(), rows, &request_ids) => result,
        // The process manager saw the worker exit: treat it like a lost connection.
        () = dead.cancelled() => Err(ClientError::Unavailable("worker process exited".to_owned())),
    };
    {
        let mut state = pool.lock();
        state.in_flight -= batch.len();
        state.running.remove(&worker.index);
        if let Ok(answer) = &result {
            state.answered(worker.index, batch.len(), Instant::now());
            let changes = state.model.speed().changes;
            state.model.observe(
                checkpoint,
                forward,
                Duration::from_micros(answer.device_us),
                Instant::now(),
            );
            let speed = state.model.speed();
            if speed.changes != changes {
                // Placement and admission follow this factor: say when and why it moved.
                tracing::info!(
                    pool = pool.name(),
                    worker = name,
                    factor = speed.factor,
                    why = speed.why.as_deref().unwrap_or(""),
                    "device speed changed"
                );
            }
        }
    }
    match result {
        Ok(answer) => {
            let device_time = Duration::from_micros(answer.device_us);
            let mut outputs = answer.outputs.into_iter();
            for q in batch {
                let own: Vec<RowOutput> = outputs.by_ref().take(q.job.rows.len()).collect();
                let _ = q.reply.send(Ok(PoolAnswer {
                    outputs: own,
                    pool: pool.name().to_owned(),
                    worker: name.to_owned(),
                    device: worker.device.clone(),
                    queue_wait: started.duration_since(q.enqueued),
                    device_time,
                    batch_rows: forward.rows,
                    taken_over: q.taken_over.clone(),
                }));
            }
            true
        }
        Err(error) if error.is_retryable() => {
            let (retry, give_up): (Vec<Entry>, Vec<Entry>) = batch.into_iter().partition(|q| q.attempts < MAX_ATTEMPTS);
            for q in &retry {
                tracing::warn!(worker = name, request_id = %q.job.request_id, %error, "worker lost a job; retrying it on another worker");
            }
            for q in give_up {
                tracing::error!(worker = name, request_id = %q.job.request_id, %error, "job lost its worker twice");
                let _ = q
                    .reply
                    .send(Err(BackendError::Lost(format!("its worker died twice: {error}"))));
            }
            pool.lock().requeue(retry);
            pool.notify.notify_waiters();
            false
        }
        Err(error) if batch.len() > 1 => {
            // One job of the batch may have been refused for all: run each alone.
            tracing::warn!(worker = name, %error, jobs = batch.len(), "a batched forward failed; running its jobs one by one");
            for q in &mut batch {
                q.solo = true;
                q.attempts -= 1;
            }
            pool.lock().requeue(batch);
            pool.notify.notify_waiters();
            true
        }
        Err(error) => {
            for q in batch {
                tracing::error!(worker = name, request_id = %q.job.request_id, %error, "worker failed a job");
                let _ = q.reply.send(Err(BackendError::Failed(error.to_string())));
            }
            true
        }
    }
}
