//! One bf16 kernel call's operands and the tiles' shapes (and the dispatch of a tile's height to
//! its compiled kernel), shared by the portable tiles (`bf16/mod.rs`) and the SIMD ones
//! (`avx512.rs`, `widened.rs`, `halves.rs`) without either importing the other's module.

use crate::driver::Prefetch;

/// Columns per packed panel: two AVX-512 registers of f32 sums.
pub(super) const NR: usize = 32;
/// Rows of the activation tile one `vdpbf16ps` kernel call computes.
pub(super) const MR: usize = 8;
/// The same for the widened kernel (`bf16/widened.rs`): 24 accumulators, two widened weight
/// registers and the mask beside them in AVX-512's 32; and for the f16 kernel (`halves.rs`),
/// whose 14 f16 sum registers leave room to widen them.
pub(super) const MW: usize = 14;

/// `$kernel::<R>($call)` with the constant `R` equal to `$rows` (at most `MW`; 0 runs 1 row): the
/// tiles of `MW` rows (the widened and f16 kernels') are compiled for each height.
#[cfg(target_arch = "x86_64")]
macro_rules! tile_of_rows {
    ($kernel:ident, $rows:expr, $call:expr) => {
        match $rows {
            14 => $kernel::<14>($call),
            13 => $kernel::<13>($call),
            12 => $kernel::<12>($call),
            11 => $kernel::<11>($call),
            10 => $kernel::<10>($call),
            9 => $kernel::<9>($call),
            8 => $kernel::<8>($call),
            7 => $kernel::<7>($call),
            6 => $kernel::<6>($call),
            5 => $kernel::<5>($call),
            4 => $kernel::<4>($call),
            3 => $kernel::<3>($call),
            2 => $kernel::<2>($call),
            _ => $kernel::<1>($call),
        }
    };
}
#[cfg(target_arch = "x86_64")]
pub(super) use tile_of_rows;

/// Depth pairs the f16 kernel sums in f16 before adding into f32: 32 products, each below
/// `2^(ROW_PEAK + 1) · 2^(PANEL_PEAK + 1)` = 2^10, sum below 2^15, half f16's largest value.
/// A prototype of the tile on Emerald Rapids, data in L1: 16 pairs 1.65× the f32 FMA tile's
/// products a second, 8 pairs 1.3× (docs/benchmarks/notes.md).
pub(super) const FLUSH_PAIRS: usize = 16;
/// The f16 kernel scales each activation row by a power of two that puts its largest finite
/// magnitude in `[2^ROW_PEAK, 2^(ROW_PEAK + 1))`, the weights of each panel into
/// `[2^PANEL_PEAK, 2^(PANEL_PEAK + 1))`: far from f16's subnormal values, and no overflow.
pub(super) const ROW_PEAK: i32 = 9;
pub(super) const PANEL_PEAK: i32 = -1;

/// One kernel call: `rows` rows of packed bf16 pairs (`MR` words per pair; the widened kernel's
/// `2·MW` f32 per pair, a depth's `MW` rows then the next depth's; the f16 kernel's the same as
/// f16 words) times one panel slice (`2·NR` bf16 or f16 per pair), into `out` (rows `stride`
/// apart), added to what `out` holds when `accumulate`.
pub(super) struct Bf16TileCall<'a> {
    pub(super) x: &'a [u32],
    pub(super) panel: &'a [u16],
    pub(super) out: &'a mut [f32],
    pub(super) stride: usize,
    pub(super) accumulate: bool,
    /// The f16 kernel's multiplier per row, which undoes its row's and panel's scales (empty
    /// for the others).
    pub(super) scales: &'a [f32],
    /// Weights to request into L2 during the call (`driver::NextSlices`).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(super) prefetch: Prefetch<'a, u16>,
}
