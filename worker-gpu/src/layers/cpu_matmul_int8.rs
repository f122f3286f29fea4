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
//!   columns of s8 per instruction, `layad_cpu_kernels::amx`): the same quad panels (read in place
//!   as tiles, the depth padded to whole tiles of 16 quads), activation planes, quantization and
//!   combine as AVX512-VNNI, so the same sums exactly; only the activation planes are laid out
//!   row by row (rows padded to 16) instead of in tiles of 8, as the tiles load them.
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

use layad_cpu_kernels::amx::{Amx, Int8Tiles, TILE_ROWS, TILE_WORDS, TileProduct, row_stride};
use rayon::prelude::*;

use crate::layers::cpu_matmul::{
    ColumnRange, CpuKernels, CpuWeight, NextSlices, Prefetch, bias_rows, in_column_ranges, with_reused,
};

/// Columns per packed panel of the i16 pair layout (two AVX2 registers of i32 sums).
const NR: usize = 16;
/// Rows of the activation tile one pair-kernel call computes.
const MR: usize = 6;
/// Depth pairs of one pass: a panel slice of `KC` pairs (8 KiB) stays in L1.
const KC: usize = 128;
/// Columns per packed panel of the u8 × s8 quad layout (two AVX-512 registers of i32 sums).
const NR_Q: usize = 32;
/// (Plane) rows of the activation tile one quad-kernel call computes: 16 accumulator registers of
/// the 32 AVX-512 has, two for the weights.
const MR_Q: usize = 8;
/// Depth quads of one pass: a panel slice of `KC_Q` quads (16 KiB) stays in L1.
const KC_Q: usize = 128;
/// Deepest product the quad layout sums in i32 without overflow.
const MAX_QUAD_DEPTH: usize = i32::MAX as usize / (255 * WEIGHT_LEVELS as usize);
/// Largest weight level: symmetric int8 without −128.
const WEIGHT_LEVELS: i32 = 127;
/// Largest activation level (i16, symmetric) of the pair layout.
const MAX_ACTIVATION_LEVELS: i32 = i16::MAX as i32;

/// The integer kernel a quantized weight runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Int8Kernel {
    /// `tdpbusd` on AMX tiles (with AVX512-VNNI for the rows' quantization and the combine): u8 ×
    /// s8 quads, the VNNI layout's panels.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    Amx,
    /// `vpdpbusd` on 512-bit registers (AVX512-VNNI, with AVX-512F/BW): u8 × s8 quads.
    // Elsewhere only the tests name it (they skip it where the CPU lacks it).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    Avx512Vnni,
    /// `vpdpbusd` on 256-bit registers (AVX-VNNI, with AVX2 and FMA: Alder Lake and later Intel
    /// cores, Zen 5): the same u8 × s8 quads and packed panels, four registers per 32 columns.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    AvxVnni,
    /// `_mm256_madd_epi16` through pulp's AVX2 token (x86-64 with AVX2 + FMA): i16 pairs.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    Avx2,
    /// Portable integer code on the i16 pair layout: other CPUs.
    Scalar,
}

impl Int8Kernel {
    /// The best integer kernel this CPU runs.
    // Only the tests ask without a float family in hand.
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) fn detect() -> Self {
        Self::for_family(CpuKernels::detect())
    }

    /// The integer kernel that goes with a float32 kernel family: the best this CPU has beside the
    /// AVX-512 family (AVX512-VNNI, then AVX-VNNI, then the AVX2 pair kernel), AMX first beside
    /// the AMX family; beside AVX2 only
    /// 256-bit code (AVX-VNNI where the CPU has it, else the pair kernel), so `cpu_kernels = "avx2"`
    /// also keeps the integer path off AVX-512; the portable code otherwise.
    pub(crate) fn for_family(family: CpuKernels) -> Self {
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
    pub(crate) fn available(self) -> bool {
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
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Amx => "amx-int8",
            Self::Avx512Vnni => "avx512-vnni",
            Self::AvxVnni => "avx-vnni",
            Self::Avx2 => "avx2",
            Self::Scalar => "portable",
        }
    }
}

/// How a u8 × s8 (quad layout) product quantizes its activation rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Int8Activations {
    /// 8 bits: 256 levels between the row's minimum and maximum (zero included).
    U8,
    /// 8 bits over the range of the row *without* its largest-magnitude values (at most this many
    /// per row): those are set to the zero point's level and added back exactly, in f32, from the
    /// same packed weights (`Σ x_j · w(j, c)` over the outliers) when the sums are combined.
    U8Outliers(u16),
    /// 16 bits, as a high and a low u8 plane: 65536 levels, twice the dot products.
    U16,
}

impl Int8Activations {
    /// Outliers per row of `u8o` when the count is not given.
    pub const DEFAULT_OUTLIERS: u16 = 4;

    /// 8 bits with [`Self::DEFAULT_OUTLIERS`] outliers per row.
    pub const U8_OUTLIERS: Self = Self::U8Outliers(Self::DEFAULT_OUTLIERS);

    /// Parses `u8`, `u16`, `u8o` (8 bits with the default outlier count) or `u8o:N` (N outliers
    /// per row, 1 to 256).
    pub fn parse(text: &str) -> Result<Self, String> {
        let text = text.trim().to_ascii_lowercase();
        match text.as_str() {
            "u8" | "8" => Ok(Self::U8),
            "u16" | "16" => Ok(Self::U16),
            "u8o" => Ok(Self::U8_OUTLIERS),
            _ => match text.strip_prefix("u8o:").map(str::parse::<u16>) {
                Some(Ok(count @ 1..=256)) => Ok(Self::U8Outliers(count)),
                _ => Err(format!(
                    "unknown int8 activations '{text}'; expected u8, u16, u8o or u8o:N (1 ≤ N ≤ 256 outliers per row)"
                )),
            },
        }
    }

    fn planes(self) -> usize {
        match self {
            Self::U8 | Self::U8Outliers(_) => 1,
            Self::U16 => 2,
        }
    }

    fn levels(self) -> f32 {
        match self {
            Self::U8 | Self::U8Outliers(_) => 255.0,
            Self::U16 => 65535.0,
        }
    }

    /// Largest-magnitude values per row taken out of the 8-bit range.
    fn outliers(self) -> usize {
        match self {
            Self::U8Outliers(count) => usize::from(count),
            Self::U8 | Self::U16 => 0,
        }
    }
}

/// `u8`, `u16` or `u8o:N`: what [`Int8Activations::parse`] reads back.
impl std::fmt::Display for Int8Activations {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::U8 => f.write_str("u8"),
            Self::U16 => f.write_str("u16"),
            Self::U8Outliers(count) => write!(f, "u8o:{count}"),
        }
    }
}

/// The packed integer weights, in the layout of the kernel that runs them.
enum Panels {
    /// Panel `p` holds columns `p·16 .. p·16 + 16` (zero past `n`); per depth pair `d`, column `c`
    /// holds `[w(2d, c), w(2d + 1, c)]` (zero past `k`), so one `madd_epi16` by a broadcast
    /// activation pair gives 8 columns' sums of two products.
    Pairs {
        /// `k` rounded up to pairs.
        pairs: usize,
        panels: Vec<i16>,
        /// Activation levels: rows are quantized to `−levels ..= levels`.
        activation_levels: i32,
    },
    /// Panel `p` holds columns `p·32 .. p·32 + 32` (zero past `n`); per depth quad `q`, column `c`
    /// holds the bytes `w(4q .. 4q + 4, c)` (zero past `k`), so one `vpdpbusd` by a broadcast quad
    /// of u8 activations gives 16 columns' sums of four products.
    Quads {
        /// `k` rounded up to quads.
        quads: usize,
        panels: Vec<i8>,
        /// `Σ_d w(d, c)` of the quantized weights: the zero point's correction.
        column_sums: Vec<i32>,
        activations: Int8Activations,
    },
}

/// A weight `[k, n]` (the transposed PyTorch `[out, in]`) quantized per column and packed for one
/// integer kernel.
pub(crate) struct QuantizedWeight {
    kernel: Int8Kernel,
    k: usize,
    n: usize,
    panels: Panels,
    /// `max|w[.., c]| / 127` per column.
    column_scales: Vec<f32>,
    bias: Option<Vec<f32>>,
}

/// One activation row's quantization: `x ≈ scale · (u − zero)`, plus `outliers` values held apart
/// (8-bit activations with outliers); `scale` NaN for a row with a non-finite value, 0 for an
/// all-zero row (or one whose values are all outliers or zero).
#[derive(Clone, Copy, Default)]
struct RowQuant {
    scale: f32,
    zero: i64,
    outliers: u32,
}

impl QuantizedWeight {
    /// Quantizes and packs `weight_t` (`[k, n]` row-major) with an optional bias `[n]`, for
    /// `kernel` (the quad layout with 8-bit activations for VNNI; see [`Self::set_activations`]).
    pub(crate) fn quantize(weight_t: &[f32], k: usize, n: usize, bias: Option<Vec<f32>>, kernel: Int8Kernel) -> Self {
        Self::quantize_with(|depth, col| weight_t[depth * n + col], k, n, bias, kernel)
    }

    /// [`Self::quantize`] of the weight whose entry `(depth, col)` is `value(depth, col)`: packed
    /// float panels are quantized without being unpacked first.
    pub(crate) fn quantize_with(
        value: impl Fn(usize, usize) -> f32 + Sync,
        k: usize,
        n: usize,
        bias: Option<Vec<f32>>,
        kernel: Int8Kernel,
    ) -> Self {
        let column_max: Vec<f32> = (0..n)
            .into_par_iter()
            .map(|col| (0..k).fold(0f32, |m, depth| m.max(value(depth, col).abs())))
            .collect();
        let column_scales: Vec<f32> = column_max.iter().map(|&m| m / WEIGHT_LEVELS as f32).collect();
        let inverse: Vec<f32> = column_max
            .iter()
            .map(|&m| if m > 0.0 { WEIGHT_LEVELS as f32 / m } else { 0.0 })
            .collect();
        let q = |depth: usize, col: usize| round_small(value(depth, col) * inverse[col]);
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
                            for (c, sum) in sums.iter_mut().enumerate().take(NR_Q.min(n - p * NR_Q)) {
                                let col = p * NR_Q + c;
                                for depth in 0..k {
                                    let v = q(depth, col) as i8;
                                    panel[(depth / 4) * 4 * NR_Q + 4 * c + depth % 4] = v;
                                    *sum += i32::from(v);
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
                            for c in 0..NR.min(n - p * NR) {
                                let col = p * NR + c;
                                for depth in 0..k {
                                    panel[(depth / 2) * 2 * NR + 2 * c + depth % 2] = q(depth, col) as i16;
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
        }
    }

    /// Sets how a quad-layout (VNNI) weight quantizes its activations; the pair layout's are fixed.
    pub(crate) fn set_activations(&mut self, bits: Int8Activations) {
        if let Panels::Quads { activations, .. } = &mut self.panels {
            *activations = bits;
        }
    }

    /// The activations of the quad layout (`None` for the pair layout).
    pub(crate) fn activations(&self) -> Option<Int8Activations> {
        match &self.panels {
            Panels::Quads { activations, .. } => Some(*activations),
            Panels::Pairs { .. } => None,
        }
    }

    /// The kernel and, for the quad layout, the activations: for reports.
    pub(crate) fn describe(&self) -> String {
        match &self.panels {
            Panels::Quads { activations, .. } => {
                format!("{} {activations} activations", self.kernel.as_str())
            }
            Panels::Pairs { .. } => format!("{} i16 activations", self.kernel.as_str()),
        }
    }

    /// `x · W (+ bias)` for `x` `[m, k]` row-major; returns `[m, n]` row-major. A row holding a
    /// non-finite value gives a row of NaN (as the float product would).
    pub(crate) fn matmul(&self, x: &[f32], m: usize) -> Vec<f32> {
        self.matmul_with(x, m, false)
    }

    /// [`Self::matmul`], with the portable tile instead of the SIMD one when `portable`.
    fn matmul_with(&self, x: &[f32], m: usize, portable: bool) -> Vec<f32> {
        let n = self.n;
        if m == 0 || n == 0 || self.k == 0 {
            // No depth: every output is its bias (and no depth pass would store the sums).
            return bias_rows(self.bias.as_deref(), m, n);
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
        // The combine adds the bias, and writes each row's real columns in place.
        in_column_ranges(m, n, nr, |first, count, out| {
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
        for row in 0..m {
            let dst = &mut out.row(row)[..width];
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
                Some(simd) => simd.combine(combine, dst),
                None => combine.scalar(dst),
            }
            #[cfg(not(target_arch = "x86_64"))]
            combine.scalar(dst);
        }
    }

    /// Pair layout: each row of `x` to `levels`-level integers, packed as row tiles of `MR`: tile
    /// `t` holds, per depth pair, `MR` i32 words `(x[2d] as i16) | (x[2d + 1] as i16) << 16` (zero
    /// past `m`, `k`). Returns the packed tiles and each row's quantization.
    fn quantize_pairs(&self, x: &[f32], m: usize) -> (Vec<i32>, Vec<RowQuant>) {
        let Panels::Pairs {
            pairs,
            activation_levels,
            ..
        } = &self.panels
        else {
            return (Vec::new(), vec![RowQuant::default(); m]);
        };
        let (k, pairs) = (self.k, *pairs);
        let levels = *activation_levels as f32;
        let tiles = m.div_ceil(MR);
        let mut packed = vec![0i32; tiles * pairs * MR];
        let mut quants = vec![RowQuant::default(); tiles * MR];
        packed
            .par_chunks_mut(pairs * MR)
            .zip(quants.par_chunks_mut(MR))
            .enumerate()
            .for_each(|(t, (dst, quants))| {
                for (r, quant) in quants.iter_mut().enumerate().take(MR.min(m - t * MR)) {
                    let row = &x[(t * MR + r) * k..(t * MR + r + 1) * k];
                    let max = row.iter().fold(0f32, |a, v| a.max(v.abs()));
                    if !max.is_finite() || row.iter().any(|v| v.is_nan()) {
                        quant.scale = f32::NAN;
                        continue;
                    }
                    if max == 0.0 {
                        continue;
                    }
                    quant.scale = max / levels;
                    let inverse = levels / max;
                    let q = |v: f32| (v * inverse).round() as i16 as u16 as u32;
                    for (d, pair) in row.chunks(2).enumerate() {
                        let lo = q(pair[0]);
                        let hi = pair.get(1).map_or(0, |&v| q(v));
                        dst[d * MR + r] = (lo | hi << 16) as i32;
                    }
                }
            });
        (packed, quants)
    }

    /// Quad layout: each row of `x` to unsigned levels between its minimum and maximum (zero
    /// included; with outliers, those of the row without them), as one (8-bit) or two (16-bit: high
    /// byte, then low byte) plane rows, packed as tiles of `MR_Q` plane rows: tile `t` holds, per
    /// depth quad, `MR_Q` u32 words of four u8 (zero past the rows and `k`). Returns the packed
    /// tiles, each row's quantization and its outliers (for AMX the plane rows one after another,
    /// `amx::row_stride` words apart, padded to 16 rows). With VNNI (and not `portable`) rows are quantized with AVX-512, to the same
    /// levels exactly.
    fn quantize_quads(
        &self,
        x: &[f32],
        m: usize,
        bits: Int8Activations,
        portable: bool,
    ) -> (Vec<u32>, Vec<RowQuant>, RowOutliers) {
        let Panels::Quads { quads, .. } = &self.panels else {
            return (Vec::new(), vec![RowQuant::default(); m], RowOutliers::default());
        };
        let (k, quads) = (self.k, *quads);
        let planes = bits.planes();
        let levels = bits.levels();
        // A row of `k` values keeps at least one inside the range.
        let per_row = bits.outliers().min(k.saturating_sub(1));
        let plane_rows = m * planes;
        // AMX loads plane rows row by row, 16 at a time: its rows are padded to whole tiles (two
        // of these tiles of 8), and each row's words follow each other.
        let row_major = self.kernel == Int8Kernel::Amx;
        let (tiles, row_words) = if row_major {
            (plane_rows.next_multiple_of(TILE_ROWS) / MR_Q, row_stride(quads))
        } else {
            (plane_rows.div_ceil(MR_Q), quads)
        };
        let mut packed = vec![0u32; tiles * row_words * MR_Q];
        // MR_Q is a multiple of both plane counts, so a row's planes share one tile.
        let rows_per_tile = MR_Q / planes;
        let mut quants = vec![RowQuant::default(); tiles * rows_per_tile];
        let mut outliers = RowOutliers {
            per_row,
            held: vec![(0, 0.0); tiles * rows_per_tile * per_row.max(1)],
        };
        #[cfg(target_arch = "x86_64")]
        let simd = self.quad_simd(portable);
        #[cfg(not(target_arch = "x86_64"))]
        let _ = portable;
        packed
            .par_chunks_mut(row_words * MR_Q)
            .zip(quants.par_chunks_mut(rows_per_tile))
            .zip(outliers.held.par_chunks_mut(rows_per_tile * per_row.max(1)))
            .enumerate()
            .for_each(|(t, ((dst, quants), held))| {
                let first = t * rows_per_tile;
                // One row's levels as byte planes (high, then low), zero past `k`.
                let mut bytes = vec![0u8; planes * quads * 4];
                let mut magnitudes = Vec::new();
                #[cfg(target_arch = "x86_64")]
                let plain = |row: &[f32], hi: &mut [u8], lo: Option<&mut [u8]>| match simd {
                    Some(simd) => simd.quantize_row(row, levels, hi, lo),
                    None => quantize_row(row, levels, hi, lo),
                };
                #[cfg(not(target_arch = "x86_64"))]
                let plain = |row: &[f32], hi: &mut [u8], lo: Option<&mut [u8]>| quantize_row(row, levels, hi, lo);
                for (r, quant) in quants
                    .iter_mut()
                    .enumerate()
                    .take(rows_per_tile.min(m.saturating_sub(first)))
                {
                    let row = &x[(first + r) * k..(first + r + 1) * k];
                    let (hi_plane, lo_plane) = bytes.split_at_mut(quads * 4);
                    let lo_plane = (planes == 2).then_some(lo_plane);
                    let found = if per_row > 0 {
                        let held = &mut held[r * per_row..(r + 1) * per_row];
                        #[cfg(target_arch = "x86_64")]
                        let found = match simd.and_then(QuadSimd::avx512) {
                            Some(simd) => {
                                quantize_row_with_outliers(&simd, row, levels, hi_plane, held, &mut magnitudes)
                            }
                            None => quantize_row_with_outliers(&Portable, row, levels, hi_plane, held, &mut magnitudes),
                        };
                        #[cfg(not(target_arch = "x86_64"))]
                        let found = quantize_row_with_outliers(&Portable, row, levels, hi_plane, held, &mut magnitudes);
                        found
                    } else {
                        plain(row, hi_plane, lo_plane)
                    };
                    // A row with a non-finite value (NaN scale) or a constant one: its words stay zero.
                    let Some(found) = found else {
                        *quant = RowQuant {
                            scale: if row.iter().all(|v| v.is_finite()) {
                                0.0
                            } else {
                                f32::NAN
                            },
                            zero: 0,
                            outliers: 0,
                        };
                        continue;
                    };
                    *quant = found;
                    for (p, plane) in bytes.chunks_exact(quads * 4).enumerate() {
                        let plane_row = r * planes + p;
                        for (d, word) in plane.chunks_exact(4).enumerate() {
                            let at = if row_major {
                                plane_row * row_words + d
                            } else {
                                d * MR_Q + plane_row
                            };
                            dst[at] = u32::from_le_bytes([word[0], word[1], word[2], word[3]]);
                        }
                    }
                }
            });
        quants.truncate(m);
        (packed, quants, outliers)
    }

    /// Pair layout: panels `first .. first + count` for every row into `sums` (`[m, count·NR]`).
    fn block_pairs(&self, packed_x: &[i32], m: usize, first: usize, count: usize, sums: &mut [i32], portable: bool) {
        let Panels::Pairs { pairs, panels, .. } = &self.panels else {
            return;
        };
        let pairs = *pairs;
        let stride = count * NR;
        let kernel = if portable { Int8Kernel::Scalar } else { self.kernel };
        let mut depth = 0;
        while depth < pairs {
            let kc = KC.min(pairs - depth);
            for (tile, row) in (0..m).step_by(MR).enumerate() {
                let rows = MR.min(m - row);
                let x = &packed_x[(tile * pairs + depth) * MR..(tile * pairs + depth + kc) * MR];
                for p in 0..count {
                    let start = (first + p) * pairs * 2 * NR;
                    let call = IntTileCall {
                        x,
                        panel: &panels[start + depth * 2 * NR..start + (depth + kc) * 2 * NR],
                        out: &mut sums[row * stride + p * NR..],
                        stride,
                        accumulate: depth > 0,
                    };
                    run_tile(kernel, rows, call);
                }
            }
            depth += kc;
        }
    }

    /// The SIMD code of this quad-layout weight's kernel (`None`: the portable code, also when
    /// `portable`), checked once per product or block.
    #[cfg(target_arch = "x86_64")]
    fn quad_simd(&self, portable: bool) -> Option<QuadSimd> {
        match (portable, self.kernel) {
            (false, Int8Kernel::Amx | Int8Kernel::Avx512Vnni) => vnni::Vnni::try_new().map(QuadSimd::Avx512),
            (false, Int8Kernel::AvxVnni) => avx_vnni::AvxVnni::try_new().map(QuadSimd::Avx256),
            _ => None,
        }
    }

    /// Quad layout: panels `first .. first + count` for every plane row (`rows` of them) into
    /// `sums` (`[rows, count·NR_Q]`). The CPU check is made once per block.
    fn block_quads(&self, packed_x: &[u32], rows: usize, first: usize, count: usize, sums: &mut [i32], portable: bool) {
        let Panels::Quads { quads, panels, .. } = &self.panels else {
            return;
        };
        let quads = *quads;
        let stride = count * NR_Q;
        if self.kernel == Int8Kernel::Amx {
            let product = TileProduct::<Int8Tiles> {
                a: packed_x,
                a_stride: row_stride(quads),
                rows,
                words: quads,
                panels: &panels[first * quads * 4 * NR_Q..(first + count) * quads * 4 * NR_Q],
                out: sums,
                stride,
            };
            // The tile model where AMX is not granted (the tests' portable path, or a kernel
            // refused after the weight was packed: slow, not wrong).
            match Amx::detect() {
                Ok(amx) if !portable => amx.multiply(product),
                _ => product.model(),
            }
            return;
        }
        #[cfg(target_arch = "x86_64")]
        let simd = self.quad_simd(portable);
        #[cfg(not(target_arch = "x86_64"))]
        let _ = portable;
        let next = NextSlices {
            panels,
            panel_units: quads,
            unit: 4 * NR_Q,
            pass: KC_Q,
            count,
            tiles: rows.div_ceil(MR_Q),
        };
        let mut depth = 0;
        while depth < quads {
            let kc = KC_Q.min(quads - depth);
            let prefetch = next.pass(depth, kc);
            for (tile, row) in (0..rows).step_by(MR_Q).enumerate() {
                let height = MR_Q.min(rows - row);
                let x = &packed_x[(tile * quads + depth) * MR_Q..(tile * quads + depth + kc) * MR_Q];
                for p in 0..count {
                    let start = (first + p) * quads * 4 * NR_Q;
                    let call = QuadTileCall {
                        x,
                        panel: &panels[start + depth * 4 * NR_Q..start + (depth + kc) * 4 * NR_Q],
                        out: &mut sums[row * stride + p * NR_Q..],
                        stride,
                        accumulate: depth > 0,
                        prefetch: prefetch.share(first + p, tile),
                    };
                    #[cfg(target_arch = "x86_64")]
                    match simd {
                        Some(simd) => simd.tile(height, call),
                        None => scalar_quad_tile(height, call),
                    }
                    #[cfg(not(target_arch = "x86_64"))]
                    scalar_quad_tile(height, call);
                }
            }
            depth += kc;
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

/// `v` rounded to the nearest integer (ties to even) for |v| < 2²², by adding and subtracting
/// 1.5 · 2²³: one float add each way where `f32::round` is a libm call per value on baseline
/// x86-64 (3% of an int8 forward's profile, and most of quantizing the weights at load). Every
/// value rounded here is a weight or activation level, |v| ≤ 65535.
#[inline(always)]
fn round_small(v: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0;
    (v + MAGIC) - MAGIC
}

/// The range `(min, max)` of a row, with zero included; `None` if it holds a NaN or an infinity.
fn row_range(row: &[f32]) -> Option<(f32, f32)> {
    let (lo, hi) = row.iter().fold((0f32, 0f32), |(lo, hi), &v| (lo.min(v), hi.max(v)));
    (lo.is_finite() && hi.is_finite() && !row.iter().any(|v| v.is_nan())).then_some((lo, hi))
}

/// The quantization of a row of range `(lo, hi)` (`lo ≤ 0 ≤ hi`, `lo < hi`) to `levels` levels:
/// `(scale, inverse, zero point)`.
fn row_levels(lo: f32, hi: f32, levels: f32) -> (RowQuant, f32, f32) {
    let scale = (hi - lo) / levels;
    let inverse = levels / (hi - lo);
    // lo ≤ 0 ≤ hi, so the zero point is within 0..=levels.
    let zero = (-lo * inverse).round();
    (
        RowQuant {
            scale,
            zero: zero as i64,
            outliers: 0,
        },
        inverse,
        zero,
    )
}

/// One activation row of the quad layout to unsigned levels between its minimum and maximum
/// (zero included): the level of `row[d]` goes to byte `d` of `hi` (8-bit activations), or its high
/// byte to `hi` and its low byte to `lo` (16-bit). `None` (nothing written) for a row holding a
/// non-finite value or a constant row (all zeros).
fn quantize_row(row: &[f32], levels: f32, hi: &mut [u8], lo: Option<&mut [u8]>) -> Option<RowQuant> {
    let (min, max) = row_range(row)?;
    if min == max {
        return None;
    }
    Some(quantize_levels(row, (min, max), levels, hi, lo))
}

/// [`quantize_row`] over the range `(min, max)` (`min ≤ 0 ≤ max`, `min < max`): values outside
/// it take the end levels.
fn quantize_levels(row: &[f32], (min, max): (f32, f32), levels: f32, hi: &mut [u8], lo: Option<&mut [u8]>) -> RowQuant {
    let (quant, inverse, zero) = row_levels(min, max, levels);
    let q = |v: f32| round_small((v * inverse + zero).clamp(0.0, levels)) as u32;
    match lo {
        Some(lo) => {
            for ((&v, h), l) in row.iter().zip(hi.iter_mut()).zip(lo.iter_mut()) {
                let u = q(v);
                *h = (u >> 8) as u8;
                *l = (u & 0xff) as u8;
            }
        }
        None => {
            for (&v, h) in row.iter().zip(hi.iter_mut()) {
                *h = q(v) as u8;
            }
        }
    }
    quant
}

/// Each row's outliers: `(depth, value)`, at most `per_row` of them, in depth order, the row's
/// count in its [`RowQuant`]; row `r`'s from `r · per_row`.
#[derive(Default)]
struct RowOutliers {
    per_row: usize,
    held: Vec<(u32, f32)>,
}

impl RowOutliers {
    fn row(&self, row: usize, count: u32) -> &[(u32, f32)] {
        if count == 0 {
            // Also the layouts without outliers, which hold none.
            return &[];
        }
        let start = row * self.per_row;
        &self.held[start..start + count as usize]
    }
}

/// One 8-bit activation row with its largest-magnitude values held apart: the values whose
/// magnitude exceeds the `held.len() + 1`-th largest (so at most `held.len()` of them, ties kept
/// inside) leave the range, which becomes the other values' minimum and maximum (zero included);
/// their bytes are set to the zero point's level, which stands for exactly 0, and their values go
/// to `held` in depth order, to be added exactly by [`OutlierProducts`]. `passes` runs the passes
/// over the row (portable or AVX-512: the same results). `None` (nothing written) for a row
/// holding a non-finite value or an all-zero row.
fn quantize_row_with_outliers(
    passes: &impl OutlierPasses,
    row: &[f32],
    levels: f32,
    bytes: &mut [u8],
    held: &mut [(u32, f32)],
    largest: &mut Vec<f32>,
) -> Option<RowQuant> {
    let apart = held.len().min(row.len().saturating_sub(1));
    let (min, max) = passes.scan(row, apart + 1, largest)?;
    if min == max {
        return None;
    }
    let bound = if apart == 0 { f32::INFINITY } else { largest[0] };
    let (lo, hi, count) = passes.clip(row, bound, held);
    let mut quant = if lo == hi {
        // Every value inside the range is zero: only the outliers count.
        bytes[..row.len()].fill(0);
        RowQuant::default()
    } else {
        passes.levels(row, (lo, hi), levels, bytes)
    };
    // The zero point is within 0..=levels (≤ 255).
    let zero = quant.zero as u8;
    for &(depth, _) in &held[..count] {
        bytes[depth as usize] = zero;
    }
    quant.outliers = count as u32;
    Some(quant)
}

/// The passes over a row of [`quantize_row_with_outliers`]: [`Portable`] code, or AVX-512 with
/// the same results exactly.
trait OutlierPasses {
    /// The row's range (zero included), `None` if it holds a non-finite value; `largest` ends
    /// with the row's `count` largest magnitudes, ascending (see [`keep_largest`]).
    fn scan(&self, row: &[f32], count: usize, largest: &mut Vec<f32>) -> Option<(f32, f32)>;
    /// The range (zero included) of the values of magnitude at most `bound`; the others go to
    /// `held` (in depth order), and how many there are.
    fn clip(&self, row: &[f32], bound: f32, held: &mut [(u32, f32)]) -> (f32, f32, usize);
    /// [`quantize_levels`] to one plane.
    fn levels(&self, row: &[f32], range: (f32, f32), levels: f32, bytes: &mut [u8]) -> RowQuant;
}

/// Keeps the `count` largest magnitudes seen so far in `largest`, ascending: fills it first, then
/// a magnitude above the smallest kept replaces it. The multiset kept, so its smallest, does not
/// depend on the order the magnitudes come in.
#[inline(always)]
fn keep_largest(largest: &mut Vec<f32>, count: usize, magnitude: f32) {
    if largest.len() < count {
        let at = largest.partition_point(|&t| t < magnitude);
        largest.insert(at, magnitude);
    } else if magnitude > largest[0] {
        let at = largest.partition_point(|&t| t < magnitude);
        largest.copy_within(1..at, 0);
        largest[at - 1] = magnitude;
    }
}

/// The portable [`OutlierPasses`] (other CPUs, and the reference of the AVX-512 ones in the tests).
struct Portable;

impl OutlierPasses for Portable {
    fn scan(&self, row: &[f32], count: usize, largest: &mut Vec<f32>) -> Option<(f32, f32)> {
        largest.clear();
        for &v in row {
            keep_largest(largest, count, v.abs());
        }
        row_range(row)
    }

    fn clip(&self, row: &[f32], bound: f32, held: &mut [(u32, f32)]) -> (f32, f32, usize) {
        let (mut lo, mut hi, mut count) = (0f32, 0f32, 0);
        for (depth, &v) in row.iter().enumerate() {
            if v.abs() > bound {
                held[count] = (depth as u32, v);
                count += 1;
            } else {
                lo = lo.min(v);
                hi = hi.max(v);
            }
        }
        (lo, hi, count)
    }

    fn levels(&self, row: &[f32], range: (f32, f32), levels: f32, bytes: &mut [u8]) -> RowQuant {
        quantize_levels(row, range, levels, bytes, None)
    }
}

/// The outliers' exact part of one output row over a column block: `Σ_j x_j · w(j, c)` in f32,
/// `w` the quantized weights (the column scale applied in [`Combine`]) read from the packed quad
/// panels, the outliers in depth order, one fused multiply-add each.
struct OutlierProducts<'a> {
    /// The block's panels on (`quads · 4 · NR_Q` bytes each).
    panels: &'a [i8],
    quads: usize,
    outliers: &'a [(u32, f32)],
}

impl OutlierProducts<'_> {
    /// Into `out` (a whole number of panels' columns).
    fn scalar(&self, out: &mut [f32]) {
        let panel_bytes = self.quads * 4 * NR_Q;
        for (p, out) in out.chunks_exact_mut(NR_Q).enumerate() {
            let panel = &self.panels[p * panel_bytes..(p + 1) * panel_bytes];
            for (c, o) in out.iter_mut().enumerate() {
                *o = self.outliers.iter().fold(0f32, |acc, &(depth, v)| {
                    let depth = depth as usize;
                    let w = panel[(depth / 4) * 4 * NR_Q + 4 * c + depth % 4];
                    v.mul_add(f32::from(w), acc)
                });
            }
        }
    }
}

/// One output row of a quad-layout product from its integer sums: `(acc − zero·Σw) · sx · sw
/// (+ outliers · sw) (+ b)`, `acc` the sums of the 8-bit plane, or `256·hi + lo` of the two 16-bit
/// planes.
struct Combine<'a> {
    hi: &'a [i32],
    lo: Option<&'a [i32]>,
    /// `Σ_d w(d, c)` per column, or empty (the pair layout: symmetric activations, no zero point).
    corrections: &'a [i32],
    scales: &'a [f32],
    bias: Option<&'a [f32]>,
    quant: RowQuant,
    /// The outliers' exact products ([`OutlierProducts`]), one per column, when the row has any.
    outliers: Option<&'a [f32]>,
}

impl Combine<'_> {
    /// Output column `c`, as the SIMD combine computes it (the portable code, and the tails).
    #[inline(always)]
    fn column(&self, c: usize) -> f32 {
        let RowQuant { scale: sx, zero, .. } = self.quant;
        let mut acc = i64::from(self.hi[c]);
        if let Some(lo) = self.lo {
            acc = 256 * acc + i64::from(lo[c]);
        }
        if let Some(&sum) = self.corrections.get(c) {
            acc -= zero * i64::from(sum);
        }
        let mut out = acc as f32 * (sx * self.scales[c]);
        if let Some(exact) = self.outliers {
            out = exact[c].mul_add(self.scales[c], out);
        }
        match self.bias {
            Some(bias) => out + bias[c],
            None => out,
        }
    }

    fn scalar(&self, dst: &mut [f32]) {
        for (c, o) in dst.iter_mut().enumerate() {
            *o = self.column(c);
        }
    }
}

/// The activations of one product, packed for its layout.
enum Packed {
    Pairs(Vec<i32>),
    Quads(Vec<u32>),
}

/// One pair-kernel call: `rows` rows of packed activation pairs times one panel slice, into `out`
/// (rows `stride` apart), added to what `out` holds when `accumulate`.
struct IntTileCall<'a> {
    x: &'a [i32],
    panel: &'a [i16],
    out: &'a mut [i32],
    stride: usize,
    accumulate: bool,
}

/// One quad-kernel call: `rows` plane rows of packed u8 quads (`MR_Q` words per quad) times one
/// panel slice (`4·NR_Q` bytes per quad), into `out` (rows `stride` apart, `NR_Q` sums each),
/// added to what `out` holds when `accumulate`.
struct QuadTileCall<'a> {
    x: &'a [u32],
    panel: &'a [i8],
    out: &'a mut [i32],
    stride: usize,
    accumulate: bool,
    /// Weights to request into L2 during the call ([`NextSlices`]).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    prefetch: Prefetch<'a, i8>,
}

/// The SIMD code a quad-layout weight runs, one of the two proofs that the CPU has its VNNI: the
/// AVX512-VNNI kernel with AVX-512 rows (quantizing activations, outliers, combining sums), or the
/// AVX-VNNI kernel with AVX2 rows and portable outliers, so `cpu_kernels = "avx2"` runs no 512-bit
/// code.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
enum QuadSimd {
    Avx512(vnni::Vnni),
    Avx256(avx_vnni::AvxVnni),
}

#[cfg(target_arch = "x86_64")]
impl QuadSimd {
    fn tile(self, rows: usize, call: QuadTileCall<'_>) {
        match self {
            Self::Avx512(simd) => simd.tile(rows, call),
            Self::Avx256(simd) => simd.tile(rows, call),
        }
    }

    fn quantize_row(self, row: &[f32], levels: f32, hi: &mut [u8], lo: Option<&mut [u8]>) -> Option<RowQuant> {
        match self {
            Self::Avx512(simd) => simd.quantize_row(row, levels, hi, lo),
            Self::Avx256(simd) => simd.quantize_row(row, levels, hi, lo),
        }
    }

    fn combine(self, combine: Combine<'_>, dst: &mut [f32]) {
        match self {
            Self::Avx512(simd) => simd.combine(combine, dst),
            Self::Avx256(simd) => simd.combine(combine, dst),
        }
    }

    /// The AVX-512 code, for what only it has (outliers).
    fn avx512(self) -> Option<vnni::Vnni> {
        match self {
            Self::Avx512(simd) => Some(simd),
            Self::Avx256(_) => None,
        }
    }
}

/// The quad tile in portable integer code: the same sums as the VNNI tiles, exactly (a CPU without
/// VNNI never packs this layout outside the tests; this keeps a mistake slow rather than wrong).
fn scalar_quad_tile(rows: usize, call: QuadTileCall<'_>) {
    let QuadTileCall {
        x,
        panel,
        out,
        stride,
        accumulate,
        prefetch: _,
    } = call;
    for r in 0..rows {
        let dst = &mut out[r * stride..r * stride + NR_Q];
        if !accumulate {
            dst.fill(0);
        }
        for (w, a) in panel.chunks_exact(4 * NR_Q).zip(x.chunks_exact(MR_Q)) {
            let bytes = a[r].to_le_bytes();
            for (o, w) in dst.iter_mut().zip(w.chunks_exact(4)) {
                let sum: i32 = bytes.iter().zip(w).map(|(&u, &w)| i32::from(u) * i32::from(w)).sum();
                *o = o.wrapping_add(sum);
            }
        }
    }
}

/// The AVX512-VNNI micro-kernel. std's `vpdpbusd` intrinsic is safe to call only from code compiled
/// for the feature, so the kernel is a `#[target_feature]` function, entered through a token that
/// exists only once run-time detection found the features.
#[cfg(target_arch = "x86_64")]
mod vnni {
    // Entering a `#[target_feature]` function and unaligned vector loads and stores are `unsafe`;
    // this module is the only place in the crate's kernels that needs it, each use says why it holds.
    #![allow(unsafe_code)]

    use std::arch::x86_64::{
        __m256, __m512, __m512i, _CMP_GT_OQ, _CMP_UNORD_Q, _mm_cvtsi32_si128, _mm256_add_ps, _mm256_fmadd_ps,
        _mm256_loadu_ps, _mm256_loadu_si256, _mm256_mul_ps, _mm256_set1_ps, _mm256_storeu_ps, _mm512_abs_ps,
        _mm512_add_epi64, _mm512_add_ps, _mm512_and_si512, _mm512_cmp_ps_mask, _mm512_cvtepi32_epi64,
        _mm512_cvtepi32_ps, _mm512_cvtepi64_ps, _mm512_cvtps_epi32, _mm512_dpbusd_epi32, _mm512_fmadd_ps,
        _mm512_loadu_ps, _mm512_loadu_si512, _mm512_mask_cmp_ps_mask, _mm512_mask_cvtepi32_storeu_epi8,
        _mm512_mask_max_ps, _mm512_mask_min_ps, _mm512_maskz_loadu_ps, _mm512_max_ps, _mm512_min_ps, _mm512_mul_epi32,
        _mm512_mul_ps, _mm512_mullo_epi32, _mm512_reduce_max_ps, _mm512_reduce_min_ps, _mm512_set1_epi32,
        _mm512_set1_epi64, _mm512_set1_ps, _mm512_setzero_ps, _mm512_setzero_si512, _mm512_sll_epi32,
        _mm512_slli_epi64, _mm512_srai_epi32, _mm512_srli_epi32, _mm512_storeu_ps, _mm512_storeu_si512,
        _mm512_sub_epi32, _mm512_sub_epi64,
    };

    use super::{
        Combine, MR_Q, NR_Q, OutlierPasses, OutlierProducts, QuadTileCall, RowQuant, keep_largest, row_levels,
    };

    /// Proof that this CPU has AVX-512F, AVX-512BW, AVX-512DQ, AVX512-VNNI and FMA.
    #[derive(Clone, Copy)]
    pub(super) struct Vnni(());

    impl Vnni {
        pub(super) fn try_new() -> Option<Self> {
            let has = std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx512bw")
                && std::arch::is_x86_feature_detected!("avx512dq")
                && std::arch::is_x86_feature_detected!("avx512vnni")
                && std::arch::is_x86_feature_detected!("fma");
            has.then_some(Self(()))
        }

        /// [`super::quantize_row`] with AVX-512: the same levels, bytes and quantization exactly.
        pub(super) fn quantize_row(
            self,
            row: &[f32],
            levels: f32,
            hi: &mut [u8],
            lo: Option<&mut [u8]>,
        ) -> Option<RowQuant> {
            // SAFETY: a `Vnni` exists only where `try_new` detected every feature it is compiled for.
            unsafe { quantize_row(row, levels, hi, lo) }
        }

        /// [`super::quantize_levels`] with AVX-512: the same levels, bytes and quantization exactly.
        pub(super) fn quantize_levels(
            self,
            row: &[f32],
            range: (f32, f32),
            levels: f32,
            hi: &mut [u8],
            lo: Option<&mut [u8]>,
        ) -> RowQuant {
            // SAFETY: as in `quantize_row`.
            unsafe { quantize_levels(row, range, levels, hi, lo) }
        }

        /// [`OutlierProducts::scalar`] with AVX-512 (16 columns at a time): the same floats.
        pub(super) fn outlier_products(self, products: &OutlierProducts<'_>, out: &mut [f32]) {
            // SAFETY: as in `quantize_row`.
            unsafe { outlier_products(products, out) }
        }

        /// [`Combine::scalar`] with AVX-512 (8 columns of i64 sums at a time): the same floats.
        pub(super) fn combine(self, combine: Combine<'_>, dst: &mut [f32]) {
            // SAFETY: as in `quantize_row`.
            unsafe { combine_row(&combine, dst) }
        }

        /// One tile of `rows` (at most `MR_Q`) plane rows.
        pub(super) fn tile(self, rows: usize, call: QuadTileCall<'_>) {
            // SAFETY: a `Vnni` exists only where `try_new` detected every feature `tile_rows`
            // is compiled for.
            unsafe {
                match rows {
                    8 => tile_rows::<8>(call),
                    7 => tile_rows::<7>(call),
                    6 => tile_rows::<6>(call),
                    5 => tile_rows::<5>(call),
                    4 => tile_rows::<4>(call),
                    3 => tile_rows::<3>(call),
                    2 => tile_rows::<2>(call),
                    _ => tile_rows::<1>(call),
                }
            }
        }
    }

    /// 16 lanes at a time; a lane over the bound (rare after the first few) goes through the
    /// portable code's bookkeeping, in depth order.
    impl OutlierPasses for Vnni {
        fn scan(&self, row: &[f32], count: usize, largest: &mut Vec<f32>) -> Option<(f32, f32)> {
            // SAFETY: a `Vnni` exists only where `try_new` detected every feature it is compiled for.
            unsafe { scan(row, count, largest) }
        }

        fn clip(&self, row: &[f32], bound: f32, held: &mut [(u32, f32)]) -> (f32, f32, usize) {
            // SAFETY: as in `scan`.
            unsafe { clip(row, bound, held) }
        }

        fn levels(&self, row: &[f32], range: (f32, f32), levels: f32, bytes: &mut [u8]) -> RowQuant {
            self.quantize_levels(row, range, levels, bytes, None)
        }
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni")]
    fn scan(row: &[f32], count: usize, largest: &mut Vec<f32>) -> Option<(f32, f32)> {
        largest.clear();
        let (mut min, mut max) = (_mm512_setzero_ps(), _mm512_setzero_ps());
        let mut nan = 0u16;
        // Below every magnitude until `largest` is full, then its smallest.
        let mut floor = -1f32;
        for chunk in row.chunks(16) {
            let len = chunk.len();
            let lanes = ((1u32 << len) - 1) as u16;
            let v = load_lanes(chunk, len);
            nan |= _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(v, v);
            min = _mm512_min_ps(min, v);
            max = _mm512_max_ps(max, v);
            let mut over = _mm512_mask_cmp_ps_mask::<_CMP_GT_OQ>(lanes, _mm512_abs_ps(v), _mm512_set1_ps(floor));
            while over != 0 {
                let lane = over.trailing_zeros() as usize;
                over &= over - 1;
                keep_largest(largest, count, chunk[lane].abs());
                if largest.len() == count {
                    floor = largest[0];
                }
            }
        }
        let (min, max) = (_mm512_reduce_min_ps(min), _mm512_reduce_max_ps(max));
        (nan == 0 && min.is_finite() && max.is_finite()).then_some((min, max))
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni")]
    fn clip(row: &[f32], bound: f32, held: &mut [(u32, f32)]) -> (f32, f32, usize) {
        let (mut lo, mut hi) = (_mm512_setzero_ps(), _mm512_setzero_ps());
        let bound = _mm512_set1_ps(bound);
        let mut count = 0;
        for (i, chunk) in row.chunks(16).enumerate() {
            let len = chunk.len();
            let lanes = ((1u32 << len) - 1) as u16;
            let v = load_lanes(chunk, len);
            let mut over = _mm512_mask_cmp_ps_mask::<_CMP_GT_OQ>(lanes, _mm512_abs_ps(v), bound);
            // Zero lanes past the row change neither end: zero is inside the range anyway.
            let inside = !over;
            lo = _mm512_mask_min_ps(lo, inside, lo, v);
            hi = _mm512_mask_max_ps(hi, inside, hi, v);
            while over != 0 {
                let lane = over.trailing_zeros() as usize;
                over &= over - 1;
                held[count] = ((16 * i + lane) as u32, chunk[lane]);
                count += 1;
            }
        }
        (_mm512_reduce_min_ps(lo), _mm512_reduce_max_ps(hi), count)
    }

    /// Lanes `0..len` (at most 16) of `values`, zero elsewhere.
    #[target_feature(enable = "avx512f")]
    fn load_lanes(values: &[f32], len: usize) -> __m512 {
        let len = len.min(16).min(values.len());
        let mask = ((1u32 << len) - 1) as u16;
        // SAFETY: only the `len` lanes inside `values` are read (masked load).
        unsafe { _mm512_maskz_loadu_ps(mask, values.as_ptr()) }
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni")]
    fn quantize_row(row: &[f32], levels: f32, hi: &mut [u8], lo: Option<&mut [u8]>) -> Option<RowQuant> {
        // Range and NaN check 16 lanes at a time; the zero lanes of a tail change neither, since
        // zero is inside the range anyway.
        let (mut min, mut max) = (_mm512_setzero_ps(), _mm512_setzero_ps());
        let mut nan = 0u16;
        for chunk in row.chunks(16) {
            let v = load_lanes(chunk, chunk.len());
            nan |= _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(v, v);
            min = _mm512_min_ps(min, v);
            max = _mm512_max_ps(max, v);
        }
        let (min, max) = (_mm512_reduce_min_ps(min), _mm512_reduce_max_ps(max));
        if nan != 0 || !(min.is_finite() && max.is_finite()) || min == max {
            return None;
        }
        Some(quantize_levels(row, (min, max), levels, hi, lo))
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni")]
    fn quantize_levels(
        row: &[f32],
        (min, max): (f32, f32),
        levels: f32,
        hi: &mut [u8],
        lo: Option<&mut [u8]>,
    ) -> RowQuant {
        let (quant, inverse, zero) = row_levels(min, max, levels);
        let (inverse, zero, top) = (_mm512_set1_ps(inverse), _mm512_set1_ps(zero), _mm512_set1_ps(levels));
        let bottom = _mm512_setzero_ps();
        let low_byte = _mm512_set1_epi32(0xff);
        let mut lo = lo;
        for (i, chunk) in row.chunks(16).enumerate() {
            let len = chunk.len();
            let mask = ((1u32 << len) - 1) as u16;
            // The scalar code's `round_small((v · inverse + zero).clamp(0, levels))`: a product and a
            // sum rounded apart (no fused multiply-add), then the round to nearest even of
            // `cvtps2dq` (the default rounding mode), which `round_small` also computes.
            let v = load_lanes(chunk, len);
            let level = _mm512_min_ps(
                _mm512_max_ps(_mm512_add_ps(_mm512_mul_ps(v, inverse), zero), bottom),
                top,
            );
            let u = _mm512_cvtps_epi32(level);
            let at = 16 * i;
            assert!(hi.len() >= at + len, "quantized row too short");
            match lo.as_deref_mut() {
                Some(lo) => {
                    assert!(lo.len() >= at + len, "quantized row too short");
                    // SAFETY: `len` bytes from `at` are inside each plane (checked above).
                    unsafe {
                        _mm512_mask_cvtepi32_storeu_epi8(hi[at..].as_mut_ptr().cast(), mask, _mm512_srli_epi32::<8>(u));
                        _mm512_mask_cvtepi32_storeu_epi8(
                            lo[at..].as_mut_ptr().cast(),
                            mask,
                            _mm512_and_si512(u, low_byte),
                        );
                    }
                }
                // SAFETY: as above.
                None => unsafe { _mm512_mask_cvtepi32_storeu_epi8(hi[at..].as_mut_ptr().cast(), mask, u) },
            }
        }
        quant
    }

    /// Per panel and half (16 columns): per outlier, the 64 bytes of its depth quad, byte
    /// `depth % 4` of each i32 lane shifted to the top and back (sign-extended), converted, and
    /// one fused multiply-add by the outlier's value, in depth order as the portable code.
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,fma")]
    fn outlier_products(products: &OutlierProducts<'_>, out: &mut [f32]) {
        let OutlierProducts {
            panels,
            quads,
            outliers,
        } = *products;
        let panel_bytes = quads * 4 * NR_Q;
        assert!(
            out.len().is_multiple_of(NR_Q) && panels.len() >= out.len() / NR_Q * panel_bytes,
            "outlier products past the panels"
        );
        assert!(
            outliers.iter().all(|&(depth, _)| (depth as usize) < 4 * quads),
            "outlier past the depth"
        );
        for (p, out) in out.chunks_exact_mut(NR_Q).enumerate() {
            let panel = &panels[p * panel_bytes..(p + 1) * panel_bytes];
            for half in 0..2 {
                let mut acc = _mm512_setzero_ps();
                for &(depth, v) in outliers {
                    let depth = depth as usize;
                    let at = (depth / 4) * 4 * NR_Q + 64 * half;
                    // SAFETY: `at + 64 ≤ panel_bytes` (depth < 4·quads, checked above).
                    let quad = unsafe { _mm512_loadu_si512(panel[at..].as_ptr().cast::<__m512i>()) };
                    let up = _mm512_sll_epi32(quad, _mm_cvtsi32_si128(8 * (3 - (depth % 4) as i32)));
                    let w = _mm512_cvtepi32_ps(_mm512_srai_epi32::<24>(up));
                    acc = _mm512_fmadd_ps(_mm512_set1_ps(v), w, acc);
                }
                // SAFETY: `out` holds 32 f32 of this panel: 16 from `16 · half`.
                unsafe { _mm512_storeu_ps(out[16 * half..].as_mut_ptr(), acc) };
            }
        }
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,fma")]
    fn combine_row(combine: &Combine<'_>, dst: &mut [f32]) {
        let width = dst.len();
        assert!(
            combine.hi.len() >= width
                && combine.lo.is_none_or(|lo| lo.len() >= width)
                && combine.outliers.is_none_or(|o| o.len() >= width)
                && combine.corrections.len() >= width
                && combine.scales.len() >= width
                && combine.bias.is_none_or(|b| b.len() >= width),
            "combine inputs shorter than the row"
        );
        let RowQuant { scale: sx, zero, .. } = combine.quant;
        // One plane (8-bit levels, zero ≤ 255): 16 columns at a time in i32. The true
        // difference Σ (x − zero)·w is within ±255 · 127 · k ≤ i32::MAX (k ≤ MAX_QUAD_DEPTH), so
        // the wrapping one is it, exactly the i64 integer below, then rounded to f32 the same way.
        let wide = if combine.lo.is_none() && (0..=255).contains(&zero) {
            width - width % 16
        } else {
            0
        };
        let (zero16, sx16) = (_mm512_set1_epi32(zero as i32), _mm512_set1_ps(sx));
        for c in (0..wide).step_by(16) {
            // SAFETY: `c + 16 ≤ width ≤` every input's length (checked above): 16 i32 or f32 = 64
            // bytes each; `loadu` and `storeu` need no alignment.
            unsafe {
                let sums = _mm512_loadu_si512(combine.hi[c..].as_ptr().cast::<__m512i>());
                let corrections = _mm512_loadu_si512(combine.corrections[c..].as_ptr().cast::<__m512i>());
                let levels = _mm512_sub_epi32(sums, _mm512_mullo_epi32(zero16, corrections));
                let scales = _mm512_loadu_ps(combine.scales[c..].as_ptr());
                let mut out = _mm512_mul_ps(_mm512_cvtepi32_ps(levels), _mm512_mul_ps(sx16, scales));
                if let Some(exact) = combine.outliers {
                    out = _mm512_fmadd_ps(_mm512_loadu_ps(exact[c..].as_ptr()), scales, out);
                }
                if let Some(bias) = combine.bias {
                    out = _mm512_add_ps(out, _mm512_loadu_ps(bias[c..].as_ptr()));
                }
                _mm512_storeu_ps(dst[c..].as_mut_ptr(), out);
            }
        }
        let sx = _mm256_set1_ps(sx);
        let zero = _mm512_set1_epi64(zero);
        let body = width - width % 8;
        let load = |values: &[i32], c: usize| {
            // SAFETY: `c + 8 ≤ width ≤ values.len()` (checked above): 8 i32 = 32 bytes.
            _mm512_cvtepi32_epi64(unsafe { _mm256_loadu_si256(values[c..].as_ptr().cast()) })
        };
        for c in (wide..body).step_by(8) {
            let mut acc = load(combine.hi, c);
            if let Some(lo) = combine.lo {
                acc = _mm512_add_epi64(_mm512_slli_epi64::<8>(acc), load(lo, c));
            }
            // zero ≤ 65535 and the column sums are i32: the 32 × 32 → 64-bit product is exact.
            acc = _mm512_sub_epi64(acc, _mm512_mul_epi32(zero, load(combine.corrections, c)));
            // SAFETY: as in `load`, for 8 f32.
            let scales: __m256 = unsafe { _mm256_loadu_ps(combine.scales[c..].as_ptr()) };
            let mut out = _mm256_mul_ps(_mm512_cvtepi64_ps(acc), _mm256_mul_ps(sx, scales));
            if let Some(exact) = combine.outliers {
                // SAFETY: as above.
                out = _mm256_fmadd_ps(unsafe { _mm256_loadu_ps(exact[c..].as_ptr()) }, scales, out);
            }
            if let Some(bias) = combine.bias {
                // SAFETY: as above.
                out = _mm256_add_ps(out, unsafe { _mm256_loadu_ps(bias[c..].as_ptr()) });
            }
            // SAFETY: as above, into `dst`.
            unsafe { _mm256_storeu_ps(dst[c..].as_mut_ptr(), out) };
        }
        for (c, o) in dst.iter_mut().enumerate().skip(body) {
            *o = combine.column(c);
        }
    }

    /// `R × 2` i32 accumulator registers (32 columns per row); per depth quad, two weight registers
    /// and one broadcast activation word per row, `vpdpbusd` into each accumulator.
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni")]
    fn tile_rows<const R: usize>(call: QuadTileCall<'_>) {
        let QuadTileCall {
            x,
            panel,
            out,
            stride,
            accumulate,
            prefetch,
        } = call;
        const { assert!(R >= 1 && R <= MR_Q && NR_Q == 32) };
        // Every row's 32 sums lie inside `out`: the loads and stores below stay in bounds.
        assert!(out.len() >= (R - 1) * stride + NR_Q, "quad tile output too short");
        let mut acc = [[_mm512_setzero_si512(); 2]; R];
        if accumulate {
            for (r, acc) in acc.iter_mut().enumerate() {
                let held = &out[r * stride..r * stride + NR_Q];
                // SAFETY: `held` is 32 i32 = two 64-byte vectors; `loadu` needs no alignment.
                *acc = unsafe {
                    [
                        _mm512_loadu_si512(held.as_ptr().cast::<__m512i>()),
                        _mm512_loadu_si512(held[16..].as_ptr().cast::<__m512i>()),
                    ]
                };
            }
        }
        for (i, (w, a)) in panel.chunks_exact(4 * NR_Q).zip(x.chunks_exact(MR_Q)).enumerate() {
            prefetch.step(i);
            // SAFETY: `w` is 128 bytes = two 64-byte vectors; `loadu` needs no alignment.
            let (w0, w1) = unsafe {
                (
                    _mm512_loadu_si512(w.as_ptr().cast::<__m512i>()),
                    _mm512_loadu_si512(w[64..].as_ptr().cast::<__m512i>()),
                )
            };
            for r in 0..R {
                let v = _mm512_set1_epi32(a[r] as i32);
                acc[r][0] = _mm512_dpbusd_epi32(acc[r][0], v, w0);
                acc[r][1] = _mm512_dpbusd_epi32(acc[r][1], v, w1);
            }
        }
        for (r, acc) in acc.iter().enumerate() {
            let dst = &mut out[r * stride..r * stride + NR_Q];
            // SAFETY: `dst` is 32 i32 = two 64-byte vectors; `storeu` needs no alignment.
            unsafe {
                _mm512_storeu_si512(dst.as_mut_ptr().cast::<__m512i>(), acc[0]);
                _mm512_storeu_si512(dst[16..].as_mut_ptr().cast::<__m512i>(), acc[1]);
            }
        }
    }
}

/// The AVX-VNNI micro-kernel: the VEX-encoded, 256-bit `vpdpbusd` on the same packed quad panels
/// and activation tiles as the AVX512-VNNI one, so the two give the same sums exactly. As there,
/// std's intrinsic needs code compiled for the feature, entered through a token that exists only
/// once run-time detection found it.
#[cfg(target_arch = "x86_64")]
mod avx_vnni {
    // Entering a `#[target_feature]` function and unaligned vector loads and stores are `unsafe`;
    // each use says why it holds.
    #![allow(unsafe_code)]

    use std::arch::x86_64::{
        __m128i, __m256, __m256i, _CMP_UNORD_Q, _mm_add_ps, _mm_fmadd_ps, _mm_loadu_ps, _mm_loadu_si128, _mm_mul_ps,
        _mm_set1_ps, _mm_storel_epi64, _mm_storeu_ps, _mm256_add_pd, _mm256_add_ps, _mm256_and_si256,
        _mm256_castsi256_si128, _mm256_cmp_ps, _mm256_cvtepi32_pd, _mm256_cvtpd_ps, _mm256_cvtps_epi32,
        _mm256_dpbusd_avx_epi32, _mm256_loadu_ps, _mm256_loadu_si256, _mm256_max_ps, _mm256_min_ps, _mm256_movemask_ps,
        _mm256_mul_pd, _mm256_mul_ps, _mm256_or_ps, _mm256_permutevar8x32_epi32, _mm256_set1_epi32, _mm256_set1_pd,
        _mm256_set1_ps, _mm256_setr_epi8, _mm256_setr_epi32, _mm256_setzero_ps, _mm256_setzero_si256,
        _mm256_shuffle_epi8, _mm256_srli_epi32, _mm256_storeu_ps, _mm256_storeu_si256, _mm256_sub_pd,
    };

    use super::{Combine, MR_Q, NR_Q, Prefetch, QuadTileCall, RowQuant, round_small, row_levels};

    /// Plane rows per register block: four accumulators (32 columns) each, 12 of the 16 ymm
    /// registers, and one for each row's broadcast activation quad; the weights are read from
    /// memory by each `vpdpbusd`.
    const BLOCK_ROWS: usize = 3;

    /// Proof that this CPU has AVX2, FMA and AVX-VNNI.
    #[derive(Clone, Copy)]
    pub(super) struct AvxVnni(());

    impl AvxVnni {
        pub(super) fn try_new() -> Option<Self> {
            let has = std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
                && std::arch::is_x86_feature_detected!("avxvnni");
            has.then_some(Self(()))
        }

        /// [`super::quantize_row`] with AVX2: the same levels, bytes and quantization exactly.
        pub(super) fn quantize_row(
            self,
            row: &[f32],
            levels: f32,
            hi: &mut [u8],
            lo: Option<&mut [u8]>,
        ) -> Option<RowQuant> {
            // SAFETY: an `AvxVnni` exists only where `try_new` detected every feature it is compiled for.
            unsafe { quantize_row(row, levels, hi, lo) }
        }

        /// [`Combine::scalar`] with AVX2 (4 columns at a time, the integer sums exact in f64):
        /// the same floats.
        pub(super) fn combine(self, combine: Combine<'_>, dst: &mut [f32]) {
            // SAFETY: as in `quantize_row`.
            unsafe { combine_row(&combine, dst) }
        }

        /// One tile of `rows` (at most `MR_Q`) plane rows, in blocks of `BLOCK_ROWS`: each block
        /// reads the tile's panel slice again, from L1.
        pub(super) fn tile(self, rows: usize, call: QuadTileCall<'_>) {
            let QuadTileCall {
                x,
                panel,
                out,
                stride,
                accumulate,
                prefetch,
            } = call;
            let rows = rows.min(MR_Q);
            let mut first = 0;
            while first < rows {
                let height = BLOCK_ROWS.min(rows - first);
                let from = (first * stride).min(out.len());
                // The block's rows from its first: `out` from that row's sums on.
                let block = QuadTileCall {
                    x,
                    panel,
                    out: &mut out[from..],
                    stride,
                    accumulate,
                    // The call's prefetch once, with its first block.
                    prefetch: if first == 0 { prefetch } else { Prefetch::NONE },
                };
                // SAFETY: an `AvxVnni` exists only where `try_new` detected every feature
                // `block_rows` is compiled for.
                unsafe {
                    match height {
                        3 => block_rows::<3>(block, first),
                        2 => block_rows::<2>(block, first),
                        _ => block_rows::<1>(block, first),
                    }
                }
                first += height;
            }
        }
    }

    /// The row's range (zero included) 8 lanes at a time, NaN and infinities refused, then its
    /// levels; the portable code's tail past the last 8.
    #[target_feature(enable = "avx2,fma")]
    fn quantize_row(row: &[f32], levels: f32, hi: &mut [u8], lo: Option<&mut [u8]>) -> Option<RowQuant> {
        let body = row.len() - row.len() % 8;
        let (mut min, mut max, mut nan) = (_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps());
        for c in (0..body).step_by(8) {
            let v = load8(row, c);
            nan = _mm256_or_ps(nan, _mm256_cmp_ps::<_CMP_UNORD_Q>(v, v));
            min = _mm256_min_ps(min, v);
            max = _mm256_max_ps(max, v);
        }
        if _mm256_movemask_ps(nan) != 0 {
            return None;
        }
        let (mut lows, mut highs) = ([0f32; 8], [0f32; 8]);
        // SAFETY: each array is 8 f32 = 32 bytes; `storeu` needs no alignment.
        unsafe {
            _mm256_storeu_ps(lows.as_mut_ptr(), min);
            _mm256_storeu_ps(highs.as_mut_ptr(), max);
        }
        let (mut min, mut max) = (
            lows.into_iter().fold(0f32, f32::min),
            highs.into_iter().fold(0f32, f32::max),
        );
        for &v in &row[body..] {
            if v.is_nan() {
                return None;
            }
            min = min.min(v);
            max = max.max(v);
        }
        if !(min.is_finite() && max.is_finite()) || min == max {
            return None;
        }
        Some(quantize_levels(row, (min, max), levels, hi, lo))
    }

    /// 8 lanes at a time as [`super::quantize_levels`]: a product and a sum rounded apart (no fused
    /// multiply-add), clamped, then `cvtps2dq`'s round to nearest even, which `round_small` also
    /// computes.
    #[target_feature(enable = "avx2,fma")]
    fn quantize_levels(
        row: &[f32],
        (min, max): (f32, f32),
        levels: f32,
        hi: &mut [u8],
        mut lo: Option<&mut [u8]>,
    ) -> RowQuant {
        assert!(
            hi.len() >= row.len() && lo.as_ref().is_none_or(|lo| lo.len() >= row.len()),
            "quantized row too short"
        );
        let (quant, inverse, zero) = row_levels(min, max, levels);
        let (inverse_v, zero_v, top) = (_mm256_set1_ps(inverse), _mm256_set1_ps(zero), _mm256_set1_ps(levels));
        let low_byte = _mm256_set1_epi32(0xff);
        let body = row.len() - row.len() % 8;
        for c in (0..body).step_by(8) {
            let level = _mm256_min_ps(
                _mm256_max_ps(
                    _mm256_add_ps(_mm256_mul_ps(load8(row, c), inverse_v), zero_v),
                    _mm256_setzero_ps(),
                ),
                top,
            );
            let u = _mm256_cvtps_epi32(level);
            match lo.as_deref_mut() {
                Some(lo) => {
                    store_low_bytes(hi, c, _mm256_srli_epi32::<8>(u));
                    store_low_bytes(lo, c, _mm256_and_si256(u, low_byte));
                }
                None => store_low_bytes(hi, c, u),
            }
        }
        let q = |v: f32| round_small((v * inverse + zero).clamp(0.0, levels)) as u32;
        for (c, &v) in row.iter().enumerate().skip(body) {
            let u = q(v);
            match lo.as_deref_mut() {
                Some(lo) => {
                    hi[c] = (u >> 8) as u8;
                    lo[c] = (u & 0xff) as u8;
                }
                None => hi[c] = u as u8,
            }
        }
        quant
    }

    /// `values[at .. at + 8]`.
    #[target_feature(enable = "avx2")]
    fn load8(values: &[f32], at: usize) -> __m256 {
        let values = &values[at..at + 8];
        // SAFETY: `values` is 8 f32 = 32 bytes; `loadu` needs no alignment.
        unsafe { _mm256_loadu_ps(values.as_ptr()) }
    }

    /// The low byte of each of the 8 i32 lanes of `u` (each at most 255) to `dst[at .. at + 8]`.
    #[target_feature(enable = "avx2")]
    fn store_low_bytes(dst: &mut [u8], at: usize, u: __m256i) {
        // Bytes 0, 4, 8, 12 of each 128-bit lane to the lane's first dword, then those two dwords
        // side by side.
        let gather = _mm256_setr_epi8(
            0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1,
            -1, -1, -1, -1,
        );
        let packed = _mm256_permutevar8x32_epi32(
            _mm256_shuffle_epi8(u, gather),
            _mm256_setr_epi32(0, 4, 0, 0, 0, 0, 0, 0),
        );
        let dst = &mut dst[at..at + 8];
        // SAFETY: `dst` is 8 bytes; `storel_epi64` writes the low 8 bytes, unaligned.
        unsafe { _mm_storel_epi64(dst.as_mut_ptr().cast::<__m128i>(), _mm256_castsi256_si128(packed)) };
    }

    /// 4 columns at a time: the integer part `256·hi + lo − zero·Σw` in f64, where every term and
    /// sum is an integer below 2⁵³ (so exact, as the portable code's i64), rounded once to f32 as
    /// the portable `i64 as f32`; then the same float operations in the same order.
    #[target_feature(enable = "avx2,fma")]
    fn combine_row(combine: &Combine<'_>, dst: &mut [f32]) {
        let width = dst.len();
        assert!(
            combine.hi.len() >= width
                && combine.lo.is_none_or(|lo| lo.len() >= width)
                && combine.outliers.is_none_or(|o| o.len() >= width)
                && combine.corrections.len() >= width
                && combine.scales.len() >= width
                && combine.bias.is_none_or(|b| b.len() >= width),
            "combine inputs shorter than the row"
        );
        let RowQuant { scale: sx, zero, .. } = combine.quant;
        let sx = _mm_set1_ps(sx);
        // zero ≤ 65535, |Σw| ≤ 127·k: their product is exact in f64.
        let zero = _mm256_set1_pd(zero as f64);
        let body = width - width % 4;
        for c in (0..body).step_by(4) {
            let load = |values: &[i32]| {
                let values = &values[c..c + 4];
                // SAFETY: `values` is 4 i32 = 16 bytes; `loadu` needs no alignment.
                _mm256_cvtepi32_pd(unsafe { _mm_loadu_si128(values.as_ptr().cast::<__m128i>()) })
            };
            let load_f32 = |values: &[f32]| {
                let values = &values[c..c + 4];
                // SAFETY: as in `load`, for 4 f32.
                unsafe { _mm_loadu_ps(values.as_ptr()) }
            };
            let mut acc = load(combine.hi);
            if let Some(lo) = combine.lo {
                acc = _mm256_add_pd(_mm256_mul_pd(acc, _mm256_set1_pd(256.0)), load(lo));
            }
            acc = _mm256_sub_pd(acc, _mm256_mul_pd(zero, load(combine.corrections)));
            let scales = load_f32(combine.scales);
            let mut out = _mm_mul_ps(_mm256_cvtpd_ps(acc), _mm_mul_ps(sx, scales));
            if let Some(exact) = combine.outliers {
                out = _mm_fmadd_ps(load_f32(exact), scales, out);
            }
            if let Some(bias) = combine.bias {
                out = _mm_add_ps(out, load_f32(bias));
            }
            let dst = &mut dst[c..c + 4];
            // SAFETY: `dst` is 4 f32; `storeu` needs no alignment.
            unsafe { _mm_storeu_ps(dst.as_mut_ptr(), out) };
        }
        for (c, o) in dst.iter_mut().enumerate().skip(body) {
            *o = combine.column(c);
        }
    }

    /// Plane rows `first .. first + R` of a tile's activations (`MR_Q` words per quad) times its
    /// panel slice, into `out` (from row `first`'s sums, rows `stride` apart): `R × 4` i32
    /// accumulator registers (32 columns per row); per depth quad, one broadcast activation word
    /// per row and `vpdpbusd` of it by each 32-byte quarter of the panel row.
    #[target_feature(enable = "avx2,avxvnni")]
    fn block_rows<const R: usize>(block: QuadTileCall<'_>, first: usize) {
        let QuadTileCall {
            x,
            panel,
            out,
            stride,
            accumulate,
            prefetch,
        } = block;
        const { assert!(R >= 1 && R <= MR_Q && NR_Q == 32) };
        assert!(first + R <= MR_Q, "block past the tile's rows");
        // Every row's 32 sums lie inside `out`: the loads and stores below stay in bounds.
        assert!(out.len() >= (R - 1) * stride + NR_Q, "quad tile output too short");
        let mut acc = [[_mm256_setzero_si256(); 4]; R];
        if accumulate {
            for (r, acc) in acc.iter_mut().enumerate() {
                let held = &out[r * stride..r * stride + NR_Q];
                for (j, acc) in acc.iter_mut().enumerate() {
                    // SAFETY: `held` is 32 i32; quarter `j` is 8 of them (32 bytes); `loadu` needs
                    // no alignment.
                    *acc = unsafe { _mm256_loadu_si256(held[8 * j..].as_ptr().cast::<__m256i>()) };
                }
            }
        }
        for (i, (w, a)) in panel.chunks_exact(4 * NR_Q).zip(x.chunks_exact(MR_Q)).enumerate() {
            prefetch.step(i);
            let words: [__m256i; R] = std::array::from_fn(|r| _mm256_set1_epi32(a[first + r] as i32));
            for j in 0..4 {
                // SAFETY: `w` is 128 bytes; quarter `j` is 32 of them; `loadu` needs no alignment.
                let quarter = unsafe { _mm256_loadu_si256(w[32 * j..].as_ptr().cast::<__m256i>()) };
                for r in 0..R {
                    acc[r][j] = _mm256_dpbusd_avx_epi32(acc[r][j], words[r], quarter);
                }
            }
        }
        for (r, acc) in acc.iter().enumerate() {
            let dst = &mut out[r * stride..r * stride + NR_Q];
            for (j, acc) in acc.iter().enumerate() {
                // SAFETY: as for the loads, into `dst`.
                unsafe { _mm256_storeu_si256(dst[8 * j..].as_mut_ptr().cast::<__m256i>(), *acc) };
            }
        }
    }
}

fn run_tile(kernel: Int8Kernel, rows: usize, call: IntTileCall<'_>) {
    match kernel {
        #[cfg(target_arch = "x86_64")]
        Int8Kernel::Avx2 => match pulp::x86::V3::try_new() {
            Some(simd) => avx2_tile(simd, rows, call),
            None => scalar_tile(rows, call),
        },
        _ => scalar_tile(rows, call),
    }
}

/// The tile in portable integer code: the same sums as the SIMD tile, exactly.
fn scalar_tile(rows: usize, call: IntTileCall<'_>) {
    let IntTileCall {
        x,
        panel,
        out,
        stride,
        accumulate,
    } = call;
    for r in 0..rows {
        let dst = &mut out[r * stride..r * stride + NR];
        if !accumulate {
            dst.fill(0);
        }
        for (w, a) in panel.chunks_exact(2 * NR).zip(x.chunks_exact(MR)) {
            let word = a[r] as u32;
            let (lo, hi) = (i32::from(word as u16 as i16), i32::from((word >> 16) as u16 as i16));
            for (o, w) in dst.iter_mut().zip(w.chunks_exact(2)) {
                *o = o.wrapping_add(lo * i32::from(w[0]) + hi * i32::from(w[1]));
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
fn avx2_tile(simd: pulp::x86::V3, rows: usize, call: IntTileCall<'_>) {
    use pulp::Simd;
    match rows {
        6 => Simd::vectorize(simd, Avx2Tile::<6> { simd, call }),
        5 => Simd::vectorize(simd, Avx2Tile::<5> { simd, call }),
        4 => Simd::vectorize(simd, Avx2Tile::<4> { simd, call }),
        3 => Simd::vectorize(simd, Avx2Tile::<3> { simd, call }),
        2 => Simd::vectorize(simd, Avx2Tile::<2> { simd, call }),
        _ => Simd::vectorize(simd, Avx2Tile::<1> { simd, call }),
    }
}

/// The AVX2 micro-kernel for `R` rows: `R × 2` i32 accumulator registers; per depth pair, one
/// broadcast activation pair times two weight registers per row (`vpmaddwd`, then `vpaddd`).
#[cfg(target_arch = "x86_64")]
struct Avx2Tile<'a, const R: usize> {
    simd: pulp::x86::V3,
    call: IntTileCall<'a>,
}

#[cfg(target_arch = "x86_64")]
impl<const R: usize> pulp::WithSimd for Avx2Tile<'_, R> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _: S) {
        use pulp::bytemuck::{cast, cast_slice, cast_slice_mut};
        use pulp::{i16x16, i32x8};
        let simd = self.simd;
        let IntTileCall {
            x,
            panel,
            out,
            stride,
            accumulate,
        } = self.call;
        let weights: &[i16x16] = cast_slice(panel);
        let zero = simd.splat_i32x8(0);
        let mut acc = [[zero; 2]; R];
        if accumulate {
            for (r, acc) in acc.iter_mut().enumerate() {
                let held: &[i32x8] = cast_slice(&out[r * stride..r * stride + NR]);
                *acc = [held[0], held[1]];
            }
        }
        for (w, a) in weights.chunks_exact(2).zip(x.chunks_exact(MR)) {
            let (w0, w1) = (w[0], w[1]);
            for r in 0..R {
                let v: i16x16 = cast(simd.splat_i32x8(a[r]));
                acc[r][0] = simd.wrapping_add_i32x8(acc[r][0], simd.multiply_wrapping_add_adjacent_i16x16(v, w0));
                acc[r][1] = simd.wrapping_add_i32x8(acc[r][1], simd.multiply_wrapping_add_adjacent_i16x16(v, w1));
            }
        }
        for (r, acc) in acc.iter().enumerate() {
            let dst: &mut [i32x8] = cast_slice_mut(&mut out[r * stride..r * stride + NR]);
            dst[0] = acc[0];
            dst[1] = acc[1];
        }
    }
}

impl CpuWeight for QuantizedWeight {
    const NAME: &'static str = "laya-int8-matmul";

    fn dims(&self) -> (usize, usize) {
        (self.k, self.n)
    }

    fn matmul(&self, x: &[f32], m: usize) -> Vec<f32> {
        QuantizedWeight::matmul(self, x, m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layers::cpu_matmul::tests::reference;

    /// Pseudo-random values in [−1, 1] with a few larger outliers, like real activations.
    fn values(len: usize, seed: u64) -> Vec<f32> {
        let mut state = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (0..len)
            .map(|i| {
                state = state
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                let v = ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0;
                if i % 97 == 0 { 4.0 * v } else { v }
            })
            .collect()
    }

    /// A row quantizer under test: `(row, levels, hi, lo)` as [`quantize_row`].
    #[cfg(target_arch = "x86_64")]
    type QuantizeRow = Box<dyn Fn(&[f32], f32, &mut [u8], Option<&mut [u8]>) -> Option<RowQuant>>;

    const SHAPES: [(usize, usize, usize); 6] = [
        (1, 5, 3),
        (7, 300, 37),
        (13, 513, 70),
        (64, 64, 33),
        (6, 1, 16),
        (2, 1024, 17),
    ];

    /// Every kernel this CPU runs, with each activation choice of the quad layout: `(kernel,
    /// activations, tolerance)`.
    fn variants() -> Vec<(Int8Kernel, Option<Int8Activations>, f32)> {
        let mut variants = vec![(Int8Kernel::Scalar, None, 0.01)];
        if Int8Kernel::Avx2.available() {
            variants.push((Int8Kernel::Avx2, None, 0.01));
        }
        if Int8Kernel::Avx512Vnni.available() {
            variants.push((Int8Kernel::Avx512Vnni, Some(Int8Activations::U8), 0.02));
            variants.push((Int8Kernel::Avx512Vnni, Some(Int8Activations::U16), 0.01));
            variants.push((Int8Kernel::Avx512Vnni, Some(Int8Activations::U8_OUTLIERS), 0.02));
            variants.push((Int8Kernel::Avx512Vnni, Some(Int8Activations::U8Outliers(1)), 0.02));
            variants.push((Int8Kernel::Avx512Vnni, Some(Int8Activations::U8Outliers(40)), 0.02));
        } else {
            eprintln!("this CPU has no AVX512-VNNI: its kernel is not tested here");
        }
        if Int8Kernel::Amx.available() {
            variants.push((Int8Kernel::Amx, Some(Int8Activations::U8), 0.02));
            variants.push((Int8Kernel::Amx, Some(Int8Activations::U16), 0.01));
            variants.push((Int8Kernel::Amx, Some(Int8Activations::U8_OUTLIERS), 0.02));
        } else {
            eprintln!("AMX not granted or absent: the AMX-INT8 products are tested through the tile model only");
            variants.push((Int8Kernel::Amx, Some(Int8Activations::U8), 0.02));
        }
        if Int8Kernel::AvxVnni.available() {
            variants.push((Int8Kernel::AvxVnni, Some(Int8Activations::U8), 0.02));
            variants.push((Int8Kernel::AvxVnni, Some(Int8Activations::U16), 0.01));
            variants.push((Int8Kernel::AvxVnni, Some(Int8Activations::U8_OUTLIERS), 0.02));
        } else {
            eprintln!("this CPU has no AVX-VNNI: its kernel is not tested here");
        }
        variants
    }

    fn quantized(
        w: &[f32],
        k: usize,
        n: usize,
        bias: Option<Vec<f32>>,
        kernel: Int8Kernel,
        bits: Option<Int8Activations>,
    ) -> QuantizedWeight {
        let mut weight = QuantizedWeight::quantize(w, k, n, bias, kernel);
        if let Some(bits) = bits {
            weight.set_activations(bits);
        }
        assert_eq!(weight.activations(), bits);
        weight
    }

    /// Against a float64 product: the error of each output is within 1% (2% with 8-bit
    /// activations) of the size of its terms (`Σ |x|·|w|`), the bound 8-bit weights and the
    /// activations' levels give.
    #[test]
    fn quantized_products_match_float_products() {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(3).build().expect("pool");
        for (kernel, bits, tolerance) in variants() {
            let mut worst_seen = 0f32;
            for &(m, k, n) in &SHAPES {
                let x = values(m * k, 1);
                let w = values(k * n, 2);
                let bias = values(n, 3);
                let abs = |v: &[f32]| v.iter().map(|v| v.abs()).collect::<Vec<_>>();
                let magnitude = reference(&abs(&x), &abs(&w), m, k, n, None);
                for with_bias in [false, true] {
                    let weight = quantized(&w, k, n, with_bias.then(|| bias.clone()), kernel, bits);
                    let got = pool.install(|| weight.matmul(&x, m));
                    let want = reference(&x, &w, m, k, n, with_bias.then_some(bias.as_slice()));
                    let worst = got
                        .iter()
                        .zip(&want)
                        .zip(&magnitude)
                        .map(|((a, b), s)| (a - b).abs() / s.max(1e-6))
                        .fold(0f32, f32::max);
                    assert!(
                        worst < tolerance,
                        "{kernel:?} {bits:?} {m}x{k}x{n} bias {with_bias}: relative error {worst}"
                    );
                    worst_seen = worst_seen.max(worst);
                }
            }
            eprintln!("{kernel:?} {bits:?}: worst relative error {worst_seen:.5}");
        }
    }

    /// 16-bit activations are far closer to the float product than 8-bit ones (256 times finer
    /// steps, so about 65536 times less squared error) where the weights round exactly.
    #[test]
    fn sixteen_bit_activations_are_closer_than_eight() {
        if !Int8Kernel::Avx512Vnni.available() {
            eprintln!("this CPU has no AVX512-VNNI: skipped");
            return;
        }
        let (m, k, n) = (13, 513, 70);
        // Weights on the int8 grid (each column's largest at ±1), so only activations round.
        let mut w: Vec<f32> = values(k * n, 8)
            .iter()
            .map(|v| (v.clamp(-1.0, 1.0) * 127.0).round() / 127.0)
            .collect();
        w[..n].fill(1.0);
        let x = values(m * k, 7);
        let want = reference(&x, &w, m, k, n, None);
        let error = |bits| {
            let got = quantized(&w, k, n, None, Int8Kernel::Avx512Vnni, Some(bits)).matmul(&x, m);
            got.iter()
                .zip(&want)
                .map(|(a, b)| f64::from(a - b).powi(2))
                .sum::<f64>()
        };
        let (eight, sixteen) = (error(Int8Activations::U8), error(Int8Activations::U16));
        assert!(sixteen < eight / 1000.0, "u16 {sixteen} vs u8 {eight}");
    }

    /// Outliers held apart are exact: a row of small values with a few huge ones is as close to the
    /// float product with outliers as the same row without the huge values is with plain 8 bits,
    /// far closer than plain 8 bits on the row with them; a row whose only nonzero values are
    /// outliers is exact up to float rounding; the largest magnitudes are the ones held.
    #[test]
    fn outliers_held_apart_are_exact() {
        if !Int8Kernel::Avx512Vnni.available() {
            eprintln!("this CPU has no AVX512-VNNI: skipped");
            return;
        }
        let (m, k, n) = (5, 300, 70);
        let w: Vec<f32> = values(k * n, 12)
            .iter()
            .map(|v| (v.clamp(-1.0, 1.0) * 127.0).round() / 127.0)
            .collect();
        let mut w = w;
        w[..n].fill(1.0);
        let small: Vec<f32> = values(m * k, 13).iter().map(|v| v.clamp(-1.0, 1.0)).collect();
        let mut spiky = small.clone();
        for r in 0..m {
            spiky[r * k + 17 * r + 3] = 300.0;
            spiky[r * k + 11 * r + 200] = -450.0;
        }
        let error = |x: &[f32], bits| {
            let got = quantized(&w, k, n, None, Int8Kernel::Avx512Vnni, Some(bits)).matmul(x, m);
            let want = reference(x, &w, m, k, n, None);
            got.iter()
                .zip(&want)
                .map(|(a, b)| f64::from(a - b).powi(2))
                .sum::<f64>()
        };
        let plain_small = error(&small, Int8Activations::U8);
        let held_spiky = error(&spiky, Int8Activations::U8Outliers(2));
        let plain_spiky = error(&spiky, Int8Activations::U8);
        assert!(
            held_spiky < 2.0 * plain_small + 1e-6,
            "held {held_spiky} vs {plain_small}"
        );
        assert!(
            held_spiky * 100.0 < plain_spiky,
            "held {held_spiky} vs plain {plain_spiky}"
        );
        // Only outliers (and zeros): the products are the float products.
        let mut sparse = vec![0f32; m * k];
        sparse[5] = 2.5;
        sparse[k + 9] = -1.25;
        let got = quantized(
            &w,
            k,
            n,
            None,
            Int8Kernel::Avx512Vnni,
            Some(Int8Activations::U8Outliers(1)),
        )
        .matmul(&sparse, m);
        let want = reference(&sparse, &w, m, k, n, None);
        for (a, b) in got.iter().zip(&want) {
            assert!((a - b).abs() <= 1e-5 * b.abs().max(1.0), "{a} vs {b}");
        }
        // The held values are the largest magnitudes, ties kept inside.
        let row = [0.5, -8.0, 0.25, 8.0, 3.0, -3.0, 0.0, 1.0];
        let mut bytes = vec![0u8; 8];
        let mut held = vec![(0, 0f32); 3];
        let quant = quantize_row_with_outliers(&Portable, &row, 255.0, &mut bytes, &mut held, &mut Vec::new())
            .expect("finite row");
        // The 4th largest magnitude is 3: ±8 leave, ±3 tie with it and stay.
        assert_eq!(quant.outliers, 2);
        assert_eq!(held[..2], [(1, -8.0), (3, 8.0)]);
        assert_eq!((bytes[1], bytes[3]), (quant.zero as u8, quant.zero as u8));
        assert!((quant.scale - 6.0 / 255.0).abs() < 1e-7);
    }

    /// Each SIMD kernel's i32 sums equal the portable code's on the same layout, so the outputs
    /// are identical.
    #[test]
    fn the_simd_kernels_give_the_portable_kernels_sums() {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().expect("pool");
        for (kernel, bits, _) in variants() {
            for &(m, k, n) in &SHAPES {
                let x = values(m * k, 4);
                let w = values(k * n, 5);
                for bias in [None, Some(values(n, 6))] {
                    let with_bias = bias.is_some();
                    let weight = quantized(&w, k, n, bias, kernel, bits);
                    let (a, b) = pool.install(|| (weight.matmul(&x, m), weight.matmul_with(&x, m, true)));
                    assert!(
                        a.iter().zip(&b).all(|(a, b)| a.to_bits() == b.to_bits()),
                        "{kernel:?} {bits:?} {m}x{k}x{n}, bias {with_bias}"
                    );
                }
            }
        }
        // The pair layout's portable kernel is also the AVX2 kernel's: same sums from both weights.
        if Int8Kernel::Avx2.available() {
            let (m, k, n) = (13, 513, 70);
            let (x, w) = (values(m * k, 4), values(k * n, 5));
            let simd = QuantizedWeight::quantize(&w, k, n, None, Int8Kernel::Avx2).matmul(&x, m);
            let scalar = QuantizedWeight::quantize(&w, k, n, None, Int8Kernel::Scalar).matmul(&x, m);
            assert!(simd.iter().zip(&scalar).all(|(a, b)| a.to_bits() == b.to_bits()));
        }
    }

    /// The AVX-512 and AVX2 row quantizations give the portable code's levels and zero point
    /// exactly, on rows with tails, ties, negative zeros, a constant row and non-finite values.
    #[test]
    fn simd_row_quantization_equals_the_portable_one() {
        #[cfg(target_arch = "x86_64")]
        {
            let mut rows: Vec<Vec<f32>> = [1usize, 7, 8, 9, 15, 16, 17, 100, 1024, 2624]
                .iter()
                .map(|&k| values(k, k as u64))
                .collect();
            rows.push(vec![0.0; 33]);
            rows.push(vec![-0.0, 0.0, 1.5, -2.5, 0.5, 65535.0 / 65536.0]);
            rows.push(vec![-0.0, 0.0, 1.5, -2.5, 0.5, 65535.0 / 65536.0, 0.25, -0.0, 3.0]);
            for at in [3, 37] {
                let mut with_nan = values(40, 9);
                with_nan[at] = f32::NAN;
                rows.push(with_nan);
                let mut with_inf = values(40, 10);
                with_inf[at] = f32::NEG_INFINITY;
                rows.push(with_inf);
            }
            let quantizers: [(&str, Option<QuantizeRow>); 2] = [
                (
                    "avx512",
                    vnni::Vnni::try_new().map(|simd| {
                        Box::new(move |row: &[f32], levels, hi: &mut [u8], lo: Option<&mut [u8]>| {
                            simd.quantize_row(row, levels, hi, lo)
                        }) as QuantizeRow
                    }),
                ),
                (
                    "avx2",
                    avx_vnni::AvxVnni::try_new().map(|simd| {
                        Box::new(move |row: &[f32], levels, hi: &mut [u8], lo: Option<&mut [u8]>| {
                            simd.quantize_row(row, levels, hi, lo)
                        }) as QuantizeRow
                    }),
                ),
            ];
            for (name, quantize) in &quantizers {
                let Some(quantize) = quantize else {
                    eprintln!("this CPU has no {name} row quantization: not tested here");
                    continue;
                };
                for bits in [Int8Activations::U8, Int8Activations::U16] {
                    for row in &rows {
                        let quads = row.len().div_ceil(4) * 4;
                        let (mut hi, mut lo) = (vec![0u8; quads], vec![0u8; quads]);
                        let (mut hi2, mut lo2) = (vec![0u8; quads], vec![0u8; quads]);
                        let two = bits == Int8Activations::U16;
                        let portable = quantize_row(row, bits.levels(), &mut hi, two.then_some(&mut lo[..]));
                        let fast = quantize(row, bits.levels(), &mut hi2, two.then_some(&mut lo2[..]));
                        let key = |q: Option<RowQuant>| q.map(|q| (q.scale.to_bits(), q.zero));
                        assert_eq!(key(portable), key(fast), "{name} {bits:?} {} values", row.len());
                        assert_eq!((hi, lo), (hi2, lo2), "{name} {bits:?} {} values", row.len());
                    }
                }
            }
            let Some(simd) = vnni::Vnni::try_new() else {
                eprintln!("this CPU has no AVX512-VNNI: its outlier passes are not tested here");
                return;
            };
            // With outliers: the AVX-512 levels inside the clipped range, the same bytes and outliers.
            rows.push(vec![0.0, 0.0, 7.0, 0.0, -9.0]);
            rows.push(vec![3.0; 20]);
            for apart in [1, 4, 40] {
                for row in &rows {
                    let quads = row.len().div_ceil(4) * 4;
                    let (mut bytes, mut bytes2) = (vec![0u8; quads], vec![0u8; quads]);
                    let (mut held, mut held2) = (vec![(0, 0f32); apart], vec![(0, 0f32); apart]);
                    let mut scratch = Vec::new();
                    let portable =
                        quantize_row_with_outliers(&Portable, row, 255.0, &mut bytes, &mut held, &mut scratch);
                    let simd_found =
                        quantize_row_with_outliers(&simd, row, 255.0, &mut bytes2, &mut held2, &mut scratch);
                    let key = |q: Option<RowQuant>| q.map(|q| (q.scale.to_bits(), q.zero, q.outliers));
                    assert_eq!(key(portable), key(simd_found), "{apart} apart, {} values", row.len());
                    assert_eq!(bytes, bytes2, "{apart} apart, {} values", row.len());
                    let count = portable.map_or(0, |q| q.outliers as usize);
                    assert_eq!(held[..count], held2[..count]);
                    assert!(count <= apart.min(row.len() - 1));
                }
            }
        }
    }

    #[test]
    fn small_rounding_rounds_to_the_nearest_level() {
        for (v, want) in [
            (0.4f32, 0.0f32),
            (0.6, 1.0),
            (-0.6, -1.0),
            (126.7, 127.0),
            (-126.7, -127.0),
            (65534.6, 65535.0),
            (2.5, 2.0),
            (3.5, 4.0),
        ] {
            assert_eq!(round_small(v), want, "{v}");
        }
    }

    /// The integer kernel follows the float family and the CPU: VNNI only where it was detected.
    #[test]
    fn the_integer_kernel_follows_the_family_and_the_cpu() {
        #[cfg(target_arch = "x86_64")]
        {
            let vnni = std::arch::is_x86_feature_detected!("avx512vnni")
                && std::arch::is_x86_feature_detected!("avx512bw")
                && std::arch::is_x86_feature_detected!("avx512f");
            assert_eq!(Int8Kernel::Avx512Vnni.available(), vnni);
            assert_eq!(
                Int8Kernel::for_family(CpuKernels::Avx512) == Int8Kernel::Avx512Vnni,
                vnni
            );
            let avx_vnni = std::arch::is_x86_feature_detected!("avxvnni");
            assert_eq!(Int8Kernel::AvxVnni.available(), avx_vnni);
            assert_eq!(
                Int8Kernel::for_family(CpuKernels::Avx2) == Int8Kernel::AvxVnni,
                avx_vnni
            );
            if avx_vnni && !vnni {
                assert_eq!(Int8Kernel::for_family(CpuKernels::Avx512), Int8Kernel::AvxVnni);
            }
        }
        assert_ne!(Int8Kernel::for_family(CpuKernels::Avx2), Int8Kernel::Avx512Vnni);
        // AMX only beside the AMX family, and there wherever the CPU and the kernel grant it.
        #[cfg(target_arch = "x86_64")]
        assert_eq!(
            Int8Kernel::Amx.available(),
            Int8Kernel::Avx512Vnni.available() && Amx::detect().is_ok()
        );
        assert_eq!(
            Int8Kernel::for_family(CpuKernels::Amx) == Int8Kernel::Amx,
            Int8Kernel::Amx.available()
        );
        for family in [CpuKernels::Avx512, CpuKernels::Avx2, CpuKernels::Gemm] {
            assert_ne!(Int8Kernel::for_family(family), Int8Kernel::Amx);
        }
        assert!(Int8Kernel::detect().available());
        assert_eq!(Int8Activations::parse(" U16 "), Ok(Int8Activations::U16));
        assert_eq!(Int8Activations::parse("u8o"), Ok(Int8Activations::U8_OUTLIERS));
        assert_eq!(Int8Activations::parse("u8o:12"), Ok(Int8Activations::U8Outliers(12)));
        for bits in [
            Int8Activations::U8,
            Int8Activations::U16,
            Int8Activations::U8Outliers(7),
        ] {
            assert_eq!(Int8Activations::parse(&bits.to_string()), Ok(bits));
        }
        for bad in ["u4", "u8o:0", "u8o:257", "u8o:x", "u8o:"] {
            assert!(Int8Activations::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn empty_inputs_zero_weights_and_non_finite_rows() {
        for (kernel, bits, _) in variants() {
            let w = values(8 * 5, 6);
            let weight = quantized(&w, 8, 5, Some(vec![1.0; 5]), kernel, bits);
            assert!(weight.matmul(&[], 0).is_empty());
            // A zero row gives the bias; a row with a NaN or an infinity gives NaN, the others are unharmed.
            let mut x = vec![0f32; 3 * 8];
            x[8] = f32::NAN;
            x[16] = f32::INFINITY;
            let y = weight.matmul(&x, 3);
            assert_eq!(&y[..5], &[1.0; 5], "{kernel:?} {bits:?}");
            assert!(y[5..].iter().all(|v| v.is_nan()), "{kernel:?} {bits:?}");
            let zero = quantized(&[0.0; 12], 3, 4, None, kernel, bits);
            assert_eq!(zero.matmul(&[1.0, 2.0, 3.0], 1), vec![0.0; 4]);
            // No depth at all: the bias, whatever the reused sum buffers held before.
            let _ = weight.matmul(&values(64 * 8, 7), 64);
            let no_depth = quantized(&[], 0, 5, Some(vec![2.0; 5]), kernel, bits);
            assert_eq!(no_depth.matmul(&[], 3), vec![2.0; 15], "{kernel:?} {bits:?}");
        }
    }

    /// The worst case of the overflow bound: every activation and weight at its largest level.
    #[test]
    fn the_sums_do_not_overflow_at_full_scale() {
        for (kernel, bits, _) in variants() {
            let k = 4099;
            let weight = quantized(&vec![-1.0; k * 3], k, 3, None, kernel, bits);
            for x in [1.0, -1.0] {
                let y = weight.matmul(&vec![x; k], 1);
                assert!(
                    y.iter().all(|&v| (v + x * k as f32).abs() < 1e-3 * k as f32),
                    "{kernel:?} {bits:?} {y:?}"
                );
            }
        }
    }
}
