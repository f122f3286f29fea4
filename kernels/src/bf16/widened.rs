//! The bf16 weights' products with f32 multiply-adds (AVX-512F): each depth pair's weight words
//! widened to two f32 registers in place (a shift and a mask), the activation rows rounded to bf16
//! once and laid out as f32, one `vfmadd` per depth. For CPUs whose `vdpbf16ps` does not pay:
//! Intel's (Emerald Rapids runs one every two cycles against two FMAs a cycle, measured in
//! docs/benchmarks/notes.md: 16 products a cycle against the FMAs' 32), and AVX-512 CPUs without
//! AVX512_BF16. The weights stay half the size of f32's.

// Entering a `#[target_feature]` function and unaligned vector loads and stores are `unsafe`;
// each use says why it holds.
#![allow(unsafe_code)]

use std::arch::x86_64::{
    __m512, __m512i, _CMP_UNORD_Q, _mm512_add_epi32, _mm512_and_si512, _mm512_castsi512_ps, _mm512_cmp_ps_mask,
    _mm512_fmadd_ps, _mm512_loadu_si512, _mm512_mask_blend_epi32, _mm512_maskz_loadu_ps, _mm512_or_si512,
    _mm512_set1_epi32, _mm512_set1_ps, _mm512_slli_epi32, _mm512_srli_epi32, _mm512_storeu_si512,
};

use super::avx512::{held_sums, store_sums};
use super::tile::{Bf16TileCall, MW, NR, tile_of_rows};

/// Proof that this CPU has AVX-512F.
#[derive(Clone, Copy, Debug)]
pub(super) struct Widened(());

impl Widened {
    pub(super) fn try_new() -> Option<Self> {
        std::arch::is_x86_feature_detected!("avx512f").then_some(Self(()))
    }

    /// One row's values rounded to bf16 (as [`super::words::to_bf16`], NaN and subnormal values
    /// included), as f32 bits, into `dst[0]`, `dst[step]`, `dst[2·step]`, ….
    pub(super) fn pack_row(self, row: &[f32], dst: &mut [u32], step: usize) {
        // SAFETY: a `Widened` exists only where `try_new` detected AVX-512F.
        unsafe { pack_row(row, dst, step) }
    }

    /// One tile of `rows` (at most `MW`) rows.
    pub(super) fn tile(self, rows: usize, call: Bf16TileCall<'_>) {
        // SAFETY: as in `pack_row`.
        unsafe { tile_of_rows!(tile_rows, rows, call) }
    }
}

/// 16 values at a time: round to nearest even by adding `0x7fff` and the kept part's last bit,
/// then clear the low half; NaN keeps its high half, quieted (`to_bf16`'s rule, bit for bit).
#[target_feature(enable = "avx512f")]
fn pack_row(row: &[f32], dst: &mut [u32], step: usize) {
    let high = _mm512_set1_epi32(0xffff_0000_u32 as i32);
    let mut words = [0u32; 16];
    for (i, chunk) in row.chunks(16).enumerate() {
        // SAFETY: only the lanes inside `chunk` are read (a masked load).
        let v = unsafe { _mm512_maskz_loadu_ps(lanes(chunk.len()), chunk.as_ptr()) };
        let bits = as_int(v);
        let last = _mm512_and_si512(_mm512_srli_epi32::<16>(bits), _mm512_set1_epi32(1));
        let rounded = _mm512_add_epi32(bits, _mm512_add_epi32(last, _mm512_set1_epi32(0x7fff)));
        let quiet = _mm512_or_si512(bits, _mm512_set1_epi32(0x0040_0000));
        let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(v, v);
        let out = _mm512_and_si512(_mm512_mask_blend_epi32(nan, rounded, quiet), high);
        // SAFETY: `words` is 16 u32 = one 64-byte vector; `storeu` needs no alignment.
        unsafe { _mm512_storeu_si512(words.as_mut_ptr().cast::<__m512i>(), out) };
        for (j, &word) in words.iter().enumerate().take(chunk.len()) {
            dst[(16 * i + j) * step] = word;
        }
    }
}

/// The mask of the first `count` (at most 16) lanes.
fn lanes(count: usize) -> u16 {
    ((1u32 << count.min(16)) - 1) as u16
}

/// f32 lanes as integer bits.
#[inline(always)]
fn as_int(v: __m512) -> __m512i {
    // SAFETY: both are 512-bit plain vectors; every bit pattern is a valid integer vector.
    unsafe { std::mem::transmute::<__m512, __m512i>(v) }
}

/// `R × 2` f32 accumulator registers (32 columns per row). Per depth pair, the two weight
/// registers of pair words give the even depth's values (shifted into the high half) and then the
/// odd depth's (the high half kept): two widened registers live at a time, each used by `R`
/// multiply-adds whose activation is broadcast from memory. Per output, the sum runs depth by
/// depth, one rounding each (the portable twin's order).
#[target_feature(enable = "avx512f")]
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
    const { assert!(R >= 1 && R <= MW && NR == 32) };
    let high = _mm512_set1_epi32(0xffff_0000_u32 as i32);
    let mut acc = held_sums::<R>(out, stride, accumulate);
    for (i, (w, a)) in panel.chunks_exact(2 * NR).zip(x.chunks_exact(2 * MW)).enumerate() {
        prefetch.step(i);
        // SAFETY: `w` is 64 u16 = two 64-byte vectors; `loadu` needs no alignment.
        let (w0, w1) = unsafe {
            (
                _mm512_loadu_si512(w.as_ptr().cast::<__m512i>()),
                _mm512_loadu_si512(w[32..].as_ptr().cast::<__m512i>()),
            )
        };
        let (even, odd) = a.split_at(MW);
        let (e0, e1) = (
            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(w0)),
            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(w1)),
        );
        for r in 0..R {
            let v = _mm512_set1_ps(f32::from_bits(even[r]));
            acc[r][0] = _mm512_fmadd_ps(v, e0, acc[r][0]);
            acc[r][1] = _mm512_fmadd_ps(v, e1, acc[r][1]);
        }
        let (o0, o1) = (
            _mm512_castsi512_ps(_mm512_and_si512(w0, high)),
            _mm512_castsi512_ps(_mm512_and_si512(w1, high)),
        );
        for r in 0..R {
            let v = _mm512_set1_ps(f32::from_bits(odd[r]));
            acc[r][0] = _mm512_fmadd_ps(v, o0, acc[r][0]);
            acc[r][1] = _mm512_fmadd_ps(v, o1, acc[r][1]);
        }
    }
    store_sums(&acc, out, stride);
}
