//! Integer sums to float outputs: per row, `(acc − zero·Σw) · sx · sw (+ outliers · sw) (+ bias)`,
//! written in place into the row's columns; the outliers' exact products beside.

use super::activations::{RowOutliers, RowQuant};
#[cfg(target_arch = "x86_64")]
use super::quads::QuadSimd;
use super::{NR, NR_Q, Panels, QuantizedWeight};
use crate::driver::ColumnRange;

impl QuantizedWeight {
    /// The float outputs of the column block from panel `first` on into `out` (`m` rows `stride`
    /// apart, the block's columns first in each), from its integer sums (`planes` rows of `stride`
    /// sums per row of `x`) and each row's outliers.
    #[allow(clippy::too_many_arguments)] // one block's inputs, as its caller holds them
    pub(super) fn combine_block(
        &self,
        sums: &[i32],
        m: usize,
        (planes, stride): (usize, usize),
        first: usize,
        (quants, outliers): (&[RowQuant], &RowOutliers),
        portable: bool,
        out: &mut ColumnRange<'_>,
    ) {
        let (column_sums, nr, quads, panels): (&[i32], usize, usize, &[i8]) = match &self.panels {
            Panels::Quads {
                column_sums,
                quads,
                panels,
                ..
            } => (column_sums, NR_Q, *quads, panels),
            Panels::Pairs { .. } => (&[], NR, 0, &[]),
        };
        let width = stride.min(self.n - first * nr);
        let columns = first * nr..first * nr + width;
        let scales = &self.column_scales[columns.clone()];
        let corrections = if column_sums.is_empty() {
            &[][..]
        } else {
            &column_sums[columns.clone()]
        };
        let bias = self.bias.as_ref().map(|b| &b[columns.clone()]);
        #[cfg(target_arch = "x86_64")]
        let simd = self.quad_simd(portable);
        #[cfg(not(target_arch = "x86_64"))]
        let _ = portable;
        // The outliers' exact products for one row, `stride` columns (zero weights past `n`).
        let mut exact = if outliers.per_row > 0 {
            vec![0f32; stride]
        } else {
            Vec::new()
        };
        let block_panels = &panels[(first * quads * 4 * NR_Q).min(panels.len())..];
        for row in 0..m {
            let dst = &mut out.row(row)[..width];
            let plane = |p: usize| &sums[(row * planes + p) * stride..(row * planes + p) * stride + width];
            let quant = quants[row];
            let held = outliers.row(row, quant.outliers);
            let outlier_products = if held.is_empty() {
                None
            } else {
                let products = OutlierProducts {
                    panels: block_panels,
                    quads,
                    outliers: held,
                };
                #[cfg(target_arch = "x86_64")]
                match simd.and_then(QuadSimd::avx512) {
                    Some(simd) => simd.outlier_products(&products, &mut exact),
                    None => products.scalar(&mut exact),
                }
                #[cfg(not(target_arch = "x86_64"))]
                products.scalar(&mut exact);
                Some(&exact[..width])
            };
            let combine = Combine {
                hi: plane(0),
                lo: (planes == 2).then(|| plane(1)),
                corrections,
                scales,
                bias,
                quant,
                outliers: outlier_products,
            };
            #[cfg(target_arch = "x86_64")]
            match simd {
                Some(simd) => simd.combine(combine, dst),
                None => combine.scalar(dst),
            }
            #[cfg(not(target_arch = "x86_64"))]
            combine.scalar(dst);
        }
    }
}

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

    pub(super) fn scalar(&self, dst: &mut [f32]) {
        for (c, o) in dst.iter_mut().enumerate() {
            *o = self.column(c);
        }
    }
}
