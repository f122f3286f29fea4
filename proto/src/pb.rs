//! Rust types and tonic client/server code generated from `worker.proto` by `build.rs`, plus the
//! conversions between wire messages and the engine types.

#![allow(missing_docs, clippy::all, clippy::pedantic)]

use crate::engine::{EngineOutput, EngineRow, LoadedCheckpoint};

tonic::include_proto!("layad.worker.v1");

impl From<Row> for EngineRow {
    fn from(row: Row) -> Self {
        EngineRow {
            ids: row.ids,
            markers: row.markers,
            qtype: row.qtype,
        }
    }
}

impl From<&EngineRow> for Row {
    fn from(row: &EngineRow) -> Self {
        Row {
            ids: row.ids.clone(),
            markers: row.markers.clone(),
            qtype: row.qtype,
        }
    }
}

impl From<EngineOutput> for RowOutput {
    fn from(output: EngineOutput) -> Self {
        RowOutput {
            logits: output.logits,
            act_probabilities: output.act_probabilities,
        }
    }
}

impl From<RowOutput> for EngineOutput {
    fn from(output: RowOutput) -> Self {
        EngineOutput {
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
