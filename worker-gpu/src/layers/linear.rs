//! `y = x·Wᵀ (+ b)` in the compute precision: the input is cast down, the output stays in the
//! compute dtype (what torch autocast does for `nn.Linear`). float32 on the CPU runs the packed
//! kernels of `cpu_matmul` once [`Linear::pack_for_cpu`] was called, and int8 ones (`cpu_matmul_int8`)
//! once [`Linear::quantize_for_cpu`] was.

use candle_core::{DType, Tensor};

use crate::error::LoadError;
use crate::layers::cpu_matmul::{CpuKernels, CpuMatmul, PackedWeight};
use crate::layers::cpu_matmul_int8::{Int8Activations, Int8Kernel, QuantizedWeight};
use crate::weights::Weights;

/// A dense layer whose weight (and bias) are stored in the compute dtype.
pub(crate) struct Linear {
    /// `Wᵀ`, `[in, out]` and contiguous: with the activations row-major, the gemm crate then reads
    /// the weight without repacking it; for few rows (one 64–128 token row) that is 10–80% faster
    /// per product than PyTorch's `[out, in]` layout, measured on the model's shapes.
    weight_t: Tensor,
    bias: Option<Tensor>,
    /// The same weight (and bias) packed for the CPU kernels; then `weight_t` is not used.
    packed: Option<PackedWeight>,
    /// The weight quantized to int8 for the CPU; then neither `weight_t` nor `packed` is used.
    quantized: Option<QuantizedWeight>,
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
        Ok(Self {
            weight_t,
            bias,
            packed: None,
            quantized: None,
        })
    }

    /// Packs the weight for `kernels` when it is a float32 weight on the CPU and the family has
    /// kernels of its own (not `Gemm`); the tensor copy is then dropped to a placeholder.
    pub(crate) fn pack_for_cpu(&mut self, kernels: CpuKernels) -> candle_core::Result<()> {
        let on_cpu_f32 = self.weight_t.device().is_cpu() && self.weight_t.dtype() == DType::F32;
        if !on_cpu_f32 || kernels == CpuKernels::Gemm || self.packed.is_some() || self.quantized.is_some() {
            return Ok(());
        }
        let (k, n) = self.weight_t.dims2()?;
        let weight = self.weight_t.flatten_all()?.to_vec1::<f32>()?;
        let bias = match &self.bias {
            Some(bias) => Some(bias.to_dtype(DType::F32)?.to_vec1::<f32>()?),
            None => None,
        };
        self.packed = Some(PackedWeight::pack(&weight, k, n, bias, kernels));
        // Keep the shape and dtype for `forward`'s checks, not the 4 bytes per weight.
        self.weight_t = Tensor::zeros((1, 1), DType::F32, self.weight_t.device())?;
        self.bias = None;
        Ok(())
    }

    /// Replaces the float32 CPU weight (packed or not) by its int8 quantization (`dtype = "int8"`);
    /// a no-op for a weight already quantized. Only float32 weights on the CPU can be quantized.
    pub(crate) fn quantize_for_cpu(&mut self, kernel: Int8Kernel) -> candle_core::Result<()> {
        if self.quantized.is_some() {
            return Ok(());
        }
        let (weight, k, n, bias) = match self.packed.take() {
            Some(packed) => packed.unpack(),
            None => {
                if !self.weight_t.device().is_cpu() || self.weight_t.dtype() != DType::F32 {
                    candle_core::bail!(
                        "int8 needs a float32 weight on the CPU, not {:?} on {:?}",
                        self.weight_t.dtype(),
                        self.weight_t.device().location()
                    )
                }
                let (k, n) = self.weight_t.dims2()?;
                let bias = match self.bias.take() {
                    Some(bias) => Some(bias.to_vec1::<f32>()?),
                    None => None,
                };
                (self.weight_t.flatten_all()?.to_vec1::<f32>()?, k, n, bias)
            }
        };
        self.quantized = Some(QuantizedWeight::quantize(&weight, k, n, bias, kernel));
        self.weight_t = Tensor::zeros((1, 1), DType::F32, self.weight_t.device())?;
        self.bias = None;
        Ok(())
    }

    /// How the int8 weight (VNNI layout) quantizes its activation rows; a no-op otherwise.
    pub(crate) fn set_int8_activations(&mut self, bits: Int8Activations) {
        if let Some(quantized) = &mut self.quantized {
            quantized.set_activations(bits);
        }
    }

    /// The int8 weight's activations when it runs the VNNI kernel.
    pub(crate) fn int8_activations(&self) -> Option<Int8Activations> {
        self.quantized.as_ref().and_then(QuantizedWeight::activations)
    }

    /// The int8 weight's kernel and activations, once quantized.
    pub(crate) fn int8_kernel(&self) -> Option<String> {
        self.quantized.as_ref().map(QuantizedWeight::describe)
    }

    /// Multiplies outputs `start..start + len` (weight rows and bias entries in PyTorch's terms) by
    /// `factor`; used to fold attention's `head_dim^-0.5` into the query projection.
    pub(crate) fn scale_outputs(&mut self, start: usize, len: usize, factor: f64) -> candle_core::Result<()> {
        if self.packed.is_some() || self.quantized.is_some() {
            candle_core::bail!("scale_outputs after pack_for_cpu or quantize_for_cpu")
        }
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
        if let Some(quantized) = &self.quantized {
            return x
                .to_dtype(DType::F32)?
                .contiguous()?
                .apply_op1_no_bwd(&CpuMatmul(quantized));
        }
        if let Some(packed) = &self.packed {
            return x
                .to_dtype(DType::F32)?
                .contiguous()?
                .apply_op1_no_bwd(&CpuMatmul(packed));
        }
        let y = x.to_dtype(self.weight_t.dtype())?.matmul(&self.weight_t)?;
        match &self.bias {
            Some(bias) => y.broadcast_add(bias),
            None => Ok(y),
        }
    }
}
