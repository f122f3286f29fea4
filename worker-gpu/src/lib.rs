//! The candle engine: Laya's ModernBERT encoder, decision head and act head on CPU, Metal or CUDA,
//! matching upstream PyTorch (`laya[serve]==0.3.20`) in float32, running f16/bf16 (on any device) and
//! int8 (on the CPU) behind a parity gate against float32.
//!
//! Layout:
//! - [`engine`]: [`CandleEngine`], the [`layad_proto::Engine`] the worker binary serves — loading named
//!   checkpoints, validating rows, reporting what really runs.
//! - [`device`]: device requests and fallback (Metal discovery behind [`device::MetalHost`]),
//!   precision, the per-process CPU thread pool.
//! - [`macos`]: the running macOS version and [`macos::MIN_MACOS`], checked before Metal or Core ML.
//! - [`memory`]: the memory a load freed, handed back to the system.
//! - [`model`]: one checkpoint as a candle model ([`LayaModel`]): `modernbert` (encoder),
//!   `decision_head` (head layers, scorer, act head), `batch` (right-padded rows).
//! - `layers`: linear, LayerNorm, RoPE tables and attention with cached masks (banded for long
//!   sliding-window rows).
//! - [`cuda`]: CUDA math settings (TF32 off) and the device's name, memory and compute capability.
//! - [`parity`]: the parity gate's rule (shared with the Neural Engine worker); [`gate`]: the
//!   gate every checkpoint passes at load before it is served in `int8`, `f16` or `bf16`;
//!   [`reference_cache`]: its float32 reference outputs kept on disk between starts.
//! - `weights`: strict reading of `model.safetensors`; [`error`]: [`LoadError`].
//!
//! Verified on x86-64 Linux CPUs only (f32, f16, bf16 against upstream's goldens). The Metal path
//! (macOS builds enable candle's `metal` feature) is type-checked for `aarch64-apple-darwin` in CI
//! (`.ci/check-macos`); the CUDA path (`--features cuda`) is clippy-checked for compute capability
//! 9.0 in CI (`.ci/check-cuda`) and links (`tools/device/build-cuda.sh`). Neither has ever run on
//! a GPU.

pub mod cuda;
pub mod device;
pub mod engine;
pub mod error;
pub mod gate;
mod layers;
pub mod macos;
pub mod memory;
pub mod model;
pub mod parity;
pub mod reference_cache;
mod weights;

pub use device::{DeviceRequest, Precision, SelectedDevice};
pub use engine::{CandleEngine, EngineOptions};
pub use error::LoadError;
pub use layad_cpu_kernels::CpuKernels;
pub use layad_cpu_kernels::int8::Int8Activations;
pub use model::{LayaModel, MatrixFormat};
pub use reference_cache::ReferenceCache;
