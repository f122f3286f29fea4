//! Int8 products of activations by constant weights on the CPU (`dtype = "int8"`): weights quantized
//! per output column at load, activations per row at each call, integer sums, float32 results.
//!
//! Weights are symmetric 8-bit per output column (`scale = max|w| / 127`), packed once at load for
//! the integer kernel this CPU runs best:
//!
//! - **AVX512-VNNI** (`vpdpbusd`: 64 u8 × s8 products summed into 16 i32 lanes per instruction, the
//!   add included): weights as s8 in panels of 32 columns, four depths per i32 lane. Activations are
//!   quantized per row *asymmetrically* to u8 (256 levels between the row's minimum and maximum,
//!   zero included), and `zero_point · Σ_d w(d, c)` (a column sum computed at load) is subtracted
//!   from each sum: `Σ (u − z)·w = Σ u·w − z·Σ w`. Plain 8 bits did not keep upstream's golden
//!   rows within the parity gate (`gate.rs`) on the fixture checkpoints, so by default the gate
//!   serves one u8 plane only where its rows stay within a third of its bound, else u16 (below).
//!   Also ([`Int8Activations`]):
//!   - **u8 with outliers** (`u8o:N`): the N largest-magnitude values of each row are held apart
//!     (selected in O(k)), the row is quantized to u8 over the range of the others, the outliers'
//!     bytes set to the zero point's level (exactly 0), and their products added exactly in f32
//!     when the sums are combined: `sw[c] · Σ_j x_j · w(j, c)`, the weights read from the packed
//!     quad panels (no second copy), 16 columns per fused multiply-add. One u8 plane plus about
//!     `N·n/16` vector operations per row against the dense product's `k·n/64`. Closer than plain
//!     u8 but still not within the gate on upstream's golden rows (measured in
//!     docs/benchmarks.md): opt-in, behind the gate.
//!   - **u16** (the default where u8 misses the gate's margin): 16 bits split into a high and a
//!     low u8 plane, each run as its own row through the same kernel (`256·Σ hi·w + Σ lo·w`):
//!     twice the dot products, still half the instructions per product of the AVX2 kernel below.
//! - **AMX-INT8** (`tdpbusd`: a 16 × 16 tile of i32 sums from 16 rows × 64 u8 and 16 quads × 16
//!   columns of s8 per instruction, `crate::amx`): the same quad panels (read in place
//!   as tiles, the depth padded to whole tiles of 16 quads), activation planes, quantization and
//!   combine as AVX512-VNNI, so the same sums exactly; only the activation planes are laid out
//!   row by row (rows padded to 16) instead of in tiles of 8, as the tiles load them. Up to four
//!   rows past a product's last whole 32-row block run on the VNNI tile instead (cheaper than a
//!   block of tile products for them).
//! - **AVX-VNNI** (the VEX-encoded `vpdpbusd` on 256-bit registers: Alder Lake and later Intel
//!   cores, Zen 5): the same quad panels, activation planes and quantization as AVX512-VNNI, so the
//!   same sums exactly, from four ymm accumulators per row of 32 columns, three rows per register
//!   block. It is the integer kernel beside the AVX2 float family (`cpu_kernels = "avx2"`, which
//!   keeps every kernel off 512-bit registers: its rows are quantized and combined with AVX2, its
//!   outliers by the portable code), and beside AVX-512 on a CPU without AVX512-VNNI.
//! - **AVX2** (`vpmaddwd`, i16 × i16 pairs summed into i32): weights held as i16 in panels of 16
//!   columns; activations symmetric per row to as many levels as an i32 sum over the depth holds
//!   (`127 · levels · k < 2³¹`: about 14 bits at k = 1024). Without VNNI, `vpmaddubsw` (u8 × s8)
//!   needs a second `vpmaddwd` by ones to widen its saturating i16 pairs, so it does no fewer
//!   multiply instructions and needs 7-bit activations to avoid saturation.
//! - **Portable** integer code for other CPUs (and as the exact reference of every SIMD kernel in
//!   the tests: the SIMD sums equal the portable sums bit for bit).
//!
//! `y = (acc − z·colsum) · sx[row] · sw[col] (+ outliers · sw[col]) (+ bias)` in f32. Measured in
//! docs/benchmarks.md.

use std::cell::RefCell;
use std::mem::MaybeUninit;

use rayon::prelude::*;

#[cfg(target_arch = "x86_64")]
use crate::amx::Amx;
use crate::amx::TILE_WORDS;
use crate::driver::{ColumnRange, bias_rows, in_column_ranges, with_reused};
use crate::geglu::{GROUP, GeGlu};
use crate::{CpuKernels, CpuWeight};

mod activations;
#[cfg(target_arch = "x86_64")]
mod avx_vnni;
mod combine;
mod pairs;
mod quads;
#[cfg(test)]
mod tests;
#[cfg(target_arch = "x86_64")]
mod vnni;

mod layout;

use activations::{RowOutliers, RowQuant, round_small};
use combine::{Combine, OutlierProducts};
pub use layout::{Int8Activations, Int8Kernel, QuantizedWeight};
use layout::{MAX_ACTIVATION_LEVELS, MAX_QUAD_DEPTH, NR, NR_Q, Panels, WEIGHT_LEVELS};
#[cfg(target_arch = "x86_64")]
use quads::QuadSimd;

impl Int8Kernel {
    /// The best integer kernel this CPU runs.
    // Only the tests ask without a float family in hand.
    #[cfg_attr(not(test), allow(dead_code))]
    pub fn detect() -> Self {
        Self::for_family(CpuKernels::detect())
    }

    /// The integer kernel that goes with a float32 kernel family: the best this CPU has beside the
    /// AVX-512 family (AVX512-VNNI, then AVX-VNNI, then the AVX2 pair kernel), the same with AMX
    /// first beside the AMX family; beside AVX2 only 256-bit code (AVX-VNNI where the CPU has it,
    /// else the pair kernel), so `cpu_kernels = "avx2"` also keeps the integer path off AVX-512;
    /// the portable code otherwise.
    pub fn for_family(family: CpuKernels) -> Self {
        let first = |kernels: &[Self]| kernels.iter().copied().find(|k| k.available()).unwrap_or(Self::Scalar);
        match family {
            CpuKernels::Amx => first(&[Self::Amx, Self::Avx512Vnni, Self::AvxVnni, Self::Avx2]),
            CpuKernels::Avx512 | CpuKernels::Gemm => first(&[Self::Avx512Vnni, Self::AvxVnni, Self::Avx2]),
            CpuKernels::Avx2 => first(&[Self::AvxVnni, Self::Avx2]),
        }
    }

    /// Whether the kernel runs the u8 × s8 quad layout (else the i16 pair layout).
    fn quads(self) -> bool {
        matches!(self, Self::Amx | Self::Avx512Vnni | Self::AvxVnni)
    }

    /// Depth quads of a quad-layout weight of depth `k`: whole AMX tiles (16 quads) for AMX.
    fn quads_for(self, k: usize) -> usize {
        match self {
            Self::Amx => k.div_ceil(4 * TILE_WORDS) * TILE_WORDS,
            _ => k.div_ceil(4),
        }
    }

    /// Whether this CPU runs the kernel.
    pub fn available(self) -> bool {
        match self {
            #[cfg(target_arch = "x86_64")]
            Self::Amx => vnni::Vnni::try_new().is_some() && Amx::detect().is_ok(),
            #[cfg(target_arch = "x86_64")]
            Self::Avx512Vnni => vnni::Vnni::try_new().is_some(),
            #[cfg(target_arch = "x86_64")]
            Self::AvxVnni => avx_vnni::AvxVnni::try_new().is_some(),
            #[cfg(target_arch = "x86_64")]
            Self::Avx2 => pulp::x86::V3::try_new().is_some(),
            #[cfg(not(target_arch = "x86_64"))]
            Self::Amx | Self::Avx512Vnni | Self::AvxVnni | Self::Avx2 => false,
            Self::Scalar => true,
        }
    }

    /// `amx-int8`, `avx512-vnni`, `avx-vnni`, `avx2` or `portable`: what the gate's report names.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Amx => "amx-int8",
            Self::Avx512Vnni => "avx512-vnni",
            Self::AvxVnni => "avx-vnni",
            Self::Avx2 => "avx2",
            Self::Scalar => "portable",
        }
    }
}

impl QuantizedWeight {
    /// Quantizes and packs `weight_t` (`[k, n]` row-major) with an optional bias `[n]`, for
    /// `kernel` (the quad layout with 8-bit activations for VNNI; see [`Self::set_activations`]).
    pub fn quantize(weight_t: &[f32], k: usize, n: usize, bias: Option<Vec<f32>>, kernel: Int8Kernel) -> Self {
        let row = |depth: usize, first: usize, out: &mut [f32]| {
            out.copy_from_slice(&weight_t[depth * n + first..][..out.len()]);
        };
        Self::quantize_with(row, k, n, bias, kernel)
    }

    /// [`Self::quantize`] of the weight whose entries `(depth, first ..)` `row(depth, first, out)`
    /// writes into `out` (a panel's columns: 32 or 16 of them, fewer at the last panel): packed
    /// float panels are quantized without being unpacked first.
    pub fn quantize_with(
        row: impl Fn(usize, usize, &mut [f32]) + Sync,
        k: usize,
        n: usize,
        bias: Option<Vec<f32>>,
        kernel: Int8Kernel,
    ) -> Self {
        // Both passes read depth by depth, a few columns at a time: every source keeps a depth's
        // columns side by side (a row-major matrix's row, a packed panel's slice), where reading a
        // column at a time — once for its maximum, once to quantize it — took a cache line per value
        // (3.3 ns a value: 1.3 of the CPU seconds a full-size ModernBERT-large int8 start spent),
        // and a depth's columns copied out together are what the loops below vectorise over.
        let mut column_max = vec![0f32; n];
        column_max.par_chunks_mut(NR_Q).enumerate().for_each(|(p, maxima)| {
            let mut values = [0f32; NR_Q];
            let values = &mut values[..maxima.len()];
            for depth in 0..k {
                row(depth, p * NR_Q, values);
                for (m, v) in maxima.iter_mut().zip(values.iter()) {
                    *m = m.max(v.abs());
                }
            }
        });
        let column_scales: Vec<f32> = column_max.iter().map(|&m| m / WEIGHT_LEVELS as f32).collect();
        let inverse: Vec<f32> = column_max
            .iter()
            .map(|&m| if m > 0.0 { WEIGHT_LEVELS as f32 / m } else { 0.0 })
            .collect();
        // 8-bit planes times 8-bit weights stay inside i32 up to this depth (255 · 127 · k < 2³¹);
        // deeper weights (none in Laya's models: k ≤ 4096) take the pair layout.
        let kernel = match kernel {
            kernel if kernel.quads() && k > MAX_QUAD_DEPTH && Int8Kernel::Avx2.available() => Int8Kernel::Avx2,
            kernel if kernel.quads() && k > MAX_QUAD_DEPTH => Int8Kernel::Scalar,
            kernel => kernel,
        };
        let panels = match kernel {
            Int8Kernel::Amx | Int8Kernel::Avx512Vnni | Int8Kernel::AvxVnni => {
                let quads = kernel.quads_for(k);
                let count = n.div_ceil(NR_Q);
                let mut panels = vec![0i8; count * quads * 4 * NR_Q];
                let mut column_sums = vec![0i32; count * NR_Q];
                if k > 0 {
                    panels
                        .par_chunks_mut(quads * 4 * NR_Q)
                        .zip(column_sums.par_chunks_mut(NR_Q))
                        .enumerate()
                        .for_each(|(p, (panel, sums))| {
                            let width = NR_Q.min(n - p * NR_Q);
                            let inverse = &inverse[p * NR_Q..][..width];
                            let (mut values, mut levels) = ([0f32; NR_Q], [0i8; NR_Q]);
                            for depth in 0..k {
                                row(depth, p * NR_Q, &mut values[..width]);
                                for ((level, v), inv) in levels.iter_mut().zip(&values[..width]).zip(inverse) {
                                    *level = round_small(v * inv) as i8;
                                }
                                let at = (depth / 4) * 4 * NR_Q + depth % 4;
                                for (c, (&level, sum)) in levels[..width].iter().zip(sums.iter_mut()).enumerate() {
                                    panel[at + 4 * c] = level;
                                    *sum += i32::from(level);
                                }
                            }
                        });
                }
                column_sums.truncate(n);
                Panels::Quads {
                    quads,
                    panels,
                    column_sums,
                    activations: Int8Activations::U8,
                }
            }
            Int8Kernel::Avx2 | Int8Kernel::Scalar => {
                let pairs = k.div_ceil(2);
                let count = n.div_ceil(NR);
                let mut panels = vec![0i16; count * pairs * 2 * NR];
                if k > 0 {
                    panels
                        .par_chunks_mut(pairs * 2 * NR)
                        .enumerate()
                        .for_each(|(p, panel)| {
                            let width = NR.min(n - p * NR);
                            let inverse = &inverse[p * NR..][..width];
                            let mut values = [0f32; NR];
                            for depth in 0..k {
                                row(depth, p * NR, &mut values[..width]);
                                let at = (depth / 2) * 2 * NR + depth % 2;
                                for (c, (v, inv)) in values[..width].iter().zip(inverse).enumerate() {
                                    panel[at + 2 * c] = round_small(v * inv) as i16;
                                }
                            }
                        });
                }
                // The whole depth's sum stays inside i32: |Σ x·w| ≤ k·levels·127.
                let activation_levels = (i32::MAX as usize / (WEIGHT_LEVELS as usize * (2 * pairs).max(1)))
                    .clamp(1, MAX_ACTIVATION_LEVELS as usize) as i32;
                Panels::Pairs {
                    pairs,
                    panels,
                    activation_levels,
                }
            }
        };
        Self {
            kernel,
            k,
            n,
            panels,
            column_scales,
            bias,
            geglu: None,
        }
    }

    /// The same weight, its products followed by `geglu` when its columns are grouped for it.
    pub(crate) fn with_geglu(self, geglu: Option<GeGlu>) -> Self {
        Self { geglu, ..self }
    }

    /// Whether products apply GeGLU (quantized from a weight packed for it).
    pub fn applies_geglu(&self) -> bool {
        self.geglu.is_some()
    }

    /// Output columns: `n`, or half of them with GeGLU.
    fn out_features(&self) -> usize {
        if self.geglu.is_some() { self.n / 2 } else { self.n }
    }

    /// Sets how a quad-layout (VNNI) weight quantizes its activations; the pair layout's are fixed.
    pub fn set_activations(&mut self, bits: Int8Activations) {
        if let Panels::Quads { activations, .. } = &mut self.panels {
            *activations = bits;
        }
    }

    /// The activations of the quad layout (`None` for the pair layout).
    pub fn activations(&self) -> Option<Int8Activations> {
        match &self.panels {
            Panels::Quads { activations, .. } => Some(*activations),
            Panels::Pairs { .. } => None,
        }
    }

    /// The kernel and, for the quad layout, the activations: for reports.
    pub fn describe(&self) -> String {
        match &self.panels {
            Panels::Quads { activations, .. } => {
                format!("{} {activations} activations", self.kernel.as_str())
            }
            Panels::Pairs { .. } => format!("{} i16 activations", self.kernel.as_str()),
        }
    }

    /// `x · W (+ bias)` for `x` `[m, k]` row-major; returns `[m, n]` row-major. A row holding a
    /// non-finite value gives a row of NaN (as the float product would).
    pub fn matmul(&self, x: &[f32], m: usize) -> Vec<f32> {
        self.matmul_with(x, m, false)
    }

    /// [`Self::matmul`], with the portable tile instead of the SIMD one when `portable`.
    fn matmul_with(&self, x: &[f32], m: usize, portable: bool) -> Vec<f32> {
        let n = self.n;
        if m == 0 || n == 0 || self.k == 0 {
            // No depth: every output is its bias (and no depth pass would store the sums).
            return bias_rows(self.bias.as_deref(), m, self.out_features());
        }
        let (nr, planes, packed_x, quants, outliers) = match &self.panels {
            Panels::Pairs { .. } => {
                let (packed, quants) = self.quantize_pairs(x, m);
                (NR, 1, Packed::Pairs(packed), quants, RowOutliers::default())
            }
            Panels::Quads { activations, .. } => {
                let (packed, quants, outliers) = self.quantize_quads(x, m, *activations, portable);
                (NR_Q, activations.planes(), Packed::Quads(packed), quants, outliers)
            }
        };
        // A block of output columns is `per` panels of the weight: with GeGLU, each output panel
        // of `GROUP` columns is a pair of groups, one or two of the layout's panels.
        let (n_out, nr_out, per) = match self.geglu {
            Some(_) => (n / 2, GROUP, 2 * GROUP / nr),
            None => (n, nr, 1),
        };
        // The combine adds the bias, and writes each row's real columns in place.
        // SAFETY: every task's `combine_block` writes all `width` columns of its range (the
        // range's own width: `stride` cut at `n`, halved with GeGLU) in each of the `m` rows,
        // through `Combine::scalar` or a SIMD combine, each of which stores every column it is
        // given, and `GeGlu::groups`, which stores every column of its output.
        #[allow(unsafe_code)]
        unsafe {
            in_column_ranges(m, n_out, nr_out, |first, count, out| {
                let (first, count) = (first * per, count * per);
                let stride = count * nr;
                with_sums(m * planes * stride, |sums| {
                    match &packed_x {
                        Packed::Pairs(packed) => self.block_pairs(packed, m, first, count, sums, portable),
                        Packed::Quads(packed) => self.block_quads(packed, m * planes, first, count, sums, portable),
                    }
                    self.combine_block(sums, m, (planes, stride), first, (&quants, &outliers), portable, out);
                });
            })
        }
    }
}

impl QuantizedWeight {
    /// The float outputs of the column block from panel `first` on into `out` (`m` rows `stride`
    /// apart, the block's columns first in each), from its integer sums (`planes` rows of `stride`
    /// sums per row of `x`) and each row's outliers.
    #[allow(clippy::too_many_arguments)] // one block's inputs, as its caller holds them
    fn combine_block(
        &self,
        sums: &[i32],
        m: usize,
        (planes, stride): (usize, usize),
        first: usize,
        (quants, outliers): (&[RowQuant], &RowOutliers),
        portable: bool,
        out: &mut ColumnRange<'_>,
    ) {
        let (column_sums, nr, quads, panels): (&[i32], usize, usize, &[i8]) = match &self.panels {
            Panels::Quads {
                column_sums,
                quads,
                panels,
                ..
            } => (column_sums, NR_Q, *quads, panels),
            Panels::Pairs { .. } => (&[], NR, 0, &[]),
        };
        let width = stride.min(self.n - first * nr);
        let columns = first * nr..first * nr + width;
        let scales = &self.column_scales[columns.clone()];
        let corrections = if column_sums.is_empty() {
            &[][..]
        } else {
            &column_sums[columns.clone()]
        };
        let bias = self.bias.as_ref().map(|b| &b[columns.clone()]);
        #[cfg(target_arch = "x86_64")]
        let simd = self.quad_simd(portable);
        #[cfg(not(target_arch = "x86_64"))]
        let _ = portable;
        // The outliers' exact products for one row, `stride` columns (zero weights past `n`).
        let mut exact = if outliers.per_row > 0 {
            vec![0f32; stride]
        } else {
            Vec::new()
        };
        let block_panels = &panels[(first * quads * 4 * NR_Q).min(panels.len())..];
        // With GeGLU each row is combined here first (whole pairs of groups: `width` is `stride`).
        let mut grouped = match self.geglu {
            Some(_) => vec![MaybeUninit::<f32>::uninit(); width],
            None => Vec::new(),
        };
        for row in 0..m {
            let dst = match self.geglu {
                Some(_) => &mut grouped[..],
                None => &mut out.row(row)[..width],
            };
            let plane = |p: usize| &sums[(row * planes + p) * stride..(row * planes + p) * stride + width];
            let quant = quants[row];
            let held = outliers.row(row, quant.outliers);
            let outlier_products = if held.is_empty() {
                None
            } else {
                let products = OutlierProducts {
                    panels: block_panels,
                    quads,
                    outliers: held,
                };
                #[cfg(target_arch = "x86_64")]
                match simd.and_then(QuadSimd::avx512) {
                    Some(simd) => simd.outlier_products(&products, &mut exact),
                    None => products.scalar(&mut exact),
                }
                #[cfg(not(target_arch = "x86_64"))]
                products.scalar(&mut exact);
                Some(&exact[..width])
            };
            let combine = Combine {
                hi: plane(0),
                lo: (planes == 2).then(|| plane(1)),
                corrections,
                scales,
                bias,
                quant,
                outliers: outlier_products,
            };
            #[cfg(target_arch = "x86_64")]
            match simd {
                Some(simd) => simd.combine(&combine, dst),
                None => combine.scalar(dst),
            }
            #[cfg(not(target_arch = "x86_64"))]
            combine.scalar(dst);
            if let Some(geglu) = self.geglu {
                // SAFETY: the combine above wrote every value of `grouped` (as it does into the
                // output without GeGLU); `MaybeUninit<f32>` has `f32`'s layout.
                #[allow(unsafe_code)]
                let values = unsafe { &*(std::ptr::from_ref::<[MaybeUninit<f32>]>(&grouped[..]) as *const [f32]) };
                geglu.groups(values, out.row(row));
            }
        }
    }
}

/// Most i32 sums a pool thread keeps for reuse (1 MiB): a 64-token row's column blocks need
/// 64–128 KiB; a larger batch allocates its (then well amortised) buffers per block.
const REUSED_SUMS: usize = 1 << 18;

thread_local! {
    /// The integer sums of one column block, reused across products on each pool thread. Every
    /// product stores before it reads (its first depth pass does not accumulate), so the buffer is
    /// never cleared: cleared per block, these buffers were most of an int8 forward's `memset`.
    static SUMS: RefCell<Vec<i32>> = const { RefCell::new(Vec::new()) };
}

/// Runs `work` on a buffer of `len` i32 whose contents are unspecified (reused, or zero).
fn with_sums<R>(len: usize, work: impl FnOnce(&mut [i32]) -> R) -> R {
    with_reused(&SUMS, len, REUSED_SUMS, work)
}

/// The activations of one product, packed for its layout.
enum Packed {
    Pairs(Vec<i32>),
    Quads(Vec<u32>),
}

impl CpuWeight for QuantizedWeight {
    const NAME: &'static str = "laya-int8-matmul";

    fn dims(&self) -> (usize, usize) {
        (self.k, self.out_features())
    }

    fn matmul(&self, x: &[f32], m: usize) -> Vec<f32> {
        QuantizedWeight::matmul(self, x, m)
    }
}
