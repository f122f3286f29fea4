//! Service-time estimates of one pool: how long a forward of a given shape takes on its workers,
//! seeded from the workers' warm-up timings and following the measured device times.
//!
//! Estimates are kept per checkpoint × length band × rows band as an exponentially weighted moving
//! average of the time per padded token, started by the band's first measurement; a band never
//! observed is interpolated from the warm-up shapes by token count, a guess:
//! [`ServiceModel::measured`] tells which is which. Per token, so that within a band a forward
//! costs in proportion to its tokens: a row added to a batch never looks free because the larger
//! batch falls in the same band.

use std::collections::HashMap;
use std::time::Duration;

use laya::routing::CheckpointName;
use layad_proto::bucket_for;

use crate::pool::capabilities::ForwardShape;

/// Weight of a new observation in the moving average: recent enough to follow a device that got
/// busier, smooth enough that one slow forward (a page fault, a preempted thread) does not swing it.
const EWMA_WEIGHT: f64 = 0.2;

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

/// The estimates of one pool.
#[derive(Clone, Debug, Default)]
pub struct ServiceModel {
    warmup: Vec<WarmupPoint>,
    /// Milliseconds per padded token, per band.
    learnt: HashMap<Band, f64>,
}

impl ServiceModel {
    /// Replaces the warm-up seed (a worker became ready); learnt averages are kept.
    pub fn seed(&mut self, warmup: Vec<WarmupPoint>) {
        if !warmup.is_empty() {
            self.warmup = warmup;
        }
    }

    /// Expected device time of a forward of `shape` on `checkpoint`.
    pub fn estimate(&self, checkpoint: CheckpointName, shape: ForwardShape) -> Duration {
        let ms = match self.learnt.get(&Band::of(checkpoint, shape)) {
            Some(&per_token) => per_token * shape.tokens() as f64,
            None => self.scaled_warmup(checkpoint, shape),
        };
        Duration::from_secs_f64(ms.max(0.0) / 1000.0)
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

    /// Folds a measured forward into the average of its band. The first measurement replaces the
    /// interpolated guess: a batch shape is often measured once only (it did not pay), and that
    /// once must count.
    pub fn observe(&mut self, checkpoint: CheckpointName, shape: ForwardShape, device_time: Duration) {
        let per_token = device_time.as_secs_f64() * 1000.0 / shape.tokens().max(1) as f64;
        self.learnt
            .entry(Band::of(checkpoint, shape))
            .and_modify(|average| *average += EWMA_WEIGHT * (per_token - *average))
            .or_insert(per_token);
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
        model.seed(vec![WarmupPoint {
            checkpoint: ENGLISH,
            shape: shape(1, 64),
            steady_ms: 10.0,
        }]);
        for _ in 0..50 {
            model.observe(ENGLISH, shape(1, 60), Duration::from_millis(30));
        }
        let learnt = ms(model.estimate(ENGLISH, shape(1, 60)));
        assert!((learnt - 30.0).abs() < 0.01, "{learnt}");
        // The band (33 to 64 tokens) costs in proportion to its tokens.
        assert!((ms(model.estimate(ENGLISH, shape(1, 64))) - 32.0).abs() < 0.01);
        assert!(model.measured(ENGLISH, shape(1, 60)) && !model.measured(ENGLISH, shape(2, 64)));
        // One outlier moves it by a fifth of the difference only.
        model.observe(ENGLISH, shape(1, 60), Duration::from_millis(130));
        assert!((ms(model.estimate(ENGLISH, shape(1, 60))) - 50.0).abs() < 0.01);
        // 4 rows of 64 is another band: still the warm-up (proportional beyond its one shape)...
        assert!((ms(model.estimate(ENGLISH, shape(4, 64))) - 40.0).abs() < 1e-9);
        // ...until measured once: the measurement replaces the guess. 3 rows share the 4-row band
        // and cost three quarters of 4.
        model.observe(ENGLISH, shape(4, 64), Duration::from_millis(90));
        assert!((ms(model.estimate(ENGLISH, shape(4, 64))) - 90.0).abs() < 1e-6);
        assert!((ms(model.estimate(ENGLISH, shape(3, 64))) - 67.5).abs() < 1e-6);
    }
}
