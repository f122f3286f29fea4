//! The one trait every worker's model engine implements: describe what runs, and run a batch of
//! prompt rows to per-option logits and act probabilities. The serving harness drives it.
//!
//! Engines are synchronous and own their device; the harness calls them from one dedicated thread,
//! one batch at a time, so an engine needs no locking of its own.

/// One prompt row as the supervisor built it (see `layad-laya`'s `prompt::Row`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EngineRow {
    /// Token ids, unpadded; every id is a real token (attention covers the whole row).
    pub ids: Vec<u32>,
    /// Positions of the option `[MASK]` tokens, in option order.
    pub markers: Vec<u32>,
    /// Question type: 0 choice, 1 score, 2 noul.
    pub qtype: u32,
}

/// What the model computed for one row.
#[derive(Clone, Debug, PartialEq)]
pub struct EngineOutput {
    /// One logit per marker, float32, before any temperature.
    pub logits: Vec<f32>,
    /// Softmax of the act head (length `n_act`); component 0 is upstream's `act_probability`.
    pub act_probabilities: Vec<f32>,
}

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
    /// Longest row the checkpoint accepts (its `max_len`).
    pub max_len: u32,
}

/// What an engine really runs on, as opposed to what it was asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
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

/// A model engine behind the worker protocol.
pub trait Engine: Send + 'static {
    /// What is loaded and where it runs.
    fn info(&self) -> EngineInfo;

    /// Runs `rows` on `checkpoint` in one batch and returns one output per row, in order.
    fn forward(&mut self, checkpoint: &str, rows: &[EngineRow]) -> Result<Vec<EngineOutput>, EngineError>;
}
