//! One f32 kernel call's operands and the row tile's height, shared by the portable tile
//! (`f32/mod.rs`) and the SIMD one (`f32/simd.rs`) without either importing the other's module.

use crate::driver::Prefetch;

/// Rows of the activation tile one AVX-512 kernel call computes at most
/// ([`crate::CpuKernels::f32_tile_rows`]).
pub(crate) const WIDE_ROWS: usize = 14;
/// The same for AVX2's 16 registers, and the portable tile.
pub(crate) const NARROW_ROWS: usize = 6;

/// One kernel call: `R` rows of packed activations times one panel slice, into `out` (rows `stride`
/// apart), added to what `out` holds when `accumulate`.
pub(crate) struct TileCall<'a> {
    /// Packed activation rows (the family's row tile height of values per depth), as `pack_rows`
    /// lays them out.
    pub(crate) x: &'a [f32],
    /// One panel: `nr` values per depth, as many depths as `x` has.
    pub(crate) panel: &'a [f32],
    /// The first output row; row `r` starts at `r·stride`, `nr` values each.
    pub(crate) out: &'a mut [f32],
    pub(crate) stride: usize,
    pub(crate) accumulate: bool,
    /// Weights to request into L2 during the call ([`NextSlices`]).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(crate) prefetch: Prefetch<'a, f32>,
}
