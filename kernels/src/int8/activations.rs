//! Activation rows to integer levels at each call: the pair layout's symmetric i16 levels, the quad
//! layout's u8 planes (one, or two for 16 bits) between each row's minimum and maximum, and the
//! 8-bit rows with their largest-magnitude values held apart (outliers): the portable passes here,
//! the AVX-512 and AVX2 ones in `vnni` and `avx_vnni` (the same levels exactly).

use rayon::prelude::*;

#[cfg(target_arch = "x86_64")]
use super::quads::QuadSimd;
use super::{Int8Kernel, MR, MR_Q, Panels, QuantizedWeight};
use crate::amx::{TILE_ROWS, row_stride};

/// How a u8 × s8 (quad layout) product quantizes its activation rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Int8Activations {
    /// 8 bits: 256 levels between the row's minimum and maximum (zero included).
    U8,
    /// 8 bits over the range of the row *without* its largest-magnitude values (at most this many
    /// per row): those are set to the zero point's level and added back exactly, in f32, from the
    /// same packed weights (`Σ x_j · w(j, c)` over the outliers) when the sums are combined.
    U8Outliers(u16),
    /// 16 bits, as a high and a low u8 plane: 65536 levels, twice the dot products.
    U16,
}

impl Int8Activations {
    /// Outliers per row of `u8o` when the count is not given.
    pub const DEFAULT_OUTLIERS: u16 = 4;

    /// 8 bits with [`Self::DEFAULT_OUTLIERS`] outliers per row.
    pub const U8_OUTLIERS: Self = Self::U8Outliers(Self::DEFAULT_OUTLIERS);

    /// Parses `u8`, `u16`, `u8o` (8 bits with the default outlier count) or `u8o:N` (N outliers
    /// per row, 1 to 256).
    pub fn parse(text: &str) -> Result<Self, String> {
        let text = text.trim().to_ascii_lowercase();
        match text.as_str() {
            "u8" | "8" => Ok(Self::U8),
            "u16" | "16" => Ok(Self::U16),
            "u8o" => Ok(Self::U8_OUTLIERS),
            _ => match text.strip_prefix("u8o:").map(str::parse::<u16>) {
                Some(Ok(count @ 1..=256)) => Ok(Self::U8Outliers(count)),
                _ => Err(format!(
                    "unknown int8 activations '{text}'; expected u8, u16, u8o or u8o:N (1 ≤ N ≤ 256 outliers per row)"
                )),
            },
        }
    }

    pub(super) fn planes(self) -> usize {
        match self {
            Self::U8 | Self::U8Outliers(_) => 1,
            Self::U16 => 2,
        }
    }

    pub(super) fn levels(self) -> f32 {
        match self {
            Self::U8 | Self::U8Outliers(_) => 255.0,
            Self::U16 => 65535.0,
        }
    }

    /// Largest-magnitude values per row taken out of the 8-bit range.
    pub(super) fn outliers(self) -> usize {
        match self {
            Self::U8Outliers(count) => usize::from(count),
            Self::U8 | Self::U16 => 0,
        }
    }
}

/// `u8`, `u16` or `u8o:N`: what [`Int8Activations::parse`] reads back.
impl std::fmt::Display for Int8Activations {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::U8 => f.write_str("u8"),
            Self::U16 => f.write_str("u16"),
            Self::U8Outliers(count) => write!(f, "u8o:{count}"),
        }
    }
}

/// One activation row's quantization: `x ≈ scale · (u − zero)`, plus `outliers` values held apart
/// (8-bit activations with outliers); `scale` NaN for a row with a non-finite value, 0 for an
/// all-zero row (or one whose values are all outliers or zero).
#[derive(Clone, Copy, Default)]
pub(super) struct RowQuant {
    pub(super) scale: f32,
    pub(super) zero: i64,
    pub(super) outliers: u32,
}

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

    /// Quad layout: each row of `x` to unsigned levels between its minimum and maximum (zero
    /// included; with outliers, those of the row without them), as one (8-bit) or two (16-bit: high
    /// byte, then low byte) plane rows, packed as tiles of `MR_Q` plane rows: tile `t` holds, per
    /// depth quad, `MR_Q` u32 words of four u8 (zero past the rows and `k`). Returns the packed
    /// tiles, each row's quantization and its outliers (for AMX the plane rows one after another,
    /// `amx::row_stride` words apart, padded to 16 rows). With VNNI (and not `portable`) rows are
    /// quantized with AVX-512, to the same levels exactly.
    pub(super) fn quantize_quads(
        &self,
        x: &[f32],
        m: usize,
        bits: Int8Activations,
        portable: bool,
    ) -> (Vec<u32>, Vec<RowQuant>, RowOutliers) {
        let Panels::Quads { quads, .. } = &self.panels else {
            return (Vec::new(), vec![RowQuant::default(); m], RowOutliers::default());
        };
        let (k, quads) = (self.k, *quads);
        let planes = bits.planes();
        let levels = bits.levels();
        // A row of `k` values keeps at least one inside the range.
        let per_row = bits.outliers().min(k.saturating_sub(1));
        let plane_rows = m * planes;
        // AMX loads plane rows row by row, 16 at a time: its rows are padded to whole tiles (two
        // of these tiles of 8), and each row's words follow each other.
        let row_major = self.kernel == Int8Kernel::Amx;
        let (tiles, row_words) = if row_major {
            (plane_rows.next_multiple_of(TILE_ROWS) / MR_Q, row_stride(quads))
        } else {
            (plane_rows.div_ceil(MR_Q), quads)
        };
        let mut packed = vec![0u32; tiles * row_words * MR_Q];
        // MR_Q is a multiple of both plane counts, so a row's planes share one tile.
        let rows_per_tile = MR_Q / planes;
        let mut quants = vec![RowQuant::default(); tiles * rows_per_tile];
        let mut outliers = RowOutliers {
            per_row,
            held: vec![(0, 0.0); tiles * rows_per_tile * per_row.max(1)],
        };
        #[cfg(target_arch = "x86_64")]
        let simd = self.quad_simd(portable);
        #[cfg(not(target_arch = "x86_64"))]
        let _ = portable;
        packed
            .par_chunks_mut(row_words * MR_Q)
            .zip(quants.par_chunks_mut(rows_per_tile))
            .zip(outliers.held.par_chunks_mut(rows_per_tile * per_row.max(1)))
            .enumerate()
            .for_each(|(t, ((dst, quants), held))| {
                let first = t * rows_per_tile;
                // One row's levels as byte planes (high, then low), zero past `k`.
                let mut bytes = vec![0u8; planes * quads * 4];
                let mut magnitudes = Vec::new();
                #[cfg(target_arch = "x86_64")]
                let plain = |row: &[f32], hi: &mut [u8], lo: Option<&mut [u8]>| match simd {
                    Some(simd) => simd.quantize_row(row, levels, hi, lo),
                    None => quantize_row(row, levels, hi, lo),
                };
                #[cfg(not(target_arch = "x86_64"))]
                let plain = |row: &[f32], hi: &mut [u8], lo: Option<&mut [u8]>| quantize_row(row, levels, hi, lo);
                for (r, quant) in quants
                    .iter_mut()
                    .enumerate()
                    .take(rows_per_tile.min(m.saturating_sub(first)))
                {
                    let row = &x[(first + r) * k..(first + r + 1) * k];
                    let (hi_plane, lo_plane) = bytes.split_at_mut(quads * 4);
                    let lo_plane = (planes == 2).then_some(lo_plane);
                    let found = if per_row > 0 {
                        let held = &mut held[r * per_row..(r + 1) * per_row];
                        #[cfg(target_arch = "x86_64")]
                        let found = match simd.and_then(QuadSimd::avx512) {
                            Some(simd) => {
                                quantize_row_with_outliers(&simd, row, levels, hi_plane, held, &mut magnitudes)
                            }
                            None => quantize_row_with_outliers(&Portable, row, levels, hi_plane, held, &mut magnitudes),
                        };
                        #[cfg(not(target_arch = "x86_64"))]
                        let found = quantize_row_with_outliers(&Portable, row, levels, hi_plane, held, &mut magnitudes);
                        found
                    } else {
                        plain(row, hi_plane, lo_plane)
                    };
                    // A row with a non-finite value (NaN scale) or a constant one: its words stay zero.
                    let Some(found) = found else {
                        *quant = RowQuant {
                            scale: if row.iter().all(|v| v.is_finite()) {
                                0.0
                            } else {
                                f32::NAN
                            },
                            zero: 0,
                            outliers: 0,
                        };
                        continue;
                    };
                    *quant = found;
                    for (p, plane) in bytes.chunks_exact(quads * 4).enumerate() {
                        let plane_row = r * planes + p;
                        for (d, word) in plane.chunks_exact(4).enumerate() {
                            let at = if row_major {
                                plane_row * row_words + d
                            } else {
                                d * MR_Q + plane_row
                            };
                            dst[at] = u32::from_le_bytes([word[0], word[1], word[2], word[3]]);
                        }
                    }
                }
            });
        quants.truncate(m);
        (packed, quants, outliers)
    }
}

/// `v` rounded to the nearest integer (ties to even) for |v| < 2²², by adding and subtracting
/// 1.5 · 2²³: one float add each way where `f32::round` is a libm call per value on baseline
/// x86-64 (3% of an int8 forward's profile, and most of quantizing the weights at load). Every
/// value rounded here is a weight or activation level, |v| ≤ 65535.
#[inline(always)]
pub(super) fn round_small(v: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0;
    (v + MAGIC) - MAGIC
}

/// The range `(min, max)` of a row, with zero included; `None` if it holds a NaN or an infinity.
pub(super) fn row_range(row: &[f32]) -> Option<(f32, f32)> {
    let (lo, hi) = row.iter().fold((0f32, 0f32), |(lo, hi), &v| (lo.min(v), hi.max(v)));
    (lo.is_finite() && hi.is_finite() && !row.iter().any(|v| v.is_nan())).then_some((lo, hi))
}

/// The quantization of a row of range `(lo, hi)` (`lo ≤ 0 ≤ hi`, `lo < hi`) to `levels` levels:
/// `(scale, inverse, zero point)`.
pub(super) fn row_levels(lo: f32, hi: f32, levels: f32) -> (RowQuant, f32, f32) {
    let scale = (hi - lo) / levels;
    let inverse = levels / (hi - lo);
    // lo ≤ 0 ≤ hi, so the zero point is within 0..=levels.
    let zero = (-lo * inverse).round();
    (
        RowQuant {
            scale,
            zero: zero as i64,
            outliers: 0,
        },
        inverse,
        zero,
    )
}

/// One activation row of the quad layout to unsigned levels between its minimum and maximum
/// (zero included): the level of `row[d]` goes to byte `d` of `hi` (8-bit activations), or its high
/// byte to `hi` and its low byte to `lo` (16-bit). `None` (nothing written) for a row holding a
/// non-finite value or a constant row (all zeros).
pub(super) fn quantize_row(row: &[f32], levels: f32, hi: &mut [u8], lo: Option<&mut [u8]>) -> Option<RowQuant> {
    let (min, max) = row_range(row)?;
    if min == max {
        return None;
    }
    Some(quantize_levels(row, (min, max), levels, hi, lo))
}

/// [`quantize_row`] over the range `(min, max)` (`min ≤ 0 ≤ max`, `min < max`): values outside
/// it take the end levels.
pub(super) fn quantize_levels(
    row: &[f32],
    (min, max): (f32, f32),
    levels: f32,
    hi: &mut [u8],
    lo: Option<&mut [u8]>,
) -> RowQuant {
    let (quant, inverse, zero) = row_levels(min, max, levels);
    let q = |v: f32| round_small((v * inverse + zero).clamp(0.0, levels)) as u32;
    match lo {
        Some(lo) => {
            for ((&v, h), l) in row.iter().zip(hi.iter_mut()).zip(lo.iter_mut()) {
                let u = q(v);
                *h = (u >> 8) as u8;
                *l = (u & 0xff) as u8;
            }
        }
        None => {
            for (&v, h) in row.iter().zip(hi.iter_mut()) {
                *h = q(v) as u8;
            }
        }
    }
    quant
}

/// Each row's outliers: `(depth, value)`, at most `per_row` of them, in depth order, the row's
/// count in its [`RowQuant`]; row `r`'s from `r · per_row`.
#[derive(Default)]
pub(super) struct RowOutliers {
    pub(super) per_row: usize,
    pub(super) held: Vec<(u32, f32)>,
}

impl RowOutliers {
    pub(super) fn row(&self, row: usize, count: u32) -> &[(u32, f32)] {
        if count == 0 {
            // Also the layouts without outliers, which hold none.
            return &[];
        }
        let start = row * self.per_row;
        &self.held[start..start + count as usize]
    }
}

/// One 8-bit activation row with its largest-magnitude values held apart: the values whose
/// magnitude exceeds the `held.len() + 1`-th largest (so at most `held.len()` of them, ties kept
/// inside) leave the range, which becomes the other values' minimum and maximum (zero included);
/// their bytes are set to the zero point's level, which stands for exactly 0, and their values go
/// to `held` in depth order, to be added exactly by [`OutlierProducts`]. `passes` runs the passes
/// over the row (portable or AVX-512: the same results). `None` (nothing written) for a row
/// holding a non-finite value or an all-zero row.
pub(super) fn quantize_row_with_outliers(
    passes: &impl OutlierPasses,
    row: &[f32],
    levels: f32,
    bytes: &mut [u8],
    held: &mut [(u32, f32)],
    largest: &mut Vec<f32>,
) -> Option<RowQuant> {
    let apart = held.len().min(row.len().saturating_sub(1));
    let (min, max) = passes.scan(row, apart + 1, largest)?;
    if min == max {
        return None;
    }
    let bound = if apart == 0 { f32::INFINITY } else { largest[0] };
    let (lo, hi, count) = passes.clip(row, bound, held);
    let mut quant = if lo == hi {
        // Every value inside the range is zero: only the outliers count.
        bytes[..row.len()].fill(0);
        RowQuant::default()
    } else {
        passes.levels(row, (lo, hi), levels, bytes)
    };
    // The zero point is within 0..=levels (≤ 255).
    let zero = quant.zero as u8;
    for &(depth, _) in &held[..count] {
        bytes[depth as usize] = zero;
    }
    quant.outliers = count as u32;
    Some(quant)
}

/// The passes over a row of [`quantize_row_with_outliers`]: [`Portable`] code, or AVX-512 with
/// the same results exactly.
pub(super) trait OutlierPasses {
    /// The row's range (zero included), `None` if it holds a non-finite value; `largest` ends
    /// with the row's `count` largest magnitudes, ascending (see [`keep_largest`]).
    fn scan(&self, row: &[f32], count: usize, largest: &mut Vec<f32>) -> Option<(f32, f32)>;
    /// The range (zero included) of the values of magnitude at most `bound`; the others go to
    /// `held` (in depth order), and how many there are.
    fn clip(&self, row: &[f32], bound: f32, held: &mut [(u32, f32)]) -> (f32, f32, usize);
    /// [`quantize_levels`] to one plane.
    fn levels(&self, row: &[f32], range: (f32, f32), levels: f32, bytes: &mut [u8]) -> RowQuant;
}

/// Keeps the `count` largest magnitudes seen so far in `largest`, ascending: fills it first, then
/// a magnitude above the smallest kept replaces it. The multiset kept, so its smallest, does not
/// depend on the order the magnitudes come in.
#[inline(always)]
pub(super) fn keep_largest(largest: &mut Vec<f32>, count: usize, magnitude: f32) {
    if largest.len() < count {
        let at = largest.partition_point(|&t| t < magnitude);
        largest.insert(at, magnitude);
    } else if magnitude > largest[0] {
        let at = largest.partition_point(|&t| t < magnitude);
        largest.copy_within(1..at, 0);
        largest[at - 1] = magnitude;
    }
}

/// The portable [`OutlierPasses`] (other CPUs, and the reference of the AVX-512 ones in the tests).
pub(super) struct Portable;

impl OutlierPasses for Portable {
    fn scan(&self, row: &[f32], count: usize, largest: &mut Vec<f32>) -> Option<(f32, f32)> {
        largest.clear();
        for &v in row {
            keep_largest(largest, count, v.abs());
        }
        row_range(row)
    }

    fn clip(&self, row: &[f32], bound: f32, held: &mut [(u32, f32)]) -> (f32, f32, usize) {
        let (mut lo, mut hi, mut count) = (0f32, 0f32, 0);
        for (depth, &v) in row.iter().enumerate() {
            if v.abs() > bound {
                held[count] = (depth as u32, v);
                count += 1;
            } else {
                lo = lo.min(v);
                hi = hi.max(v);
            }
        }
        (lo, hi, count)
    }

    fn levels(&self, row: &[f32], range: (f32, f32), levels: f32, bytes: &mut [u8]) -> RowQuant {
        quantize_levels(row, range, levels, bytes, None)
    }
}
