//! Activation rows to integer levels at each call: the pair layout's symmetric i16 levels, the quad
//! layout's u8 planes (one, or two for 16 bits) between each row's minimum and maximum, and the
//! 8-bit rows with their largest-magnitude values held apart (outliers): the portable passes here,
//! the AVX-512 and AVX2 ones in `vnni` and `avx_vnni` (the same levels exactly).

/// One activation row's quantization: `x ≈ scale · (u − zero)`, plus `outliers` values held apart
/// (8-bit activations with outliers); `scale` NaN for a row with a non-finite value, 0 for an
/// all-zero row (or one whose values are all outliers or zero).
#[derive(Clone, Copy, Default)]
pub(super) struct RowQuant {
    pub(super) scale: f32,
    pub(super) zero: i64,
    pub(super) outliers: u32,
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
