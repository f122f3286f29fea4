//! Integer sums to float outputs: per row, `(acc − zero·Σw) · sx · sw (+ outliers · sw) (+ bias)`,
//! written in place into the row's columns, and the outliers' exact products beside: one block's
//! operands (`Combine`, `OutlierProducts`) and their portable code; the SIMD combines are in `vnni`
//! and `avx_vnni`, and `mod.rs` runs a product's blocks through them.

use std::mem::MaybeUninit;

use super::activations::RowQuant;
use super::layout::NR_Q;

/// The outliers' exact part of one output row over a column block: `Σ_j x_j · w(j, c)` in f32,
/// `w` the quantized weights (the column scale applied in [`Combine`]) read from the packed quad
/// panels, the outliers in depth order, one fused multiply-add each.
pub(super) struct OutlierProducts<'a> {
    /// The block's panels on (`quads · 4 · NR_Q` bytes each).
    pub(super) panels: &'a [i8],
    pub(super) quads: usize,
    pub(super) outliers: &'a [(u32, f32)],
}

impl OutlierProducts<'_> {
    /// Into `out` (a whole number of panels' columns).
    pub(super) fn scalar(&self, out: &mut [f32]) {
        let panel_bytes = self.quads * 4 * NR_Q;
        for (p, out) in out.chunks_exact_mut(NR_Q).enumerate() {
            let panel = &self.panels[p * panel_bytes..(p + 1) * panel_bytes];
            for (c, o) in out.iter_mut().enumerate() {
                *o = self.outliers.iter().fold(0f32, |acc, &(depth, v)| {
                    let depth = depth as usize;
                    let w = panel[(depth / 4) * 4 * NR_Q + 4 * c + depth % 4];
                    v.mul_add(f32::from(w), acc)
                });
            }
        }
    }
}

/// One output row of a quad-layout product from its integer sums: `(acc − zero·Σw) · sx · sw
/// (+ outliers · sw) (+ b)`, `acc` the sums of the 8-bit plane, or `256·hi + lo` of the two 16-bit
/// planes.
pub(super) struct Combine<'a> {
    pub(super) hi: &'a [i32],
    pub(super) lo: Option<&'a [i32]>,
    /// `Σ_d w(d, c)` per column, or empty (the pair layout: symmetric activations, no zero point).
    pub(super) corrections: &'a [i32],
    pub(super) scales: &'a [f32],
    pub(super) bias: Option<&'a [f32]>,
    pub(super) quant: RowQuant,
    /// The outliers' exact products ([`OutlierProducts`]), one per column, when the row has any.
    pub(super) outliers: Option<&'a [f32]>,
}

impl Combine<'_> {
    /// Output column `c`, as the SIMD combine computes it (the portable code, and the tails).
    #[inline(always)]
    pub(super) fn column(&self, c: usize) -> f32 {
        let RowQuant { scale: sx, zero, .. } = self.quant;
        let mut acc = i64::from(self.hi[c]);
        if let Some(lo) = self.lo {
            acc = 256 * acc + i64::from(lo[c]);
        }
        if let Some(&sum) = self.corrections.get(c) {
            acc -= zero * i64::from(sum);
        }
        let mut out = acc as f32 * (sx * self.scales[c]);
        if let Some(exact) = self.outliers {
            out = exact[c].mul_add(self.scales[c], out);
        }
        match self.bias {
            Some(bias) => out + bias[c],
            None => out,
        }
    }

    /// Every column of the row into `dst` (written, not added to: it may not be initialised).
    pub(super) fn scalar(&self, dst: &mut [MaybeUninit<f32>]) {
        for (c, o) in dst.iter_mut().enumerate() {
            o.write(self.column(c));
        }
    }
}
