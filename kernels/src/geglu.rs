//! GeGLU, `gelu_erf(u) · g` with erf's rational approximation, vectorised: on a projection's plain
//! output (its two halves, [`geglu_row`]: the worker's GeGLU op), and inside the products that apply
//! it as they write their output (`GeGlu`). A weight packed for the second holds its columns in
//! groups of [`GROUP`]: each 32-column panel is 16 input columns followed by their 16 gate columns
//! (`grouped_column`), so a product's column block holds whole pairs and writes half as many
//! values, and the projection's `[rows, 2·I]` output is never stored nor read back. Both ways run the
//! same arithmetic per value, so they give the same floats.

use std::mem::MaybeUninit;

use pulp::{Simd, WithSimd};

use crate::CpuKernels;

/// Columns of one group: a grouped weight's panel holds 16 input columns, then their 16 gate
/// columns.
pub const GROUP: usize = 16;

/// The original column that column `j` of a grouped `[k, 2·half]` weight holds.
pub(crate) fn grouped_column(j: usize, half: usize) -> usize {
    let (pair, lane) = (j / (2 * GROUP), j % (2 * GROUP));
    if lane < GROUP {
        pair * GROUP + lane
    } else {
        half + pair * GROUP + lane - GROUP
    }
}

/// Whether a weight with `n` output columns can be grouped: whole pairs of groups (so `n / 2` a
/// multiple of [`GROUP`]).
pub(crate) fn groups_fit(n: usize) -> bool {
    n > 0 && n.is_multiple_of(2 * GROUP)
}

/// GeGLU applied by a product to its grouped columns, with the SIMD of this kernel family.
#[derive(Clone, Copy, Debug)]
pub(crate) struct GeGlu(pub(crate) CpuKernels);

impl GeGlu {
    /// `dst[16p + l] = gelu(src[32p + l]) · src[32p + 16 + l]` for every group pair `p` of `src`.
    pub(crate) fn groups(self, src: &[f32], dst: &mut [MaybeUninit<f32>]) {
        assert!(
            src.len().is_multiple_of(2 * GROUP) && dst.len() == src.len() / 2,
            "GeGLU of {} grouped values into {}",
            src.len(),
            dst.len()
        );
        self.0.dispatch(Groups { src, dst });
    }
}

/// `gelu_erf(input) · gate` into `out`, value by value, with the widest SIMD of `kernels`.
pub fn geglu_row(kernels: CpuKernels, input: &[f32], gate: &[f32], out: &mut [f32]) {
    assert!(
        input.len() == out.len() && gate.len() == out.len(),
        "GeGLU halves of {} and {} values into {}",
        input.len(),
        gate.len(),
        out.len()
    );
    kernels.dispatch(Row { input, gate, out });
}

struct Row<'a> {
    input: &'a [f32],
    gate: &'a [f32],
    out: &'a mut [f32],
}

impl WithSimd for Row<'_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: Simd>(self, simd: S) {
        geglu_values(simd, self.input, self.gate, self.out);
    }
}

struct Groups<'a> {
    src: &'a [f32],
    dst: &'a mut [MaybeUninit<f32>],
}

impl WithSimd for Groups<'_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: Simd>(self, simd: S) {
        let mut values = [0f32; GROUP];
        for (pair, dst) in self.src.chunks_exact(2 * GROUP).zip(self.dst.chunks_exact_mut(GROUP)) {
            let (input, gate) = pair.split_at(GROUP);
            geglu_values(simd, input, gate, &mut values);
            for (d, &v) in dst.iter_mut().zip(&values) {
                d.write(v);
            }
        }
    }
}

/// The values of both ways, so that they give the same floats: SIMD lanes, then the scalar tail
/// with the same operations in the same order.
#[inline(always)]
fn geglu_values<S: Simd>(simd: S, input: &[f32], gate: &[f32], out: &mut [f32]) {
    let (input, input_tail) = S::as_simd_f32s(input);
    let (gate, gate_tail) = S::as_simd_f32s(gate);
    let (out, out_tail) = S::as_mut_simd_f32s(out);
    let half = simd.splat_f32s(0.5);
    let one = simd.splat_f32s(1.0);
    let scale = simd.splat_f32s(std::f32::consts::FRAC_1_SQRT_2);
    for ((o, &u), &g) in out.iter_mut().zip(input).zip(gate) {
        let e = erf_simd(simd, simd.mul_f32s(u, scale));
        let gelu = simd.mul_f32s(simd.mul_f32s(simd.add_f32s(e, one), half), u);
        *o = simd.mul_f32s(gelu, g);
    }
    for ((o, &u), &g) in out_tail.iter_mut().zip(input_tail).zip(gate_tail) {
        *o = (erf(u * std::f32::consts::FRAC_1_SQRT_2) + 1.0) * 0.5 * u * g;
    }
}

/// erf as a clamped rational function, `x·P(x²)/Q(x²)` on [−4, 4] (±1 outside, where float32 erf
/// is ±1 anyway); the float32 approximation XLA and Eigen use. Within 4e-7 of libm's `erff`.
const ERF_ALPHA: [f32; 7] = [
    -2.726_142_3e-10,
    2.770_681_4e-8,
    -2.101_024e-6,
    -5.692_506_4e-5,
    -7.349_906_3e-4,
    -2.954_6e-3,
    -1.609_603_3e-2,
];
const ERF_BETA: [f32; 5] = [
    -1.456_607_2e-5,
    -2.133_740_6e-4,
    -1.682_827e-3,
    -7.373_329_2e-3,
    -1.426_473_9e-2,
];

/// Scalar `ERF_ALPHA`/`ERF_BETA` erf, for the tails of rows (the same operations as the SIMD lanes).
pub fn erf(x: f32) -> f32 {
    let x = x.clamp(-4.0, 4.0);
    let x2 = x * x;
    let p = ERF_ALPHA.iter().fold(0.0f32, |acc, &c| acc.mul_add(x2, c));
    let q = ERF_BETA.iter().fold(0.0f32, |acc, &c| acc.mul_add(x2, c));
    x * p / q
}

#[inline(always)]
fn erf_simd<S: Simd>(simd: S, x: S::f32s) -> S::f32s {
    let x = simd.min_f32s(simd.max_f32s(x, simd.splat_f32s(-4.0)), simd.splat_f32s(4.0));
    let x2 = simd.mul_f32s(x, x);
    let mut p = simd.splat_f32s(0.0);
    for c in ERF_ALPHA {
        p = simd.mul_add_f32s(p, x2, simd.splat_f32s(c));
    }
    let mut q = simd.splat_f32s(0.0);
    for c in ERF_BETA {
        q = simd.mul_add_f32s(q, x2, simd.splat_f32s(c));
    }
    simd.div_f32s(simd.mul_f32s(x, p), q)
}

#[cfg(test)]
mod tests {
    use super::grouped_column;

    #[test]
    fn a_grouped_panel_holds_sixteen_inputs_then_their_gates() {
        let order: Vec<usize> = (0..64).map(|j| grouped_column(j, 32)).collect();
        let want: Vec<usize> = (0..16).chain(32..48).chain(16..32).chain(48..64).collect();
        assert_eq!(order, want);
    }
}
