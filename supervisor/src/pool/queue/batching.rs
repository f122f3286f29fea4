//! Who joins a batch: the rule for a queue that drains ([`joins_batch`]: a job joins while it
//! saves the jobs queued behind it more than it delays the batch's members), the rule for a
//! saturated pool ([`throughput_size`]: the batch that does the most work per second of device
//! time) and its hold for the clients it just answered ([`Returns`]), with the limits every
//! batch keeps (rows, tokens, padding). Plain functions of the pool's estimates;
//! `State::batch_members` and `State::take_batch` apply them to the queue.

use std::time::{Duration, Instant};

use crate::pool::capabilities::{Capabilities, ForwardShape};

/// Most padding a batch may add, as a share of the tokens its jobs would run alone.
const MAX_PADDING: f64 = 0.25;

/// Offered load from which a pool batches for throughput: its workers, running the jobs one at a
/// time, would be busy all the time. Below 1, because closed-loop clients send their next request
/// only once answered: a few milliseconds of the answer's way back and forth per forward keep
/// their load just under 1 however many wait.
pub const SATURATED: f64 = 0.9;

/// A saturated pool batches only where that gets through at least this much more work per second of
/// device time than running the jobs alone: less is within what the per-band averages vary by, and
/// a batch always makes its first job wait for the others.
const MIN_GAIN: f64 = 0.05;

/// Batch sizes whose rate is within this share of the best one count as good as it: the largest of
/// them is taken. The estimates price every size of a rows band at the band's cost per token, so
/// only the band's largest size shows what the band's forwards gain.
const RATE_TOLERANCE: f64 = 0.02;

/// Longest a pool holds its next forward for the clients of a saturated forward it just answered
/// ([`Returns::hold`]), and the most of the held job's expected time: a closed-loop client sends its
/// next request a few milliseconds after its answer. Without the hold, 8 such clients on a 2-vCPU
/// Zen 4 ran forwards of 7 rows and of 1 in turn: the eighth request, sent during a 7-row forward,
/// started alone the moment it ended, a few milliseconds before the seven others came back
/// (docs/benchmarks/notes.md, stop 54).
const RETURN_HOLD_MAX: Duration = Duration::from_millis(10);
const RETURN_HOLD_SHARE: f64 = 0.1;

/// A pool holds for returning clients only while at least this share of its recent saturated
/// forwards' jobs had a request arrive within [`RETURN_HOLD_MAX`] of their answer: an open-loop
/// stream at saturation sends ~capacity × 10 ms requests in that time, far fewer than a forward
/// answers, and is not held for clients that are not coming.
const RETURNING_MIN: f64 = 0.5;
/// Weight of the last forward in that running share.
const RETURNING_WEIGHT: f64 = 0.25;

/// Whether the clients of a saturated pool's forwards come back for more (closed-loop clients send
/// their next request a few milliseconds after their answer): the last such forward — when it
/// answered, how many jobs, how many requests arrived within [`RETURN_HOLD_MAX`] after — and the
/// running share of answered jobs followed by an arrival so.
#[derive(Debug)]
pub(super) struct Returns {
    last: Option<(Instant, usize, usize)>,
    share: f64,
}

impl Default for Returns {
    /// Clients are not counted on until forwards show that they come back: an open-loop burst
    /// that saturates a pool for a moment is not held for anyone (three forwards whose clients all
    /// came back lift the share past a half).
    fn default() -> Self {
        Self { last: None, share: 0.0 }
    }
}

impl Returns {
    /// A forward taken while the pool was saturated answered `jobs` at `at`.
    pub(super) fn answered(&mut self, at: Instant, jobs: usize) {
        if let Some((_, answered, arrived)) = self.last {
            let returned = arrived.min(answered) as f64 / answered.max(1) as f64;
            self.share += RETURNING_WEIGHT * (returned - self.share);
        }
        self.last = Some((at, jobs, 0));
    }

    /// A request arrived at `at`.
    pub(super) fn arrived(&mut self, at: Instant) {
        if let Some((answer, _, arrived)) = &mut self.last
            && at.saturating_duration_since(*answer) <= RETURN_HOLD_MAX
        {
            *arrived += 1;
        }
    }

    /// Until when the pool holds its next forward, whose first job takes `alone`: after the last
    /// saturated forward answered, while fewer requests have arrived since than it answered (those
    /// clients' next ones, whatever else waits: the jobs queued during the forward and the
    /// returning ones start together), for as long as [`RETURN_HOLD_MAX`] and
    /// [`RETURN_HOLD_SHARE`] allow, where clients have been coming back ([`RETURNING_MIN`]).
    pub(super) fn hold(&self, alone: Duration) -> Option<Instant> {
        let (at, jobs, arrived) = self.last?;
        (arrived < jobs && self.share >= RETURNING_MIN)
            .then(|| at + RETURN_HOLD_MAX.min(alone.mul_f64(RETURN_HOLD_SHARE)))
    }
}

/// Whether a job joins a batch of `members` jobs, given what it adds to the batch's device time
/// (`added`), what it would take alone (`alone`) and how many queued jobs wait behind it per worker
/// (`behind`). Every job of a batch waits for all of it, so joining delays the `members` by `added`;
/// it saves `alone - added` for the job itself and for each job behind it. It joins when the saving
/// outweighs the delay: on a GPU a row adds little and batches grow; on a CPU a 64-token row adds
/// most of its own time (about 0.8 of it on two threads, where the worker runs a batch's rows side
/// by side; docs/benchmarks.md, "Rows side by side"), so only a deep queue makes a batch worth its
/// members' wait.
pub fn joins_batch(added: Duration, alone: Duration, members: usize, behind: f64) -> bool {
    let saved = alone.saturating_sub(added).as_secs_f64();
    members as f64 * added.as_secs_f64() < saved * (1.0 + behind)
}

/// One way to start a saturated pool's next batch: its first `jobs` fitting jobs, what they would
/// take one at a time (`alone`), what they take together (`together`), and whether that estimate was
/// measured (else it is interpolated, a guess).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Prefix {
    /// How many jobs.
    pub jobs: usize,
    /// Their expected device times alone, summed.
    pub alone: Duration,
    /// The expected device time of their batch.
    pub together: Duration,
    /// Whether `together` was measured.
    pub measured: bool,
}

impl Prefix {
    /// Work done per second of device time, against running the jobs one at a time.
    fn rate(&self) -> f64 {
        self.alone.as_secs_f64() / self.together.as_secs_f64().max(f64::MIN_POSITIVE)
    }
}

/// How many jobs a saturated pool starts together, given the batches it could start (`prefixes`,
/// by increasing size, the first being the first job alone); `None` when no batch is worth it
/// ([`joins_batch`] decides then). While jobs arrive faster than the workers can run them one at a
/// time, every job waits behind those still to come as much as behind those queued, so the batch
/// that does the most work per second of device time shortens every wait: [`joins_batch`], which
/// weighs only the jobs queued now, kept 8 closed-loop clients in 2- and 3-row forwards on an AMX
/// Xeon whose 8-row forwards answer 33–36 requests a second against 22–31 for 1 to 4 rows
/// (docs/benchmarks/notes.md, issue 36's stop-50 and stop-51 sections). The first size never
/// measured is tried once, in order, so that each rows band's cost is measured before a rate is
/// read from it.
pub fn throughput_size(prefixes: &[Prefix]) -> Option<usize> {
    if let Some(untried) = prefixes.iter().find(|p| !p.measured) {
        return (untried.jobs > 1).then_some(untried.jobs);
    }
    let best = prefixes.iter().map(Prefix::rate).fold(1.0, f64::max);
    if best < 1.0 + MIN_GAIN {
        return None;
    }
    prefixes
        .iter()
        .filter(|p| p.rate() * (1.0 + RATE_TOLERANCE) >= best)
        .map(|p| p.jobs)
        .max()
}

/// For a saturated pool: the jobs of `candidates` (queue positions and forwards, in service
/// order) that join a batch led by a job of `head`, as [`throughput_size`] chooses among the
/// prefixes of those that fit; `None` when it finds no batch worth it.
pub(super) fn throughput_members(
    head: ForwardShape,
    candidates: &[(usize, ForwardShape)],
    limits: &Capabilities,
    cost: impl Fn(ForwardShape) -> (Duration, bool),
) -> Option<Vec<(usize, ForwardShape)>> {
    let (mut alone, measured) = cost(head);
    let mut prefixes = vec![Prefix {
        jobs: 1,
        alone,
        together: alone,
        measured,
    }];
    let (mut batch, mut joined) = (Growing::of(head), Vec::new());
    for &(pos, own) in candidates {
        let Some(grown) = batch.with(own, limits) else { continue };
        joined.push((pos, own));
        alone += cost(own).0;
        let (together, measured) = cost(grown.shape);
        prefixes.push(Prefix {
            jobs: joined.len() + 1,
            alone,
            together,
            measured,
        });
        batch = grown;
    }
    let size = throughput_size(&prefixes)?;
    joined.truncate(size - 1);
    Some(joined)
}

/// A batch being formed: the forward it runs and the tokens its jobs would run alone.
#[derive(Clone, Copy, Debug)]
pub(super) struct Growing {
    pub(super) shape: ForwardShape,
    needed: usize,
}

impl Growing {
    pub(super) fn of(head: ForwardShape) -> Self {
        Self {
            shape: head,
            needed: head.tokens(),
        }
    }

    /// The batch with a job of `own` added, if `limits` and the padding allow.
    pub(super) fn with(self, own: ForwardShape, limits: &Capabilities) -> Option<Self> {
        let len = self.shape.padded_len.max(own.padded_len);
        let rows = self.shape.rows + own.rows;
        let needed = self.needed + own.tokens();
        // Every row runs at the batch's length: padding short rows to a long one costs more than
        // running them apart (a CPU forward's time grows with its tokens), so a job joins only
        // while the batch stays within MAX_PADDING of the tokens its jobs need alone.
        let within_padding = (rows * len) as f64 <= needed as f64 * (1.0 + MAX_PADDING);
        (rows <= limits.max_rows && rows * len <= limits.max_batch_tokens && within_padding).then_some(Self {
            shape: ForwardShape { rows, padded_len: len },
            needed,
        })
    }
}
