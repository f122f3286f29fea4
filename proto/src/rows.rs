//! The row contract between the supervisor and every worker, in one place: what a forward may hold
//! (checked once, by the harness before any engine, or by [`check_and_forward`] for callers that
//! hold an engine directly), what an engine must answer, how rows are padded to length buckets, and
//! the defaults of the limits of one forward.
//!
//! The supervisor plans its batches with the same bucket choice and defaults, so what it sends is
//! what a worker accepts.

use crate::engine::{CheckedForward, Engine, EngineError, EngineInfo, Row, RowOutput};

/// The defaults of the limits of one forward: `laya::limits` holds them, where the configuration
/// (which does not depend on this crate) takes them too.
pub use laya::limits::{DEFAULT_MAX_BATCH_TOKENS, DEFAULT_MAX_ROWS};

/// The length a row of `len` tokens is padded to: the smallest of `buckets` (ascending) that holds
/// it; `None` when none does.
pub fn bucket_for(len: usize, buckets: &[u32]) -> Option<u32> {
    buckets.iter().copied().find(|&b| b as usize >= len)
}

/// The buckets (ascending) rows of a checkpoint whose longest row is `max_len` can land in: every
/// one up to `max_len`, and the first at or above it (rows longer than the bucket below pad to it).
pub fn usable_buckets(buckets: &[u32], max_len: usize) -> Vec<u32> {
    let mut usable = Vec::new();
    for &bucket in buckets.iter().filter(|&&b| b > 0) {
        usable.push(bucket);
        if bucket as usize >= max_len {
            break;
        }
    }
    usable
}

/// What a forward may contain, taken once from the engine's [`EngineInfo`].
#[derive(Clone, Debug)]
pub struct ForwardLimits {
    checkpoints: Vec<RowLimits>,
    max_rows: u32,
    max_batch_tokens: u32,
}

/// What one row of one checkpoint may contain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RowLimits {
    /// The checkpoint's name.
    pub checkpoint: String,
    /// Ids must be below this.
    pub vocab_size: u32,
    /// Longest row the checkpoint takes.
    pub max_len: u32,
    /// Largest length bucket, when the engine pads to fixed lengths.
    pub longest_bucket: Option<u32>,
}

/// Why a forward request was refused; each message names the row, position and limit involved.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[allow(missing_docs)] // each variant's message says what it means
pub enum InvalidForward {
    #[error("unknown checkpoint {name:?}; this worker serves {served}")]
    UnknownCheckpoint { name: String, served: String },
    #[error("the forward has no rows")]
    NoRows,
    #[error("the forward has {rows} rows; this worker takes at most {max_rows} rows per forward")]
    TooManyRows { rows: usize, max_rows: u32 },
    #[error("the forward has {tokens} tokens in all; this worker takes at most {max_batch_tokens} tokens per forward")]
    TooManyTokens { tokens: usize, max_batch_tokens: u32 },
    #[error("row {row} has no tokens")]
    EmptyRow { row: usize },
    #[error("row {row} has {len} tokens; checkpoint {checkpoint} takes at most {max_len}")]
    RowTooLong {
        row: usize,
        len: usize,
        checkpoint: String,
        max_len: u32,
    },
    #[error("row {row} has {len} tokens; the longest length bucket of this worker is {bucket}")]
    RowLongerThanBuckets { row: usize, len: usize, bucket: u32 },
    #[error(
        "row {row} position {position} has token id {id}; checkpoint {checkpoint} has {vocab_size} ids (0..{vocab_size})"
    )]
    IdOutOfRange {
        row: usize,
        position: usize,
        id: u32,
        checkpoint: String,
        vocab_size: u32,
    },
    #[error("row {row} has no markers")]
    NoMarkers { row: usize },
    #[error("row {row} marker {marker} is at position {position}, outside the row ({len} tokens)")]
    MarkerOutsideRow {
        row: usize,
        marker: usize,
        position: u32,
        len: usize,
    },
    #[error("row {row} marker {marker} is at position {position}, not after the previous marker at {previous}")]
    MarkersNotIncreasing {
        row: usize,
        marker: usize,
        position: u32,
        previous: u32,
    },
    /// Found when the message is decoded (`pb::decode_rows`): a decoded row holds a question type.
    #[error("row {row} has qtype {qtype}; expected 0 (choice), 1 (score) or 2 (noul)")]
    UnknownQtype { row: usize, qtype: u32 },
}

/// Checks `rows` against `engine`'s own limits, then runs them: for callers that hold an engine
/// directly (warm-up, tools, tests), where the harness would have checked them. A refusal is
/// [`EngineError::InvalidArgument`] with the row contract's message.
pub fn check_and_forward<E: Engine + ?Sized>(
    engine: &mut E,
    checkpoint: &str,
    rows: &[Row],
) -> Result<Vec<RowOutput>, EngineError> {
    let forward = ForwardLimits::from_info(&engine.describe())
        .admit(checkpoint.to_owned(), rows.to_vec())
        .map_err(|invalid| EngineError::InvalidArgument(invalid.to_string()))?;
    engine.forward(&forward)
}

impl ForwardLimits {
    /// Limits of the engine described by `info`.
    pub fn from_info(info: &EngineInfo) -> Self {
        let longest_bucket = info.length_buckets.iter().copied().max();
        ForwardLimits {
            checkpoints: info
                .checkpoints
                .iter()
                .map(|c| RowLimits {
                    checkpoint: c.name.clone(),
                    vocab_size: c.vocab_size,
                    max_len: c.max_len,
                    longest_bucket,
                })
                .collect(),
            max_rows: info.max_rows,
            max_batch_tokens: info.max_batch_tokens,
        }
    }

    /// The forward of `rows` on `checkpoint` once [`check`](Self::check) has found nothing wrong.
    pub fn admit(&self, checkpoint: String, rows: Vec<Row>) -> Result<CheckedForward, InvalidForward> {
        self.check(&checkpoint, &rows)?;
        Ok(CheckedForward::new(checkpoint, rows))
    }

    /// Checks one forward; the first problem found is the answer.
    pub fn check(&self, checkpoint: &str, rows: &[Row]) -> Result<(), InvalidForward> {
        let limits = self
            .checkpoints
            .iter()
            .find(|c| c.checkpoint == checkpoint)
            .ok_or_else(|| {
                let served: Vec<&str> = self.checkpoints.iter().map(|c| c.checkpoint.as_str()).collect();
                InvalidForward::UnknownCheckpoint {
                    name: checkpoint.to_owned(),
                    served: served.join(", "),
                }
            })?;
        if rows.is_empty() {
            return Err(InvalidForward::NoRows);
        }
        if rows.len() > self.max_rows as usize {
            return Err(InvalidForward::TooManyRows {
                rows: rows.len(),
                max_rows: self.max_rows,
            });
        }
        let tokens: usize = rows.iter().map(|r| r.ids.len()).sum();
        if tokens > self.max_batch_tokens as usize {
            return Err(InvalidForward::TooManyTokens {
                tokens,
                max_batch_tokens: self.max_batch_tokens,
            });
        }
        for (index, row) in rows.iter().enumerate() {
            limits.check(index, row)?;
        }
        Ok(())
    }
}

impl RowLimits {
    /// Checks row number `row` of a forward: tokens, ids, markers (its question type is typed).
    pub fn check(&self, row: usize, data: &Row) -> Result<(), InvalidForward> {
        let len = data.ids.len();
        if len == 0 {
            return Err(InvalidForward::EmptyRow { row });
        }
        if len > self.max_len as usize {
            return Err(InvalidForward::RowTooLong {
                row,
                len,
                checkpoint: self.checkpoint.clone(),
                max_len: self.max_len,
            });
        }
        if let Some(bucket) = self.longest_bucket.filter(|&b| len > b as usize) {
            return Err(InvalidForward::RowLongerThanBuckets { row, len, bucket });
        }
        if let Some((position, &id)) = data.ids.iter().enumerate().find(|(_, id)| **id >= self.vocab_size) {
            return Err(InvalidForward::IdOutOfRange {
                row,
                position,
                id,
                checkpoint: self.checkpoint.clone(),
                vocab_size: self.vocab_size,
            });
        }
        if data.markers.is_empty() {
            return Err(InvalidForward::NoMarkers { row });
        }
        let mut previous: Option<u32> = None;
        for (marker, &position) in data.markers.iter().enumerate() {
            if position as usize >= len {
                return Err(InvalidForward::MarkerOutsideRow {
                    row,
                    marker,
                    position,
                    len,
                });
            }
            if let Some(previous) = previous.filter(|&p| position <= p) {
                return Err(InvalidForward::MarkersNotIncreasing {
                    row,
                    marker,
                    position,
                    previous,
                });
            }
            previous = Some(position);
        }
        Ok(())
    }
}

/// Checks that the engine answered every row with one finite logit per marker and finite act
/// probabilities; a failure here is an engine bug, reported instead of sent on.
pub fn check_outputs(rows: &[Row], outputs: &[RowOutput]) -> Result<(), String> {
    if outputs.len() != rows.len() {
        return Err(format!(
            "engine returned {} outputs for {} rows",
            outputs.len(),
            rows.len()
        ));
    }
    for (index, (row, output)) in rows.iter().zip(outputs).enumerate() {
        if output.logits.len() != row.markers.len() {
            return Err(format!(
                "row {index}: engine returned {} logits for {} markers",
                output.logits.len(),
                row.markers.len()
            ));
        }
        if output.act_probabilities.is_empty() {
            return Err(format!("row {index}: engine returned no act probabilities"));
        }
        if let Some(value) = output
            .logits
            .iter()
            .chain(&output.act_probabilities)
            .find(|v| !v.is_finite())
        {
            return Err(format!("row {index}: engine returned a non-finite value ({value})"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{EngineFacts, LoadedCheckpoint};
    use laya::question::QuestionType;

    fn info(length_buckets: Vec<u32>) -> EngineInfo {
        let checkpoint = |name: &str, vocab_size, max_len| LoadedCheckpoint {
            name: name.into(),
            revision: None,
            weights_sha256: "00".into(),
            vocab_size,
            max_len,
            warmup_len: max_len,
        };
        EngineInfo {
            device: "cpu".into(),
            dtype: "f32".into(),
            checkpoints: vec![checkpoint("english", 701, 96), checkpoint("multilingual", 776, 128)],
            max_rows: 4,
            max_batch_tokens: 200,
            length_buckets,
            parity: Vec::new(),
            facts: EngineFacts::default(),
        }
    }

    fn row(len: u32, markers: Vec<u32>) -> Row {
        Row {
            ids: (0..len).collect(),
            markers,
            qtype: QuestionType::Choice,
        }
    }

    fn check(rows: &[Row]) -> Result<(), InvalidForward> {
        ForwardLimits::from_info(&info(vec![])).check("english", rows)
    }

    #[test]
    fn accepts_rows_at_every_limit() {
        let limits = ForwardLimits::from_info(&info(vec![]));
        assert_eq!(
            check(&[row(96, vec![0, 95]), row(96, vec![5]), row(8, vec![1])]),
            Ok(())
        );
        let mut top = row(128, vec![127]);
        top.ids[0] = 775;
        top.qtype = QuestionType::Noul;
        assert_eq!(limits.check("multilingual", &[top]), Ok(()));
    }

    #[test]
    fn names_every_problem() {
        let limits = ForwardLimits::from_info(&info(vec![]));
        let message = limits
            .check("klingon", &[row(4, vec![1])])
            .expect_err("refused")
            .to_string();
        assert_eq!(
            message,
            "unknown checkpoint \"klingon\"; this worker serves english, multilingual"
        );
        assert_eq!(check(&[]), Err(InvalidForward::NoRows));
        let five = vec![row(4, vec![1]); 5];
        assert_eq!(check(&five), Err(InvalidForward::TooManyRows { rows: 5, max_rows: 4 }));
        let three_long = vec![row(90, vec![1]); 3];
        assert_eq!(
            check(&three_long),
            Err(InvalidForward::TooManyTokens {
                tokens: 270,
                max_batch_tokens: 200
            })
        );
        assert_eq!(
            check(&[row(4, vec![1]), row(0, vec![])]),
            Err(InvalidForward::EmptyRow { row: 1 })
        );
        assert_eq!(
            check(&[row(97, vec![1])]).expect_err("refused").to_string(),
            "row 0 has 97 tokens; checkpoint english takes at most 96"
        );
        let mut bad_id = row(10, vec![1]);
        bad_id.ids[7] = 701;
        assert_eq!(
            check(&[bad_id]).expect_err("refused").to_string(),
            "row 0 position 7 has token id 701; checkpoint english has 701 ids (0..701)"
        );
        assert_eq!(check(&[row(10, vec![])]), Err(InvalidForward::NoMarkers { row: 0 }));
        assert_eq!(
            check(&[row(10, vec![3, 10])]).expect_err("refused").to_string(),
            "row 0 marker 1 is at position 10, outside the row (10 tokens)"
        );
        assert_eq!(
            check(&[row(10, vec![3, 3])]),
            Err(InvalidForward::MarkersNotIncreasing {
                row: 0,
                marker: 1,
                position: 3,
                previous: 3
            })
        );
    }

    #[test]
    fn bucketed_engines_refuse_rows_beyond_their_longest_bucket() {
        let limits = ForwardLimits::from_info(&info(vec![32, 64]));
        assert_eq!(limits.check("english", &[row(64, vec![1])]), Ok(()));
        assert_eq!(
            limits.check("english", &[row(65, vec![1])]),
            Err(InvalidForward::RowLongerThanBuckets {
                row: 0,
                len: 65,
                bucket: 64
            })
        );
    }

    #[test]
    fn a_row_pads_to_the_smallest_bucket_that_holds_it() {
        let buckets = [64, 96, 128];
        assert_eq!(bucket_for(1, &buckets), Some(64));
        assert_eq!(bucket_for(64, &buckets), Some(64));
        assert_eq!(bucket_for(65, &buckets), Some(96));
        assert_eq!(bucket_for(128, &buckets), Some(128));
        assert_eq!(bucket_for(129, &buckets), None);
        assert_eq!(bucket_for(1, &[]), None);
    }

    #[test]
    fn a_checkpoint_uses_buckets_up_to_the_first_that_holds_its_longest_row() {
        assert_eq!(usable_buckets(&[64, 96, 128], 96), vec![64, 96]);
        assert_eq!(usable_buckets(&[64, 96, 128], 100), vec![64, 96, 128]);
        assert_eq!(usable_buckets(&[64, 96, 128], 512), vec![64, 96, 128]);
        assert_eq!(usable_buckets(&[64, 96, 128], 40), vec![64]);
        assert_eq!(usable_buckets(&[0, 96], 40), vec![96]);
        assert!(usable_buckets(&[], 40).is_empty());
    }

    #[test]
    fn outputs_must_match_the_rows_and_be_finite() {
        let rows = [row(10, vec![1, 2]), row(10, vec![3])];
        let output = |logits: Vec<f32>| RowOutput {
            logits,
            act_probabilities: vec![0.4, 0.6],
        };
        assert_eq!(
            check_outputs(&rows, &[output(vec![1.0, 2.0]), output(vec![3.0])]),
            Ok(())
        );
        assert_eq!(
            check_outputs(&rows, &[output(vec![1.0, 2.0])]),
            Err("engine returned 1 outputs for 2 rows".to_owned())
        );
        assert_eq!(
            check_outputs(&rows, &[output(vec![1.0]), output(vec![3.0])]),
            Err("row 0: engine returned 1 logits for 2 markers".to_owned())
        );
        assert_eq!(
            check_outputs(&rows, &[output(vec![1.0, 2.0]), output(vec![f32::NAN])]),
            Err("row 1: engine returned a non-finite value (NaN)".to_owned())
        );
        let no_act = RowOutput {
            logits: vec![3.0],
            act_probabilities: vec![],
        };
        assert_eq!(
            check_outputs(&rows, &[output(vec![1.0, 2.0]), no_act]),
            Err("row 1: engine returned no act probabilities".to_owned())
        );
    }
}
