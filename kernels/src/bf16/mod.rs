//! bf16 products of activations by constant weights on AVX-512 CPUs (`dtype = "bf16"` on the CPU):
//! weights rounded to bf16 once at load, activation rows rounded to bf16 at each call, f32 sums and
//! results. Which instructions multiply ([`Bf16Kernel`], chosen once beside the float family):
//! `vdpbf16ps` (32 bf16 products summed pairwise into 16 f32 lanes per instruction, twice the
//! products of an f32 FMA) where the CPU runs it at the FMA's rate; f16 multiply-adds
//! (`halves.rs`, AVX512-FP16: twice the f32 FMA's products, sums in f16 over 32 depths) where it
//! does not (Intel's); the weights widened to f32 in registers and f32 FMAs (`widened.rs`) on the
//! other AVX-512 CPUs.
//!
//! Why not candle's bf16 CPU path: its matmul converts and multiplies through the `gemm` crate
//! without native bf16 dot products, and every other op of a bf16 forward runs candle's slower bf16
//! elementwise code; measured 2× slower than f32 on this machine (issue 26). Here only the matrix
//! products change precision (the encoder's and the decision head's layers' weights, the encoder
//! attention's q·kᵀ and p·v): embeddings, norms, the softmax, the scorer and the act head stay f32.
//! Served only behind the parity gate against the f32 forward (`gate.rs`).
//!
//! The attention of a bf16 pool multiplies on the same tile ([`RowsProduct`], `rows.rs`): its rows
//! laid out as the activations here, its keys and values as panels the attention builds per head.
//!
//! With AMX (the `amx` kernel family) the same panels run on the tile registers instead
//! (`tdpbf16ps`, `crate::amx`): the depth padded to whole tiles of 16 pairs, the
//! activation rows laid out one after another (padded to 16 rows) instead of in tiles of 8.

use rayon::prelude::*;

use crate::CpuWeight;
use crate::amx::{Bf16Tiles, TILE_ROWS, TILE_WORDS, TileProduct, row_stride};
use crate::driver::{NextSlices, bias_rows, in_column_blocks};
use crate::geglu::GeGlu;

#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "x86_64")]
mod halves;
mod rows;
#[cfg(test)]
mod tests;
mod tile;
#[cfg(target_arch = "x86_64")]
mod widened;
mod words;

pub use rows::{MAX_ROWS, PANEL_COLUMNS, RowTiles, RowsKernel, RowsProduct};

use crate::CpuKernels;
use tile::{Bf16TileCall, FLUSH_PAIRS, MR, MW, NR, PANEL_PEAK, ROW_PEAK};
use words::{f16_shift, finite_peak, from_bf16, from_f16, pair_word, pow2_f32, to_bf16, to_f16};

/// Depth pairs of one pass: a panel slice of `KC` pairs (16 KiB) stays in L1.
const KC: usize = 128;
/// Depths of the activation rows packed at a time, row after row of a tile (even: whole pairs).
const PACK_DEPTHS: usize = 256;

/// The instructions a bf16 weight's products run on: the same packed panels for each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bf16Kernel {
    /// AMX's tiles (`tdpbf16ps`, the `amx` family).
    Tiles,
    /// `vdpbf16ps` (AVX512_BF16), where it runs at the f32 FMA's rate and so multiplies twice its
    /// products (AMD's Zen 4 and Zen 5).
    DotPairs,
    /// f16 multiply-adds (AVX512-FP16, `halves.rs`): where `vdpbf16ps` runs at half the FMA's
    /// rate (Intel's Xeons without AMX's tiles; measured on Emerald Rapids), so it would be slower
    /// than the f32 pool; the weights' bf16 values and the rows held in f16, each scaled by a
    /// power of two, sums in f16 over 32 depths.
    Halves,
    /// Weights widened to f32 in registers, f32 FMAs (AVX-512F): the AVX-512 CPUs with neither
    /// (AVX512_BF16 missing, or Intel's half-rate one without AVX512-FP16); as fast as f32, with
    /// half its weights' memory.
    Widened,
}

impl Bf16Kernel {
    /// The bf16 kernel beside a float kernel family: AMX's tiles beside `amx`; `vdpbf16ps`, f16
    /// multiply-adds or the widened kernel beside `avx512` (see the variants); none beside `avx2`
    /// and `gemm` (their bf16 pools run candle's bf16 path).
    pub fn for_family(family: CpuKernels) -> Option<Self> {
        match family {
            CpuKernels::Amx if dot_pairs_available() => Some(Self::Tiles),
            CpuKernels::Amx | CpuKernels::Avx512 if dot_pairs_available() && !half_rate_dot_pairs() => {
                Some(Self::DotPairs)
            }
            CpuKernels::Amx | CpuKernels::Avx512 if halves_available() => Some(Self::Halves),
            CpuKernels::Amx | CpuKernels::Avx512 => Some(Self::Widened),
            CpuKernels::Avx2 | CpuKernels::Gemm => None,
        }
    }

    /// `amx-bf16`, `avx512-bf16`, `avx512-fp16` or `avx512-bf16-widened`: what the gate's report
    /// names.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Tiles => "amx-bf16",
            Self::DotPairs => "avx512-bf16",
            Self::Halves => "avx512-fp16",
            Self::Widened => "avx512-bf16-widened",
        }
    }

    /// Rows of the activations' tile, and the packed words each takes per depth pair.
    fn row_tile(self) -> (usize, usize) {
        match self {
            Self::Tiles => (1, 1),
            Self::DotPairs => (MR, MR),
            Self::Halves | Self::Widened => (MW, 2 * MW),
        }
    }
}

/// Whether this CPU has `vdpbf16ps` (AVX-512F, AVX-512BW and AVX512_BF16).
fn dot_pairs_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        avx512::Bf16Dp::try_new().is_some()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether this CPU has the f16 multiply-adds (AVX-512F, AVX-512BW and AVX512-FP16).
fn halves_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        halves::Halves::try_new().is_some()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether this CPU's `vdpbf16ps` runs at half its f32 FMA's rate: Intel's (one every two cycles
/// on Emerald Rapids against two FMAs a cycle, `tools/bench/simd-peak.c`; the other Intel Xeons
/// with AVX512_BF16 are assumed alike, not measured); AMD's Zen 4 and Zen 5 run it at about the
/// FMA's instruction rate (docs/benchmarks/notes.md).
fn half_rate_dot_pairs() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        let vendor = std::arch::x86_64::__cpuid(0);
        // "GenuineIntel" in EBX, EDX, ECX order.
        (vendor.ebx, vendor.edx, vendor.ecx) == (0x756e_6547, 0x4965_6e69, 0x6c65_746e)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// A weight `[k, n]` in bf16, packed: panel `p` holds columns `p·32 .. p·32 + 32` (zero past `n`);
/// per depth pair `d`, column `c` holds `[w(2d, c), w(2d + 1, c)]` (zero past `k`). For the f16
/// kernel, the pair's 32 even-depth values then its 32 odd-depth ones, in f16, scaled by the power
/// of two whose inverse is the panel's entry in `scales`.
pub struct Bf16Weight {
    k: usize,
    n: usize,
    kernel: Bf16Kernel,
    pairs: usize,
    panels: Vec<u16>,
    /// The f16 kernel's per panel: what multiplies its sums back (empty for the others).
    scales: Vec<f32>,
    bias: Option<Vec<f32>>,
    /// GeGLU applied as the products write (columns grouped for it, `crate::geglu`).
    geglu: Option<GeGlu>,
}

impl Bf16Weight {
    /// Rounds and packs the weight whose entries `(depth, first ..)` `row(depth, first, out)` writes
    /// into `out` (a panel's columns, as `QuantizedWeight::quantize_with` asks), for `kernel`.
    pub fn pack_with(
        row: impl Fn(usize, usize, &mut [f32]) + Sync,
        k: usize,
        n: usize,
        bias: Option<Vec<f32>>,
        kernel: Bf16Kernel,
    ) -> Self {
        let pairs = if kernel == Bf16Kernel::Tiles {
            k.div_ceil(2 * TILE_WORDS) * TILE_WORDS
        } else {
            k.div_ceil(2)
        };
        let count = n.div_ceil(NR);
        let mut panels = vec![0u16; count * pairs * 2 * NR];
        let halves = kernel == Bf16Kernel::Halves;
        let mut scales = vec![1f32; if halves { count } else { 0 }];
        if k > 0 && halves {
            panels
                .par_chunks_mut(pairs * 2 * NR)
                .zip(scales.par_iter_mut())
                .enumerate()
                .for_each(|(p, (panel, scale))| {
                    // The panel's bf16 values first (its largest finite one sets its scale).
                    let width = NR.min(n - p * NR);
                    let mut values = vec![0f32; k * NR];
                    for (depth, values) in values.chunks_exact_mut(NR).enumerate() {
                        row(depth, p * NR, &mut values[..width]);
                        for v in &mut values[..width] {
                            *v = from_bf16(to_bf16(*v));
                        }
                    }
                    let shift = f16_shift(finite_peak(&values), PANEL_PEAK);
                    *scale = pow2_f32(-shift);
                    let up = pow2_f32(shift);
                    for (depth, values) in values.chunks_exact(NR).enumerate() {
                        let at = (depth / 2) * 2 * NR + (depth % 2) * NR;
                        for (c, &v) in values[..width].iter().enumerate() {
                            panel[at + c] = to_f16(f64::from(v * up));
                        }
                    }
                });
        } else if k > 0 {
            panels
                .par_chunks_mut(pairs * 2 * NR)
                .enumerate()
                .for_each(|(p, panel)| {
                    // Depth by depth across the panel's columns, as the sources keep them (see
                    // `QuantizedWeight::quantize_with`).
                    let width = NR.min(n - p * NR);
                    let mut values = [0f32; NR];
                    for depth in 0..k {
                        row(depth, p * NR, &mut values[..width]);
                        let at = (depth / 2) * 2 * NR + depth % 2;
                        for (c, &v) in values[..width].iter().enumerate() {
                            panel[at + 2 * c] = to_bf16(v);
                        }
                    }
                });
        }
        Self {
            k,
            n,
            kernel,
            pairs,
            panels,
            scales,
            bias,
            geglu: None,
        }
    }

    /// The same weight, its products followed by `geglu` when its columns are grouped for it.
    pub(crate) fn with_geglu(self, geglu: Option<GeGlu>) -> Self {
        Self { geglu, ..self }
    }

    /// Whether products apply GeGLU (made from a weight packed for it).
    pub fn applies_geglu(&self) -> bool {
        self.geglu.is_some()
    }

    /// Output columns: `n`, or half of them with GeGLU.
    fn out_features(&self) -> usize {
        if self.geglu.is_some() { self.n / 2 } else { self.n }
    }

    /// `x · W (+ bias)` for `x` `[m, k]` row-major; returns `[m, n]` row-major (with GeGLU: its
    /// GeGLU, `[m, n / 2]`).
    pub fn matmul(&self, x: &[f32], m: usize) -> Vec<f32> {
        self.matmul_with(x, m, false)
    }

    fn matmul_with(&self, x: &[f32], m: usize, portable: bool) -> Vec<f32> {
        if m == 0 || self.n == 0 || self.k == 0 {
            return bias_rows(self.bias.as_deref(), m, self.out_features());
        }
        let packed = self.pack_rows(x, m, portable);
        in_column_blocks(
            m,
            self.n,
            NR,
            self.bias.as_deref(),
            self.geglu,
            |first, count, block| {
                self.block(&packed, m, first, count, block, portable);
            },
        )
    }

    /// Rows of `x` rounded to bf16 and packed for the kernel: for `vdpbf16ps`, in tiles of `MR`
    /// rows, tile `t` holding per depth pair `MR` u32 words `bf16(x[2d]) | bf16(x[2d + 1]) << 16`;
    /// for the widened kernel, in tiles of `MW` rows, per depth `MW` rounded values as f32 bits;
    /// for the f16 kernel the same as f16 twice in each word, each row scaled, its multiplier back
    /// in [`PackedRows::scales`]; for AMX, the rows' pair words one row after another
    /// (`amx::row_stride` words apart), rows padded to 16. Zero past `m` and `k`. With the SIMD
    /// (and not `portable`), `vdpbf16ps`' rows are rounded by `vcvtne2ps2bf16`: the same words,
    /// except that it flushes subnormal values to zero; the other kernels' give the portable bits.
    fn pack_rows(&self, x: &[f32], m: usize, portable: bool) -> PackedRows {
        let (k, pairs) = (self.k, self.pairs);
        // Rows per chunk of the packed words (a row's values `tile` words apart), and its words.
        let (tile, words_per_pair) = self.kernel.row_tile();
        let (rows, chunk) = match self.kernel {
            Bf16Kernel::Tiles => (m.next_multiple_of(TILE_ROWS), row_stride(pairs)),
            Bf16Kernel::DotPairs | Bf16Kernel::Halves | Bf16Kernel::Widened => {
                (m.next_multiple_of(tile), pairs * words_per_pair)
            }
        };
        let mut words = vec![0u32; rows / tile * chunk];
        let mut scales = vec![1f32; rows];
        let instructions = Instructions::new(self.kernel, portable);
        words
            .par_chunks_mut(chunk)
            .zip(scales.par_chunks_mut(tile))
            .enumerate()
            .for_each(|(t, (dst, scales))| {
                let rows = tile.min(m.saturating_sub(t * tile));
                let row = |r: usize| &x[(t * tile + r) * k..(t * tile + r + 1) * k];
                let row_scales: Vec<f32> = (0..rows).map(|r| instructions.row_scale(row(r))).collect();
                // The tile's rows a block of depths at a time: the words they write stay in L1
                // (a whole row at a time, 14 rows' 1,024 depths would not).
                for depth in (0..k).step_by(PACK_DEPTHS) {
                    let end = k.min(depth + PACK_DEPTHS);
                    for (r, &scale) in row_scales.iter().enumerate() {
                        let dst = &mut dst[depth / 2 * words_per_pair + r..];
                        instructions.pack(&row(r)[depth..end], scale, dst, tile);
                    }
                }
                // Powers of two: their inverses are exact.
                for (back, scale) in scales.iter_mut().zip(row_scales) {
                    *back = 1.0 / scale;
                }
            });
        PackedRows { words, scales }
    }

    fn block(&self, packed: &PackedRows, m: usize, first: usize, count: usize, block: &mut [f32], portable: bool) {
        let packed_x = &packed.words;
        let pairs = self.pairs;
        let stride = count * NR;
        if self.kernel == Bf16Kernel::Tiles {
            let product = TileProduct::<Bf16Tiles> {
                a: packed_x,
                a_stride: row_stride(pairs),
                rows: m,
                words: pairs,
                panels: &self.panels[first * pairs * 2 * NR..(first + count) * pairs * 2 * NR],
                out: block,
                stride,
            };
            product.run(portable);
            return;
        }
        let instructions = Instructions::new(self.kernel, portable);
        let (tile_rows, words) = self.kernel.row_tile();
        let next = NextSlices {
            panels: &self.panels,
            panel_units: pairs,
            unit: 2 * NR,
            pass: KC,
            count,
            tiles: m.div_ceil(tile_rows),
        };
        let mut depth = 0;
        while depth < pairs {
            let kc = KC.min(pairs - depth);
            let prefetch = next.pass(depth, kc);
            for (tile, row) in (0..m).step_by(tile_rows).enumerate() {
                let rows = tile_rows.min(m - row);
                let x = &packed_x[(tile * pairs + depth) * words..(tile * pairs + depth + kc) * words];
                for p in 0..count {
                    let start = (first + p) * pairs * 2 * NR;
                    // The f16 kernel's multipliers: its rows' times its panel's.
                    let mut scales = [0f32; MW];
                    let scales = match self.scales.get(first + p) {
                        Some(panel) => {
                            for (s, row) in scales.iter_mut().zip(&packed.scales[row..row + rows]) {
                                *s = row * panel;
                            }
                            &scales[..rows]
                        }
                        None => &[],
                    };
                    instructions.tile(
                        rows,
                        Bf16TileCall {
                            x,
                            panel: &self.panels[start + depth * 2 * NR..start + (depth + kc) * 2 * NR],
                            out: &mut block[row * stride + p * NR..],
                            stride,
                            accumulate: depth > 0,
                            scales,
                            prefetch: prefetch.share(first + p, tile),
                        },
                    );
                }
            }
            depth += kc;
        }
    }
}

/// The activation rows of one product, packed ([`Bf16Weight::pack_rows`]).
struct PackedRows {
    words: Vec<u32>,
    /// Per row, what multiplies its sums back: the f16 kernel's inverse row scale, else 1.
    scales: Vec<f32>,
}

/// The instructions a weight's rows are rounded and its tiles multiplied with: SIMD, or the
/// portable twin of a kernel (AMX's rows are `vdpbf16ps`' pair words; its tiles run elsewhere).
#[derive(Clone, Copy)]
enum Instructions {
    #[cfg(target_arch = "x86_64")]
    DotPairs(avx512::Bf16Dp),
    #[cfg(target_arch = "x86_64")]
    Halves(halves::Halves),
    #[cfg(target_arch = "x86_64")]
    Widened(widened::Widened),
    Portable(Bf16Kernel),
}

impl Instructions {
    fn new(kernel: Bf16Kernel, portable: bool) -> Self {
        #[cfg(target_arch = "x86_64")]
        if !portable {
            let simd = match kernel {
                Bf16Kernel::Tiles | Bf16Kernel::DotPairs => avx512::Bf16Dp::try_new().map(Self::DotPairs),
                Bf16Kernel::Halves => halves::Halves::try_new().map(Self::Halves),
                Bf16Kernel::Widened => widened::Widened::try_new().map(Self::Widened),
            };
            if let Some(simd) = simd {
                return simd;
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = portable;
        Self::Portable(kernel)
    }

    /// What the f16 kernel multiplies `row` by before rounding it (a power of two that puts its
    /// largest finite magnitude into `[2^ROW_PEAK, 2^(ROW_PEAK + 1))`); 1 for the others.
    fn row_scale(self, row: &[f32]) -> f32 {
        let peak = match self {
            #[cfg(target_arch = "x86_64")]
            Self::Halves(simd) => simd.peak(row),
            Self::Portable(Bf16Kernel::Halves) => finite_peak(row),
            _ => return 1.0,
        };
        pow2_f32(f16_shift(peak, ROW_PEAK))
    }

    /// `row` into `dst[0]`, `dst[step]`, …: a word per depth pair, or per depth (the f16 kernel's
    /// values times `scale`, [`Instructions::row_scale`]).
    fn pack(self, row: &[f32], scale: f32, dst: &mut [u32], step: usize) {
        match self {
            #[cfg(target_arch = "x86_64")]
            Self::DotPairs(simd) => simd.pack_row(row, dst, step),
            #[cfg(target_arch = "x86_64")]
            Self::Halves(simd) => simd.pack_row(row, scale, dst, step),
            #[cfg(target_arch = "x86_64")]
            Self::Widened(simd) => simd.pack_row(row, dst, step),
            Self::Portable(Bf16Kernel::Tiles | Bf16Kernel::DotPairs) => {
                for (d, pair) in row.chunks(2).enumerate() {
                    dst[d * step] = pair_word(pair);
                }
            }
            Self::Portable(Bf16Kernel::Halves) => {
                for (d, &v) in row.iter().enumerate() {
                    let half = u32::from(to_f16(f64::from(v * scale)));
                    dst[d * step] = half | half << 16;
                }
            }
            Self::Portable(Bf16Kernel::Widened) => {
                for (d, &v) in row.iter().enumerate() {
                    dst[d * step] = u32::from(to_bf16(v)) << 16;
                }
            }
        }
    }

    /// One kernel call of `rows` rows ([`Bf16Weight::block`]).
    fn tile(self, rows: usize, call: Bf16TileCall<'_>) {
        match self {
            #[cfg(target_arch = "x86_64")]
            Self::DotPairs(simd) => simd.tile(rows, call),
            #[cfg(target_arch = "x86_64")]
            Self::Halves(simd) => simd.tile(rows, call),
            #[cfg(target_arch = "x86_64")]
            Self::Widened(simd) => simd.tile(rows, call),
            Self::Portable(Bf16Kernel::Tiles | Bf16Kernel::DotPairs) => scalar_tile(rows, call),
            Self::Portable(Bf16Kernel::Halves) => scalar_halves_tile(rows, call),
            Self::Portable(Bf16Kernel::Widened) => scalar_widened_tile(rows, call),
        }
    }
}

/// The tile in portable code (the same products in f32; the sums may differ from `vdpbf16ps` in
/// the last bits, which rounds differently inside a pair).
fn scalar_tile(rows: usize, call: Bf16TileCall<'_>) {
    let Bf16TileCall {
        x,
        panel,
        out,
        stride,
        accumulate,
        ..
    } = call;
    for r in 0..rows {
        let dst = &mut out[r * stride..r * stride + NR];
        if !accumulate {
            dst.fill(0.0);
        }
        for (w, a) in panel.chunks_exact(2 * NR).zip(x.chunks_exact(MR)) {
            let (lo, hi) = (from_bf16(a[r] as u16), from_bf16((a[r] >> 16) as u16));
            for (o, w) in dst.iter_mut().zip(w.chunks_exact(2)) {
                *o += lo * from_bf16(w[0]) + hi * from_bf16(w[1]);
            }
        }
    }
}

/// The widened kernel's tile in portable code: the same fused multiply-adds in the same order
/// (depth by depth), so the same sums bit for bit.
fn scalar_widened_tile(rows: usize, call: Bf16TileCall<'_>) {
    let Bf16TileCall {
        x,
        panel,
        out,
        stride,
        accumulate,
        ..
    } = call;
    for r in 0..rows {
        let dst = &mut out[r * stride..r * stride + NR];
        if !accumulate {
            dst.fill(0.0);
        }
        for (w, a) in panel.chunks_exact(2 * NR).zip(x.chunks_exact(2 * MW)) {
            let (even, odd) = (f32::from_bits(a[r]), f32::from_bits(a[MW + r]));
            for (o, w) in dst.iter_mut().zip(w.chunks_exact(2)) {
                *o = odd.mul_add(from_bf16(w[1]), even.mul_add(from_bf16(w[0]), *o));
            }
        }
    }
}

/// The f16 kernel's tile in portable code: each multiply-add computed in f64 (where a product of
/// two f16 and its sum with an f16 are exact) and rounded to f16 once, as `vfmadd…ph` rounds it, in
/// the same order, and the sums added into f32 as often: the same sums bit for bit.
fn scalar_halves_tile(rows: usize, call: Bf16TileCall<'_>) {
    let Bf16TileCall {
        x,
        panel,
        out,
        stride,
        accumulate,
        scales,
        ..
    } = call;
    let half = |bits: u32| f64::from(from_f16(bits as u16));
    for r in 0..rows {
        let dst = &mut out[r * stride..r * stride + NR];
        if !accumulate {
            dst.fill(0.0);
        }
        for (ws, xs) in panel.chunks(FLUSH_PAIRS * 2 * NR).zip(x.chunks(FLUSH_PAIRS * 2 * MW)) {
            let mut sums = [0u16; NR];
            for (w, a) in ws.chunks_exact(2 * NR).zip(xs.chunks_exact(2 * MW)) {
                for (depth, a) in [(0, a[r]), (NR, a[MW + r])] {
                    for (c, sum) in sums.iter_mut().enumerate() {
                        *sum = to_f16(half(a) * half(u32::from(w[depth + c])) + half(u32::from(*sum)));
                    }
                }
            }
            for (o, &sum) in dst.iter_mut().zip(&sums) {
                *o = from_f16(sum).mul_add(scales[r], *o);
            }
        }
    }
}

impl CpuWeight for Bf16Weight {
    const NAME: &'static str = "laya-bf16-matmul";

    fn dims(&self) -> (usize, usize) {
        (self.k, self.out_features())
    }

    fn matmul(&self, x: &[f32], m: usize) -> Vec<f32> {
        Bf16Weight::matmul(self, x, m)
    }
}
