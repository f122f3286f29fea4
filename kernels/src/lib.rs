//! layad's CPU matrix kernels, free of candle: slices in, slices out. The worker (`worker-gpu`)
//! keeps the candle adapters (its `CpuMatmul` op runs any [`CpuWeight`]), the weights its
//! linear layers hold and the choice of CPU or device; everything here is packing, quantization,
//! the panel driver and the microkernels.
//!
//! Layout, one concern per module (no file past ~800 lines):
//! - [`CpuKernels`] (`family.rs`): the kernel family, detected once at load ([`CpuKernels::detect`],
//!   or parsed from `amx`, `avx512`, `avx2`, `gemm`), reported (`/health`), and turned into
//!   `pulp`'s SIMD token ([`CpuKernels::dispatch`], also for the worker's elementwise ops).
//! - `driver.rs`: what every format's products share: the output cut into parallel column blocks
//!   (copied into place, or written in place through column ranges), the per-thread buffers they
//!   reuse, and the weight slices streamed into L2 while the current ones compute (next slices,
//!   prefetch). Each format keeps its own depth × row tile × panel loop, beside its microkernel
//!   call, because the tiles' shapes and element types differ.
//! - [`f32`](mod@f32): [`f32::PackedWeight`], float32 weights packed once into column panels;
//!   `f32/simd.rs` is the microkernel for both x86-64 families through `pulp` (AVX-512F, AVX2 +
//!   FMA), the portable tile beside it, and `f32/tile.rs` the call both take.
//! - [`int8`]: [`int8::QuantizedWeight`], weights quantized per column for the integer kernel
//!   chosen beside the family ([`int8::Int8Kernel`]): `layout.rs` the weight, its two layouts
//!   (u8 × s8 quads, i16 pairs) and what every int8 module shares; `mod.rs` quantizing, the
//!   product and its combine; `activations.rs` the rows' quantization passes
//!   ([`int8::Int8Activations`], outliers included); `combine.rs` integer sums to floats;
//!   `quads.rs` and `pairs.rs` each layout's row packing and loop with its portable tile; `vnni.rs`
//!   (AVX512-VNNI) and `avx_vnni.rs` (AVX-VNNI) the SIMD microkernels, row quantization and
//!   combine; AMX's `tdpbusd` through [`amx`].
//! - [`bf16`]: [`bf16::Bf16Weight`], weights rounded to bf16, and [`bf16::Bf16Kernel`], which
//!   instructions multiply them beside a family; `bf16/avx512.rs` the AVX512_BF16 microkernel
//!   (`vdpbf16ps`), `bf16/halves.rs` f16 multiply-adds (AVX512-FP16: Intel's `vdpbf16ps` runs at
//!   half the FMA's rate), `bf16/widened.rs` the weights widened to f32 for f32 FMAs (AVX-512F
//!   without either), `bf16/tile.rs` the call they and the portable
//!   tiles take, AMX's `tdpbf16ps` through [`amx`]; `bf16/rows.rs` the same tile for products by something other
//!   than a weight ([`bf16::RowsProduct`]: the attention's q·kᵀ and p·v in a bf16 pool), and
//!   their blocks of rows on AMX's tiles where the pool's weights run there ([`bf16::RowTiles`]).
//! - [`geglu`]: GeGLU (`gelu_erf(u) · g`, erf's rational approximation) for the worker's op on a
//!   projection's output, and applied by the products themselves to a weight packed for it
//!   ([`f32::PackedWeight::pack_out_in_geglu`]: columns grouped 16 inputs then their 16 gates per
//!   panel, so a column block holds whole pairs; the f32 and bf16 block copy and the int8 combine
//!   then write `[m, I]`, and the `[m, 2·I]` projection is never stored).
//! - [`amx`]: Intel AMX (Sapphire Rapids and later Xeons): the CPU's tile permission and why it was
//!   refused ([`amx::Amx::detect`]), and one driver (`amx/tiles.rs`) that multiplies row-major
//!   activation words by packed 32-column weight panels on the tile registers, for two formats
//!   (`amx/product.rs`: the sizes, the formats, a block of products and its portable model):
//!   - `tdpbusd`: u8 activations × s8 weights, four depths per 32-bit word, exact i32 sums
//!     ([`amx::Int8Tiles`]);
//!   - `tdpbf16ps`: bf16 activations × bf16 weights, two depths per word, f32 sums
//!     ([`amx::Bf16Tiles`]; [`amx::Bf16Words`] where the right-hand side arrives as pair words,
//!     the attention's keys and values).
//!
//!   The same products run in a portable model of the tile operation ([`amx::TileProduct::model`]),
//!   which is how the tests check the packing and the tile layout on every CPU, and the AMX code
//!   against it bit for bit where the CPU has AMX.
//!
//! Every SIMD kernel has a portable twin the tests compare it with: bit for bit for the integer
//! sums, the row quantization and the combine (int8) and the f32 panels; within f32 rounding where
//! the instruction rounds differently (bf16's `vdpbf16ps`), and against a float64 product; the f16
//! kernel's bit for bit against each multiply-add computed in f64 and rounded to f16.
//!
//! `unsafe` lives in the modules that execute SIMD or tile instructions (`int8::vnni`,
//! `int8::avx_vnni`, `bf16::avx512`, `bf16::halves`, `bf16::widened`, `amx::tiles`), in the permission request
//! (`amx::permission`), and in the marked places of `driver.rs` (the prefetch hint, and the output's
//! disjoint column ranges, written in place or copied into without zeroing first) and of
//! `int8/mod.rs` (its combine's promise to write every column of its range), each use with its
//! SAFETY note. The x86-only modules
//! compile only for x86-64; elsewhere the worker runs candle's matmul (the `gemm` family).

pub mod amx;
pub mod bf16;
mod driver;
pub mod f32;
mod family;
pub mod geglu;
pub mod int8;

pub use family::CpuKernels;

/// A constant weight `[k, n]` prepared for the CPU kernels (packed f32, bf16 or int8): what the
/// worker's candle op (`CpuMatmul`) needs to run it.
pub trait CpuWeight: Sync {
    /// The op's name in candle's errors.
    const NAME: &'static str;
    /// Input features (`k`) and output features (`n`).
    fn dims(&self) -> (usize, usize);
    /// `x · W (+ bias)` for `x` `[m, k]` row-major; returns `[m, n]` row-major.
    fn matmul(&self, x: &[f32], m: usize) -> Vec<f32>;
}
