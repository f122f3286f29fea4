//! Int8 products of activations by constant weights on the CPU (`dtype = "int8"`): weights quantized
//! per output column at load, activations per row at each call, i32 sums, float32 results.
//!
//! Weights are symmetric 8-bit per output column (`scale = max|w| / 127`), packed once into panels
//! of 16 columns. Activations are quantized per row at every call, symmetric, to as many levels as
//! an i32 sum over the whole depth can hold without overflow (`127 · levels · k < 2³¹`: about 14
//! bits for k = 1024, 12 bits for k = 4096), so the weights' 8 bits are the only coarse rounding.
//! `y = acc · sx[row] · sw[col] (+ bias)` in f32.
//!
//! Why `_mm256_madd_epi16` (i16 × i16, pairs summed into i32) and not `_mm256_maddubs_epi16`
//! (u8 × i8, 32 products per instruction): without VNNI, maddubs needs a second `madd_epi16` by
//! ones to widen its saturating i16 pairs to i32, so both do 16 products per multiply-port
//! instruction; maddubs additionally needs 7-bit activations (or a per-product `sign` step) to stay
//! clear of saturation, while madd_epi16 takes 12–14-bit activations for free. Per depth pair and
//! row the kernel issues one `vpmaddwd` + one `vpaddd` per 8 columns, against one FMA per 8 columns
//! *per depth* in float32; measured in docs/benchmarks.md. Weights are held as i16 (half of f32's
//! memory) so the inner loop does no sign extension.

use rayon::prelude::*;

use crate::layers::cpu_matmul::{CpuWeight, panels_per_task};

/// Columns per packed panel (two AVX2 registers of i32 sums).
const NR: usize = 16;
/// Rows of the activation tile one kernel call computes.
const MR: usize = 6;
/// Depth pairs of one pass: a panel slice of `KC` pairs (8 KiB) stays in L1.
const KC: usize = 128;
/// Largest weight level: symmetric int8 without −128.
const WEIGHT_LEVELS: i32 = 127;
/// Largest activation level (i16, symmetric).
const MAX_ACTIVATION_LEVELS: i32 = i16::MAX as i32;

/// The integer kernel a quantized weight runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Int8Kernel {
    /// `_mm256_madd_epi16` through pulp's AVX2 token (x86-64 with AVX2 + FMA).
    // Elsewhere only the tests name it (they skip it where `detect` finds no AVX2).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    Avx2,
    /// Portable integer code: other CPUs, and the reference the SIMD path is tested against.
    Scalar,
}

impl Int8Kernel {
    /// AVX2 when this CPU has it, else the portable code.
    pub(crate) fn detect() -> Self {
        #[cfg(target_arch = "x86_64")]
        if pulp::x86::V3::try_new().is_some() {
            return Self::Avx2;
        }
        Self::Scalar
    }
}

/// A weight `[k, n]` (the transposed PyTorch `[out, in]`) quantized per column and packed: panel `p`
/// holds columns `p·16 .. p·16 + 16` (zero past `n`); per depth pair `d`, column `c` holds
/// `[w(2d, c), w(2d + 1, c)]` (zero past `k`), so one `madd_epi16` by a broadcast activation pair
/// gives 8 columns' sums of two products.
pub(crate) struct QuantizedWeight {
    kernel: Int8Kernel,
    k: usize,
    n: usize,
    /// `k` rounded up to pairs.
    pairs: usize,
    panels: Vec<i16>,
    /// `max|w[.., c]| / 127` per column.
    column_scales: Vec<f32>,
    bias: Option<Vec<f32>>,
    /// Activation levels: rows are quantized to `−levels ..= levels`.
    activation_levels: i32,
}

impl QuantizedWeight {
    /// Quantizes and packs `weight_t` (`[k, n]` row-major) with an optional bias `[n]`.
    pub(crate) fn quantize(weight_t: &[f32], k: usize, n: usize, bias: Option<Vec<f32>>, kernel: Int8Kernel) -> Self {
        let mut column_max = vec![0f32; n];
        for row in weight_t.chunks_exact(n.max(1)).take(k) {
            for (m, &w) in column_max.iter_mut().zip(row) {
                *m = m.max(w.abs());
            }
        }
        let column_scales: Vec<f32> = column_max.iter().map(|&m| m / WEIGHT_LEVELS as f32).collect();
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
                        let inverse = if column_max[col] > 0.0 {
                            WEIGHT_LEVELS as f32 / column_max[col]
                        } else {
                            0.0
                        };
                        for depth in 0..k {
                            let q = (weight_t[depth * n + col] * inverse).round();
                            panel[(depth / 2) * 2 * NR + 2 * c + depth % 2] = q as i16;
                        }
                    }
                });
        }
        // The whole depth's sum stays inside i32: |Σ x·w| ≤ k·levels·127.
        let activation_levels = (i32::MAX as usize / (WEIGHT_LEVELS as usize * (2 * pairs).max(1)))
            .clamp(1, MAX_ACTIVATION_LEVELS as usize) as i32;
        Self {
            kernel,
            k,
            n,
            pairs,
            panels,
            column_scales,
            bias,
            activation_levels,
        }
    }

    /// `x · W (+ bias)` for `x` `[m, k]` row-major; returns `[m, n]` row-major. A row holding a
    /// non-finite value gives a row of NaN (as the float product would).
    pub(crate) fn matmul(&self, x: &[f32], m: usize) -> Vec<f32> {
        let n = self.n;
        let mut out = vec![0f32; m * n];
        if m == 0 || n == 0 {
            return out;
        }
        let (packed_x, row_scales) = self.quantize_rows(x, m);
        let panels = n.div_ceil(NR);
        let per_task = panels_per_task(panels);
        let blocks: Vec<(usize, Vec<f32>)> = (0..panels)
            .step_by(per_task)
            .collect::<Vec<_>>()
            .into_par_iter()
            .map(|first| {
                let count = per_task.min(panels - first);
                let mut sums = vec![0i32; m * count * NR];
                self.block(&packed_x, m, first, count, &mut sums);
                let width = (count * NR).min(n - first * NR);
                let mut block = vec![0f32; m * width];
                let scales = &self.column_scales[first * NR..first * NR + width];
                for (row, dst) in block.chunks_exact_mut(width).enumerate() {
                    let sx = row_scales[row];
                    let src = &sums[row * count * NR..row * count * NR + width];
                    for ((o, &acc), &sw) in dst.iter_mut().zip(src).zip(scales) {
                        *o = acc as f32 * (sx * sw);
                    }
                    if let Some(bias) = &self.bias {
                        for (o, b) in dst.iter_mut().zip(&bias[first * NR..]) {
                            *o += b;
                        }
                    }
                }
                (first, block)
            })
            .collect();
        for (first, block) in blocks {
            let width = block.len() / m;
            for (dst, src) in out.chunks_exact_mut(n).zip(block.chunks_exact(width)) {
                dst[first * NR..first * NR + width].copy_from_slice(src);
            }
        }
        out
    }

    /// Each row of `x` to `levels`-level integers, packed as row tiles of `MR`: tile `t` holds, per
    /// depth pair, `MR` i32 words `(x[2d] as i16) | (x[2d + 1] as i16) << 16` (zero past `m`, `k`).
    /// Returns the packed tiles and each row's scale (NaN for a row with a non-finite value).
    fn quantize_rows(&self, x: &[f32], m: usize) -> (Vec<i32>, Vec<f32>) {
        let (k, pairs) = (self.k, self.pairs);
        let levels = self.activation_levels as f32;
        let tiles = m.div_ceil(MR);
        let mut packed = vec![0i32; tiles * pairs * MR];
        let mut scales = vec![0f32; tiles * MR];
        packed
            .par_chunks_mut(pairs * MR)
            .zip(scales.par_chunks_mut(MR))
            .enumerate()
            .for_each(|(t, (dst, scales))| {
                for (r, scale) in scales.iter_mut().enumerate().take(MR.min(m - t * MR)) {
                    let row = &x[(t * MR + r) * k..(t * MR + r + 1) * k];
                    let max = row.iter().fold(0f32, |a, v| a.max(v.abs()));
                    if !max.is_finite() || row.iter().any(|v| v.is_nan()) {
                        *scale = f32::NAN;
                        continue;
                    }
                    if max == 0.0 {
                        continue;
                    }
                    *scale = max / levels;
                    let inverse = levels / max;
                    let q = |v: f32| (v * inverse).round() as i16 as u16 as u32;
                    for (d, pair) in row.chunks(2).enumerate() {
                        let lo = q(pair[0]);
                        let hi = pair.get(1).map_or(0, |&v| q(v));
                        dst[d * MR + r] = (lo | hi << 16) as i32;
                    }
                }
            });
        (packed, scales)
    }

    /// Panels `first .. first + count` for every row into `sums` (`[m, count·NR]`, i32).
    fn block(&self, packed_x: &[i32], m: usize, first: usize, count: usize, sums: &mut [i32]) {
        let pairs = self.pairs;
        let stride = count * NR;
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
                        panel: &self.panels[start + depth * 2 * NR..start + (depth + kc) * 2 * NR],
                        out: &mut sums[row * stride + p * NR..],
                        stride,
                        accumulate: depth > 0,
                    };
                    run_tile(self.kernel, rows, call);
                }
            }
            depth += kc;
        }
    }
}

/// One kernel call: `rows` rows of packed activation pairs times one panel slice, into `out` (rows
/// `stride` apart), added to what `out` holds when `accumulate`.
struct IntTileCall<'a> {
    x: &'a [i32],
    panel: &'a [i16],
    out: &'a mut [i32],
    stride: usize,
    accumulate: bool,
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

    const SHAPES: [(usize, usize, usize); 6] = [
        (1, 5, 3),
        (7, 300, 37),
        (13, 513, 70),
        (64, 64, 33),
        (6, 1, 16),
        (2, 1024, 17),
    ];

    /// Against a float64 product: the error of each output is within 1% of the size of its terms
    /// (`Σ |x|·|w|`), the bound 8-bit weights and ≥ 12-bit activations give.
    #[test]
    fn quantized_products_match_float_products() {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(3).build().expect("pool");
        for &(m, k, n) in &SHAPES {
            let x = values(m * k, 1);
            let w = values(k * n, 2);
            let bias = values(n, 3);
            let abs = |v: &[f32]| v.iter().map(|v| v.abs()).collect::<Vec<_>>();
            let magnitude = reference(&abs(&x), &abs(&w), m, k, n, None);
            for with_bias in [false, true] {
                let weight = QuantizedWeight::quantize(&w, k, n, with_bias.then(|| bias.clone()), Int8Kernel::detect());
                let got = pool.install(|| weight.matmul(&x, m));
                let want = reference(&x, &w, m, k, n, with_bias.then_some(bias.as_slice()));
                let worst = got
                    .iter()
                    .zip(&want)
                    .zip(&magnitude)
                    .map(|((a, b), s)| (a - b).abs() / s.max(1e-6))
                    .fold(0f32, f32::max);
                assert!(worst < 0.01, "{m}x{k}x{n} bias {with_bias}: relative error {worst}");
            }
        }
    }

    /// The AVX2 kernel's i32 sums equal the portable code's, so the outputs are identical.
    #[test]
    fn the_simd_kernel_gives_the_portable_kernels_sums() {
        if Int8Kernel::detect() == Int8Kernel::Scalar {
            return;
        }
        for &(m, k, n) in &SHAPES {
            let x = values(m * k, 4);
            let w = values(k * n, 5);
            let simd = QuantizedWeight::quantize(&w, k, n, None, Int8Kernel::Avx2);
            let scalar = QuantizedWeight::quantize(&w, k, n, None, Int8Kernel::Scalar);
            let (a, b) = (simd.matmul(&x, m), scalar.matmul(&x, m));
            assert!(a.iter().zip(&b).all(|(a, b)| a.to_bits() == b.to_bits()), "{m}x{k}x{n}");
        }
    }

    #[test]
    fn empty_inputs_zero_weights_and_non_finite_rows() {
        let w = values(8 * 5, 6);
        let weight = QuantizedWeight::quantize(&w, 8, 5, Some(vec![1.0; 5]), Int8Kernel::detect());
        assert!(weight.matmul(&[], 0).is_empty());
        // A zero row gives the bias; a row with a NaN or an infinity gives NaN, the others are unharmed.
        let mut x = vec![0f32; 3 * 8];
        x[8] = f32::NAN;
        x[16] = f32::INFINITY;
        let y = weight.matmul(&x, 3);
        assert_eq!(&y[..5], &[1.0; 5]);
        assert!(y[5..].iter().all(|v| v.is_nan()));
        let zero = QuantizedWeight::quantize(&[0.0; 12], 3, 4, None, Int8Kernel::detect());
        assert_eq!(zero.matmul(&[1.0, 2.0, 3.0], 1), vec![0.0; 4]);
    }

    /// The worst case of the overflow bound: every activation and weight at its largest level.
    #[test]
    fn the_sums_do_not_overflow_at_full_scale() {
        let k = 4099;
        let weight = QuantizedWeight::quantize(&vec![-1.0; k * 3], k, 3, None, Int8Kernel::detect());
        let y = weight.matmul(&vec![1.0; k], 1);
        assert!(y.iter().all(|&v| (v + k as f32).abs() < 1e-3 * k as f32), "{y:?}");
    }
}
