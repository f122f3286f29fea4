//! Service-time estimates of one pool: how long a forward of a given shape takes on its workers,
//! seeded from the workers' warm-up timings and following the measured device times.
//!
//! An estimate is a shape's normal cost times the device's current speed factor ([`Speed`]).
//! Normal costs are kept per checkpoint × length band × rows band as an exponentially weighted
//! moving average of the time per padded token, started by the band's first measurement; a band
//! never observed is interpolated from the warm-up shapes by token count, a guess:
//! [`ServiceModel::measured`] tells which is which. Per token, so that within a band a forward
//! costs in proportion to its tokens: a row added to a batch never looks free because the larger
//! batch falls in the same band.
//!
//! The speed factor is a change detector, not an average: a device that suddenly runs at a quarter
//! of its speed (a GPU shared with another program, a throttled laptop, a noisy neighbour on a
//! CPU) is a level shift, and an average with a weight smooth enough to ignore one slow forward
//! takes about ten forwards to follow it, seconds at the rate a slowed pool still gets work. Here
//! [`CONFIRM`] forwards in a row off their estimate by [`SHIFT`] or more, in the same direction,
//! set the factor to what they measured; a forward within [`SHIFT`] resets the count and feeds the
//! band's average instead (only while the factor is 1: see [`ServiceModel::observe`]), so drifts
//! are followed slowly and single outliers not at all.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use laya::routing::CheckpointName;
use layad_proto::bucket_for;

use crate::pool::capabilities::ForwardShape;

/// Weight of a new observation in the moving average: recent enough to follow a device that got
/// busier, smooth enough that one slow forward (a page fault, a preempted thread) does not swing it.
const EWMA_WEIGHT: f64 = 0.2;

/// How far off its estimate a forward must be (either way, as a ratio) to count towards a change
/// of the device's speed. Forwards of a steady CPU worker vary by well under this on a quiet
/// machine; a device at half its speed or less is caught.
pub const SHIFT: f64 = 1.5;

/// Forwards in a row, each off by [`SHIFT`] in the same direction, that change the speed factor.
/// Two: one slow forward (a page fault, a preempted thread) is not a slower device, and a third
/// would leave a device that became four times slower serving another slow job.
pub const CONFIRM: usize = 2;

/// A factor this close to 1 (as a ratio) is the device's normal speed again.
const NORMAL: f64 = 1.25;

/// Assumed cost of a shape when nothing is known yet (no warm-up reported): a typical short CPU
/// forward, so an unmeasured pool is neither always nor never chosen.
const UNKNOWN_MS: f64 = 50.0;

/// Row lengths are banded so similar shapes share what was learnt.
const LENGTH_BANDS: [u32; 12] = [16, 32, 64, 96, 128, 192, 256, 384, 512, 1024, 2048, 4096];

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Band {
    checkpoint: CheckpointName,
    length: usize,
    rows: usize,
}

impl Band {
    fn of(checkpoint: CheckpointName, shape: ForwardShape) -> Self {
        // Bands are buckets of the estimates: a length falls in the smallest band that holds it.
        let length =
            bucket_for(shape.padded_len, &LENGTH_BANDS).map_or(shape.padded_len.next_power_of_two(), |b| b as usize);
        Self {
            checkpoint,
            length,
            rows: shape.rows.next_power_of_two(),
        }
    }
}

/// One warm-up measurement a worker reported in Describe.
#[derive(Clone, Debug, PartialEq)]
pub struct WarmupPoint {
    /// The checkpoint it ran.
    pub checkpoint: CheckpointName,
    /// Its shape.
    pub shape: ForwardShape,
    /// Steady-state time (median after the first run), in milliseconds.
    pub steady_ms: f64,
}

/// How fast the pool's device runs now, relative to the normal costs learnt per band.
#[derive(Clone, Debug, PartialEq)]
pub struct Speed {
    /// Measured time over normal time: 1 normally, 4 for a device at a quarter of its speed.
    pub factor: f64,
    /// When the factor last changed (`None`: never, it is the normal speed since the start).
    pub since: Option<Instant>,
    /// Why it changed, in words.
    pub why: Option<String>,
    /// Times it changed.
    pub changes: u64,
}

impl Default for Speed {
    fn default() -> Self {
        Self {
            factor: 1.0,
            since: None,
            why: None,
            changes: 0,
        }
    }
}

impl Speed {
    /// Whether the device runs markedly slower than normal (a slowed pool is probed, not left).
    pub fn slowed(&self) -> bool {
        self.factor > NORMAL
    }
}

/// The estimates of one pool.
#[derive(Clone, Debug, Default)]
pub struct ServiceModel {
    warmup: Vec<WarmupPoint>,
    /// Milliseconds per padded token at the device's normal speed, per band.
    learnt: HashMap<Band, f64>,
    speed: Speed,
    /// The latest forwards that were off their estimate by [`SHIFT`] or more, in the same
    /// direction, as measured over normal time (fewer than [`CONFIRM`]).
    pending: Vec<f64>,
}

impl ServiceModel {
    /// Replaces the warm-up seed (a worker became ready); learnt averages are kept.
    pub fn seed(&mut self, warmup: Vec<WarmupPoint>) {
        if !warmup.is_empty() {
            self.warmup = warmup;
        }
    }

    /// Expected device time of a forward of `shape` on `checkpoint`, at the device's current speed;
    /// while a slowdown awaits its confirming forward, at the speed it measured: the next job should
    /// not be the second to wait for a device that may have become four times slower (the copy run
    /// as a probe confirms it or not, [`super::queue::State::probe_due`]).
    pub fn estimate(&self, checkpoint: CheckpointName, shape: ForwardShape) -> Duration {
        let ms = self.normal_ms(checkpoint, shape) * self.placement_factor();
        Duration::from_secs_f64(ms.max(0.0) / 1000.0)
    }

    /// The speed factor estimates use: the current one, or a pending slowdown's if slower.
    fn placement_factor(&self) -> f64 {
        match self.pending.first() {
            Some(&first) if first / self.speed.factor >= SHIFT => {
                let pending = (self.pending.iter().map(|r| r.ln()).sum::<f64>() / self.pending.len() as f64).exp();
                pending.max(self.speed.factor)
            }
            _ => self.speed.factor,
        }
    }

    /// Expected device time in milliseconds at the device's normal speed.
    fn normal_ms(&self, checkpoint: CheckpointName, shape: ForwardShape) -> f64 {
        match self.learnt.get(&Band::of(checkpoint, shape)) {
            Some(&per_token) => per_token * shape.tokens() as f64,
            None => self.scaled_warmup(checkpoint, shape),
        }
    }

    /// How fast the device runs now.
    pub fn speed(&self) -> &Speed {
        &self.speed
    }

    /// Whether the latest forward was off its estimate and a change of speed awaits confirmation.
    pub fn change_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Interpolated by token count between this checkpoint's warm-up shapes (proportionally beyond
    /// the smallest or largest): a forward's cost grows with the tokens it pads to. A warm-up shape
    /// timed slower than a larger one (another process took the core meanwhile) counts as fast as
    /// the larger one, so that more tokens are never expected to take less time.
    fn scaled_warmup(&self, checkpoint: CheckpointName, shape: ForwardShape) -> f64 {
        let mut points: Vec<(f64, f64)> = self
            .warmup
            .iter()
            .filter(|w| w.checkpoint == checkpoint && w.shape.tokens() > 0)
            .map(|w| (w.shape.tokens() as f64, w.steady_ms))
            .collect();
        points.sort_by(|a, b| a.0.total_cmp(&b.0));
        for i in (0..points.len().saturating_sub(1)).rev() {
            points[i].1 = points[i].1.min(points[i + 1].1);
        }
        let wanted = shape.tokens() as f64;
        let (Some(&first), Some(&last)) = (points.first(), points.last()) else {
            return UNKNOWN_MS;
        };
        if wanted <= first.0 {
            return first.1 * wanted / first.0;
        }
        if wanted >= last.0 {
            return last.1 * wanted / last.0;
        }
        points.windows(2).find(|w| wanted <= w[1].0).map_or(last.1, |w| {
            let ((x0, y0), (x1, y1)) = (w[0], w[1]);
            if x1 == x0 {
                y1
            } else {
                y0 + (y1 - y0) * (wanted - x0) / (x1 - x0)
            }
        })
    }

    /// Whether forwards in the band of `shape` were measured (else its estimate is interpolated).
    pub fn measured(&self, checkpoint: CheckpointName, shape: ForwardShape) -> bool {
        self.learnt.contains_key(&Band::of(checkpoint, shape))
    }

    /// Learns from a forward measured `now`: a change of the device's speed once [`CONFIRM`]
    /// forwards in a row were off their estimates by [`SHIFT`] the same way, else the average of
    /// its band. The first measurement of a band replaces the interpolated guess (a batch shape is
    /// often measured once only, and that once must count) and says nothing about the device's
    /// speed: the guess may have been off, not the device.
    pub fn observe(&mut self, checkpoint: CheckpointName, shape: ForwardShape, device_time: Duration, now: Instant) {
        let band = Band::of(checkpoint, shape);
        let tokens = shape.tokens().max(1) as f64;
        let measured_ms = device_time.as_secs_f64() * 1000.0;
        let Some(&normal) = self.learnt.get(&band) else {
            self.learnt.insert(band, measured_ms / tokens / self.speed.factor);
            return;
        };
        // Measured over normal time; the factor is what it is expected to be.
        let ratio = measured_ms / tokens / normal;
        let off = ratio / self.speed.factor;
        if off < SHIFT && off > 1.0 / SHIFT {
            self.pending.clear();
            // Bands learn at the device's normal speed only. Divided by a factor that was itself a
            // false alarm (two forwards of a millisecond delayed by a busy machine), every band's
            // average drifts down, the next forwards read slower against it, the next factor is
            // higher: a reload storm beside builds ratcheted it to 1,500x in three minutes, and
            // estimates to a minute. A real change of speed is followed by the factor alone.
            if self.speed.factor == 1.0 {
                self.learnt
                    .entry(band)
                    .and_modify(|average| *average += EWMA_WEIGHT * (measured_ms / tokens - *average));
            }
            return;
        }
        let slower = off >= SHIFT;
        if self
            .pending
            .first()
            .is_some_and(|&p| (p / self.speed.factor >= SHIFT) != slower)
        {
            self.pending.clear();
        }
        self.pending.push(ratio);
        if self.pending.len() < CONFIRM {
            return;
        }
        // The geometric mean of what they measured: the new speed.
        let factor = (self.pending.iter().map(|r| r.ln()).sum::<f64>() / self.pending.len() as f64).exp();
        let times: Vec<String> = self.pending.iter().map(|r| format!("{r:.1}×")).collect();
        let normal_again = factor < NORMAL && factor > 1.0 / NORMAL;
        self.speed = Speed {
            factor: if normal_again { 1.0 } else { factor },
            since: Some(now),
            why: Some(format!(
                "the last {} forwards took {} their normal time{}",
                self.pending.len(),
                times.join(" and "),
                if normal_again { ": back to normal" } else { "" }
            )),
            changes: self.speed.changes + 1,
        };
        self.pending.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ENGLISH: CheckpointName = CheckpointName::English;

    fn shape(rows: usize, padded_len: usize) -> ForwardShape {
        ForwardShape { rows, padded_len }
    }

    fn ms(d: Duration) -> f64 {
        d.as_secs_f64() * 1000.0
    }

    #[test]
    fn estimates_start_from_the_warmup_shapes_interpolated_by_tokens() {
        let mut model = ServiceModel::default();
        assert_eq!(ms(model.estimate(ENGLISH, shape(1, 64))), UNKNOWN_MS);
        model.seed(vec![
            WarmupPoint {
                checkpoint: ENGLISH,
                shape: shape(1, 64),
                steady_ms: 10.0,
            },
            WarmupPoint {
                checkpoint: ENGLISH,
                shape: shape(1, 512),
                steady_ms: 100.0,
            },
        ]);
        assert!((ms(model.estimate(ENGLISH, shape(1, 64))) - 10.0).abs() < 1e-9);
        assert!((ms(model.estimate(ENGLISH, shape(1, 32))) - 5.0).abs() < 1e-9);
        // 128 tokens: a seventh of the way from 64 (10 ms) to 512 (100 ms).
        // (Durations hold whole nanoseconds.)
        assert!((ms(model.estimate(ENGLISH, shape(2, 64))) - (10.0 + 90.0 / 7.0)).abs() < 1e-6);
        assert!((ms(model.estimate(ENGLISH, shape(2, 512))) - 200.0).abs() < 1e-9);
        // Another checkpoint has no warm-up of its own.
        assert_eq!(
            ms(model.estimate(CheckpointName::Multilingual, shape(1, 64))),
            UNKNOWN_MS
        );
    }

    #[test]
    fn a_warmup_shape_timed_slower_than_a_larger_one_never_makes_fewer_tokens_cost_more() {
        let mut model = ServiceModel::default();
        model.seed(vec![
            WarmupPoint {
                checkpoint: ENGLISH,
                shape: shape(1, 16),
                steady_ms: 30.0,
            },
            WarmupPoint {
                checkpoint: ENGLISH,
                shape: shape(1, 96),
                steady_ms: 12.0,
            },
            WarmupPoint {
                checkpoint: ENGLISH,
                shape: shape(8, 96),
                steady_ms: 80.0,
            },
        ]);
        let estimates: Vec<f64> = [8, 16, 37, 96, 192, 768]
            .into_iter()
            .map(|len| ms(model.estimate(ENGLISH, shape(1, len))))
            .collect();
        assert!(estimates.windows(2).all(|w| w[0] <= w[1]), "{estimates:?}");
        // The 16-token shape counts as fast as the 96-token one.
        assert!((estimates[1] - 12.0).abs() < 1e-9, "{estimates:?}");
    }

    #[test]
    fn observations_move_the_band_average_and_leave_other_bands_alone() {
        let mut model = ServiceModel::default();
        let now = Instant::now();
        model.seed(vec![WarmupPoint {
            checkpoint: ENGLISH,
            shape: shape(1, 64),
            steady_ms: 10.0,
        }]);
        // The first measurement replaces the guess, three times off it: no change of speed.
        for _ in 0..50 {
            model.observe(ENGLISH, shape(1, 60), Duration::from_millis(30), now);
        }
        assert_eq!(model.speed(), &Speed::default());
        let learnt = ms(model.estimate(ENGLISH, shape(1, 60)));
        assert!((learnt - 30.0).abs() < 0.01, "{learnt}");
        // The band (33 to 64 tokens) costs in proportion to its tokens.
        assert!((ms(model.estimate(ENGLISH, shape(1, 64))) - 32.0).abs() < 0.01);
        assert!(model.measured(ENGLISH, shape(1, 60)) && !model.measured(ENGLISH, shape(2, 64)));
        // A forward off by less than SHIFT moves the average by a fifth of the difference...
        model.observe(ENGLISH, shape(1, 60), Duration::from_millis(40), now);
        assert!((ms(model.estimate(ENGLISH, shape(1, 60))) - 32.0).abs() < 0.01);
        assert!(!model.change_pending());
        // ...one far off leaves it alone and waits for the next to confirm (meanwhile estimates
        // are at the speed it measured); a normal one clears it.
        model.observe(ENGLISH, shape(1, 60), Duration::from_millis(130), now);
        assert!(model.change_pending() && model.speed().factor == 1.0);
        assert!((ms(model.estimate(ENGLISH, shape(1, 60))) - 130.0).abs() < 0.01);
        model.observe(ENGLISH, shape(1, 60), Duration::from_millis(32), now);
        assert!(!model.change_pending() && model.speed().factor == 1.0);
        // 4 rows of 64 is another band: still the warm-up (proportional beyond its one shape)...
        assert!((ms(model.estimate(ENGLISH, shape(4, 64))) - 40.0).abs() < 1e-9);
        // ...until measured once: the measurement replaces the guess. 3 rows share the 4-row band
        // and cost three quarters of 4.
        model.observe(ENGLISH, shape(4, 64), Duration::from_millis(90), now);
        assert!((ms(model.estimate(ENGLISH, shape(4, 64))) - 90.0).abs() < 1e-6);
        assert!((ms(model.estimate(ENGLISH, shape(3, 64))) - 67.5).abs() < 1e-6);
    }

    #[test]
    fn false_alarms_under_noise_do_not_ratchet_the_normal_costs_down() {
        // A busy machine: pairs of forwards 1.6x slow set a factor, forwards 1.3x slow follow it
        // (within 1.5x of it), then the normal time again. Averaged while the factor stood, the
        // 1.3x forwards would pull the band to 1.3/1.6 of its cost each round, and each next alarm
        // would read higher: the factor climbed to 1,500x in a reload storm.
        let mut model = steady();
        let now = Instant::now();
        let at = |ratio: f64| Duration::from_secs_f64(0.035 * ratio);
        for _ in 0..20 {
            model.observe(ENGLISH, shape(1, 60), at(1.6), now);
            model.observe(ENGLISH, shape(1, 60), at(1.6), now);
            for _ in 0..3 {
                model.observe(ENGLISH, shape(1, 60), at(1.3), now);
            }
            model.observe(ENGLISH, shape(1, 60), at(1.0), now);
            model.observe(ENGLISH, shape(1, 60), at(1.0), now);
        }
        assert_eq!(model.speed().factor, 1.0, "{:?}", model.speed());
        assert!((ms(model.estimate(ENGLISH, shape(1, 60))) - 35.0).abs() < 1e-6);
    }

    /// A model that learnt 35 ms for one 60-token row.
    fn steady() -> ServiceModel {
        let mut model = ServiceModel::default();
        for _ in 0..10 {
            model.observe(ENGLISH, shape(1, 60), Duration::from_millis(35), Instant::now());
        }
        model
    }

    #[test]
    fn a_device_at_a_quarter_of_its_speed_is_learnt_from_two_forwards_and_its_recovery_from_two() {
        let mut model = steady();
        model.observe(ENGLISH, shape(4, 64), Duration::from_millis(100), Instant::now());
        let t0 = Instant::now();
        model.observe(ENGLISH, shape(1, 60), Duration::from_millis(140), t0);
        assert!(!model.speed().slowed(), "one slow forward is not a slower device");
        let t1 = t0 + Duration::from_millis(150);
        model.observe(ENGLISH, shape(1, 60), Duration::from_millis(140), t1);
        let speed = model.speed().clone();
        assert!((speed.factor - 4.0).abs() < 1e-9 && speed.slowed(), "{speed:?}");
        assert_eq!((speed.since, speed.changes), (Some(t1), 1));
        let why = speed.why.unwrap_or_default();
        assert!(why.contains("4.0× and 4.0×"), "{why}");
        // Every shape slows with the device, measured or not.
        assert!((ms(model.estimate(ENGLISH, shape(1, 60))) - 140.0).abs() < 1e-6);
        assert!((ms(model.estimate(ENGLISH, shape(4, 64))) - 400.0).abs() < 1e-6);
        // Slow forwards are what is expected now: they confirm the factor and move no band.
        model.observe(ENGLISH, shape(1, 60), Duration::from_millis(150), t1);
        assert!(!model.change_pending());
        assert!((ms(model.estimate(ENGLISH, shape(1, 60))) - 140.0).abs() < 1e-6);
        // Two forwards at the old speed: back to normal, and said so.
        let t2 = t1 + Duration::from_secs(12);
        model.observe(ENGLISH, shape(1, 60), Duration::from_millis(35), t2);
        model.observe(ENGLISH, shape(1, 60), Duration::from_millis(36), t2);
        let speed = model.speed();
        assert_eq!((speed.factor, speed.since, speed.changes), (1.0, Some(t2), 2));
        assert!(
            speed.why.as_deref().is_some_and(|w| w.ends_with("back to normal")),
            "{speed:?}"
        );
        assert!((ms(model.estimate(ENGLISH, shape(4, 64))) - 100.0).abs() < 0.5);
    }

    #[test]
    fn outliers_that_alternate_or_are_interrupted_change_nothing() {
        let mut model = steady();
        let now = Instant::now();
        for time in [140, 10, 140, 35, 140, 10, 10 * 35, 35] {
            model.observe(ENGLISH, shape(1, 60), Duration::from_millis(time), now);
            assert_eq!(model.speed(), &Speed::default(), "after {time} ms");
        }
        assert!((ms(model.estimate(ENGLISH, shape(1, 60))) - 35.0).abs() < 1e-6);
    }
}
