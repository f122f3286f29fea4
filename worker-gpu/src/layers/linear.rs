//! `y = x·Wᵀ (+ b)` in the compute precision: the input is cast down, the output stays in the
//! compute dtype (what torch autocast does for `nn.Linear`). float32 on the CPU runs the packed
//! kernels of `layad-cpu-kernels` (through `cpu_matmul`'s candle op) once [`Linear::pack_for_cpu`]
//! was called, and int8 ones once [`Linear::quantize_for_cpu`] was.

use candle_core::{DType, Tensor};
use layad_cpu_kernels::CpuKernels;
use layad_cpu_kernels::bf16::Bf16Weight;
use layad_cpu_kernels::f32::PackedWeight;
use layad_cpu_kernels::int8::{Int8Activations, Int8Kernel, QuantizedWeight};

use crate::error::LoadError;
use crate::layers::cpu_matmul::CpuMatmul;
use crate::weights::Weights;

/// A dense layer whose weight (and bias) are stored in the compute dtype.
pub(crate) struct Linear {
    /// The weight as the file holds it, `[out, in]`, until [`Linear::pack_for_cpu`] packs it for
    /// the CPU kernels straight from this layout or transposes it into `weight_t`: one pass over
    /// the weight at load instead of a transpose, a copy out of the tensor and the packing.
    weight: Option<Tensor>,
    /// Outputs `start..start + len` of `weight` to multiply by `factor` when it is packed or
    /// transposed ([`Linear::scale_outputs`]).
    output_scale: Option<(usize, usize, f64)>,
    /// `Wᵀ`, `[in, out]` and contiguous: with the activations row-major, the gemm crate then reads
    /// the weight without repacking it; for few rows (one 64–128 token row) that is 10–80% faster
    /// per product than PyTorch's `[out, in]` layout, measured on the model's shapes. A `[1, 1]`
    /// placeholder (keeping the device and dtype) while `weight` is pending and once packed.
    weight_t: Tensor,
    bias: Option<Tensor>,
    /// The same weight (and bias) packed for the CPU kernels; then `weight_t` is not used.
    packed: Option<PackedWeight>,
    /// The weight quantized to int8 for the CPU; then neither `weight_t` nor `packed` is used.
    quantized: Option<QuantizedWeight>,
    /// The weight in bf16 for the AVX512_BF16 kernel; then neither `weight_t` nor `packed` is used.
    bf16: Option<Bf16Weight>,
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
        let bias = match bias_name {
            Some(name) => Some(weights.take(name, &[out_features], dtype)?),
            None => None,
        };
        let weight_t = Tensor::zeros((1, 1), weight.dtype(), weight.device())
            .map_err(|e| LoadError::Device(format!("{weight_name}: {e}")))?;
        Ok(Self {
            weight: Some(weight),
            output_scale: None,
            weight_t,
            bias,
            packed: None,
            quantized: None,
            bf16: None,
        })
    }

    /// Finishes loading: packs a float32 CPU weight for `kernels` (not `Gemm`) straight from the
    /// file's `[out, in]` layout, or transposes it into `weight_t` for candle's matmul (other
    /// devices, precisions, and `Gemm`). Every layer is finished once, before its first forward.
    pub(crate) fn pack_for_cpu(&mut self, kernels: CpuKernels) -> candle_core::Result<()> {
        let Some(weight) = self.weight.take() else {
            return Ok(());
        };
        let scale = self.output_scale.take();
        let on_cpu_f32 = weight.device().is_cpu() && weight.dtype() == DType::F32;
        if !on_cpu_f32 || kernels == CpuKernels::Gemm {
            let mut weight_t = weight.t()?.contiguous()?;
            if let Some((start, len, factor)) = scale {
                weight_t = scale_along(&weight_t, 1, start, len, factor)?;
            }
            self.weight_t = weight_t;
            return Ok(());
        }
        let (n, k) = weight.dims2()?;
        let bias = match &self.bias {
            Some(bias) => Some(bias.to_dtype(DType::F32)?.to_vec1::<f32>()?),
            None => None,
        };
        let (storage, layout) = weight.storage_and_layout();
        let candle_core::Storage::Cpu(candle_core::CpuStorage::F32(data)) = &*storage else {
            candle_core::bail!("pack_for_cpu: expected a float32 CPU weight")
        };
        let Some((begin, end)) = layout.contiguous_offsets() else {
            candle_core::bail!("pack_for_cpu: expected a contiguous weight")
        };
        self.packed = Some(PackedWeight::pack_out_in(&data[begin..end], k, n, bias, kernels, scale));
        self.bias = None;
        Ok(())
    }

    /// Replaces the float32 CPU weight (packed or not) by its int8 quantization (`dtype = "int8"`);
    /// a no-op for a weight already quantized. Only float32 weights on the CPU can be quantized.
    pub(crate) fn quantize_for_cpu(&mut self, kernel: Int8Kernel) -> candle_core::Result<()> {
        if self.quantized.is_some() {
            return Ok(());
        }
        if self.weight.is_some() {
            candle_core::bail!("quantize_for_cpu before pack_for_cpu")
        }
        if let Some(packed) = self.packed.take() {
            self.quantized = Some(packed.quantize(kernel));
            return Ok(());
        }
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
        let weight = self.weight_t.flatten_all()?.to_vec1::<f32>()?;
        self.quantized = Some(QuantizedWeight::quantize(&weight, k, n, bias, kernel));
        self.weight_t = Tensor::zeros((1, 1), DType::F32, self.weight_t.device())?;
        Ok(())
    }

    /// Replaces the packed float32 CPU weight by its bf16 rounding for the AVX512_BF16 kernel
    /// (`dtype = "bf16"` on such a CPU); the caller checked that the CPU has it.
    pub(crate) fn round_to_bf16_for_cpu(&mut self) -> candle_core::Result<()> {
        if self.bf16.is_some() {
            return Ok(());
        }
        match self.packed.take() {
            Some(packed) => {
                self.bf16 = Some(packed.to_bf16());
                Ok(())
            }
            None => candle_core::bail!("bf16 kernels need a weight packed for the CPU kernels"),
        }
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
        if self.weight.is_none() || self.output_scale.is_some() {
            candle_core::bail!("scale_outputs once, before pack_for_cpu")
        }
        // The weight is scaled where it is packed or transposed, without a pass of its own.
        self.output_scale = Some((start, len, factor));
        if let Some(bias) = &self.bias {
            self.bias = Some(scale_along(bias, 0, start, len, factor)?);
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
        if let Some(bf16) = &self.bf16 {
            return x.to_dtype(DType::F32)?.contiguous()?.apply_op1_no_bwd(&CpuMatmul(bf16));
        }
        if let Some(packed) = &self.packed {
            return x
                .to_dtype(DType::F32)?
                .contiguous()?
                .apply_op1_no_bwd(&CpuMatmul(packed));
        }
        if self.weight.is_some() {
            candle_core::bail!("Linear::forward before pack_for_cpu")
        }
        let y = x.to_dtype(self.weight_t.dtype())?.matmul(&self.weight_t)?;
        match &self.bias {
            Some(bias) => y.broadcast_add(bias),
            None => Ok(y),
        }
    }
}

/// `t` with entries `start..start + len` along `dim` multiplied by `factor`.
fn scale_along(t: &Tensor, dim: usize, start: usize, len: usize, factor: f64) -> candle_core::Result<Tensor> {
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
}
