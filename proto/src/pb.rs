//! Rust types and tonic client/server code generated from `worker.proto` by `build.rs`, plus the
//! conversions between wire messages and the engine types.

#![allow(missing_docs, clippy::all, clippy::pedantic)]

use crate::engine::{EngineOutput, EngineRow, GpuInfo, LoadedCheckpoint, ParityReport, PlacementReport};

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

impl From<&GpuInfo> for GpuDevice {
    fn from(gpu: &GpuInfo) -> Self {
        GpuDevice {
            name: gpu.name.clone(),
            total_memory_bytes: gpu.total_memory_bytes,
            compute_capability: gpu
                .compute_capability
                .map(|(major, minor)| format!("{major}.{minor}"))
                .unwrap_or_default(),
            tf32: gpu.tf32,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gpu_is_described_with_its_compute_capability_as_major_dot_minor() {
        let mut gpu = GpuInfo {
            name: "NVIDIA H200".into(),
            total_memory_bytes: 150_754_820_096,
            compute_capability: Some((9, 0)),
            tf32: false,
        };
        let wire = GpuDevice::from(&gpu);
        assert_eq!(
            (
                wire.name.as_str(),
                wire.total_memory_bytes,
                wire.compute_capability.as_str(),
                wire.tf32
            ),
            ("NVIDIA H200", 150_754_820_096, "9.0", false)
        );
        gpu.compute_capability = None;
        assert_eq!(GpuDevice::from(&gpu).compute_capability, "");
    }
}
