//! The bf16 weights' products with f16 multiply-adds (AVX512-FP16): `vfmadd…ph` multiplies 32
//! f16 lanes an instruction at the f32 FMA's rate, twice its products. For Intel's Xeons from
//! Sapphire Rapids on where AMX's tiles are not available (hidden by a hypervisor, refused by
//! Linux): their `vdpbf16ps` runs at half the FMA's rate (docs/benchmarks/notes.md).
//!
//! The weights' bf16 values are held in f16 (exact: f16 has more mantissa bits, and each panel is
//! scaled by a power of two into f16's range, `tile::PANEL_PEAK`); each activation row is scaled
//! by a power of two (`tile::ROW_PEAK`) and rounded to f16 at each call. A depth's f16 products
//! are summed in f16 over [`FLUSH_PAIRS`] depth pairs, then multiplied back and added to the f32
//! sums in `out`: the scales bound every f16 sum below 2^15, half f16's largest value, whatever
//! the magnitudes of the rows and weights.

// Entering a `#[target_feature]` function, unaligned vector loads and stores, and the one f16
// instruction written as assembly are `unsafe`; each use says why it holds.
#![allow(unsafe_code)]

use std::arch::asm;
use std::arch::x86_64::{
    __m512i, _CMP_LT_OQ, _MM_FROUND_NO_EXC, _MM_FROUND_TO_NEAREST_INT, _mm512_abs_ps, _mm512_castsi512_si256,
    _mm512_cmp_ps_mask, _mm512_cvtepu16_epi32, _mm512_cvtph_ps, _mm512_cvtps_ph, _mm512_extracti64x4_epi64,
    _mm512_fmadd_ps, _mm512_loadu_ps, _mm512_loadu_si512, _mm512_mask_max_ps, _mm512_maskz_loadu_ps, _mm512_mul_ps,
    _mm512_or_si512, _mm512_reduce_max_ps, _mm512_set1_epi32, _mm512_set1_ps, _mm512_setzero_ps, _mm512_setzero_si512,
    _mm512_slli_epi32, _mm512_storeu_ps, _mm512_storeu_si512,
};

use super::tile::{Bf16TileCall, FLUSH_PAIRS, MW, NR, tile_of_rows};

/// Proof that this CPU has AVX-512F, AVX-512BW and AVX512-FP16.
#[derive(Clone, Copy, Debug)]
pub(super) struct Halves(());

impl Halves {
    pub(super) fn try_new() -> Option<Self> {
        let has = std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512fp16");
        has.then_some(Self(()))
    }

    /// The largest finite magnitude of `row` (NaN and ±∞ left out: they stay what they are).
    pub(super) fn peak(self, row: &[f32]) -> f32 {
        // SAFETY: a `Halves` exists only where `try_new` detected every feature `peak`,
        // `pack_row` and `tile_rows` are compiled for.
        unsafe { peak(row) }
    }

    /// `row` times `scale` (a power of two) rounded to f16, each value twice in its word, into
    /// `dst[0]`, `dst[step]`, `dst[2·step]`, ….
    pub(super) fn pack_row(self, row: &[f32], scale: f32, dst: &mut [u32], step: usize) {
        // SAFETY: as in `peak`.
        unsafe { pack_row(row, scale, dst, step) }
    }

    /// One tile of `rows` (at most `MW`) rows.
    pub(super) fn tile(self, rows: usize, call: Bf16TileCall<'_>) {
        // SAFETY: as in `pack_row`.
        unsafe { tile_of_rows!(tile_rows, rows, call) }
    }
}

/// 16 magnitudes at a time, those below ∞ (an ordered compare: not NaN) kept in the running
/// maximum.
#[target_feature(enable = "avx512f,avx512bw,avx512fp16")]
fn peak(row: &[f32]) -> f32 {
    let infinity = _mm512_set1_ps(f32::INFINITY);
    let mut peak = _mm512_setzero_ps();
    for chunk in row.chunks(16) {
        // SAFETY: only the lanes inside `chunk` are read (a masked load).
        let size = _mm512_abs_ps(unsafe { _mm512_maskz_loadu_ps(lanes(chunk.len()), chunk.as_ptr()) });
        peak = _mm512_mask_max_ps(peak, _mm512_cmp_ps_mask::<_CMP_LT_OQ>(size, infinity), peak, size);
    }
    _mm512_reduce_max_ps(peak)
}

/// 16 values at a time: each times the scale, rounded to nearest even by `vcvtps2ph` (the
/// portable `to_f16`, bit for bit), widened to words and doubled.
#[target_feature(enable = "avx512f,avx512bw,avx512fp16")]
fn pack_row(row: &[f32], scale: f32, dst: &mut [u32], step: usize) {
    let scale = _mm512_set1_ps(scale);
    let mut words = [0u32; 16];
    for (i, chunk) in row.chunks(16).enumerate() {
        // SAFETY: only the lanes inside `chunk` are read (a masked load).
        let v = _mm512_mul_ps(
            unsafe { _mm512_maskz_loadu_ps(lanes(chunk.len()), chunk.as_ptr()) },
            scale,
        );
        let halves = _mm512_cvtepu16_epi32(_mm512_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(v));
        let doubled = _mm512_or_si512(halves, _mm512_slli_epi32::<16>(halves));
        // SAFETY: `words` is 16 u32 = one 64-byte vector; `storeu` needs no alignment.
        unsafe { _mm512_storeu_si512(words.as_mut_ptr().cast::<__m512i>(), doubled) };
        for (j, &word) in words.iter().enumerate().take(chunk.len()) {
            dst[(16 * i + j) * step] = word;
        }
    }
}

/// The mask of the first `count` (at most 16) lanes.
fn lanes(count: usize) -> u16 {
    ((1u32 << count.min(16)) - 1) as u16
}

/// `R` f16 sum registers (32 columns per row, their bits held as integer vectors); per depth
/// pair, the even depth's weight register and the odd one's, each used by `R` multiply-adds whose
/// activation is broadcast from memory.
/// Every `FLUSH_PAIRS` pairs (and at the call's end) each sum register is widened to two f32
/// registers, multiplied by its row's scale and added to the row's sums in `out` (fused), and
/// restarted from zero: the f32 sums stay in memory, leaving the registers to 14 rows.
#[target_feature(enable = "avx512f,avx512bw,avx512fp16")]
fn tile_rows<const R: usize>(call: Bf16TileCall<'_>) {
    let Bf16TileCall {
        x,
        panel,
        out,
        stride,
        accumulate,
        scales,
        prefetch,
    } = call;
    const { assert!(R >= 1 && R <= MW && NR == 32) };
    // Every row's 32 sums lie inside `out`: the loads and stores below stay in bounds.
    assert!(
        out.len() >= (R - 1) * stride + NR && scales.len() >= R,
        "f16 tile output or scales too short"
    );
    if !accumulate {
        for r in 0..R {
            out[r * stride..r * stride + NR].fill(0.0);
        }
    }
    let mut step = 0;
    for (ws, xs) in panel.chunks(FLUSH_PAIRS * 2 * NR).zip(x.chunks(FLUSH_PAIRS * 2 * MW)) {
        let mut sums = [_mm512_setzero_si512(); R];
        for (w, a) in ws.chunks_exact(2 * NR).zip(xs.chunks_exact(2 * MW)) {
            prefetch.step(step);
            step += 1;
            // SAFETY: `w` is 64 u16 = two 64-byte vectors; `loadu` needs no alignment.
            let (even, odd) = unsafe {
                (
                    _mm512_loadu_si512(w.as_ptr().cast::<__m512i>()),
                    _mm512_loadu_si512(w[32..].as_ptr().cast::<__m512i>()),
                )
            };
            let (a_even, a_odd) = a.split_at(MW);
            for r in 0..R {
                multiply_add(&mut sums[r], _mm512_set1_epi32(a_even[r] as i32), even);
            }
            for r in 0..R {
                multiply_add(&mut sums[r], _mm512_set1_epi32(a_odd[r] as i32), odd);
            }
        }
        for (r, &bits) in sums.iter().enumerate() {
            let low = _mm512_cvtph_ps(_mm512_castsi512_si256(bits));
            let high = _mm512_cvtph_ps(_mm512_extracti64x4_epi64::<1>(bits));
            let scale = _mm512_set1_ps(scales[r]);
            let dst = &mut out[r * stride..r * stride + NR];
            // SAFETY: `dst` is 32 f32 = two 64-byte vectors; `loadu`/`storeu` need no alignment.
            unsafe {
                _mm512_storeu_ps(
                    dst.as_mut_ptr(),
                    _mm512_fmadd_ps(low, scale, _mm512_loadu_ps(dst.as_ptr())),
                );
                let dst = &mut dst[16..];
                _mm512_storeu_ps(
                    dst.as_mut_ptr(),
                    _mm512_fmadd_ps(high, scale, _mm512_loadu_ps(dst.as_ptr())),
                );
            }
        }
    }
}

/// `sum += a · b` in 32 f16 lanes, rounded once (`vfmadd231ph`), each register's bits as f16;
/// written as assembly because its intrinsic is stable only from Rust 1.94, above the workspace's
/// minimum.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512fp16")]
fn multiply_add(sum: &mut __m512i, a: __m512i, b: __m512i) {
    // SAFETY: the instruction exists on this CPU (this function is compiled for AVX512-FP16 and
    // called only from `tile_rows`, entered through a `Halves`); it reads and writes only these
    // three registers.
    unsafe {
        asm!(
            "vfmadd231ph {sum}, {a}, {b}",
            sum = inout(zmm_reg) *sum,
            a = in(zmm_reg) a,
            b = in(zmm_reg) b,
            options(pure, nomem, nostack, preserves_flags),
        );
    }
}
