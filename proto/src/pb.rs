//! Rust types and tonic client/server code generated from `worker.proto` by `build.rs`, plus the
//! conversions between wire messages and the engine types, and the one encoding and decoding of an
//! engine's facts (`WorkerInfo.engine_facts`, JSON).

#![allow(missing_docs, clippy::all, clippy::pedantic)]

use laya::question::QuestionType;

use crate::engine::{self, EngineFacts, LoadedCheckpoint, ParityReport, PlacementReport};
use crate::error::EngineFactsError;
use crate::rows::InvalidForward;

tonic::include_proto!("layad.worker.v1");

/// Revision of the worker protocol within package `layad.worker.v1`. Bump it on any change a peer
/// built from the previous revision would misread; the client refuses a worker whose revision differs.
/// Revision 2: the engine's facts for operators travel as one JSON value (`engine_facts`) instead of
/// the fields `cpu_kernels`, `gpu` and `device_fallback`.
pub const PROTOCOL_VERSION: u32 = 2;

/// The gRPC metadata key of a forward's request ids, one entry per job of the batch in batch
/// order: the supervisor's `Job.request_id`, which the worker puts on every log line of the
/// forward (its `forward` span's `request_id`), so that both sides' lines of a request can be tied.
pub const REQUEST_ID_METADATA: &str = "x-request-id";

impl Row {
    /// The prompt row this message carries, its buffers moved, not copied; `index` is the row's
    /// place in the forward, for the refusal of a `qtype` that is not a question type.
    pub fn into_row(self, index: usize) -> Result<engine::Row, InvalidForward> {
        let qtype = QuestionType::from_index(self.qtype).ok_or(InvalidForward::UnknownQtype {
            row: index,
            qtype: self.qtype,
        })?;
        Ok(engine::Row {
            ids: self.ids,
            markers: self.markers,
            qtype,
        })
    }
}

/// A forward message's rows, decoded once on the worker's side of the socket.
pub fn decode_rows(rows: Vec<Row>) -> Result<Vec<engine::Row>, InvalidForward> {
    rows.into_iter()
        .enumerate()
        .map(|(index, row)| row.into_row(index))
        .collect()
}

/// By move: the message takes the row's buffers, so a request's token ids are not copied again
/// on their way to the socket.
impl From<engine::Row> for Row {
    fn from(row: engine::Row) -> Self {
        Row {
            ids: row.ids,
            markers: row.markers,
            qtype: row.qtype.index(),
        }
    }
}

impl From<RowOutput> for engine::RowOutput {
    fn from(output: RowOutput) -> Self {
        engine::RowOutput {
            logits: output.logits,
            act_probabilities: output.act_probabilities,
        }
    }
}

impl From<engine::RowOutput> for RowOutput {
    fn from(output: engine::RowOutput) -> Self {
        RowOutput {
            logits: output.logits,
            act_probabilities: output.act_probabilities,
        }
    }
}

impl From<&LoadedCheckpoint> for Checkpoint {
    fn from(checkpoint: &LoadedCheckpoint) -> Self {
        Checkpoint {
            name: checkpoint.name.clone(),
            revision: checkpoint.revision.clone(),
            weights_sha256: checkpoint.weights_sha256.clone(),
            vocab_size: checkpoint.vocab_size,
            max_len: checkpoint.max_len,
        }
    }
}

impl From<&PlacementReport> for PlacementProbe {
    fn from(probe: &PlacementReport) -> Self {
        PlacementProbe {
            bucket: probe.bucket,
            fastest_ms: probe.fastest_ms,
            cpu_only_fastest_ms: probe.cpu_only_fastest_ms,
            ratio: probe.ratio(),
        }
    }
}

impl From<&ParityReport> for CheckpointParity {
    fn from(report: &ParityReport) -> Self {
        CheckpointParity {
            checkpoint: report.checkpoint.clone(),
            executor: report.executor.clone(),
            rows: report.rows,
            skipped_rows: report.skipped_rows,
            tolerance: report.tolerance,
            max_probability_diff: report.max_probability_diff,
            max_act_probability_diff: report.max_act_probability_diff,
            hard_mismatches: report.hard_mismatches,
            near_tie_flips: report.near_tie_flips.clone(),
            placement: report.placement.iter().map(PlacementProbe::from).collect(),
        }
    }
}

impl ParityGate {
    /// The gate of an engine's reports, or `None` when the engine ran none.
    pub fn from_reports(reports: &[ParityReport]) -> Option<Self> {
        (!reports.is_empty()).then(|| ParityGate {
            checkpoints: reports.iter().map(CheckpointParity::from).collect(),
        })
    }
}

/// `WorkerInfo.engine_facts` of `facts`: a JSON object, one key per field.
pub fn encode_engine_facts(facts: &EngineFacts) -> Result<String, serde_json::Error> {
    serde_json::to_string(facts)
}

impl WorkerInfo {
    /// The engine's facts, decoded from `engine_facts` (empty: a worker with none to report). A
    /// value that does not decode breaks the protocol: both ends are built from the same
    /// `EngineFacts`.
    pub fn decode_engine_facts(&self) -> Result<EngineFacts, EngineFactsError> {
        if self.engine_facts.is_empty() {
            return Ok(EngineFacts::default());
        }
        Ok(serde_json::from_str(&self.engine_facts)?)
    }
}

impl WorkerState {
    /// Lower-case name used in log lines and messages: `loading`, `ready`, …
    pub fn label(self) -> &'static str {
        match self {
            WorkerState::Unspecified => "unspecified",
            WorkerState::Loading => "loading",
            WorkerState::Warming => "warming",
            WorkerState::Ready => "ready",
            WorkerState::Draining => "draining",
            WorkerState::Failed => "failed",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::GpuInfo;

    #[test]
    fn engine_facts_cross_the_wire_unchanged_and_garbage_is_a_protocol_error() {
        let facts = EngineFacts {
            cpu_kernels: Some("avx512".into()),
            gpu: Some(GpuInfo {
                name: "NVIDIA H100".into(),
                total_memory_bytes: 85_000_000_000,
                compute_capability: Some((9, 0)),
                tf32: false,
            }),
            ..EngineFacts::default()
        };
        let mut info = WorkerInfo {
            engine_facts: encode_engine_facts(&facts).expect("encodes"),
            ..WorkerInfo::default()
        };
        assert_eq!(info.decode_engine_facts().expect("decodes"), facts);
        info.engine_facts = String::new();
        assert_eq!(info.decode_engine_facts().expect("none"), EngineFacts::default());
        info.engine_facts = "[1, 2]".into();
        let error = info.decode_engine_facts().expect_err("refused");
        assert!(error.to_string().starts_with("engine_facts is not"), "{error}");
    }

    #[test]
    fn rows_cross_into_and_out_of_the_message_without_copying_their_ids() {
        let row = engine::Row {
            ids: vec![101, 7, 8, 9, 102],
            markers: vec![1, 2],
            qtype: QuestionType::Noul,
        };
        let ids = row.ids.as_ptr();
        let message = Row::from(row);
        assert_eq!(
            message.ids.as_ptr(),
            ids,
            "the supervisor's side moves the ids into the message"
        );
        assert_eq!(message.qtype, 2);
        let back = message.into_row(0).expect("a known qtype");
        assert_eq!(back.ids.as_ptr(), ids, "the worker's side moves them out of it");
        assert_eq!(back.ids, [101, 7, 8, 9, 102]);
        assert_eq!(back.qtype, QuestionType::Noul);
    }

    #[test]
    fn a_qtype_that_is_no_question_type_is_refused_with_its_row() {
        let row = |qtype| Row {
            ids: vec![101, 4, 102],
            markers: vec![1],
            qtype,
        };
        let error = decode_rows(vec![row(0), row(1), row(3)]).expect_err("qtype 3 is refused");
        assert_eq!(error, InvalidForward::UnknownQtype { row: 2, qtype: 3 });
        let rows = decode_rows(vec![row(0), row(1), row(2)]).expect("every type decodes");
        let types: Vec<_> = rows.iter().map(|r| r.qtype).collect();
        assert_eq!(types, [QuestionType::Choice, QuestionType::Score, QuestionType::Noul]);
    }
}
