//! One bf16 kernel call's operands and the tile's shape, shared by the portable tile
//! (`bf16/mod.rs`) and the AVX512_BF16 one (`bf16/avx512.rs`) without either importing the other's
//! module.

use crate::driver::Prefetch;

/// Columns per packed panel: two AVX-512 registers of f32 sums.
pub(super) const NR: usize = 32;
/// Rows of the activation tile one `vdpbf16ps` kernel call computes.
pub(super) const MR: usize = 8;
/// The same for the widened kernel (`bf16/widened.rs`): 24 accumulators, two widened weight
/// registers and the mask beside them in AVX-512's 32.
pub(super) const MW: usize = 14;

/// One kernel call: `rows` rows of packed bf16 pairs (`MR` words per pair; the widened kernel's
/// `2·MW` f32 per pair, a depth's `MW` rows then the next depth's) times one panel slice
/// (`2·NR` bf16 per pair), into `out` (rows `stride` apart), added to what `out` holds when
/// `accumulate`.
pub(super) struct Bf16TileCall<'a> {
    pub(super) x: &'a [u32],
    pub(super) panel: &'a [u16],
    pub(super) out: &'a mut [f32],
    pub(super) stride: usize,
    pub(super) accumulate: bool,
    /// Weights to request into L2 during the call (`driver::NextSlices`).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(super) prefetch: Prefetch<'a, u16>,
}
