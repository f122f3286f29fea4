//! The f32 microkernel on SIMD registers, through `pulp`: one generic tile for both x86-64
//! families (AVX-512F's 16 lanes, AVX2 + FMA's 8), monomorphised per row count. Safe code: `pulp`'s
//! tokens prove the features.

use pulp::{Simd, WithSimd};

use super::tile::{MR, TileCall};

/// The SIMD tile for `rows` rows (x86-64 only: elsewhere the CPU path is candle's, and the
/// families that call this are never chosen).
pub(super) fn simd_tile<S: Simd>(simd: S, rows: usize, call: TileCall<'_>) {
    match rows {
        6 => simd.vectorize(Tile::<6>(call)),
        5 => simd.vectorize(Tile::<5>(call)),
        4 => simd.vectorize(Tile::<4>(call)),
        3 => simd.vectorize(Tile::<3>(call)),
        2 => simd.vectorize(Tile::<2>(call)),
        _ => simd.vectorize(Tile::<1>(call)),
    }
}

/// The micro-kernel for `R` rows: `R × 2` accumulator registers, one broadcast activation times two
/// weight registers per row and depth. `R` is a constant so the accumulators stay in registers.
struct Tile<'a, const R: usize>(TileCall<'a>);

impl<const R: usize> WithSimd for Tile<'_, R> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: Simd>(self, simd: S) {
        let TileCall {
            x,
            panel,
            out,
            stride,
            accumulate,
            prefetch,
        } = self.0;
        let lanes = S::F32_LANES;
        let (weights, _) = S::as_simd_f32s(panel);
        let zero = simd.splat_f32s(0.0);
        let mut acc = [[zero; 2]; R];
        if accumulate {
            for (r, acc) in acc.iter_mut().enumerate() {
                let (held, _) = S::as_simd_f32s(&out[r * stride..r * stride + 2 * lanes]);
                *acc = [held[0], held[1]];
            }
        }
        for (i, (w, a)) in weights.chunks_exact(2).zip(x.chunks_exact(MR)).enumerate() {
            prefetch.step(i);
            let (w0, w1) = (w[0], w[1]);
            for r in 0..R {
                let v = simd.splat_f32s(a[r]);
                acc[r][0] = simd.mul_add_f32s(v, w0, acc[r][0]);
                acc[r][1] = simd.mul_add_f32s(v, w1, acc[r][1]);
            }
        }
        for (r, acc) in acc.iter().enumerate() {
            let (dst, _) = S::as_mut_simd_f32s(&mut out[r * stride..r * stride + 2 * lanes]);
            dst[0] = acc[0];
            dst[1] = acc[1];
        }
    }
}
