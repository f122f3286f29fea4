//! The f32 microkernel on SIMD registers, through `pulp`: one generic tile for both x86-64
//! families (AVX-512F's 16 lanes, AVX2 + FMA's 8), monomorphised per row count and per the rows a
//! tile is packed with (14 on AVX-512's 32 registers, 6 on AVX2's 16: each family compiles only
//! the tiles its registers hold). x86-64 only: elsewhere the CPU path is candle's. Safe code:
//! `pulp`'s tokens prove the features.

use pulp::x86::{V3, V4};
use pulp::{Simd, WithSimd};

use super::tile::{NARROW_ROWS, TileCall, WIDE_ROWS};

/// The AVX-512 tile for `rows` (at most [`WIDE_ROWS`]) rows packed `WIDE_ROWS` values per depth.
pub(super) fn wide_tile(simd: V4, rows: usize, call: TileCall<'_>) {
    const M: usize = WIDE_ROWS;
    match rows {
        14 => Simd::vectorize(simd, Tile::<14, M>(call)),
        13 => Simd::vectorize(simd, Tile::<13, M>(call)),
        12 => Simd::vectorize(simd, Tile::<12, M>(call)),
        11 => Simd::vectorize(simd, Tile::<11, M>(call)),
        10 => Simd::vectorize(simd, Tile::<10, M>(call)),
        9 => Simd::vectorize(simd, Tile::<9, M>(call)),
        8 => Simd::vectorize(simd, Tile::<8, M>(call)),
        7 => Simd::vectorize(simd, Tile::<7, M>(call)),
        _ => short_tile::<_, M>(simd, rows, call),
    }
}

/// The AVX2 tile for `rows` (at most [`NARROW_ROWS`]) rows packed `NARROW_ROWS` values per depth.
pub(super) fn narrow_tile(simd: V3, rows: usize, call: TileCall<'_>) {
    short_tile::<_, NARROW_ROWS>(simd, rows, call);
}

/// The tile for at most 6 rows (every family's shortest tiles) of rows packed `M` values per depth.
fn short_tile<S: Simd, const M: usize>(simd: S, rows: usize, call: TileCall<'_>) {
    match rows {
        6 => simd.vectorize(Tile::<6, M>(call)),
        5 => simd.vectorize(Tile::<5, M>(call)),
        4 => simd.vectorize(Tile::<4, M>(call)),
        3 => simd.vectorize(Tile::<3, M>(call)),
        2 => simd.vectorize(Tile::<2, M>(call)),
        _ => simd.vectorize(Tile::<1, M>(call)),
    }
}

/// The micro-kernel for `R` rows of a tile packed `M` rows high: `R × 2` accumulator registers,
/// one broadcast activation times two weight registers per row and depth. `R` is a constant so the
/// accumulators stay in registers.
struct Tile<'a, const R: usize, const M: usize>(TileCall<'a>);

impl<const R: usize, const M: usize> WithSimd for Tile<'_, R, M> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: Simd>(self, simd: S) {
        const { assert!(R <= M) };
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
        for (i, (w, a)) in weights.chunks_exact(2).zip(x.chunks_exact(M)).enumerate() {
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
