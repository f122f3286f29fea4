//! A pool's plain state: its bounded queue of jobs, the batches taken from it, its ready workers and
//! what `/health` reports about them. No processes and no waiting: [`super::Pool`] holds it under a
//! lock, and the tests below drive it directly.
//!
//! The queue is first in, first out per checkpoint; a batch is the oldest job a worker can run plus
//! later jobs of the same checkpoint that fit beside it without too much padding.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use laya::routing::CheckpointName;
use tokio::sync::oneshot;

use crate::backend::{BackendError, Job, PoolAnswer, Route};
use crate::pool::capabilities::{Capabilities, ForwardShape};
use crate::pool::estimate::ServiceModel;
use crate::status::{RouteCounts, WorkerStatus};

/// Most padding a batch may add, as a share of the tokens its jobs would run alone.
const MAX_PADDING: f64 = 0.25;

/// Where a job's answer goes.
pub type Reply = oneshot::Sender<Result<PoolAnswer, BackendError>>;

/// One queued job.
#[derive(Debug)]
pub struct Entry {
    /// The job.
    pub job: Job,
    /// The forward it needs on this pool.
    pub forward: ForwardShape,
    /// Its expected device time, counted in the backlog while it waits.
    pub estimate: Duration,
    /// When it was queued.
    pub enqueued: Instant,
    /// Times it was started on a worker.
    pub attempts: u32,
    /// Run alone: a batch it was part of failed, and only a lone run tells whose fault it was.
    pub solo: bool,
    /// Where its answer goes; closed when the request no longer waits for it.
    pub reply: Reply,
}

/// A worker admitted to the pool.
#[derive(Clone, Debug)]
pub struct ReadyWorker {
    /// The checkpoints it has loaded.
    pub checkpoints: Vec<CheckpointName>,
    /// What it takes in one forward.
    pub capabilities: Capabilities,
}

/// Everything a pool knows, as plain data.
#[derive(Debug, Default)]
pub struct State {
    /// Jobs waiting for a worker, oldest first.
    pub queue: VecDeque<Entry>,
    /// Jobs on a worker now.
    pub in_flight: usize,
    /// Per busy worker: when its forward started and how long it was expected to take.
    pub running: BTreeMap<usize, (Instant, Duration)>,
    /// Every worker slot's record for `/health`.
    pub workers: BTreeMap<usize, WorkerStatus>,
    /// The workers that take jobs now.
    pub ready: BTreeMap<usize, ReadyWorker>,
    /// Why the pool is degraded, if it is.
    pub degraded: Option<String>,
    /// Why the pool cannot run on this machine, if so.
    pub unavailable: Option<String>,
    /// Replaced or removed by a reload: takes no new jobs.
    pub retiring: bool,
    /// Service-time estimates.
    pub model: ServiceModel,
    /// Jobs placed here, by route.
    pub routed: RouteCounts,
    /// Jobs that preferred this pool but went elsewhere.
    pub spilled_out: u64,
    /// Forwards that carried more than one job, and the jobs they carried.
    pub batches: (u64, u64),
}

impl State {
    /// Queues `job`, or refuses it when `capacity` jobs already wait.
    pub fn push(
        &mut self,
        job: Job,
        forward: ForwardShape,
        route: Route,
        capacity: usize,
    ) -> Result<oneshot::Receiver<Result<PoolAnswer, BackendError>>, BackendError> {
        if self.queue.len() >= capacity {
            return Err(BackendError::Overloaded {
                retry_after: Duration::from_secs(1),
            });
        }
        let (reply, receiver) = oneshot::channel();
        let estimate = self.model.estimate(job.checkpoint, forward);
        match route {
            Route::Preferred => self.routed.preferred += 1,
            Route::Spilled => self.routed.spilled += 1,
            Route::Fallback => self.routed.fallback += 1,
        }
        self.queue.push_back(Entry {
            job,
            forward,
            estimate,
            enqueued: Instant::now(),
            attempts: 0,
            solo: false,
            reply,
        });
        Ok(receiver)
    }

    /// Queued work plus what running forwards still need, per ready worker; `None` without one.
    pub fn backlog(&self) -> Option<Duration> {
        let ready = self.ready.len();
        if ready == 0 {
            return None;
        }
        let now = Instant::now();
        let queued: Duration = self.queue.iter().map(|q| q.estimate).sum();
        let running: Duration = self
            .running
            .values()
            .map(|(started, estimate)| estimate.saturating_sub(now.duration_since(*started)))
            .sum();
        Some((queued + running) / ready as u32)
    }

    /// Forgets queued jobs nobody waits for any more: the client went away or its deadline passed
    /// (request handling stopped waiting), so no forward is spent on them.
    pub fn drop_abandoned(&mut self) {
        self.queue.retain(|q| !q.reply.is_closed());
    }

    /// Takes the next batch a worker serving `checkpoints` within `limits` can run: the oldest job
    /// for one of them, plus (when the worker takes several rows) later jobs of the same checkpoint
    /// that fit beside it. `None` when there is none, or when the oldest could still gain company
    /// within `batch_wait`.
    pub fn take_batch(
        &mut self,
        checkpoints: &[CheckpointName],
        limits: &Capabilities,
        batch_wait: Duration,
    ) -> Option<Vec<Entry>> {
        let first = self
            .queue
            .iter()
            .position(|q| checkpoints.contains(&q.job.checkpoint))?;
        let (checkpoint, solo) = (self.queue[first].job.checkpoint, self.queue[first].solo);
        let mut members = vec![first];
        let head = self.queue[first].forward;
        let (mut rows, mut padded_len, mut needed) = (head.rows, head.padded_len, head.tokens());
        if !solo && limits.max_rows > 1 {
            for (pos, q) in self.queue.iter().enumerate().skip(first + 1) {
                if q.job.checkpoint != checkpoint || q.solo {
                    continue;
                }
                let len = padded_len.max(q.forward.padded_len);
                let total = rows + q.forward.rows;
                // Every row runs at the batch's length: padding short rows to a long one costs more
                // than running them apart (a CPU forward's time grows with its tokens), so a job joins
                // only while the batch stays within MAX_PADDING of the tokens its jobs need alone.
                let within_padding = (total * len) as f64 <= (needed + q.forward.tokens()) as f64 * (1.0 + MAX_PADDING);
                if total <= limits.max_rows && total * len <= limits.max_batch_tokens && within_padding {
                    members.push(pos);
                    (rows, padded_len, needed) = (total, len, needed + q.forward.tokens());
                }
            }
        }
        let room_left = rows < limits.max_rows && !solo;
        if room_left && self.queue[first].enqueued.elapsed() < batch_wait {
            return None;
        }
        // Remove from the back so earlier positions stay valid.
        let mut batch: Vec<Entry> = members.iter().rev().filter_map(|&pos| self.queue.remove(pos)).collect();
        batch.reverse();
        self.in_flight += batch.len();
        Some(batch)
    }

    /// How long until the oldest job for `checkpoints` has waited `batch_wait` (when a worker should
    /// look again), if one waits.
    pub fn batch_wait_left(&self, checkpoints: &[CheckpointName], batch_wait: Duration) -> Option<Duration> {
        self.queue
            .iter()
            .find(|q| checkpoints.contains(&q.job.checkpoint))
            .map(|q| batch_wait.saturating_sub(q.enqueued.elapsed()))
    }

    /// Puts `entries` back at the front of the queue, in their order (a worker lost them).
    pub fn requeue_front(&mut self, entries: Vec<Entry>) {
        for entry in entries.into_iter().rev() {
            self.queue.push_front(entry);
        }
    }

    /// Empties the queue (shutdown), handing back what was waiting.
    pub fn take_all(&mut self) -> Vec<Entry> {
        self.queue.drain(..).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use laya::prompt::Row;
    use layad_config::PoolConfig;

    use crate::pool::capabilities::JobShape;

    /// A queued job of one row per entry of `lengths`, and the receiver of its answer.
    fn entry(checkpoint: CheckpointName, lengths: &[usize]) -> Entry {
        let rows: Vec<Row> = lengths
            .iter()
            .map(|&len| Row {
                ids: vec![1; len],
                markers: vec![0],
                qtype: laya::question::QuestionType::Noul,
            })
            .collect();
        let shape = JobShape::of(&rows);
        Entry {
            forward: ForwardShape {
                rows: shape.questions,
                padded_len: shape.longest,
            },
            job: Job {
                request_id: format!("{lengths:?}"),
                checkpoint,
                rows,
            },
            estimate: Duration::ZERO,
            enqueued: Instant::now(),
            attempts: 0,
            solo: false,
            reply: oneshot::channel().0,
        }
    }

    #[test]
    fn batches_take_same_checkpoint_jobs_of_similar_length_only() {
        let english = CheckpointName::English;
        let mut state = State::default();
        for job in [
            entry(english, &[60]),
            entry(CheckpointName::Multilingual, &[60]),
            entry(english, &[384]),
            entry(english, &[64, 50]),
            entry(english, &[70]),
        ] {
            state.queue.push_back(job);
        }
        let limits = Capabilities::from_config(&PoolConfig::named("general"));
        let batch = state
            .take_batch(&CheckpointName::ALL, &limits, Duration::ZERO)
            .expect("a batch");
        let ids: Vec<&str> = batch.iter().map(|q| q.job.request_id.as_str()).collect();
        // 384 tokens would pad the others sixfold; 70 pads 4 rows of <= 64 by less than a quarter.
        assert_eq!(ids, ["[60]", "[64, 50]", "[70]"]);
        let left: Vec<&str> = state.queue.iter().map(|q| q.job.request_id.as_str()).collect();
        assert_eq!(left, ["[60]", "[384]"], "the rest keeps its order");
        // One row per forward: no batching.
        let mut one_row = limits.clone();
        one_row.max_rows = 1;
        let batch = state
            .take_batch(&CheckpointName::ALL, &one_row, Duration::ZERO)
            .expect("a batch");
        assert_eq!(batch.len(), 1);
        assert_eq!(state.in_flight, 4, "taken jobs count as in flight");
    }

    #[test]
    fn a_lone_job_waits_for_company_only_within_the_batch_wait() {
        let mut state = State::default();
        state.queue.push_back(entry(CheckpointName::English, &[20]));
        let limits = Capabilities::from_config(&PoolConfig::named("general"));
        let wait = Duration::from_secs(60);
        assert!(state.take_batch(&CheckpointName::ALL, &limits, wait).is_none());
        assert!(
            state
                .batch_wait_left(&CheckpointName::ALL, wait)
                .is_some_and(|d| d > Duration::from_secs(59))
        );
        // A worker that does not serve the checkpoint never takes it.
        assert!(
            state
                .take_batch(&[CheckpointName::Multilingual], &limits, Duration::ZERO)
                .is_none()
        );
        assert_eq!(
            state
                .take_batch(&CheckpointName::ALL, &limits, Duration::ZERO)
                .map(|b| b.len()),
            Some(1)
        );
    }

    #[test]
    fn a_full_queue_refuses_and_withdrawn_jobs_leave_it() {
        let mut state = State::default();
        let job = entry(CheckpointName::English, &[10]).job;
        let forward = ForwardShape {
            rows: 1,
            padded_len: 10,
        };
        let kept = state.push(job.clone(), forward, Route::Preferred, 2).expect("queued");
        let withdrawn = state.push(job.clone(), forward, Route::Spilled, 2).expect("queued");
        assert_eq!(
            state.push(job, forward, Route::Fallback, 2).err(),
            Some(BackendError::Overloaded {
                retry_after: Duration::from_secs(1)
            })
        );
        assert_eq!(
            (state.routed.preferred, state.routed.spilled, state.routed.fallback),
            (1, 1, 0)
        );
        drop(withdrawn);
        state.drop_abandoned();
        assert_eq!(state.queue.len(), 1);
        drop(kept);
        state.drop_abandoned();
        assert!(state.queue.is_empty());
    }

    #[test]
    fn the_backlog_is_queued_and_running_work_per_ready_worker() {
        let mut state = State::default();
        assert_eq!(state.backlog(), None, "no ready worker");
        let ready = ReadyWorker {
            checkpoints: CheckpointName::ALL.to_vec(),
            capabilities: Capabilities::from_config(&PoolConfig::named("general")),
        };
        state.ready.insert(0, ready.clone());
        state.ready.insert(1, ready);
        for ms in [30, 50] {
            let mut queued = entry(CheckpointName::English, &[10]);
            queued.estimate = Duration::from_millis(ms);
            state.queue.push_back(queued);
        }
        // A forward expected to take an hour, just started: almost all of it is still ahead.
        state.running.insert(0, (Instant::now(), Duration::from_secs(3600)));
        let backlog = state.backlog().expect("ready workers");
        let expected = (Duration::from_millis(80) + Duration::from_secs(3600)) / 2;
        assert!(
            backlog <= expected && backlog > expected - Duration::from_secs(1),
            "{backlog:?}"
        );
    }
}
