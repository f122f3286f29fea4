//! The i16 pair layout's products (AVX2's `vpmaddwd`, through `pulp`, and the portable code): the
//! rows packed as tiles of symmetric i16 levels, the depth × row tile × panel loop and its
//! microkernels. Safe code: `pulp`'s token proves AVX2.

use rayon::prelude::*;

use super::activations::RowQuant;
use super::layout::{Int8Kernel, KC, MR, NR, Panels, QuantizedWeight};

impl QuantizedWeight {
    /// Pair layout: each row of `x` to `levels`-level integers, packed as row tiles of `MR`: tile
    /// `t` holds, per depth pair, `MR` i32 words `(x[2d] as i16) | (x[2d + 1] as i16) << 16` (zero
    /// past `m`, `k`). Returns the packed tiles and each row's quantization.
    pub(super) fn quantize_pairs(&self, x: &[f32], m: usize) -> (Vec<i32>, Vec<RowQuant>) {
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
}

impl QuantizedWeight {
    /// Pair layout: panels `first .. first + count` for every row into `sums` (`[m, count·NR]`).
    pub(super) fn block_pairs(
        &self,
        packed_x: &[i32],
        m: usize,
        first: usize,
        count: usize,
        sums: &mut [i32],
        portable: bool,
    ) {
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
