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
    /// Longest row the checkpoint accepts: at least its own `max_len`; more where a request's
    /// `max_len` may ask for more (upstream 0.4.x) and the encoder's positions allow it.
    pub max_len: u32,
    /// Longest row warm-up may run (its short row and buckets are capped by it): the checkpoint's
    /// own `max_len` (`rl_agent_config.json`), which nearly every request stays within.
    pub warmup_len: u32,
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

/// A GPU as its driver describes it (Describe's `gpu`, shown in the supervisor's `/health`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuInfo {
    /// The driver's name for it, e.g. `NVIDIA H200`.
    pub name: String,
    /// Total device memory, in bytes.
    pub total_memory_bytes: u64,
    /// CUDA compute capability `(major, minor)`; `None` for GPUs that have none.
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

/// A model engine behind the worker protocol.
pub trait Engine: Send + 'static {
    /// What is loaded and where it runs.
    fn info(&self) -> EngineInfo;

    /// Runs `rows` on `checkpoint` in one batch and returns one output per row, in order.
    fn forward(&mut self, checkpoint: &str, rows: &[EngineRow]) -> Result<Vec<EngineOutput>, EngineError>;

    /// The parity gate the engine passed at load, per checkpoint; empty for engines that run the
    /// reference model itself. Read once, after warm-up.
    fn parity(&self) -> Vec<ParityReport> {
        Vec::new()
    }

    /// On the CPU, the SIMD kernel family the matrix products run on (`amx`, `avx512`, `avx2`, `gemm`);
    /// `None` on other devices and for engines that do not choose one.
    fn cpu_kernels(&self) -> Option<String> {
        None
    }

    /// On a GPU, the device as its driver describes it; `None` on the CPU and for engines that do
    /// not report it. Read once, after warm-up.
    fn gpu(&self) -> Option<GpuInfo> {
        None
    }

    /// Why the engine runs on another device than the one requested, in its own words; `None`
    /// when it did not fall back. Read once, after warm-up.
    fn device_fallback(&self) -> Option<String> {
        None
    }
}
