//! bf16 products of activations by constant weights on CPUs with AVX512_BF16 (`dtype = "bf16"` on
//! the CPU): weights rounded to bf16 once at load, activation rows rounded to bf16 at each call,
//! `vdpbf16ps` (32 bf16 products summed pairwise into 16 f32 lanes per instruction, twice the
//! products of an f32 FMA), f32 sums and results.
//!
//! Why not candle's bf16 CPU path: its matmul converts and multiplies through the `gemm` crate
//! without native bf16 dot products, and every other op of a bf16 forward runs candle's slower bf16
//! elementwise code; measured 2× slower than f32 on this machine (issue 26). Here only the matrix
//! products of the encoder and of the decision head's layers change precision: embeddings, norms,
//! attention, the scorer and the act head stay f32, as with int8. Served only behind the parity
//! gate against the f32 forward (`gate.rs`).
//!
//! With AMX (the `amx` kernel family) the same panels run on the tile registers instead
//! (`tdpbf16ps`, `layad_cpu_kernels::amx`): the depth padded to whole tiles of 16 pairs, the
//! activation rows laid out one after another (padded to 16 rows) instead of in tiles of 8.

use layad_cpu_kernels::amx::{Amx, Bf16Tiles, TILE_ROWS, TILE_WORDS, TileProduct, row_stride};
use rayon::prelude::*;

use crate::layers::cpu_matmul::{CpuWeight, NextSlices, Prefetch, bias_rows, in_column_blocks};

/// Columns per packed panel: two AVX-512 registers of f32 sums.
const NR: usize = 32;
/// Rows of the activation tile one kernel call computes.
const MR: usize = 8;
/// Depth pairs of one pass: a panel slice of `KC` pairs (16 KiB) stays in L1.
const KC: usize = 128;

/// `v` rounded to bf16 (to nearest, ties to even), as its 16 bits; NaN stays NaN.
pub(crate) fn to_bf16(v: f32) -> u16 {
    let bits = v.to_bits();
    if v.is_nan() {
        return ((bits >> 16) | 0x40) as u16;
    }
    let rounding = 0x7fff + ((bits >> 16) & 1);
    (bits.wrapping_add(rounding) >> 16) as u16
}

/// One or two values (a depth pair, zero past `k`) as the word `bf16(lo) | bf16(hi) << 16`.
fn pair_word(pair: &[f32]) -> u32 {
    let lo = u32::from(to_bf16(pair[0]));
    let hi = pair.get(1).map_or(0, |&v| u32::from(to_bf16(v)));
    lo | hi << 16
}

/// The f32 value of bf16 bits.
fn from_bf16(bits: u16) -> f32 {
    f32::from_bits(u32::from(bits) << 16)
}

/// Whether this CPU runs the bf16 kernel (AVX-512F and AVX512_BF16).
pub(crate) fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        bf16dp::Bf16Dp::try_new().is_some()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// A weight `[k, n]` in bf16, packed: panel `p` holds columns `p·32 .. p·32 + 32` (zero past `n`);
/// per depth pair `d`, column `c` holds `[w(2d, c), w(2d + 1, c)]` (zero past `k`).
pub(crate) struct Bf16Weight {
    k: usize,
    n: usize,
    /// Whether the products run on AMX tiles (else the AVX512_BF16 kernel).
    tiles: bool,
    pairs: usize,
    panels: Vec<u16>,
    bias: Option<Vec<f32>>,
}

impl Bf16Weight {
    /// Rounds and packs the weight whose entry `(depth, col)` is `value(depth, col)`, for AMX's
    /// tiles when `tiles` (else for the AVX512_BF16 kernel).
    pub(crate) fn pack_with(
        value: impl Fn(usize, usize) -> f32 + Sync,
        k: usize,
        n: usize,
        bias: Option<Vec<f32>>,
        tiles: bool,
    ) -> Self {
        let pairs = if tiles {
            k.div_ceil(2 * TILE_WORDS) * TILE_WORDS
        } else {
            k.div_ceil(2)
        };
        let count = n.div_ceil(NR);
        let mut panels = vec![0u16; count * pairs * 2 * NR];
        if k > 0 {
            panels
                .par_chunks_mut(pairs * 2 * NR)
                .enumerate()
                .for_each(|(p, panel)| {
                    for c in 0..NR.min(n - p * NR) {
                        let col = p * NR + c;
                        for depth in 0..k {
                            panel[(depth / 2) * 2 * NR + 2 * c + depth % 2] = to_bf16(value(depth, col));
                        }
                    }
                });
        }
        Self {
            k,
            n,
            tiles,
            pairs,
            panels,
            bias,
        }
    }

    /// `x · W (+ bias)` for `x` `[m, k]` row-major; returns `[m, n]` row-major.
    pub(crate) fn matmul(&self, x: &[f32], m: usize) -> Vec<f32> {
        self.matmul_with(x, m, false)
    }

    fn matmul_with(&self, x: &[f32], m: usize, portable: bool) -> Vec<f32> {
        if m == 0 || self.n == 0 || self.k == 0 {
            return bias_rows(self.bias.as_deref(), m, self.n);
        }
        let packed_x = self.pack_rows(x, m, portable);
        in_column_blocks(m, self.n, NR, self.bias.as_deref(), |first, count, block| {
            self.block(&packed_x, m, first, count, block, portable);
        })
    }

    /// Rows of `x` as bf16 pairs in tiles of `MR`: tile `t` holds, per depth pair, `MR` u32 words
    /// `bf16(x[2d]) | bf16(x[2d + 1]) << 16` (zero past `m`, `k`); for AMX the rows' words one
    /// row after another instead (`amx::row_stride` words apart), rows padded to 16. With the kernel (and not `portable`) rows are
    /// rounded by `vcvtne2ps2bf16`: the same words, except that it flushes subnormal values to
    /// zero.
    fn pack_rows(&self, x: &[f32], m: usize, portable: bool) -> Vec<u32> {
        let (k, pairs) = (self.k, self.pairs);
        // Rows per chunk of the packed words, a row's words `tile` apart, and the words per row.
        let tile = if self.tiles { 1 } else { MR };
        let (rows, row_words) = if self.tiles {
            (m.next_multiple_of(TILE_ROWS), row_stride(pairs))
        } else {
            (m.next_multiple_of(MR), pairs)
        };
        let mut packed = vec![0u32; rows * row_words];
        #[cfg(target_arch = "x86_64")]
        let simd = if portable { None } else { bf16dp::Bf16Dp::try_new() };
        #[cfg(not(target_arch = "x86_64"))]
        let _ = portable;
        packed
            .par_chunks_mut(row_words * tile)
            .enumerate()
            .for_each(|(t, dst)| {
                for r in 0..tile.min(m.saturating_sub(t * tile)) {
                    let row = &x[(t * tile + r) * k..(t * tile + r + 1) * k];
                    #[cfg(target_arch = "x86_64")]
                    if let Some(simd) = simd {
                        simd.pack_row(row, &mut dst[r..], tile);
                        continue;
                    }
                    for (d, pair) in row.chunks(2).enumerate() {
                        dst[d * tile + r] = pair_word(pair);
                    }
                }
            });
        packed
    }

    fn block(&self, packed_x: &[u32], m: usize, first: usize, count: usize, block: &mut [f32], portable: bool) {
        let pairs = self.pairs;
        let stride = count * NR;
        if self.tiles {
            let product = TileProduct::<Bf16Tiles> {
                a: packed_x,
                a_stride: row_stride(pairs),
                rows: m,
                words: pairs,
                panels: &self.panels[first * pairs * 2 * NR..(first + count) * pairs * 2 * NR],
                out: block,
                stride,
            };
            // The tile model where AMX is not granted (the tests' portable path).
            match Amx::detect() {
                Ok(amx) if !portable => amx.multiply(product),
                _ => product.model(),
            }
            return;
        }
        #[cfg(target_arch = "x86_64")]
        let simd = if portable { None } else { bf16dp::Bf16Dp::try_new() };
        #[cfg(not(target_arch = "x86_64"))]
        let _ = portable;
        let next = NextSlices {
            panels: &self.panels,
            panel_units: pairs,
            unit: 2 * NR,
            pass: KC,
            count,
            tiles: m.div_ceil(MR),
        };
        let mut depth = 0;
        while depth < pairs {
            let kc = KC.min(pairs - depth);
            let prefetch = next.pass(depth, kc);
            for (tile, row) in (0..m).step_by(MR).enumerate() {
                let rows = MR.min(m - row);
                let x = &packed_x[(tile * pairs + depth) * MR..(tile * pairs + depth + kc) * MR];
                for p in 0..count {
                    let start = (first + p) * pairs * 2 * NR;
                    let call = Bf16TileCall {
                        x,
                        panel: &self.panels[start + depth * 2 * NR..start + (depth + kc) * 2 * NR],
                        out: &mut block[row * stride + p * NR..],
                        stride,
                        accumulate: depth > 0,
                        prefetch: prefetch.share(first + p, tile),
                    };
                    #[cfg(target_arch = "x86_64")]
                    if let Some(simd) = simd {
                        simd.tile(rows, call);
                        continue;
                    }
                    scalar_tile(rows, call);
                }
            }
            depth += kc;
        }
    }
}

/// One kernel call: `rows` rows of packed bf16 pairs (`MR` words per pair) times one panel slice
/// (`2·NR` bf16 per pair), into `out` (rows `stride` apart), added to what `out` holds when
/// `accumulate`.
struct Bf16TileCall<'a> {
    x: &'a [u32],
    panel: &'a [u16],
    out: &'a mut [f32],
    stride: usize,
    accumulate: bool,
    /// Weights to request into L2 during the call ([`NextSlices`]).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    prefetch: Prefetch<'a, u16>,
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
        prefetch: _,
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

/// The AVX512_BF16 micro-kernel, entered through a token that exists only where run-time
/// detection found the features (as `cpu_matmul_int8`'s VNNI kernel).
#[cfg(target_arch = "x86_64")]
mod bf16dp {
    // Entering a `#[target_feature]` function, unaligned vector loads and stores, and viewing
    // integer vectors as bf16 vectors are `unsafe`; each use says why it holds.
    #![allow(unsafe_code)]

    use std::arch::x86_64::{
        __m512, __m512bh, __m512i, _mm512_cvtne2ps_pbh, _mm512_dpbf16_ps, _mm512_loadu_ps, _mm512_loadu_si512,
        _mm512_maskz_loadu_ps, _mm512_set1_epi32, _mm512_setzero_ps, _mm512_storeu_ps, _mm512_storeu_si512,
    };

    use super::{Bf16TileCall, MR, NR};

    /// Proof that this CPU has AVX-512F, AVX-512BW and AVX512_BF16.
    #[derive(Clone, Copy)]
    pub(super) struct Bf16Dp(());

    impl Bf16Dp {
        pub(super) fn try_new() -> Option<Self> {
            let has = std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx512bw")
                && std::arch::is_x86_feature_detected!("avx512bf16");
            has.then_some(Self(()))
        }

        /// One row's depth-pair words into `dst[0]`, `dst[step]`, `dst[2·step]`, … (as
        /// [`super::pair_word`], but subnormal values flush to zero).
        pub(super) fn pack_row(self, row: &[f32], dst: &mut [u32], step: usize) {
            // SAFETY: as in `tile`.
            unsafe { pack_row(row, dst, step) }
        }

        /// One tile of `rows` (at most `MR`) rows.
        pub(super) fn tile(self, rows: usize, call: Bf16TileCall<'_>) {
            // SAFETY: a `Bf16Dp` exists only where `try_new` detected every feature `tile_rows`
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

    /// 32 values at a time: `vcvtne2ps2bf16` rounds two registers to nearest even (NaN stays NaN,
    /// quieted) into 16 pair words, which go to every `step`-th word of `dst`; masked loads read
    /// the tail as zeros, the padding `dst` holds past `k` anyway.
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    fn pack_row(row: &[f32], dst: &mut [u32], step: usize) {
        let mut words = [0u32; 16];
        for (i, chunk) in row.chunks(32).enumerate() {
            let len = chunk.len();
            let low = ((1u64 << len.min(16)) - 1) as u16;
            let high = ((1u64 << len.saturating_sub(16)) - 1) as u16;
            // SAFETY: only the lanes inside `chunk` are read (masked loads).
            let (a, b) = unsafe {
                (
                    _mm512_maskz_loadu_ps(low, chunk.as_ptr()),
                    _mm512_maskz_loadu_ps(high, chunk.as_ptr().wrapping_add(16)),
                )
            };
            // The second operand fills the low 16 bf16: pair words in depth order.
            let pairs: __m512i = as_int(_mm512_cvtne2ps_pbh(b, a));
            // SAFETY: `words` is 16 u32 = one 64-byte vector; `storeu` needs no alignment.
            unsafe { _mm512_storeu_si512(words.as_mut_ptr().cast::<__m512i>(), pairs) };
            for (j, &word) in words.iter().enumerate().take(len.div_ceil(2)) {
                dst[(16 * i + j) * step] = word;
            }
        }
    }

    /// bf16 pairs as 512 integer bits.
    #[inline(always)]
    fn as_int(v: __m512bh) -> __m512i {
        // SAFETY: both are 512-bit plain vectors; every bit pattern is a valid integer vector.
        unsafe { std::mem::transmute::<__m512bh, __m512i>(v) }
    }

    /// 512 bits of bf16 pairs as the type `vdpbf16ps` takes.
    #[inline(always)]
    fn as_bf16(v: __m512i) -> __m512bh {
        // SAFETY: both are 512-bit plain vectors; every bit pattern is a valid bf16 vector.
        unsafe { std::mem::transmute::<__m512i, __m512bh>(v) }
    }

    /// `R × 2` f32 accumulator registers (32 columns per row); per depth pair, two weight registers
    /// and one broadcast activation pair per row, `vdpbf16ps` into each accumulator.
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    fn tile_rows<const R: usize>(call: Bf16TileCall<'_>) {
        let Bf16TileCall {
            x,
            panel,
            out,
            stride,
            accumulate,
            prefetch,
        } = call;
        const { assert!(R >= 1 && R <= MR && NR == 32) };
        // Every row's 32 sums lie inside `out`: the loads and stores below stay in bounds.
        assert!(out.len() >= (R - 1) * stride + NR, "bf16 tile output too short");
        let mut acc: [[__m512; 2]; R] = [[_mm512_setzero_ps(); 2]; R];
        if accumulate {
            for (r, acc) in acc.iter_mut().enumerate() {
                let held = &out[r * stride..r * stride + NR];
                // SAFETY: `held` is 32 f32 = two 64-byte vectors; `loadu` needs no alignment.
                *acc = unsafe { [_mm512_loadu_ps(held.as_ptr()), _mm512_loadu_ps(held[16..].as_ptr())] };
            }
        }
        for (i, (w, a)) in panel.chunks_exact(2 * NR).zip(x.chunks_exact(MR)).enumerate() {
            prefetch.step(i);
            // SAFETY: `w` is 64 u16 = two 64-byte vectors; `loadu` needs no alignment.
            let (w0, w1) = unsafe {
                (
                    as_bf16(_mm512_loadu_si512(w.as_ptr().cast::<__m512i>())),
                    as_bf16(_mm512_loadu_si512(w[32..].as_ptr().cast::<__m512i>())),
                )
            };
            for r in 0..R {
                let v = as_bf16(_mm512_set1_epi32(a[r] as i32));
                acc[r][0] = _mm512_dpbf16_ps(acc[r][0], v, w0);
                acc[r][1] = _mm512_dpbf16_ps(acc[r][1], v, w1);
            }
        }
        for (r, acc) in acc.iter().enumerate() {
            let dst = &mut out[r * stride..r * stride + NR];
            // SAFETY: `dst` is 32 f32 = two 64-byte vectors; `storeu` needs no alignment.
            unsafe {
                _mm512_storeu_ps(dst.as_mut_ptr(), acc[0]);
                _mm512_storeu_ps(dst[16..].as_mut_ptr(), acc[1]);
            }
        }
    }
}

impl CpuWeight for Bf16Weight {
    const NAME: &'static str = "laya-bf16-matmul";

    fn dims(&self) -> (usize, usize) {
        (self.k, self.n)
    }

    fn matmul(&self, x: &[f32], m: usize) -> Vec<f32> {
        Bf16Weight::matmul(self, x, m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layers::cpu_matmul::tests::reference;

    fn values(len: usize, seed: usize) -> Vec<f32> {
        (0..len)
            .map(|i| (((i * 7919 + seed * 104_729) % 2001) as f32 - 1000.0) / 1000.0)
            .collect()
    }

    #[test]
    fn rounding_to_bf16_is_to_nearest_even() {
        assert_eq!(to_bf16(1.0), 0x3f80);
        assert_eq!(from_bf16(to_bf16(1.0 + 1.0 / 256.0)), 1.0, "a tie rounds to even");
        assert_eq!(
            from_bf16(to_bf16(1.0 + 3.0 / 256.0)),
            1.0 + 4.0 / 256.0,
            "a tie rounds to even"
        );
        assert_eq!(from_bf16(to_bf16(-2.5)), -2.5);
        assert!(from_bf16(to_bf16(f32::NAN)).is_nan());
        assert_eq!(from_bf16(to_bf16(f32::INFINITY)), f32::INFINITY);
    }

    /// The SIMD kernel (where the CPU has it) and the portable one, against a float64 product:
    /// within 1% of the size of the terms (`Σ |x|·|w|`; bf16 keeps 8 bits of mantissa).
    #[test]
    fn bf16_products_match_float_products() {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(3).build().expect("pool");
        if !available() {
            eprintln!("this CPU has no AVX512_BF16: only the portable kernel is tested");
        }
        for &(m, k, n) in &[(1, 5, 3), (7, 300, 37), (13, 513, 70), (64, 64, 33), (9, 1, 40)] {
            let x = values(m * k, 1);
            let w = values(k * n, 2);
            let bias = values(n, 3);
            let abs = |v: &[f32]| v.iter().map(|v| v.abs()).collect::<Vec<_>>();
            let magnitude = reference(&abs(&x), &abs(&w), m, k, n, None);
            let want = reference(&x, &w, m, k, n, Some(&bias));
            for tiles in [false, true] {
                let weight = Bf16Weight::pack_with(|d, c| w[d * n + c], k, n, Some(bias.clone()), tiles);
                for portable in [false, true] {
                    let got = pool.install(|| weight.matmul_with(&x, m, portable));
                    let worst = got
                        .iter()
                        .zip(&want)
                        .zip(&magnitude)
                        .map(|((a, b), s)| (a - b).abs() / s.max(1e-6))
                        .fold(0f32, f32::max);
                    assert!(worst < 0.01, "{m}x{k}x{n} tiles {tiles} portable {portable}: {worst}");
                }
                // The SIMD and portable sums differ at most by f32 rounding.
                let (a, b) = pool.install(|| (weight.matmul_with(&x, m, false), weight.matmul_with(&x, m, true)));
                let worst = a
                    .iter()
                    .zip(&b)
                    .zip(&magnitude)
                    .map(|((a, b), s)| (a - b).abs() / s.max(1e-6))
                    .fold(0f32, f32::max);
                assert!(worst < 1e-5, "{m}x{k}x{n} tiles {tiles}: SIMD vs portable {worst}");
                // AMX's tiles give the tile model's sums bit for bit.
                if tiles && Amx::detect().is_ok() {
                    assert!(
                        a.iter().zip(&b).all(|(a, b)| a.to_bits() == b.to_bits()),
                        "{m}x{k}x{n}: AMX vs its model"
                    );
                }
            }
        }
    }

    /// The kernel's row packing gives the portable words exactly (odd depths, tails, ties, ±0,
    /// NaN, ±∞, the largest finite values), except that subnormal values flush to zero; a product
    /// with no depth gives its bias.
    #[test]
    fn simd_row_packing_equals_the_portable_one() {
        for tiles in [false, true] {
            let no_depth = Bf16Weight::pack_with(|_, _| 0.0, 0, 3, Some(vec![0.5; 3]), tiles);
            assert_eq!(no_depth.matmul(&[], 2), vec![0.5; 6]);
        }
        if !available() {
            eprintln!("this CPU has no AVX512_BF16: skipped");
            return;
        }
        let mut special = vec![
            0.0,
            -0.0,
            1.0 + 1.0 / 256.0,
            1.0 + 3.0 / 256.0,
            -2.5,
            f32::NAN,
            f32::INFINITY,
        ];
        special.extend([f32::NEG_INFINITY, f32::MAX, f32::MIN, 1e-30, -3.4e38]);
        for k in [1, 2, 15, 16, 17, 31, 32, 33, 64, 100, special.len()] {
            let m = 3;
            let mut x = values(m * k, k);
            if k == special.len() {
                x[k..2 * k].copy_from_slice(&special);
            }
            for tiles in [false, true] {
                let weight = Bf16Weight::pack_with(|_, _| 1.0, k, 5, None, tiles);
                assert_eq!(
                    weight.pack_rows(&x, m, false),
                    weight.pack_rows(&x, m, true),
                    "k = {k} tiles {tiles}"
                );
            }
        }
        let weight = Bf16Weight::pack_with(|_, _| 1.0, 2, 1, None, false);
        let subnormal = f32::MIN_POSITIVE / 4.0;
        assert_eq!(weight.pack_rows(&[subnormal, -subnormal], 1, false)[0], 0x8000_0000);
        assert_ne!(weight.pack_rows(&[subnormal, -subnormal], 1, true)[0], 0x8000_0000);
    }

    #[test]
    fn availability_follows_the_cpu() {
        #[cfg(target_arch = "x86_64")]
        assert_eq!(
            available(),
            std::arch::is_x86_feature_detected!("avx512bf16") && std::arch::is_x86_feature_detected!("avx512bw")
        );
        let empty = Bf16Weight::pack_with(|_, _| 1.0, 3, 2, None, true);
        assert!(empty.matmul(&[], 0).is_empty());
    }
}
