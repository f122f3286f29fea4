//! The AVX-VNNI micro-kernel: the VEX-encoded, 256-bit `vpdpbusd` on the same packed quad panels
//! and activation tiles as the AVX512-VNNI one, so the two give the same sums exactly. As there,
//! std's intrinsic needs code compiled for the feature, entered through a token that exists only
//! once run-time detection found it.

// Entering a `#[target_feature]` function and unaligned vector loads and stores are `unsafe`;
// each use says why it holds.
#![allow(unsafe_code)]

use std::arch::x86_64::{
    __m128i, __m256, __m256i, _CMP_UNORD_Q, _mm_add_ps, _mm_fmadd_ps, _mm_loadu_ps, _mm_loadu_si128, _mm_mul_ps,
    _mm_set1_ps, _mm_storel_epi64, _mm_storeu_ps, _mm256_add_pd, _mm256_add_ps, _mm256_and_si256,
    _mm256_castsi256_si128, _mm256_cmp_ps, _mm256_cvtepi32_pd, _mm256_cvtpd_ps, _mm256_cvtps_epi32,
    _mm256_dpbusd_avx_epi32, _mm256_loadu_ps, _mm256_loadu_si256, _mm256_max_ps, _mm256_min_ps, _mm256_movemask_ps,
    _mm256_mul_pd, _mm256_mul_ps, _mm256_or_ps, _mm256_permutevar8x32_epi32, _mm256_set1_epi32, _mm256_set1_pd,
    _mm256_set1_ps, _mm256_setr_epi8, _mm256_setr_epi32, _mm256_setzero_ps, _mm256_setzero_si256, _mm256_shuffle_epi8,
    _mm256_srli_epi32, _mm256_storeu_ps, _mm256_storeu_si256, _mm256_sub_pd,
};

use std::mem::MaybeUninit;

use super::activations::{RowQuant, round_small, row_levels};
use super::combine::Combine;
use super::layout::QuadTileCall;
use super::layout::{MR_Q, NR_Q};
use crate::driver::Prefetch;

/// Plane rows per register block: four accumulators (32 columns) each, 12 of the 16 ymm
/// registers, and one for each row's broadcast activation quad; the weights are read from
/// memory by each `vpdpbusd`.
const BLOCK_ROWS: usize = 3;

/// Proof that this CPU has AVX2, FMA and AVX-VNNI.
#[derive(Clone, Copy)]
pub(super) struct AvxVnni(());

impl AvxVnni {
    pub(super) fn try_new() -> Option<Self> {
        let has = std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma")
            && std::arch::is_x86_feature_detected!("avxvnni");
        has.then_some(Self(()))
    }

    /// [`super::activations::quantize_row`] with AVX2: the same levels, bytes and quantization
    /// exactly.
    pub(super) fn quantize_row(
        self,
        row: &[f32],
        levels: f32,
        hi: &mut [u8],
        lo: Option<&mut [u8]>,
    ) -> Option<RowQuant> {
        // SAFETY: an `AvxVnni` exists only where `try_new` detected every feature it is compiled for.
        unsafe { quantize_row(row, levels, hi, lo) }
    }

    /// [`Combine::scalar`] with AVX2 (4 columns at a time, the integer sums exact in f64):
    /// the same floats.
    pub(super) fn combine(self, combine: &Combine<'_>, dst: &mut [MaybeUninit<f32>]) {
        // SAFETY: as in `quantize_row`.
        unsafe { combine_row(combine, dst) }
    }

    /// One tile of `rows` (at most `MR_Q`) plane rows, in blocks of `BLOCK_ROWS`: each block
    /// reads the tile's panel slice again, from L1.
    pub(super) fn tile(self, rows: usize, call: QuadTileCall<'_>) {
        let QuadTileCall {
            x,
            panel,
            out,
            stride,
            accumulate,
            prefetch,
        } = call;
        let rows = rows.min(MR_Q);
        let mut first = 0;
        while first < rows {
            let height = BLOCK_ROWS.min(rows - first);
            let from = (first * stride).min(out.len());
            // The block's rows from its first: `out` from that row's sums on.
            let block = QuadTileCall {
                x,
                panel,
                out: &mut out[from..],
                stride,
                accumulate,
                // The call's prefetch once, with its first block.
                prefetch: if first == 0 { prefetch } else { Prefetch::NONE },
            };
            // SAFETY: an `AvxVnni` exists only where `try_new` detected every feature
            // `block_rows` is compiled for.
            unsafe {
                match height {
                    3 => block_rows::<3>(block, first),
                    2 => block_rows::<2>(block, first),
                    _ => block_rows::<1>(block, first),
                }
            }
            first += height;
        }
    }
}

/// The row's range (zero included) 8 lanes at a time, NaN and infinities refused, then its
/// levels; the portable code's tail past the last 8.
#[target_feature(enable = "avx2,fma")]
fn quantize_row(row: &[f32], levels: f32, hi: &mut [u8], lo: Option<&mut [u8]>) -> Option<RowQuant> {
    let body = row.len() - row.len() % 8;
    let (mut min, mut max, mut nan) = (_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps());
    for c in (0..body).step_by(8) {
        let v = load8(row, c);
        nan = _mm256_or_ps(nan, _mm256_cmp_ps::<_CMP_UNORD_Q>(v, v));
        min = _mm256_min_ps(min, v);
        max = _mm256_max_ps(max, v);
    }
    if _mm256_movemask_ps(nan) != 0 {
        return None;
    }
    let (mut lows, mut highs) = ([0f32; 8], [0f32; 8]);
    // SAFETY: each array is 8 f32 = 32 bytes; `storeu` needs no alignment.
    unsafe {
        _mm256_storeu_ps(lows.as_mut_ptr(), min);
        _mm256_storeu_ps(highs.as_mut_ptr(), max);
    }
    let (mut min, mut max) = (
        lows.into_iter().fold(0f32, f32::min),
        highs.into_iter().fold(0f32, f32::max),
    );
    for &v in &row[body..] {
        if v.is_nan() {
            return None;
        }
        min = min.min(v);
        max = max.max(v);
    }
    if !(min.is_finite() && max.is_finite()) || min == max {
        return None;
    }
    Some(quantize_levels(row, (min, max), levels, hi, lo))
}

/// 8 lanes at a time as [`super::activations::quantize_levels`]: a product and a sum rounded apart
/// (no fused multiply-add), clamped, then `cvtps2dq`'s round to nearest even, which `round_small`
/// also computes.
#[target_feature(enable = "avx2,fma")]
fn quantize_levels(
    row: &[f32],
    (min, max): (f32, f32),
    levels: f32,
    hi: &mut [u8],
    mut lo: Option<&mut [u8]>,
) -> RowQuant {
    assert!(
        hi.len() >= row.len() && lo.as_ref().is_none_or(|lo| lo.len() >= row.len()),
        "quantized row too short"
    );
    let (quant, inverse, zero) = row_levels(min, max, levels);
    let (inverse_v, zero_v, top) = (_mm256_set1_ps(inverse), _mm256_set1_ps(zero), _mm256_set1_ps(levels));
    let low_byte = _mm256_set1_epi32(0xff);
    let body = row.len() - row.len() % 8;
    for c in (0..body).step_by(8) {
        let level = _mm256_min_ps(
            _mm256_max_ps(
                _mm256_add_ps(_mm256_mul_ps(load8(row, c), inverse_v), zero_v),
                _mm256_setzero_ps(),
            ),
            top,
        );
        let u = _mm256_cvtps_epi32(level);
        match lo.as_deref_mut() {
            Some(lo) => {
                store_low_bytes(hi, c, _mm256_srli_epi32::<8>(u));
                store_low_bytes(lo, c, _mm256_and_si256(u, low_byte));
            }
            None => store_low_bytes(hi, c, u),
        }
    }
    let q = |v: f32| round_small((v * inverse + zero).clamp(0.0, levels)) as u32;
    for (c, &v) in row.iter().enumerate().skip(body) {
        let u = q(v);
        match lo.as_deref_mut() {
            Some(lo) => {
                hi[c] = (u >> 8) as u8;
                lo[c] = (u & 0xff) as u8;
            }
            None => hi[c] = u as u8,
        }
    }
    quant
}

/// `values[at .. at + 8]`.
#[target_feature(enable = "avx2")]
fn load8(values: &[f32], at: usize) -> __m256 {
    let values = &values[at..at + 8];
    // SAFETY: `values` is 8 f32 = 32 bytes; `loadu` needs no alignment.
    unsafe { _mm256_loadu_ps(values.as_ptr()) }
}

/// The low byte of each of the 8 i32 lanes of `u` (each at most 255) to `dst[at .. at + 8]`.
#[target_feature(enable = "avx2")]
fn store_low_bytes(dst: &mut [u8], at: usize, u: __m256i) {
    // Bytes 0, 4, 8, 12 of each 128-bit lane to the lane's first dword, then those two dwords
    // side by side.
    let gather = _mm256_setr_epi8(
        0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1,
        -1, -1, -1,
    );
    let packed = _mm256_permutevar8x32_epi32(
        _mm256_shuffle_epi8(u, gather),
        _mm256_setr_epi32(0, 4, 0, 0, 0, 0, 0, 0),
    );
    let dst = &mut dst[at..at + 8];
    // SAFETY: `dst` is 8 bytes; `storel_epi64` writes the low 8 bytes, unaligned.
    unsafe { _mm_storel_epi64(dst.as_mut_ptr().cast::<__m128i>(), _mm256_castsi256_si128(packed)) };
}

/// 4 columns at a time: the integer part `256·hi + lo − zero·Σw` in f64, where every term and
/// sum is an integer below 2⁵³ (so exact, as the portable code's i64), rounded once to f32 as
/// the portable `i64 as f32`; then the same float operations in the same order.
#[target_feature(enable = "avx2,fma")]
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
    let sx = _mm_set1_ps(sx);
    // zero ≤ 65535, |Σw| ≤ 127·k: their product is exact in f64.
    let zero = _mm256_set1_pd(zero as f64);
    let body = width - width % 4;
    for c in (0..body).step_by(4) {
        let load = |values: &[i32]| {
            let values = &values[c..c + 4];
            // SAFETY: `values` is 4 i32 = 16 bytes; `loadu` needs no alignment.
            _mm256_cvtepi32_pd(unsafe { _mm_loadu_si128(values.as_ptr().cast::<__m128i>()) })
        };
        let load_f32 = |values: &[f32]| {
            let values = &values[c..c + 4];
            // SAFETY: as in `load`, for 4 f32.
            unsafe { _mm_loadu_ps(values.as_ptr()) }
        };
        let mut acc = load(combine.hi);
        if let Some(lo) = combine.lo {
            acc = _mm256_add_pd(_mm256_mul_pd(acc, _mm256_set1_pd(256.0)), load(lo));
        }
        acc = _mm256_sub_pd(acc, _mm256_mul_pd(zero, load(combine.corrections)));
        let scales = load_f32(combine.scales);
        let mut out = _mm_mul_ps(_mm256_cvtpd_ps(acc), _mm_mul_ps(sx, scales));
        if let Some(exact) = combine.outliers {
            out = _mm_fmadd_ps(load_f32(exact), scales, out);
        }
        if let Some(bias) = combine.bias {
            out = _mm_add_ps(out, load_f32(bias));
        }
        let dst = &mut dst[c..c + 4];
        // SAFETY: `dst` is 4 f32; `storeu` needs no alignment.
        unsafe { _mm_storeu_ps(dst.as_mut_ptr().cast::<f32>(), out) };
    }
    for (c, o) in dst.iter_mut().enumerate().skip(body) {
        o.write(combine.column(c));
    }
}

/// Plane rows `first .. first + R` of a tile's activations (`MR_Q` words per quad) times its
/// panel slice, into `out` (from row `first`'s sums, rows `stride` apart): `R × 4` i32
/// accumulator registers (32 columns per row); per depth quad, one broadcast activation word
/// per row and `vpdpbusd` of it by each 32-byte quarter of the panel row.
#[target_feature(enable = "avx2,avxvnni")]
fn block_rows<const R: usize>(block: QuadTileCall<'_>, first: usize) {
    let QuadTileCall {
        x,
        panel,
        out,
        stride,
        accumulate,
        prefetch,
    } = block;
    const { assert!(R >= 1 && R <= MR_Q && NR_Q == 32) };
    assert!(first + R <= MR_Q, "block past the tile's rows");
    // Every row's 32 sums lie inside `out`: the loads and stores below stay in bounds.
    assert!(out.len() >= (R - 1) * stride + NR_Q, "quad tile output too short");
    let mut acc = [[_mm256_setzero_si256(); 4]; R];
    if accumulate {
        for (r, acc) in acc.iter_mut().enumerate() {
            let held = &out[r * stride..r * stride + NR_Q];
            for (j, acc) in acc.iter_mut().enumerate() {
                // SAFETY: `held` is 32 i32; quarter `j` is 8 of them (32 bytes); `loadu` needs
                // no alignment.
                *acc = unsafe { _mm256_loadu_si256(held[8 * j..].as_ptr().cast::<__m256i>()) };
            }
        }
    }
    for (i, (w, a)) in panel.chunks_exact(4 * NR_Q).zip(x.chunks_exact(MR_Q)).enumerate() {
        prefetch.step(i);
        let words: [__m256i; R] = std::array::from_fn(|r| _mm256_set1_epi32(a[first + r] as i32));
        for j in 0..4 {
            // SAFETY: `w` is 128 bytes; quarter `j` is 32 of them; `loadu` needs no alignment.
            let quarter = unsafe { _mm256_loadu_si256(w[32 * j..].as_ptr().cast::<__m256i>()) };
            for r in 0..R {
                acc[r][j] = _mm256_dpbusd_avx_epi32(acc[r][j], words[r], quarter);
            }
        }
    }
    for (r, acc) in acc.iter().enumerate() {
        let dst = &mut out[r * stride..r * stride + NR_Q];
        for (j, acc) in acc.iter().enumerate() {
            // SAFETY: as for the loads, into `dst`.
            unsafe { _mm256_storeu_si256(dst[8 * j..].as_mut_ptr().cast::<__m256i>(), *acc) };
        }
    }
}
