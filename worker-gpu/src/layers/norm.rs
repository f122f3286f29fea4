//! LayerNorm computed in float32 whatever the compute precision (torch autocast keeps norms in
//! fp32), with a two-pass variance, optionally without a bias (ModernBERT's norms have none).

use candle_core::{D, DType, Tensor};

use crate::error::LoadError;
use crate::layers::cpu_kernels::LayerNormOp;
use crate::weights::Weights;

/// `(x - mean) / sqrt(var + eps) * weight + bias` over the last dimension, in float32.
pub(crate) struct LayerNorm {
    weight: Tensor,
    /// Zeros for a bias-free norm, so both kinds run the same kernel.
    bias: Tensor,
    eps: f64,
}

impl LayerNorm {
    /// Takes `{prefix}.weight` `[dim]` (and `{prefix}.bias` when `bias`), kept in float32.
    pub(crate) fn load(
        weights: &mut Weights,
        prefix: &str,
        dim: usize,
        bias: bool,
        eps: f64,
    ) -> Result<Self, LoadError> {
        let weight = weights.take(&format!("{prefix}.weight"), &[dim], DType::F32)?;
        let bias = if bias {
            weights.take(&format!("{prefix}.bias"), &[dim], DType::F32)?
        } else {
            weight
                .zeros_like()
                .map_err(|e| LoadError::Device(format!("{prefix}: {e}")))?
        };
        Ok(Self { weight, bias, eps })
    }

    /// Normalizes `x` (any float dtype, last dimension `dim`); the result is float32.
    pub(crate) fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let x = x.to_dtype(DType::F32)?;
        if x.device().is_cpu() {
            let op = LayerNormOp { eps: self.eps as f32 };
            return x.contiguous()?.apply_op3_no_bwd(&self.weight, &self.bias, &op);
        }
        let centered = x.broadcast_sub(&x.mean_keepdim(D::Minus1)?)?;
        let variance = centered.sqr()?.mean_keepdim(D::Minus1)?;
        centered
            .broadcast_mul(&(variance + self.eps)?.sqrt()?.recip()?)?
            .broadcast_mul(&self.weight)?
            .broadcast_add(&self.bias)
    }
}
