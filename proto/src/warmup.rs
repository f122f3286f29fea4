//! The shapes a worker runs before it becomes ready (every checkpoint on a short row, its longest row
//! or every length bucket, and a multi-row batch) and what each took; the timings seed the scheduler.

use std::time::Instant;

use crate::engine::{Engine, EngineInfo, EngineRow};
use crate::harness::HarnessError;
use crate::pb;
use crate::rows::{check_outputs, usable_buckets};

/// How a worker warms up before it binds its socket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WarmupPolicy {
    /// Length of the short single row (capped at each checkpoint's `max_len`).
    pub short_len: u32,
    /// Rows in the multi-row batch (capped at the engine's `max_rows` and token budget).
    pub multi_rows: u32,
    /// Runs per shape: the first is reported alone, the median of the others is the steady cost.
    pub runs: u32,
}

impl Default for WarmupPolicy {
    fn default() -> Self {
        WarmupPolicy {
            short_len: 16,
            multi_rows: 8,
            runs: 3,
        }
    }
}

/// One batch shape on one checkpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct WarmupShape {
    pub(crate) checkpoint: String,
    /// `short`, `longest`, `bucket` or `multi-row`.
    pub(crate) shape: &'static str,
    pub(crate) rows: u32,
    pub(crate) tokens_per_row: u32,
    vocab_size: u32,
}

impl WarmupShape {
    /// Synthetic rows of this shape: valid ids, two markers (one for a one- or two-token row).
    pub(crate) fn rows(&self) -> Vec<EngineRow> {
        let len = self.tokens_per_row;
        let ids: Vec<u32> = (0..len)
            .map(|i| {
                if self.vocab_size > 1 {
                    1 + i % (self.vocab_size - 1)
                } else {
                    0
                }
            })
            .collect();
        let markers = if len >= 3 {
            vec![1, 2]
        } else {
            vec![len.saturating_sub(1)]
        };
        vec![EngineRow { ids, markers, qtype: 0 }; self.rows as usize]
    }
}

/// Every shape to run, checkpoint by checkpoint. A single row is capped by the token budget too, so
/// that every planned shape is one the worker would accept as a request.
pub(crate) fn plan(info: &EngineInfo, policy: &WarmupPolicy) -> Vec<WarmupShape> {
    let mut buckets = info.length_buckets.clone();
    buckets.sort_unstable();
    buckets.dedup();
    let mut shapes = Vec::new();
    for checkpoint in &info.checkpoints {
        let longest = checkpoint.warmup_len.min(checkpoint.max_len).min(info.max_batch_tokens);
        if longest == 0 {
            continue;
        }
        let shape = |shape, rows, tokens_per_row| WarmupShape {
            checkpoint: checkpoint.name.clone(),
            shape,
            rows,
            tokens_per_row,
            vocab_size: checkpoint.vocab_size,
        };
        let singles: Vec<WarmupShape> = if buckets.is_empty() {
            let short = policy.short_len.clamp(1, longest);
            let mut singles = vec![shape("short", 1, short)];
            if longest > short {
                singles.push(shape("longest", 1, longest));
            }
            singles
        } else {
            // Every bucket a row of this checkpoint can land in, run at most at its longest row.
            usable_buckets(&buckets, longest as usize)
                .into_iter()
                .map(|bucket| shape("bucket", 1, bucket.min(longest)))
                .collect()
        };
        let multi_len = singles.first().map_or(longest, |s| s.tokens_per_row);
        let multi_rows = policy
            .multi_rows
            .min(info.max_rows)
            .min(info.max_batch_tokens / multi_len);
        shapes.extend(singles);
        if multi_rows >= 2 {
            shapes.push(shape("multi-row", multi_rows, multi_len));
        }
    }
    shapes
}

/// Runs every shape `runs` times (at least once) and checks each answer like a served one.
pub(crate) fn run<E: Engine>(
    engine: &mut E,
    shapes: &[WarmupShape],
    runs: u32,
) -> Result<Vec<pb::WarmupTiming>, HarnessError> {
    let mut timings = Vec::with_capacity(shapes.len());
    for shape in shapes {
        let rows = shape.rows();
        let failed = |reason: String| HarnessError::Warmup {
            checkpoint: shape.checkpoint.clone(),
            shape: format!("{} ({}×{} tokens)", shape.shape, shape.rows, shape.tokens_per_row),
            reason,
        };
        let mut times_ms = Vec::with_capacity(runs.max(1) as usize);
        for _ in 0..runs.max(1) {
            let start = Instant::now();
            let outputs = engine
                .forward(&shape.checkpoint, &rows)
                .map_err(|e| failed(e.to_string()))?;
            times_ms.push(start.elapsed().as_secs_f64() * 1e3);
            check_outputs(&rows, &outputs).map_err(failed)?;
        }
        let first_ms = times_ms[0];
        let mut rest = times_ms.split_off(1);
        rest.sort_by(f64::total_cmp);
        let steady_ms = if rest.is_empty() {
            first_ms
        } else {
            rest[rest.len() / 2]
        };
        tracing::info!(
            checkpoint = %shape.checkpoint,
            shape = shape.shape,
            rows = shape.rows,
            tokens_per_row = shape.tokens_per_row,
            first_ms,
            steady_ms,
            "warm-up shape done"
        );
        timings.push(pb::WarmupTiming {
            checkpoint: shape.checkpoint.clone(),
            shape: shape.shape.to_owned(),
            rows: shape.rows,
            tokens_per_row: shape.tokens_per_row,
            first_ms,
            steady_ms,
        });
    }
    Ok(timings)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::LoadedCheckpoint;

    fn info(max_rows: u32, max_batch_tokens: u32, length_buckets: Vec<u32>) -> EngineInfo {
        let checkpoint = |name: &str, max_len| LoadedCheckpoint {
            name: name.into(),
            revision: None,
            weights_sha256: "00".into(),
            vocab_size: 701,
            max_len,
            warmup_len: max_len,
        };
        EngineInfo {
            device: "cpu".into(),
            dtype: "f32".into(),
            checkpoints: vec![checkpoint("english", 96), checkpoint("multilingual", 128)],
            max_rows,
            max_batch_tokens,
            length_buckets,
        }
    }

    fn summary(shapes: &[WarmupShape]) -> Vec<(String, &'static str, u32, u32)> {
        shapes
            .iter()
            .map(|s| (s.checkpoint.clone(), s.shape, s.rows, s.tokens_per_row))
            .collect()
    }

    #[test]
    fn plans_short_longest_and_multi_row_for_every_checkpoint() {
        let shapes = plan(&info(64, 8192, vec![]), &WarmupPolicy::default());
        let expected = [
            ("english", "short", 1, 16),
            ("english", "longest", 1, 96),
            ("english", "multi-row", 8, 16),
            ("multilingual", "short", 1, 16),
            ("multilingual", "longest", 1, 128),
            ("multilingual", "multi-row", 8, 16),
        ];
        let expected: Vec<_> = expected.iter().map(|&(c, s, r, t)| (c.to_owned(), s, r, t)).collect();
        assert_eq!(summary(&shapes), expected);
    }

    #[test]
    fn limits_cap_every_shape() {
        // One row per forward: no multi-row shape; a 100-token budget caps the longest row.
        let shapes = plan(&info(1, 100, vec![]), &WarmupPolicy::default());
        assert_eq!(
            summary(&shapes)[..2],
            [("english".into(), "short", 1, 16), ("english".into(), "longest", 1, 96)]
        );
        assert_eq!(summary(&shapes)[3], ("multilingual".into(), "longest", 1, 100));
        assert!(shapes.iter().all(|s| s.shape != "multi-row"));
        // The multi-row batch never exceeds the token budget.
        let shapes = plan(&info(64, 40, vec![]), &WarmupPolicy::default());
        assert!(shapes.iter().all(|s| s.rows * s.tokens_per_row <= 40), "{shapes:?}");
        assert!(shapes.iter().any(|s| s.shape == "multi-row" && s.rows == 2));
    }

    #[test]
    fn bucketed_engines_warm_every_bucket_that_fits() {
        let shapes = plan(&info(4, 8192, vec![128, 32, 64]), &WarmupPolicy::default());
        let english: Vec<_> = summary(&shapes).into_iter().filter(|s| s.0 == "english").collect();
        // english takes rows up to 96 tokens: those over 64 pad to 128, so 128 is warmed at 96 tokens.
        let expected = [
            ("bucket", 1, 32),
            ("bucket", 1, 64),
            ("bucket", 1, 96),
            ("multi-row", 4, 32),
        ];
        let expected: Vec<_> = expected
            .iter()
            .map(|&(s, r, t)| ("english".to_owned(), s, r, t))
            .collect();
        assert_eq!(english, expected);
        assert_eq!(
            shapes
                .iter()
                .filter(|s| s.checkpoint == "multilingual" && s.shape == "bucket")
                .count(),
            3
        );
    }

    #[test]
    fn single_row_bucketed_engines_get_one_row_per_bucket_and_no_multi_row_batch() {
        let shapes = plan(&info(1, 128, vec![64, 96, 128, 256]), &WarmupPolicy::default());
        let expected = [
            ("english", "bucket", 1, 64),
            ("english", "bucket", 1, 96),
            ("multilingual", "bucket", 1, 64),
            ("multilingual", "bucket", 1, 96),
            ("multilingual", "bucket", 1, 128),
        ];
        let expected: Vec<_> = expected.iter().map(|&(c, s, r, t)| (c.to_owned(), s, r, t)).collect();
        assert_eq!(summary(&shapes), expected);
        let limits = crate::rows::ForwardLimits::from_info(&info(1, 128, vec![64, 96, 128, 256]));
        for shape in &shapes {
            assert_eq!(limits.check(&shape.checkpoint, &shape.rows()), Ok(()), "{shape:?}");
        }
    }

    #[test]
    fn synthetic_rows_are_valid_requests() {
        let limits = crate::rows::ForwardLimits::from_info(&info(64, 8192, vec![]));
        for shape in plan(
            &info(64, 8192, vec![]),
            &WarmupPolicy {
                short_len: 1,
                multi_rows: 8,
                runs: 1,
            },
        ) {
            let rows = shape.rows();
            assert_eq!(rows.len(), shape.rows as usize);
            assert!(rows.iter().all(|r| r.ids.len() == shape.tokens_per_row as usize));
            assert_eq!(limits.check(&shape.checkpoint, &rows), Ok(()), "{shape:?}");
        }
    }
}
