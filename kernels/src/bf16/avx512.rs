//! The AVX512_BF16 micro-kernel, entered through a token that exists only where run-time
//! detection found the features (as `int8::vnni`'s kernel).

// Entering a `#[target_feature]` function, unaligned vector loads and stores, and viewing
// integer vectors as bf16 vectors are `unsafe`; each use says why it holds.
#![allow(unsafe_code)]

use std::arch::x86_64::{
    __m256bh, __m256i, __m512, __m512bh, __m512i, _mm512_cvtepu16_epi32, _mm512_cvtne2ps_pbh, _mm512_cvtneps_pbh,
    _mm512_dpbf16_ps, _mm512_loadu_ps, _mm512_loadu_si512, _mm512_mask_storeu_epi32, _mm512_maskz_loadu_ps,
    _mm512_or_si512, _mm512_set1_epi32, _mm512_setzero_ps, _mm512_slli_epi32, _mm512_storeu_ps, _mm512_storeu_si512,
};

use super::tile::{Bf16TileCall, MR, NR};
use crate::driver::Prefetch;

/// Proof that this CPU has AVX-512F, AVX-512BW and AVX512_BF16.
#[derive(Clone, Copy, Debug)]
pub(super) struct Bf16Dp(());

impl Bf16Dp {
    pub(super) fn try_new() -> Option<Self> {
        let has = std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512bf16");
        has.then_some(Self(()))
    }

    /// One row's depth-pair words into `dst[0]`, `dst[step]`, `dst[2·step]`, … (as
    /// [`super::words::pair_word`], but subnormal values flush to zero).
    pub(super) fn pack_row(self, row: &[f32], dst: &mut [u32], step: usize) {
        // SAFETY: as in `tile`.
        unsafe { pack_row(row, dst, step) }
    }

    /// `words[c] = bf16(low[c]) | bf16(high[c]) << 16` for every `c < low.len()` (as
    /// [`super::words::pair_word`] of the two, but subnormal values flush to zero); `high` past its end
    /// reads as zeros.
    pub(super) fn interleave(self, low: &[f32], high: &[f32], words: &mut [u32]) {
        // SAFETY: as in `tile`.
        unsafe { interleave(low, high, words) }
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

    /// [`Bf16Dp::tile`] on a panel held as words (each column's two bf16 of a depth pair in one
    /// word: [`super::RowsProduct`]'s panels), its sums stored.
    pub(super) fn tile_of_words(self, rows: usize, x: &[u32], panel: &[u32], out: &mut [f32], stride: usize) {
        // SAFETY: a u32 is two u16 in memory order (low half first on x86-64), at least as
        // aligned; every bit pattern is a valid u16.
        let (before, panel, after) = unsafe { panel.align_to::<u16>() };
        assert!(before.is_empty() && after.is_empty(), "u32 words as u16 pairs");
        self.tile(
            rows,
            Bf16TileCall {
                x,
                panel,
                out,
                stride,
                accumulate: false,
                scales: &[],
                prefetch: Prefetch::NONE,
            },
        );
    }
}

/// 32 values at a time: `vcvtne2ps2bf16` rounds two registers to nearest even (NaN stays NaN,
/// quieted) into 16 pair words, which go to every `step`-th word of `dst` (with one masked store
/// when `step` is 1); masked loads read the tail as zeros, the padding `dst` holds past `k` anyway.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
fn pack_row(row: &[f32], dst: &mut [u32], step: usize) {
    let mut words = [0u32; 16];
    for (i, chunk) in row.chunks(32).enumerate() {
        let len = chunk.len();
        // SAFETY: only the lanes inside `chunk` are read (masked loads).
        let (a, b) = unsafe {
            (
                _mm512_maskz_loadu_ps(lanes(len), chunk.as_ptr()),
                _mm512_maskz_loadu_ps(lanes(len.saturating_sub(16)), chunk.as_ptr().wrapping_add(16)),
            )
        };
        // The second operand fills the low 16 bf16: pair words in depth order.
        let pairs: __m512i = as_int(_mm512_cvtne2ps_pbh(b, a));
        let count = len.div_ceil(2);
        if step == 1 {
            let out = &mut dst[16 * i..16 * i + count];
            // SAFETY: the mask's `count` lanes are `out`'s words; `storeu` needs no alignment.
            unsafe { _mm512_mask_storeu_epi32(out.as_mut_ptr().cast::<i32>(), lanes(count), pairs) };
            continue;
        }
        // SAFETY: `words` is 16 u32 = one 64-byte vector; `storeu` needs no alignment.
        unsafe { _mm512_storeu_si512(words.as_mut_ptr().cast::<__m512i>(), pairs) };
        for (j, &word) in words.iter().enumerate().take(count) {
            dst[(16 * i + j) * step] = word;
        }
    }
}

/// 16 values of each side at a time: `vcvtneps2bf16` rounds each register to 16 bf16, widened to
/// words, the high side shifted into the upper halves.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
fn interleave(low: &[f32], high: &[f32], words: &mut [u32]) {
    let words = &mut words[..low.len()];
    for (i, (chunk, out)) in low.chunks(16).zip(words.chunks_mut(16)).enumerate() {
        let high = high.get(16 * i..).unwrap_or(&[]);
        // SAFETY: only the lanes inside `chunk` and `high` are read (masked loads).
        let (a, b) = unsafe {
            (
                _mm512_maskz_loadu_ps(lanes(chunk.len()), chunk.as_ptr()),
                _mm512_maskz_loadu_ps(lanes(high.len().min(16)), high.as_ptr()),
            )
        };
        let a = _mm512_cvtepu16_epi32(as_int256(_mm512_cvtneps_pbh(a)));
        let b = _mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(as_int256(_mm512_cvtneps_pbh(b))));
        // SAFETY: the mask's lanes are `out`'s words; `storeu` needs no alignment.
        unsafe { _mm512_mask_storeu_epi32(out.as_mut_ptr().cast::<i32>(), lanes(out.len()), _mm512_or_si512(a, b)) };
    }
}

/// The mask of the first `count` (at most 16) lanes.
fn lanes(count: usize) -> u16 {
    ((1u32 << count.min(16)) - 1) as u16
}

/// 16 bf16 as 256 integer bits.
#[inline(always)]
fn as_int256(v: __m256bh) -> __m256i {
    // SAFETY: both are 256-bit plain vectors; every bit pattern is a valid integer vector.
    unsafe { std::mem::transmute::<__m256bh, __m256i>(v) }
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
        ..
    } = call;
    const { assert!(R >= 1 && R <= MR && NR == 32) };
    let mut acc = held_sums::<R>(out, stride, accumulate);
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
    store_sums(&acc, out, stride);
}

/// The `R × 2` accumulator registers of a tile of `R` rows of 32 f32 sums (rows `stride` apart in
/// `out`): the sums `out` holds when `accumulate`, else zeros. Both bf16 microkernels' (this one's
/// and `widened.rs`'), with [`store_sums`].
#[inline]
#[target_feature(enable = "avx512f")]
pub(super) fn held_sums<const R: usize>(out: &[f32], stride: usize, accumulate: bool) -> [[__m512; 2]; R] {
    // Every row's 32 sums lie inside `out`: the loads here and the stores of `store_sums` stay in
    // bounds.
    assert!(out.len() >= (R - 1) * stride + NR, "bf16 tile output too short");
    let mut acc = [[_mm512_setzero_ps(); 2]; R];
    if accumulate {
        for (r, acc) in acc.iter_mut().enumerate() {
            let held = &out[r * stride..r * stride + NR];
            // SAFETY: `held` is 32 f32 = two 64-byte vectors; `loadu` needs no alignment.
            *acc = unsafe { [_mm512_loadu_ps(held.as_ptr()), _mm512_loadu_ps(held[16..].as_ptr())] };
        }
    }
    acc
}

/// The tile's sums into `out`'s rows (`stride` apart), over what they held.
#[inline]
#[target_feature(enable = "avx512f")]
pub(super) fn store_sums<const R: usize>(acc: &[[__m512; 2]; R], out: &mut [f32], stride: usize) {
    for (r, acc) in acc.iter().enumerate() {
        let dst = &mut out[r * stride..r * stride + NR];
        // SAFETY: `dst` is 32 f32 = two 64-byte vectors; `storeu` needs no alignment.
        unsafe {
            _mm512_storeu_ps(dst.as_mut_ptr(), acc[0]);
            _mm512_storeu_ps(dst[16..].as_mut_ptr(), acc[1]);
        }
    }
}
