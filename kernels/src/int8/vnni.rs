//! The AVX512-VNNI micro-kernel. std's `vpdpbusd` intrinsic is safe to call only from code compiled
//! for the feature, so the kernel is a `#[target_feature]` function, entered through a token that
//! exists only once run-time detection found the features.

// Entering a `#[target_feature]` function and unaligned vector loads and stores are `unsafe`;
// this module is the only place in the crate's kernels that needs it, each use says why it holds.
#![allow(unsafe_code)]

use std::arch::x86_64::{
    __m256, __m512, __m512i, _CMP_GT_OQ, _CMP_UNORD_Q, _mm_cvtsi32_si128, _mm256_add_ps, _mm256_fmadd_ps,
    _mm256_loadu_ps, _mm256_loadu_si256, _mm256_mul_ps, _mm256_set1_ps, _mm256_storeu_ps, _mm512_abs_ps,
    _mm512_add_epi64, _mm512_add_ps, _mm512_and_si512, _mm512_cmp_ps_mask, _mm512_cvtepi32_epi64, _mm512_cvtepi32_ps,
    _mm512_cvtepi64_ps, _mm512_cvtps_epi32, _mm512_dpbusd_epi32, _mm512_fmadd_ps, _mm512_loadu_ps, _mm512_loadu_si512,
    _mm512_mask_cmp_ps_mask, _mm512_mask_cvtepi32_storeu_epi8, _mm512_mask_max_ps, _mm512_mask_min_ps,
    _mm512_maskz_loadu_ps, _mm512_max_ps, _mm512_min_ps, _mm512_mul_epi32, _mm512_mul_ps, _mm512_mullo_epi32,
    _mm512_reduce_max_ps, _mm512_reduce_min_ps, _mm512_set1_epi32, _mm512_set1_epi64, _mm512_set1_ps,
    _mm512_setzero_ps, _mm512_setzero_si512, _mm512_sll_epi32, _mm512_slli_epi64, _mm512_srai_epi32, _mm512_srli_epi32,
    _mm512_storeu_ps, _mm512_storeu_si512, _mm512_sub_epi32, _mm512_sub_epi64,
};

use std::mem::MaybeUninit;

use super::activations::{OutlierPasses, RowQuant, keep_largest, row_levels};
use super::combine::{Combine, OutlierProducts};
use super::layout::QuadTileCall;
use super::layout::{MR_Q, NR_Q};

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

    /// [`super::activations::quantize_row`] with AVX-512: the same levels, bytes and quantization
    /// exactly.
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

    /// [`super::activations::quantize_levels`] with AVX-512: the same levels, bytes and
    /// quantization exactly.
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
    pub(super) fn combine(self, combine: &Combine<'_>, dst: &mut [MaybeUninit<f32>]) {
        // SAFETY: as in `quantize_row`.
        unsafe { combine_row(combine, dst) }
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
fn quantize_levels(row: &[f32], (min, max): (f32, f32), levels: f32, hi: &mut [u8], lo: Option<&mut [u8]>) -> RowQuant {
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
                    _mm512_mask_cvtepi32_storeu_epi8(lo[at..].as_mut_ptr().cast(), mask, _mm512_and_si512(u, low_byte));
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
fn combine_row(combine: &Combine<'_>, dst: &mut [MaybeUninit<f32>]) {
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
            _mm512_storeu_ps(dst[c..].as_mut_ptr().cast::<f32>(), out);
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
        unsafe { _mm256_storeu_ps(dst[c..].as_mut_ptr().cast::<f32>(), out) };
    }
    for (c, o) in dst.iter_mut().enumerate().skip(body) {
        o.write(combine.column(c));
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
