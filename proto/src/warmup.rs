//! The shapes a worker runs before it becomes ready and what each took; the timings seed the
//! scheduler's estimates (`supervisor/src/pool/estimate.rs`).
//!
//! Only what the pool runs, once: per checkpoint a short single row and a multi-row batch of short
//! rows (an engine with fixed length buckets: one row per bucket a row can land in, then the
//! batch). The first forward of each checkpoint runs once untimed before the timed ones (thread
//! pools starting, the packed weights' first pass through the caches): its time is the
//! checkpoint's first shape's `first_ms`. No row of the checkpoint's `max_len` is run: on a
//! full-size CPU checkpoint one such row costs more than the whole load, nearly every request is
//! much shorter, and the scheduler extrapolates a longer shape's cost from the warm-up points in
//! proportion to its tokens until its first forward is measured (docs/benchmarks.md, "Start-up",
//! measures that rule against the real cost).

use std::time::Instant;

use laya::question::QuestionType;

use crate::engine::{Engine, EngineInfo, Row};
use crate::error::HarnessError;
use crate::pb;
use crate::rows::{ForwardLimits, check_outputs, usable_buckets};

/// How a worker warms up before it binds its socket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WarmupPolicy {
    /// Length of the short single row (capped at each checkpoint's `max_len`).
    pub short_len: u32,
    /// Rows in the multi-row batch (capped at the engine's `max_rows` and token budget).
    pub multi_rows: u32,
    /// Timed runs per shape (at least one), after each checkpoint's one untimed first forward;
    /// their median is the steady cost.
    pub runs: u32,
}

impl Default for WarmupPolicy {
    fn default() -> Self {
        WarmupPolicy {
            short_len: 16,
            multi_rows: 8,
            runs: 1,
        }
    }
}

/// One batch shape on one checkpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct WarmupShape {
    pub(crate) checkpoint: String,
    /// `short`, `bucket` or `multi-row`.
    pub(crate) shape: &'static str,
    pub(crate) rows: u32,
    pub(crate) tokens_per_row: u32,
    vocab_size: u32,
}

impl WarmupShape {
    /// Synthetic rows of this shape: valid ids, two markers (one for a one- or two-token row).
    pub(crate) fn rows(&self) -> Vec<Row> {
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
        vec![
            Row {
                ids,
                markers,
                qtype: QuestionType::Choice
            };
            self.rows as usize
        ]
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
            vec![shape("short", 1, policy.short_len.clamp(1, longest))]
        } else {
            // Every bucket a row of this checkpoint can land in, run at most at its longest row: a
            // fixed-shape engine runs each bucket as a graph of its own.
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

/// Runs every shape `runs` times (at least once), each checkpoint's first shape once more before,
/// untimed in the steady cost, and checks each answer like a served one.
pub(crate) fn run<E: Engine>(
    engine: &mut E,
    shapes: &[WarmupShape],
    runs: u32,
) -> Result<Vec<pb::WarmupTiming>, HarnessError> {
    let mut timings: Vec<pb::WarmupTiming> = Vec::with_capacity(shapes.len());
    let limits = ForwardLimits::from_info(&engine.describe());
    for shape in shapes {
        let failed = |reason: String| HarnessError::Warmup {
            checkpoint: shape.checkpoint.clone(),
            shape: format!("{} ({}×{} tokens)", shape.shape, shape.rows, shape.tokens_per_row),
            reason,
        };
        // Checked once, outside the timings, as the harness checks a served forward before the
        // engine thread times it: the estimates then time the same work as served forwards.
        let checked = limits
            .admit(shape.checkpoint.clone(), shape.rows())
            .map_err(|invalid| failed(invalid.to_string()))?;
        let mut forward = || -> Result<f64, HarnessError> {
            let start = Instant::now();
            let outputs = engine.forward(&checked).map_err(|e| failed(e.to_string()))?;
            let ms = start.elapsed().as_secs_f64() * 1e3;
            check_outputs(checked.rows(), &outputs).map_err(failed)?;
            Ok(ms)
        };
        let cold = !timings.iter().any(|t| t.checkpoint == shape.checkpoint);
        let first_ms = if cold { Some(forward()?) } else { None };
        let mut times_ms = Vec::with_capacity(runs.max(1) as usize);
        for _ in 0..runs.max(1) {
            times_ms.push(forward()?);
        }
        let first_ms = first_ms.unwrap_or(times_ms[0]);
        times_ms.sort_by(f64::total_cmp);
        let steady_ms = times_ms[times_ms.len() / 2];
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
    use crate::engine::{EngineFacts, LoadedCheckpoint};

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
            parity: Vec::new(),
            facts: EngineFacts::default(),
        }
    }

    fn summary(shapes: &[WarmupShape]) -> Vec<(String, &'static str, u32, u32)> {
        shapes
            .iter()
            .map(|s| (s.checkpoint.clone(), s.shape, s.rows, s.tokens_per_row))
            .collect()
    }

    #[test]
    fn plans_a_short_row_and_a_multi_row_batch_for_every_checkpoint_and_no_longest_row() {
        let shapes = plan(&info(64, 8192, vec![]), &WarmupPolicy::default());
        let expected = [
            ("english", "short", 1, 16),
            ("english", "multi-row", 8, 16),
            ("multilingual", "short", 1, 16),
            ("multilingual", "multi-row", 8, 16),
        ];
        let expected: Vec<_> = expected.iter().map(|&(c, s, r, t)| (c.to_owned(), s, r, t)).collect();
        assert_eq!(summary(&shapes), expected);
    }

    #[test]
    fn limits_cap_every_shape() {
        // One row per forward: no multi-row shape; a 10-token budget caps the short row.
        let shapes = plan(&info(1, 10, vec![]), &WarmupPolicy::default());
        assert_eq!(
            summary(&shapes),
            [
                ("english".into(), "short", 1, 10),
                ("multilingual".into(), "short", 1, 10)
            ]
        );
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

    /// Records every forward (checkpoint, rows) and answers each row well.
    struct Counting {
        forwards: Vec<(String, usize)>,
    }

    impl Engine for Counting {
        fn describe(&self) -> EngineInfo {
            info(64, 8192, vec![])
        }

        fn forward(
            &mut self,
            forward: &crate::engine::CheckedForward,
        ) -> Result<Vec<crate::engine::RowOutput>, crate::engine::EngineError> {
            self.forwards
                .push((forward.checkpoint().to_owned(), forward.rows().len()));
            Ok(forward
                .rows()
                .iter()
                .map(|row| crate::engine::RowOutput {
                    logits: vec![0.5; row.markers.len()],
                    act_probabilities: vec![1.0],
                })
                .collect())
        }
    }

    #[test]
    fn each_checkpoint_runs_one_untimed_first_forward_then_every_shape_runs_times() {
        let shapes = plan(&info(64, 8192, vec![]), &WarmupPolicy::default());
        for runs in [1, 3] {
            let mut engine = Counting { forwards: Vec::new() };
            let timings = run(&mut engine, &shapes, runs).expect("warm-up");
            assert_eq!(timings.len(), shapes.len());
            // Per checkpoint: the first forward, then `runs` of the short row and of the batch.
            let expected: Vec<(String, usize)> = ["english", "multilingual"]
                .into_iter()
                .flat_map(|c| {
                    let mut forwards = vec![(c.to_owned(), 1); 1 + runs as usize];
                    forwards.extend(vec![(c.to_owned(), 8); runs as usize]);
                    forwards
                })
                .collect();
            assert_eq!(engine.forwards, expected, "runs = {runs}");
            assert!(timings.iter().all(|t| t.first_ms >= 0.0 && t.steady_ms >= 0.0));
        }
    }

    #[test]
    fn a_wrong_answer_fails_the_warm_up_and_names_the_shape() {
        struct Short;
        impl Engine for Short {
            fn describe(&self) -> EngineInfo {
                info(64, 8192, vec![])
            }
            fn forward(
                &mut self,
                _: &crate::engine::CheckedForward,
            ) -> Result<Vec<crate::engine::RowOutput>, crate::engine::EngineError> {
                Ok(Vec::new())
            }
        }
        let shapes = plan(&info(64, 8192, vec![]), &WarmupPolicy::default());
        let error = run(&mut Short, &shapes, 1).expect_err("no outputs");
        let text = error.to_string();
        assert!(
            text.contains("english") && text.contains("short (1×16 tokens)"),
            "{text}"
        );
    }
}
