//! A pool's plain state: its bounded queue of jobs in service order, the batches taken from it (by
//! its own workers, or by an idle worker of another pool), its ready workers and what `/health`
//! reports about them. No processes and no waiting: [`super::Pool`] holds it under a lock, and the
//! tests below drive it directly.
//!
//! The queue is kept in priority order ([`super::order`]: shortest expected first with aging, or
//! arrival); a batch is the first job a worker can run plus later jobs of the same checkpoint that
//! fit beside it without too much padding, and only while sharing the forward is expected to save
//! the queue more time than it costs the batch ([`joins_batch`]) — or to measure one batch size
//! whose time is still a guess. A saturated pool (more work arriving than its workers could run one
//! job at a time, [`State::offered_load`]) batches for throughput instead ([`throughput_size`]):
//! there every job waits behind the ones still to come, and only more work per second of device
//! time shortens those waits; until as many requests arrived as its last forward answered, it holds
//! the next forward a few milliseconds for those clients' next requests, where clients come back
//! ([`batching::Returns`]). The three rules are in
//! [`batching`].

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::{Duration, Instant};

use laya::routing::CheckpointName;
use tokio::sync::oneshot;

use crate::backend::{BackendError, Job, PoolAnswer, Route, TakenOver};
use crate::pool::capabilities::{Capabilities, ForwardShape, JobShape};
use crate::pool::estimate::ServiceModel;
use crate::pool::order::{QueuePolicy, Timeline};
use crate::pool::waits::WaitLog;
use crate::status::{RouteCounts, WorkerStatus};

mod batching;

use batching::{Growing, Returns, throughput_members};
pub use batching::{Prefix, SATURATED, joins_batch, throughput_size};

/// Longest gap between two probes of a slowed pool, however long its estimate: the estimate may be
/// what is wrong (two forwards delayed by a busy machine can set a speed factor in the thousands),
/// and the probe is what corrects it; a probe of a pool that really is that slow only runs while
/// it is idle, so it takes no work from it.
pub const PROBE_MAX_GAP: Duration = Duration::from_secs(2);

/// How far back [`State::offered_load`] looks: several short forwards long, and a pool whose
/// clients went away stops batching for throughput within it.
const LOAD_WINDOW: Duration = Duration::from_secs(1);

/// Where a job's answer goes.
pub type Reply = oneshot::Sender<Result<PoolAnswer, BackendError>>;

/// Where the scheduler waits for a job's answer.
pub type Answer = oneshot::Receiver<Result<PoolAnswer, BackendError>>;

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
    /// When it should start by: the queue is served in increasing priority, then arrival.
    pub priority: Instant,
    /// Arrival order, among jobs of equal priority.
    pub seq: u64,
    /// Times it was started on a worker.
    pub attempts: u32,
    /// Run alone: a batch it was part of failed, and only a lone run tells whose fault it was.
    pub solo: bool,
    /// Set when another pool's idle worker took it from the queue it was placed in.
    pub taken_over: Option<TakenOver>,
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
    /// Jobs waiting for a worker, in service order.
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
    /// Copies of jobs run here as probes of a slowed device (their answers not used).
    pub probes: u64,
    /// Forwards that carried more than one job, and the jobs they carried.
    pub batches: (u64, u64),
    /// Jobs this pool's workers took from other pools' queues, and jobs others took from this one.
    pub taken: (u64, u64),
    /// Queue waits per job class.
    pub waits: WaitLog,
    /// When a worker of the pool last started a forward (a slowed pool is probed after a pause).
    pub last_start: Option<Instant>,
    /// The workers whose running forward was taken while the pool was saturated.
    saturated_forwards: BTreeSet<usize>,
    /// Those forwards' answers and the requests that followed: their clients may be about to send
    /// their next ones.
    returns: Returns,
    /// The jobs queued here over the last [`LOAD_WINDOW`] or so: when, and their expected time alone.
    arrivals: VecDeque<(Instant, Duration)>,
    /// The next arrival number.
    next_seq: u64,
}

/// The forward a batch runs: all its rows, padded to its longest.
pub fn forward_of(batch: &[Entry]) -> ForwardShape {
    ForwardShape {
        rows: batch.iter().map(|q| q.job.rows.len()).sum(),
        padded_len: batch.iter().map(|q| q.forward.padded_len).max().unwrap_or(0),
    }
}

impl State {
    /// Queues `job` placed by `route` (`None`: a probe's copy) in `policy`'s order, or refuses it when
    /// `capacity` jobs already wait.
    pub fn push(
        &mut self,
        job: Job,
        forward: ForwardShape,
        route: Option<Route>,
        capacity: usize,
        policy: &QueuePolicy,
    ) -> Result<Answer, BackendError> {
        if self.queue.len() >= capacity {
            // By then what is queued here now has had time to run.
            let retry_after = self.backlog().unwrap_or_default().max(Duration::from_secs(1));
            return Err(BackendError::Overloaded { retry_after });
        }
        let (reply, receiver) = oneshot::channel();
        let estimate = self.model.estimate(job.checkpoint, forward);
        match route {
            Some(Route::Preferred) => self.routed.preferred += 1,
            Some(Route::Spilled) => self.routed.spilled += 1,
            Some(Route::Fallback) => self.routed.fallback += 1,
            None => self.probes += 1,
        }
        let enqueued = Instant::now();
        while self
            .arrivals
            .front()
            .is_some_and(|(at, _)| enqueued.saturating_duration_since(*at) >= LOAD_WINDOW)
        {
            self.arrivals.pop_front();
        }
        self.arrivals.push_back((enqueued, estimate));
        self.returns.arrived(enqueued);
        let priority = policy.priority(enqueued, estimate, job.deadline);
        self.next_seq += 1;
        self.insert(Entry {
            job,
            forward,
            estimate,
            enqueued,
            priority,
            seq: self.next_seq,
            attempts: 0,
            solo: false,
            taken_over: None,
            reply,
        });
        Ok(receiver)
    }

    /// Puts `entry` at its place in service order.
    fn insert(&mut self, entry: Entry) {
        let key = (entry.priority, entry.seq);
        let at = self.queue.partition_point(|q| (q.priority, q.seq) < key);
        self.queue.insert(at, entry);
    }

    /// The ready workers, each free after what its running forward is still expected to take. A
    /// forward past its estimate is expected to take as long again as it has overrun (at least
    /// 1 ms): a busy worker never looks free, and a stalled one looks ever busier.
    fn timeline(&self) -> Option<Timeline> {
        let now = Instant::now();
        let left = |w: &usize| {
            self.running.get(w).map_or(Duration::ZERO, |(started, estimate)| {
                let elapsed = now.duration_since(*started);
                match estimate.checked_sub(elapsed) {
                    Some(left) if !left.is_zero() => left,
                    _ => (elapsed - *estimate).max(Duration::from_millis(1)),
                }
            })
        };
        Timeline::new(self.ready.keys().map(left).collect())
    }

    /// When a job of `priority` queued now would start: after the running forwards and the queued
    /// jobs served before it. `None` without a ready worker.
    pub fn start_for(&self, priority: Instant) -> Option<Duration> {
        let mut timeline = self.timeline()?;
        for q in self.queue.iter().take_while(|q| q.priority <= priority) {
            timeline.book(q.estimate);
        }
        Some(timeline.next_start())
    }

    /// When a job queued behind everything would start; `None` without a ready worker.
    pub fn backlog(&self) -> Option<Duration> {
        let mut timeline = self.timeline()?;
        for q in &self.queue {
            timeline.book(q.estimate);
        }
        Some(timeline.next_start())
    }

    /// Whether a slowed device is due a probe: a copy of a job another pool answers (or that every
    /// pool refused), run here so that its recovery is measured. Only when it would start at once (a
    /// probe never waits behind other work), and then once its last forward started more than twice
    /// the probe's expected time or `every` ago, whichever is longer (the probes take at most about a
    /// third of the device) but never more than [`PROBE_MAX_GAP`] ago, or at once while a change of
    /// speed awaits confirmation (a slowdown or a recovery is confirmed by the very next forward).
    pub fn probe_due(&self, start: Option<Duration>, service: Duration, every: Duration, now: Instant) -> bool {
        let suspect = self.model.speed().slowed() || self.model.change_pending();
        if !suspect || start != Some(Duration::ZERO) {
            return false;
        }
        let gap = every.max(2 * service).min(PROBE_MAX_GAP);
        self.model.change_pending()
            || self
                .last_start
                .is_none_or(|last| now.saturating_duration_since(last) >= gap)
    }

    /// The device time of the jobs queued here over the last [`LOAD_WINDOW`], each as if run alone,
    /// per second and ready worker: the share of their time the workers would be busy running them
    /// one at a time. From [`SATURATED`] on, batches are chosen for throughput.
    pub fn offered_load(&self, now: Instant) -> f64 {
        let recent: Duration = self
            .arrivals
            .iter()
            .filter(|(at, _)| now.saturating_duration_since(*at) < LOAD_WINDOW)
            .map(|(_, estimate)| *estimate)
            .sum();
        recent.as_secs_f64() / LOAD_WINDOW.as_secs_f64() / self.ready.len().max(1) as f64
    }

    /// Forgets queued jobs nobody waits for any more: the client went away or its deadline passed
    /// (request handling stopped waiting), so no forward is spent on them.
    pub fn drop_abandoned(&mut self) {
        self.queue.retain(|q| !q.reply.is_closed());
    }

    /// The queue positions of a batch led by the job at `first`, with the forward each needs:
    /// later jobs of the same checkpoint that `forward` says fit (`None`: not here) join while
    /// `limits` and the padding allow, as many as [`throughput_size`] says when the pool is
    /// `saturated`, else each as [`joins_batch`] says. A solo job runs alone.
    fn batch_members(
        &self,
        first: usize,
        head_forward: ForwardShape,
        limits: &Capabilities,
        forward: impl Fn(&Entry) -> Option<ForwardShape>,
        cost: impl Fn(ForwardShape) -> (Duration, bool),
        saturated: bool,
    ) -> Vec<(usize, ForwardShape)> {
        let head = &self.queue[first];
        let mut members = vec![(first, head_forward)];
        if head.solo || limits.max_rows <= 1 {
            return members;
        }
        // The jobs that could share the head's forward, in service order, with their own forwards.
        let candidates = self
            .queue
            .iter()
            .enumerate()
            .skip(first + 1)
            .filter(|(_, q)| q.job.checkpoint == head.job.checkpoint && !q.solo && !q.reply.is_closed())
            .filter_map(|(pos, q)| forward(q).map(|own| (pos, own)))
            .collect::<Vec<_>>();
        if saturated && let Some(batch) = throughput_members(head_forward, &candidates, limits, &cost) {
            members.extend(batch);
            return members;
        }
        let mut batch = Growing::of(head_forward);
        // A batch size never measured has only an interpolated estimate: a batch may grow into one
        // such size to measure it, and from then on its measured time decides.
        let mut tried_a_size = false;
        for &(pos, own) in &candidates {
            let Some(grown) = batch.with(own, limits) else { continue };
            let ((with, measured), (without, _), (alone, _)) = (cost(grown.shape), cost(batch.shape), cost(own));
            // Shared by the workers that serve this queue: each waits behind a share of it.
            let behind = (self.queue.len() - pos - 1) as f64 / self.ready.len().max(1) as f64;
            let try_size = !measured && !tried_a_size;
            if try_size || joins_batch(with.saturating_sub(without), alone, members.len(), behind) {
                tried_a_size |= try_size;
                members.push((pos, own));
                batch = grown;
            }
        }
        members
    }

    /// Removes the queue positions `members` (ascending), setting each job's forward; in order.
    fn remove(&mut self, members: &[(usize, ForwardShape)]) -> Vec<Entry> {
        // From the back, so earlier positions stay valid.
        let mut batch: Vec<Entry> = members
            .iter()
            .rev()
            .filter_map(|&(pos, forward)| {
                let mut entry = self.queue.remove(pos)?;
                entry.forward = forward;
                Some(entry)
            })
            .collect();
        batch.reverse();
        batch
    }

    /// Records that `worker` starts `batch`: in flight, its expected time, its waits.
    pub fn begin(&mut self, worker: usize, batch: &[Entry]) {
        let now = Instant::now();
        self.last_start = Some(now);
        let forward = forward_of(batch);
        if let Some(first) = batch.first() {
            let estimate = self.model.estimate(first.job.checkpoint, forward);
            self.running.insert(worker, (now, estimate));
        }
        self.in_flight += batch.len();
        if batch.len() > 1 {
            self.batches.0 += 1;
            self.batches.1 += batch.len() as u64;
        }
        for q in batch.iter().filter(|q| q.attempts == 0 && !q.solo) {
            self.waits.record(q.job.class(), now.duration_since(q.enqueued));
        }
    }

    /// Takes the next batch `worker`, serving `checkpoints` within `limits`, can run, and records
    /// that it started: the first job in service order for one of them, plus (when the worker
    /// takes several rows) later jobs of the same checkpoint that fit beside it. `None` when there
    /// is none, or when the first could still gain company within `batch_wait`.
    pub fn take_batch(
        &mut self,
        worker: usize,
        checkpoints: &[CheckpointName],
        limits: &Capabilities,
        batch_wait: Duration,
    ) -> Option<Vec<Entry>> {
        let first = self
            .queue
            .iter()
            .position(|q| checkpoints.contains(&q.job.checkpoint))?;
        let head = &self.queue[first];
        let checkpoint = head.job.checkpoint;
        let now = Instant::now();
        let saturated = self.offered_load(now) >= SATURATED;
        let members = self.batch_members(
            first,
            head.forward,
            limits,
            |q| Some(q.forward),
            |f| (self.model.estimate(checkpoint, f), self.model.measured(checkpoint, f)),
            saturated,
        );
        let rows: usize = members.iter().map(|(_, f)| f.rows).sum();
        let may_grow = rows < limits.max_rows && !head.solo;
        if may_grow && head.enqueued.elapsed() < batch_wait {
            return None;
        }
        if may_grow
            && let Some(until) = self.returns.hold(head.estimate)
            && now < until
        {
            return None;
        }
        self.saturated_forwards.remove(&worker);
        if saturated {
            self.saturated_forwards.insert(worker);
        }
        let batch = self.remove(&members);
        self.begin(worker, &batch);
        Some(batch)
    }

    /// For an idle worker of another pool (`from` this one's name; it serves `checkpoints` within
    /// `limits`, `service` estimates a forward there and `measured` says whether that estimate was
    /// measured): the first queued job it can hold that no worker here would start at once and that
    /// it would finish strictly earlier than this pool, plus later jobs that can share its forward
    /// there. Taken out of this queue.
    pub fn take_for_peer(
        &mut self,
        from: &str,
        checkpoints: &[CheckpointName],
        limits: &Capabilities,
        service: impl Fn(CheckpointName, ForwardShape) -> Duration,
        measured: impl Fn(CheckpointName, ForwardShape) -> bool,
    ) -> Option<Vec<Entry>> {
        let fits = |q: &Entry| limits.holds(JobShape::of(&q.job.rows)).ok();
        // Where each job would start here, in service order; without a ready worker, never.
        let mut timeline = self.timeline();
        let mut head = None;
        for (pos, q) in self.queue.iter().enumerate() {
            let start = timeline.as_mut().map(|t| t.book(q.estimate));
            if !checkpoints.contains(&q.job.checkpoint) || q.reply.is_closed() || start == Some(Duration::ZERO) {
                continue;
            }
            let Some(forward) = fits(q) else { continue };
            let finish_here = start.map(|s| s + q.estimate);
            if finish_here.is_none_or(|f| service(q.job.checkpoint, forward) < f) {
                head = Some((pos, forward, start));
                break;
            }
        }
        let (first, forward, would_start) = head?;
        let checkpoint = self.queue[first].job.checkpoint;
        // The peer's worker is idle and takes only what would wait here: this pool's load is not
        // its own.
        let members = self.batch_members(
            first,
            forward,
            limits,
            fits,
            |f| (service(checkpoint, f), measured(checkpoint, f)),
            false,
        );
        let mut batch = self.remove(&members);
        for q in &mut batch {
            q.estimate = service(q.job.checkpoint, q.forward);
            q.taken_over = Some(TakenOver {
                from: from.to_owned(),
                would_start,
            });
        }
        self.taken.1 += batch.len() as u64;
        Some(batch)
    }

    /// Records that `worker`'s forward answered `jobs` jobs at `at`, if it was taken while the pool
    /// was saturated (after it, the one-second load may read lower: 8 closed-loop clients' forward
    /// every ~0.57 s on a 2-vCPU Zen 4 swung it between 0.7 and 1.3).
    pub fn answered(&mut self, worker: usize, jobs: usize, at: Instant) {
        if self.saturated_forwards.remove(&worker) {
            self.returns.answered(at, jobs);
        }
    }

    /// How long until the first job for `checkpoints` has waited `batch_wait`, or until a hold for
    /// returning clients ends (when a worker should look again), if one waits.
    pub fn batch_wait_left(&self, checkpoints: &[CheckpointName], batch_wait: Duration) -> Option<Duration> {
        let head = self.queue.iter().find(|q| checkpoints.contains(&q.job.checkpoint))?;
        let hold = self
            .returns
            .hold(head.estimate)
            .map_or(Duration::ZERO, |until| until.saturating_duration_since(Instant::now()));
        Some(batch_wait.saturating_sub(head.enqueued.elapsed()).max(hold))
    }

    /// Puts `entries` back in the queue at their places in service order (a worker lost them, or
    /// a batch failed and they run alone).
    pub fn requeue(&mut self, entries: Vec<Entry>) {
        for entry in entries {
            self.insert(entry);
        }
    }

    /// Empties the queue (shutdown), handing back what was waiting.
    pub fn take_all(&mut self) -> Vec<Entry> {
        self.queue.drain(..).collect()
    }
}

#[cfg(test)]
mod tests;
