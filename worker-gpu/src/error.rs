//! Why loading a checkpoint into the engine failed. Every variant names what it is about: the
//! checkpoint, the weights file, the tensor, the device.

use std::path::PathBuf;

/// Why the engine could not load a checkpoint or set itself up.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The checkpoint's files could not be found, read or parsed.
    #[error("checkpoint '{name}': {source}")]
    Checkpoint {
        /// Name the checkpoint was given.
        name: String,
        /// What `laya::checkpoint` reported.
        source: laya::checkpoint::CheckpointError,
    },
    /// Two checkpoints were given the same name.
    #[error("checkpoint name '{0}' is given twice")]
    DuplicateName(String),
    /// No checkpoint was given.
    #[error("no checkpoint to load")]
    NoCheckpoints,
    /// A tensor the model needs is not in the weights file.
    #[error("{path}: tensor '{tensor}' is missing", path = path.display())]
    MissingTensor {
        /// The weights file.
        path: PathBuf,
        /// The tensor the model needs.
        tensor: String,
    },
    /// The weights file holds tensors the model does not have (upstream loads strictly).
    #[error("{path}: unexpected tensor(s) {names} (not part of a Laya decision model with this config)", path = path.display(), names = tensors.join(", "))]
    UnexpectedTensors {
        /// The weights file.
        path: PathBuf,
        /// The names the model has no place for.
        tensors: Vec<String>,
    },
    /// A tensor's shape disagrees with the configs.
    #[error("{path}: tensor '{tensor}' has shape {found:?}, expected {expected:?}", path = path.display())]
    TensorShape {
        /// The weights file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// Shape the configs call for.
        expected: Vec<usize>,
        /// Shape in the file.
        found: Vec<usize>,
    },
    /// A tensor is stored in a dtype the model cannot use.
    #[error("{path}: tensor '{tensor}' is {dtype}; weights must be F32, F16 or BF16", path = path.display())]
    TensorDtype {
        /// The weights file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// Its dtype in the file.
        dtype: String,
    },
    /// The configs describe a model this engine cannot build.
    #[error("checkpoint '{name}': {problem}")]
    Unsupported {
        /// Name the checkpoint was given.
        name: String,
        /// What is not supported.
        problem: String,
    },
    /// The weights file could not be decoded, or a tensor could not be placed on the device.
    #[error("{path}: {source}", path = path.display())]
    Tensor {
        /// The weights file.
        path: PathBuf,
        /// candle's error.
        source: candle_core::Error,
    },
    /// The checkpoint's int8, f16 or bf16 forward disagreed with its float32 forward beyond the
    /// parity gate, so it is not served in that precision.
    #[error(
        "checkpoint '{name}': refused in {precision}, the parity gate against float32 failed on {rows} built-in rows: {reason}; serve it in f32"
    )]
    ParityGate {
        /// Name the checkpoint was given.
        name: String,
        /// The precision refused: `int8`, `f16` or `bf16`.
        precision: String,
        /// Rows compared.
        rows: u32,
        /// What exceeded the gate, with the numbers.
        reason: String,
    },
    /// The device could not be set up (thread pool, precision the device cannot run).
    #[error("device setup: {0}")]
    Device(String),
}
