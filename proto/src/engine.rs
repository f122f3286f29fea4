//! The one trait every worker's model engine implements, and the values it reports. The trait is
//! behaviour only: [`Engine::describe`] says what runs and [`Engine::forward`] runs a batch of prompt
//! rows to per-option logits and act probabilities. The serving harness drives the rest of an
//! engine's life: it loads it (the closure a worker binary hands to `harness::run`), warms it up with
//! forwards on the shapes planned from `describe`, then serves.
//!
//! Every static fact lives in one [`EngineInfo`] value. Its admission fields (device, precision,
//! checkpoints, limits) and the parity gate are typed fields of `worker.proto`, because the
//! supervisor decides by them or shows them in a fixed place; everything else an engine tells
//! operators goes in [`EngineFacts`], which crosses the socket as one JSON value and lands in
//! `/health`'s worker record as it is. A new fact is a field of [`EngineFacts`] and the code of the
//! engine that fills it: nothing between the engine and the JSON names it.
//!
//! Engines are synchronous and own their device; the harness calls them from one dedicated thread,
//! one batch at a time, so an engine needs no locking of its own.

use serde::{Deserialize, Serialize};

/// A prompt row and what the model computed for it are `layad-laya`'s own types, used unchanged
/// from the tokenizer to the engine and back: converted to protobuf once at the socket and back once
/// (`pb.rs`).
pub use laya::decision::RowOutput;
pub use laya::prompt::Row;

/// A checkpoint an engine has loaded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoadedCheckpoint {
    /// Name the supervisor uses for it (`english`, `multilingual`, `typed-decisions`, …).
    pub name: String,
    /// Commit of the snapshot it was loaded from, when known.
    pub revision: Option<String>,
    /// SHA-256 of the `model.safetensors` bytes that were loaded.
    pub weights_sha256: String,
    /// Ids must be below this.
    pub vocab_size: u32,
    /// Longest row the checkpoint accepts: at least its own `max_len`; more where a request's
    /// `max_len` may ask for more (upstream 0.4.x) and the encoder's positions allow it.
    pub max_len: u32,
    /// Longest row warm-up may run (its short row and buckets are capped by it): the checkpoint's
    /// own `max_len` (`rl_agent_config.json`), which nearly every request stays within.
    pub warmup_len: u32,
}

/// What an engine really runs on, as opposed to what it was asked for: every static fact about it,
/// fixed once it has loaded.
#[derive(Clone, Debug, PartialEq)]
pub struct EngineInfo {
    /// Device actually in use: `cpu`, `metal`, `cuda:0`, `ane`.
    pub device: String,
    /// Compute precision actually in use: `f32`, `f16`, `bf16`.
    pub dtype: String,
    /// Every loaded checkpoint.
    pub checkpoints: Vec<LoadedCheckpoint>,
    /// Most rows in one forward.
    pub max_rows: u32,
    /// Most tokens (sum of row lengths) in one forward.
    pub max_batch_tokens: u32,
    /// Fixed row lengths the engine pads to (empty: any length up to `max_len`).
    pub length_buckets: Vec<u32>,
    /// The parity gate the engine passed at load, per checkpoint; empty for engines that run the
    /// reference model itself.
    pub parity: Vec<ParityReport>,
    /// What the engine tells operators and nothing decides by; shown in `/health` as it is.
    pub facts: EngineFacts,
}

/// An engine's facts for operators: the supervisor keeps them as they arrive and writes each field,
/// under its own name, into the worker's record in `/health` (flattened beside `device` and
/// `dtype`). Sent over the socket as one JSON object (`WorkerInfo.engine_facts`), so adding a field
/// here changes neither `worker.proto` nor the supervisor. A field must be `null`, empty or zero
/// when the engine has nothing to say (`Default`), and keeps its name once published: scripts read
/// `/health`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct EngineFacts {
    /// On the CPU, the SIMD kernel family the matrix products run on (`amx`, `avx512`, `avx2`,
    /// `gemm`); `None` on other devices and for engines that do not choose one.
    pub cpu_kernels: Option<String>,
    /// On a GPU, the device as its driver describes it; `None` on the CPU and for engines that do
    /// not report it.
    pub gpu: Option<GpuInfo>,
    /// Why the engine runs on another device than the one requested, in its own words; `None` when
    /// it did not fall back.
    pub device_fallback: Option<String>,
}

/// How an engine that runs a converted graph agreed with upstream's reference outputs on one
/// checkpoint before it became ready (reported by Describe; see `worker.proto`'s `CheckpointParity`).
#[derive(Clone, Debug, PartialEq)]
pub struct ParityReport {
    /// Checkpoint name.
    pub checkpoint: String,
    /// What produced the outputs: executor, device, precision (`coreml ane f16`, `candle cpu f16`).
    pub executor: String,
    /// Reference rows compared.
    pub rows: u32,
    /// Reference rows no length bucket holds.
    pub skipped_rows: u32,
    /// Largest allowed |difference| of a calibrated option probability and of an act probability.
    pub tolerance: f64,
    /// Largest |difference| of a calibrated option probability.
    pub max_probability_diff: f64,
    /// Largest |difference| of an act probability.
    pub max_act_probability_diff: f64,
    /// Rows whose top option differs outside the near-tie margin (zero once the gate passed).
    pub hard_mismatches: u32,
    /// Reference rows whose top option differs inside the near-tie margin.
    pub near_tie_flips: Vec<u32>,
    /// Placement probe per length bucket, where the executor needs one.
    pub placement: Vec<PlacementReport>,
}

/// Timing evidence that a bucket's graph runs on the accelerator, not quietly on the CPU.
#[derive(Clone, Debug, PartialEq)]
pub struct PlacementReport {
    /// Length bucket.
    pub bucket: u32,
    /// Fastest of five predictions as configured, in milliseconds.
    pub fastest_ms: f64,
    /// Fastest of five predictions of the same artifact loaded CPU-only, in milliseconds.
    pub cpu_only_fastest_ms: f64,
}

impl PlacementReport {
    /// `fastest_ms / cpu_only_fastest_ms`.
    pub fn ratio(&self) -> f64 {
        self.fastest_ms / self.cpu_only_fastest_ms
    }
}

/// A GPU as its driver describes it ([`EngineFacts::gpu`], shown in the supervisor's `/health`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuInfo {
    /// The driver's name for it, e.g. `NVIDIA H200`.
    pub name: String,
    /// Total device memory, in bytes.
    pub total_memory_bytes: u64,
    /// CUDA compute capability `(major, minor)`; `None` for GPUs that have none. In JSON the string
    /// `major.minor` (`9.0`), empty for none, as `/health` has always shown it.
    #[serde(with = "compute_capability")]
    pub compute_capability: Option<(u32, u32)>,
    /// Whether float32 matrix products may accumulate in reduced precision (TF32).
    pub tf32: bool,
}

/// Why a forward failed.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The request itself is wrong (unknown checkpoint, id out of range, marker outside the row…).
    #[error("{0}")]
    InvalidArgument(String),
    /// The engine failed (device error, out of memory…).
    #[error("{0}")]
    Internal(String),
}

/// A model engine behind the worker protocol: behaviour only; what it is comes back from
/// [`Engine::describe`] as one value.
pub trait Engine: Send + 'static {
    /// Every static fact: what is loaded, where it runs, its limits, its parity gate and its facts
    /// for operators. The harness reads it once after load (to plan the warm-up) and once after
    /// warm-up (what Describe reports), so facts an engine learns while warming count.
    fn describe(&self) -> EngineInfo;

    /// Runs the forward's rows on its checkpoint in one batch and returns one output per row, in
    /// order. The rows were checked against this engine's [`EngineInfo`] ([`CheckedForward`]).
    fn forward(&mut self, forward: &CheckedForward) -> Result<Vec<RowOutput>, EngineError>;
}

/// A forward that passed [`ForwardLimits::admit`](crate::rows::ForwardLimits::admit): its
/// checkpoint is served and every row is within the engine's limits. `admit` is the only way to make
/// one, so an engine given one checks none of that again: the worker checks a forward's rows once,
/// in the harness, before the engine. Callers that hold an engine directly (warm-up, tools, tests)
/// use [`rows::check_and_forward`](crate::rows::check_and_forward).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckedForward {
    checkpoint: String,
    rows: Vec<Row>,
}

impl CheckedForward {
    /// Only `ForwardLimits::admit` calls this, after its check.
    pub(crate) fn new(checkpoint: String, rows: Vec<Row>) -> Self {
        CheckedForward { checkpoint, rows }
    }

    /// The checkpoint to run the rows on.
    pub fn checkpoint(&self) -> &str {
        &self.checkpoint
    }

    /// The rows, in the forward's order.
    pub fn rows(&self) -> &[Row] {
        &self.rows
    }
}

/// [`GpuInfo::compute_capability`] as the string `major.minor` (empty: none).
mod compute_capability {
    use serde::de::Error as _;
    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(value: &Option<(u32, u32)>, serializer: S) -> Result<S::Ok, S::Error> {
        match value {
            Some((major, minor)) => serializer.collect_str(&format_args!("{major}.{minor}")),
            None => serializer.serialize_str(""),
        }
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<(u32, u32)>, D::Error> {
        let text = String::deserialize(deserializer)?;
        if text.is_empty() {
            return Ok(None);
        }
        let parsed = text
            .split_once('.')
            .and_then(|(major, minor)| Some((major.parse().ok()?, minor.parse().ok()?)));
        parsed
            .map(Some)
            .ok_or_else(|| D::Error::custom(format!("compute capability '{text}' is not major.minor")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h200() -> GpuInfo {
        GpuInfo {
            name: "NVIDIA H200".into(),
            total_memory_bytes: 150_754_820_096,
            compute_capability: Some((9, 0)),
            tf32: false,
        }
    }

    #[test]
    fn facts_are_json_with_a_compute_capability_as_major_dot_minor_and_read_back_the_same() {
        let facts = EngineFacts {
            cpu_kernels: None,
            gpu: Some(h200()),
            device_fallback: Some("metal unavailable; running on cpu".into()),
        };
        let json = serde_json::to_value(&facts).expect("serializes");
        assert_eq!(
            json,
            serde_json::json!({
                "cpu_kernels": null,
                "gpu": {"name": "NVIDIA H200", "total_memory_bytes": 150_754_820_096_u64,
                        "compute_capability": "9.0", "tf32": false},
                "device_fallback": "metal unavailable; running on cpu",
            })
        );
        assert_eq!(serde_json::from_value::<EngineFacts>(json).expect("reads"), facts);

        let metal = GpuInfo {
            compute_capability: None,
            ..h200()
        };
        let json = serde_json::to_value(&metal).expect("serializes");
        assert_eq!(json["compute_capability"], "");
        assert_eq!(serde_json::from_value::<GpuInfo>(json).expect("reads"), metal);
    }

    #[test]
    fn missing_facts_read_as_none_and_a_malformed_capability_is_refused() {
        let facts: EngineFacts = serde_json::from_str(r#"{"cpu_kernels": "avx2"}"#).expect("reads");
        assert_eq!(
            facts,
            EngineFacts {
                cpu_kernels: Some("avx2".into()),
                ..EngineFacts::default()
            }
        );
        let wrong = r#"{"name": "x", "total_memory_bytes": 1, "compute_capability": "nine", "tf32": false}"#;
        let error = serde_json::from_str::<GpuInfo>(wrong).expect_err("refused");
        assert!(error.to_string().contains("'nine' is not major.minor"), "{error}");
    }
}
