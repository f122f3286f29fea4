//! bf16 rounding in portable code, shared by the weights' packing and portable tile (`mod.rs`) and
//! the rows product (`rows.rs`) without either importing the other's module: one value, a depth
//! pair's word, and back.

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
