//! The Neural Engine worker: Laya checkpoints as fixed-length `bc1s-masked` graphs (Core ML on the
//! ANE, or candle on the CPU), with the host work, artifact admission and parity gate around them.
//!
//! Layout:
//! - [`engine`]: [`AneEngine`], the [`layad_proto::Engine`] the `layad-worker-ane` binary serves:
//!   admission of every checkpoint (manifests, warm-up, placement probe, parity gate), then one row
//!   per prediction, padded to the smallest bucket that holds it.
//! - [`host`]: what runs on the host in float32: the embedding gather, masks, type vector and marker
//!   map going in, act features, act head and softmax coming out.
//! - [`executor`]: the narrow [`executor::Executor`] trait over the graph, with the candle executor
//!   (everywhere) and the Core ML executor (`executor::coreml`, macOS only, never compiled on Linux).
//! - [`artifact`]: `<artifacts>/<checkpoint>/L<bucket>/manifest.json` + `model.mlpackage/` and
//!   `parity.json`: discovery, field-by-field verification, the package tree hash.
//! - [`parity`]: the gate's rule (|Δp| and |Δact| ≤ 0.02, no hard mismatch, near-tie flips listed),
//!   shared with the candle worker's int8 gate (it lives in `worker_gpu::parity`).
//!
//! The Core ML binding is `objc2-core-ml` (see README.md for why); it is the only code here that is
//! not built and tested on Linux.

pub mod artifact;
pub mod engine;
pub mod executor;
pub mod host;
pub use worker_gpu::parity;

pub use engine::{AneEngine, AneError, AneOptions, ExecutorKind};
