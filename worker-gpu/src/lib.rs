//! The candle engine: Laya's ModernBERT encoder, decision head and act head on CPU, Metal or CUDA,
//! matching upstream PyTorch (`laya[serve]==0.3.20`) in float32, running f16/bf16 on GPUs and int8
//! (behind a parity gate) on the CPU.
//!
//! Layout:
//! - [`engine`]: [`CandleEngine`], the [`layad_proto::Engine`] the worker binary serves — loading named
//!   checkpoints, validating rows, reporting what really runs.
//! - [`device`]: device requests and fallback (Metal discovery behind [`device::MetalHost`]),
//!   precision, the per-process CPU thread pool.
//! - [`macos`]: the running macOS version and [`macos::MIN_MACOS`], checked before Metal or Core ML.
//! - [`model`]: one checkpoint as a candle model ([`LayaModel`]): `modernbert` (encoder),
//!   `decision_head` (head layers, scorer, act head), `batch` (right-padded rows).
//! - `layers`: linear, LayerNorm, RoPE tables and attention with cached masks (banded for long
//!   sliding-window rows).
//! - [`parity`]: the parity gate's rule (shared with the Neural Engine worker); [`gate`]: the
//!   int8 gate every checkpoint passes at load before it is served in `dtype = "int8"`.
//! - `weights`: strict reading of `model.safetensors`; [`error`]: [`LoadError`].
//!
//! Verified on x86-64 Linux CPUs only (f32, f16, bf16 against upstream's goldens). The Metal path
//! (macOS builds enable candle's `metal` feature) is type-checked for `aarch64-apple-darwin` in CI
//! (`.ci/check-macos`) and the CUDA path (`--features cuda`, needs the CUDA toolkit to build) uses
//! only candle ops with CUDA kernels; neither has ever run.

pub mod device;
pub mod engine;
pub mod error;
pub mod gate;
mod layers;
pub mod macos;
pub mod model;
pub mod parity;
mod weights;

pub use device::{DeviceRequest, Precision, SelectedDevice};
pub use engine::{CandleEngine, EngineOptions};
pub use error::LoadError;
pub use layers::cpu_matmul::CpuKernels;
pub use model::LayaModel;
