//! `y = x·Wᵀ (+ b)` in the compute precision: the input is cast down, the output stays in the
//! compute dtype (what torch autocast does for `nn.Linear`).

use candle_core::{DType, Tensor};

use crate::error::LoadError;
use crate::weights::Weights;

/// A dense layer whose weight (and bias) are stored in the compute dtype.
pub(crate) struct Linear {
    /// `Wᵀ`, `[in, out]` and contiguous: with the activations row-major, the gemm crate then reads
    /// the weight without repacking it; for few rows (one 64–128 token row) that is 10–80% faster
    /// per product than PyTorch's `[out, in]` layout, measured on the model's shapes.
    weight_t: Tensor,
    bias: Option<Tensor>,
}

impl Linear {
    /// Takes `{prefix}.weight` `[out, in]` (and `{prefix}.bias` `[out]` when `bias`).
    pub(crate) fn load(
        weights: &mut Weights,
        prefix: &str,
        shape: (usize, usize),
        bias: bool,
        dtype: DType,
    ) -> Result<Self, LoadError> {
        let bias_name = format!("{prefix}.bias");
        Self::load_named(
            weights,
            &format!("{prefix}.weight"),
            bias.then_some(bias_name.as_str()),
            shape,
            dtype,
        )
    }

    /// Takes a weight `[out, in]` and an optional bias `[out]` stored under other names (PyTorch's
    /// packed `in_proj_weight` / `in_proj_bias`).
    pub(crate) fn load_named(
        weights: &mut Weights,
        weight_name: &str,
        bias_name: Option<&str>,
        (out_features, in_features): (usize, usize),
        dtype: DType,
    ) -> Result<Self, LoadError> {
        let weight = weights.take(weight_name, &[out_features, in_features], dtype)?;
        let weight_t = weight
            .t()
            .and_then(|w| w.contiguous())
            .map_err(|e| LoadError::Device(format!("{weight_name}: {e}")))?;
        let bias = match bias_name {
            Some(name) => Some(weights.take(name, &[out_features], dtype)?),
            None => None,
        };
        Ok(Self { weight_t, bias })
    }

    /// Multiplies outputs `start..start + len` (weight rows and bias entries in PyTorch's terms) by
    /// `factor`; used to fold attention's `head_dim^-0.5` into the query projection.
    pub(crate) fn scale_outputs(&mut self, start: usize, len: usize, factor: f64) -> candle_core::Result<()> {
        let scale = |t: &Tensor, dim: usize| -> candle_core::Result<Tensor> {
            let size = t.dim(dim)?;
            let mut parts = Vec::with_capacity(3);
            if start > 0 {
                parts.push(t.narrow(dim, 0, start)?);
            }
            parts.push((t.narrow(dim, start, len)? * factor)?);
            if start + len < size {
                parts.push(t.narrow(dim, start + len, size - start - len)?);
            }
            Tensor::cat(&parts, dim)
        };
        self.weight_t = scale(&self.weight_t, 1)?;
        if let Some(bias) = &self.bias {
            self.bias = Some(scale(bias, 0)?);
        }
        Ok(())
    }

    /// `x`: `[n, in]` in any float dtype; returns `[n, out]` in the compute dtype.
    pub(crate) fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let y = x.to_dtype(self.weight_t.dtype())?.matmul(&self.weight_t)?;
        match &self.bias {
            Some(bias) => y.broadcast_add(bias),
            None => Ok(y),
        }
    }
}
