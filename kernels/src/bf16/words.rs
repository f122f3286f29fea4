//! bf16 and f16 rounding in portable code, shared by the weights' packing and portable tiles
//! (`mod.rs`) and the rows product (`rows.rs`) without either importing the other's module: one
//! value, a depth pair's word, and back; and the powers of two the f16 kernel scales by.

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
pub(super) fn pair_word(pair: &[f32]) -> u32 {
    let lo = u32::from(to_bf16(pair[0]));
    let hi = pair.get(1).map_or(0, |&v| u32::from(to_bf16(v)));
    lo | hi << 16
}

/// The f32 value of bf16 bits.
pub(super) fn from_bf16(bits: u16) -> f32 {
    f32::from_bits(u32::from(bits) << 16)
}

/// `v` rounded to f16 (to nearest, ties to even; past f16's largest finite value to ±∞;
/// subnormal f16 kept), as its 16 bits; NaN stays NaN. From f64, so that a sum of f16 products
/// computed in f64 (exact there) is rounded once, as `vfmadd…ph` rounds it.
pub(super) fn to_f16(v: f64) -> u16 {
    let sign = if v.is_sign_negative() { 0x8000 } else { 0 };
    let size = v.abs();
    if size.is_nan() {
        return sign | 0x7e00;
    }
    // 65520 lies halfway between the largest finite f16 (65504, odd) and 2^16: it rounds up.
    if size >= 65520.0 {
        return sign | 0x7c00;
    }
    // The exponent of the f16 interval `size` lies in; below 2^-14 the subnormal one, whose
    // quantum, 2^-24, is the smallest normal interval's too.
    let exponent = ((size.to_bits() >> 52) as i32 - 1023).max(-14);
    // `size` in quanta of that interval (a power of two: exact), rounded to an integer; a
    // normal value's 1024..=2048 quanta encode as the exponent field plus the mantissa, 2048
    // carrying into the next exponent, a subnormal's 0..=1024 as themselves.
    let quanta = (size * pow2(10 - exponent)).round_ties_even() as u32;
    let bits = if quanta < 1024 {
        quanta
    } else {
        (((exponent + 15) as u32) << 10) + quanta - 1024
    };
    sign | bits as u16
}

/// The value of f16 bits (exact in f32).
pub(super) fn from_f16(bits: u16) -> f32 {
    let sign = if bits & 0x8000 != 0 { -1.0 } else { 1.0 };
    let (exponent, mantissa) = (i32::from((bits >> 10) & 0x1f), f32::from(bits & 0x3ff));
    sign * match exponent {
        0 => mantissa * pow2(-24) as f32,
        31 if mantissa == 0.0 => f32::INFINITY,
        31 => f32::NAN,
        _ => (1024.0 + mantissa) * pow2(exponent - 25) as f32,
    }
}

/// `2^exponent`, exactly (`exponent` inside f64's normal range).
fn pow2(exponent: i32) -> f64 {
    f64::from_bits(((exponent + 1023) as u64) << 52)
}

/// The power of two `2^shift` that the f16 kernel multiplies a row or a panel of weights by before
/// rounding them to f16, so that its largest finite magnitude `peak` lands in `[2^top, 2^(top + 1))`
/// (1 when `peak` is zero); within ±126, so that `2^shift` and `2^-shift` are normal f32.
pub(super) fn f16_shift(peak: f32, top: i32) -> i32 {
    if peak == 0.0 {
        return 0;
    }
    let exponent = ((peak.to_bits() >> 23) & 0xff) as i32 - 127;
    (top - exponent).clamp(-126, 126)
}

/// The largest finite magnitude among `values` (0 if none): NaN and ±∞ leave the scale alone.
pub(super) fn finite_peak(values: &[f32]) -> f32 {
    values
        .iter()
        .map(|v| v.abs())
        .filter(|v| v.is_finite())
        .fold(0.0, f32::max)
}

/// `2^shift` as f32 (`shift` within ±126).
pub(super) fn pow2_f32(shift: i32) -> f32 {
    f32::from_bits(((shift + 127) as u32) << 23)
}
