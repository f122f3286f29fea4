//! Fused float32 CPU kernels for the elementwise hot spots of a forward — LayerNorm and GeGLU —
//! each one pass over rows on the calling rayon pool. candle would spend 2–10 separate elementwise
//! ops on each, every one a sync of its own thread pool; other devices use the composed ops.

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp1, CustomOp3, Layout, Shape};
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
        let mut out = vec![0f32; x.len()];
        out.par_chunks_mut(dim).zip(x.par_chunks(dim)).for_each(|(out, x)| {
            let mean = (x.iter().map(|&v| v as f64).sum::<f64>() / dim as f64) as f32;
            let variance = (x.iter().map(|&v| ((v - mean) as f64).powi(2)).sum::<f64>() / dim as f64) as f32;
            let inv_std = 1.0 / (variance + self.eps).sqrt();
            for (((o, &v), &w), &b) in out.iter_mut().zip(x).zip(weight).zip(bias) {
                *o = (v - mean) * inv_std * w + b;
            }
        });
        Ok((CpuStorage::F32(out), x_layout.shape().clone()))
    }
}

/// GeGLU on the input projection `[rows, 2·I]`: `gelu_erf(first half) · second half` → `[rows, I]`,
/// with candle's own f32 `gelu_erf` formula.
pub(crate) struct GeGluOp;

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
        let mut out = vec![0f32; x.len() / 2];
        out.par_chunks_mut(half.max(1))
            .zip(x.par_chunks(width.max(1)))
            .for_each(|(out, row)| {
                let (input, gate) = row.split_at(half);
                for ((o, &u), &g) in out.iter_mut().zip(input).zip(gate) {
                    let gelu = (candle_core::cpu::erf::erf_f32(u * std::f32::consts::FRAC_1_SQRT_2) + 1.0) * 0.5 * u;
                    *o = gelu * g;
                }
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
    fn geglu_matches_gelu_erf_times_gate() -> candle_core::Result<()> {
        let x = Tensor::randn(0f32, 2.0, (2, 3, 10), &Device::Cpu)?;
        let fused = x.apply_op1_no_bwd(&GeGluOp)?;
        let reference = (x.narrow(2, 0, 5)?.gelu_erf()? * x.narrow(2, 5, 5)?)?;
        assert_eq!(fused.dims(), [2, 3, 5]);
        assert_eq!(max_abs_diff(&fused, &reference), 0.0);
        Ok(())
    }
}
