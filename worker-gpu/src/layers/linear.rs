//! `y = x·Wᵀ (+ b)` in the compute precision: the input is cast down, the output stays in the
//! compute dtype (what torch autocast does for `nn.Linear`). The weight is one [`LinearWeight`]
//! (as candle's `QMatMul` is one enum): as loaded, transposed for candle's matmul, or prepared for
//! `layad-cpu-kernels` (packed float32, bf16 or int8, run through `cpu_matmul`'s candle op). Each
//! step of [`Linear`]'s life moves it from one variant to the next, so no state is representable
//! that the forward would have to refuse but the one before [`Linear::pack_for_cpu`].

use candle_core::{DType, Tensor};
use layad_cpu_kernels::CpuKernels;
use layad_cpu_kernels::bf16::Bf16Weight;
use layad_cpu_kernels::f32::PackedWeight;
use layad_cpu_kernels::int8::{Int8Activations, Int8Kernel, QuantizedWeight};

use crate::error::LoadError;
use crate::layers::cpu_matmul::CpuMatmul;
use crate::weights::Weights;

/// What a CPU load leaves the matrices of the encoder and of the decision head's layers as; each is
/// finished as soon as it is read (`LayaModel::load_reduced`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MatrixFormat {
    /// float32, packed for the kernels (or transposed for candle's matmul).
    Float32,
    /// Quantized to int8 for the integer kernel of the float family (`LayaModel::quantize_encoder`).
    Int8,
    /// Rounded to bf16 for the bf16 kernels (`LayaModel::bf16_encoder`).
    Bf16,
}

/// Finishes `matrices` (those of `part`, for the error) for `kernels` in `format`
/// ([`Linear::finish_for_cpu`]).
pub(crate) fn finish_all<'a>(
    matrices: impl IntoIterator<Item = &'a mut Linear>,
    kernels: CpuKernels,
    format: MatrixFormat,
    part: &str,
) -> Result<(), LoadError> {
    for linear in matrices {
        linear
            .finish_for_cpu(kernels, format)
            .map_err(|e| LoadError::Device(format!("{part}: finishing its matrices for {kernels}: {e}")))?;
    }
    Ok(())
}

/// A dense layer whose weight (and bias) are stored in the compute dtype.
pub(crate) struct Linear {
    weight: LinearWeight,
}

/// A layer's weight in the form its forward runs. The CPU kernels' weights carry their bias; the
/// tensor forms keep theirs beside them.
enum LinearWeight {
    /// As the file holds it, `[out, in]`, until [`Linear::pack_for_cpu`] packs it for the CPU
    /// kernels straight from this layout or transposes it: one pass over the weight at load
    /// instead of a transpose, a copy out of the tensor and the packing. `output_scale`: outputs
    /// `start..start + len` to multiply by `factor` in that pass ([`Linear::scale_outputs`]).
    Loaded {
        weight: Tensor,
        bias: Option<Tensor>,
        output_scale: Option<(usize, usize, f64)>,
        /// A GeGLU projection to pack for GeGLU where the kernels can ([`Linear::fuse_geglu`]).
        geglu: bool,
    },
    /// `Wᵀ`, `[in, out]` and contiguous, for candle's matmul (devices, half precisions, the `gemm`
    /// family): with the activations row-major, the gemm crate then reads the weight without
    /// repacking it; for few rows (one 64–128 token row) that is 10–80% faster per product than
    /// PyTorch's `[out, in]` layout, measured on the model's shapes.
    Transposed { weight_t: Tensor, bias: Option<Tensor> },
    /// float32 packed in column panels for the CPU kernels.
    Packed(PackedWeight),
    /// Rounded to bf16 for the bf16 kernels (`vdpbf16ps`, f16 multiply-adds, widened to f32, or AMX's
    /// tiles).
    Bf16(Bf16Weight),
    /// Quantized per output column to int8.
    Int8(QuantizedWeight),
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
        Ok(Self {
            weight: LinearWeight::Loaded {
                weight,
                bias,
                output_scale: None,
                geglu: false,
            },
        })
    }

    /// Finishes loading: packs a float32 CPU weight for `kernels` (not `Gemm`) straight from the
    /// file's `[out, in]` layout, or transposes it for candle's matmul (other devices, precisions,
    /// and `Gemm`). Every layer is finished once, before its first forward; later calls are no-ops.
    pub(crate) fn pack_for_cpu(&mut self, kernels: CpuKernels) -> candle_core::Result<()> {
        let LinearWeight::Loaded {
            weight,
            bias,
            output_scale,
            geglu,
        } = &self.weight
        else {
            return Ok(());
        };
        let on_cpu_f32 = weight.device().is_cpu() && weight.dtype() == DType::F32;
        if !on_cpu_f32 || kernels == CpuKernels::Gemm {
            let mut weight_t = weight.t()?.contiguous()?;
            if let Some((start, len, factor)) = *output_scale {
                weight_t = scale_along(&weight_t, 1, start, len, factor)?;
            }
            self.weight = LinearWeight::Transposed {
                weight_t,
                bias: bias.clone(),
            };
            return Ok(());
        }
        let (n, k) = weight.dims2()?;
        let bias = match bias {
            Some(bias) => Some(bias.to_dtype(DType::F32)?.to_vec1::<f32>()?),
            None => None,
        };
        let packed = {
            let (storage, layout) = weight.storage_and_layout();
            let candle_core::Storage::Cpu(candle_core::CpuStorage::F32(data)) = &*storage else {
                candle_core::bail!("pack_for_cpu: expected a float32 CPU weight")
            };
            let Some((begin, end)) = layout.contiguous_offsets() else {
                candle_core::bail!("pack_for_cpu: expected a contiguous weight")
            };
            let weight = &data[begin..end];
            let grouped = match (*geglu, &bias, output_scale) {
                (true, None, None) => PackedWeight::pack_out_in_geglu(weight, k, n, kernels),
                _ => None,
            };
            grouped.unwrap_or_else(|| PackedWeight::pack_out_in(weight, k, n, bias, kernels, *output_scale))
        };
        self.weight = LinearWeight::Packed(packed);
        Ok(())
    }

    /// Finishes loading as [`Linear::pack_for_cpu`] does, then leaves the weight in `format`: kept
    /// float32, quantized to int8 for the integer kernel of `kernels`' family, or rounded to bf16.
    /// A load that calls it on each matrix as soon as the matrix is read never holds the float32
    /// weights of more than one.
    pub(crate) fn finish_for_cpu(&mut self, kernels: CpuKernels, format: MatrixFormat) -> candle_core::Result<()> {
        self.pack_for_cpu(kernels)?;
        match format {
            MatrixFormat::Float32 => Ok(()),
            MatrixFormat::Int8 => self.quantize_for_cpu(Int8Kernel::for_family(kernels)),
            MatrixFormat::Bf16 => self.round_to_bf16_for_cpu(),
        }
    }

    /// Replaces the float32 CPU weight (packed, or transposed for the `gemm` family) by its int8
    /// quantization (`dtype = "int8"`); a no-op for a weight already quantized. Only float32
    /// weights on the CPU can be quantized.
    pub(crate) fn quantize_for_cpu(&mut self, kernel: Int8Kernel) -> candle_core::Result<()> {
        let quantized = match &self.weight {
            LinearWeight::Int8(_) => return Ok(()),
            LinearWeight::Loaded { .. } => candle_core::bail!("quantize_for_cpu before pack_for_cpu"),
            LinearWeight::Bf16(_) => candle_core::bail!("quantize_for_cpu on a weight rounded to bf16"),
            LinearWeight::Packed(packed) => packed.quantize(kernel),
            LinearWeight::Transposed { weight_t, bias } => {
                if !weight_t.device().is_cpu() || weight_t.dtype() != DType::F32 {
                    candle_core::bail!(
                        "int8 needs a float32 weight on the CPU, not {:?} on {:?}",
                        weight_t.dtype(),
                        weight_t.device().location()
                    )
                }
                let (k, n) = weight_t.dims2()?;
                let bias = match bias {
                    Some(bias) => Some(bias.to_vec1::<f32>()?),
                    None => None,
                };
                let weight = weight_t.flatten_all()?.to_vec1::<f32>()?;
                QuantizedWeight::quantize(&weight, k, n, bias, kernel)
            }
        };
        self.weight = LinearWeight::Int8(quantized);
        Ok(())
    }

    /// Replaces the packed float32 CPU weight by its bf16 rounding for the bf16 kernels (`dtype =
    /// "bf16"` on an AVX-512 CPU); the caller checked that the family has them.
    pub(crate) fn round_to_bf16_for_cpu(&mut self) -> candle_core::Result<()> {
        let rounded = match &self.weight {
            LinearWeight::Bf16(_) => return Ok(()),
            LinearWeight::Packed(packed) => packed.to_bf16(),
            _ => candle_core::bail!("bf16 kernels need a weight packed for the CPU kernels"),
        };
        self.weight = LinearWeight::Bf16(rounded);
        Ok(())
    }

    /// How the int8 weight (VNNI layout) quantizes its activation rows; a no-op otherwise.
    pub(crate) fn set_int8_activations(&mut self, bits: Int8Activations) {
        if let LinearWeight::Int8(quantized) = &mut self.weight {
            quantized.set_activations(bits);
        }
    }

    /// The int8 weight's activations when it runs the VNNI kernel.
    pub(crate) fn int8_activations(&self) -> Option<Int8Activations> {
        match &self.weight {
            LinearWeight::Int8(quantized) => quantized.activations(),
            _ => None,
        }
    }

    /// The int8 weight's kernel and activations, once quantized.
    pub(crate) fn int8_kernel(&self) -> Option<String> {
        match &self.weight {
            LinearWeight::Int8(quantized) => Some(quantized.describe()),
            _ => None,
        }
    }

    /// Multiplies outputs `start..start + len` (weight rows and bias entries in PyTorch's terms) by
    /// `factor`; used to fold attention's `head_dim^-0.5` into the query projection.
    pub(crate) fn scale_outputs(&mut self, start: usize, len: usize, factor: f64) -> candle_core::Result<()> {
        let LinearWeight::Loaded { bias, output_scale, .. } = &mut self.weight else {
            candle_core::bail!("scale_outputs before pack_for_cpu")
        };
        if output_scale.is_some() {
            candle_core::bail!("scale_outputs once")
        }
        // The weight is scaled where it is packed or transposed, without a pass of its own.
        *output_scale = Some((start, len, factor));
        if let Some(b) = bias {
            *b = scale_along(b, 0, start, len, factor)?;
        }
        Ok(())
    }

    /// Marks a GeGLU projection (`[2·I, in]`: the input half's rows, then the gate half's) to be
    /// packed for GeGLU where the CPU kernels can ([`PackedWeight::pack_out_in_geglu`]: no bias,
    /// no output scale, 32-column panels, `I` a multiple of 16); its forward then gives GeGLU's
    /// `[n, I]` ([`Self::applies_geglu`]). Other devices and families keep the plain projection.
    pub(crate) fn fuse_geglu(&mut self) {
        if let LinearWeight::Loaded { geglu, .. } = &mut self.weight {
            *geglu = true;
        }
    }

    /// Whether [`Self::forward`] gives the projection's GeGLU rather than the projection.
    pub(crate) fn applies_geglu(&self) -> bool {
        match &self.weight {
            LinearWeight::Packed(packed) => packed.applies_geglu(),
            LinearWeight::Bf16(rounded) => rounded.applies_geglu(),
            LinearWeight::Int8(quantized) => quantized.applies_geglu(),
            LinearWeight::Loaded { .. } | LinearWeight::Transposed { .. } => false,
        }
    }

    /// `x`: `[n, in]` in any float dtype; returns `[n, out]` in the compute dtype.
    pub(crate) fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let as_f32 = || x.to_dtype(DType::F32)?.contiguous();
        match &self.weight {
            LinearWeight::Int8(quantized) => as_f32()?.apply_op1_no_bwd(&CpuMatmul(quantized)),
            LinearWeight::Bf16(bf16) => as_f32()?.apply_op1_no_bwd(&CpuMatmul(bf16)),
            LinearWeight::Packed(packed) => as_f32()?.apply_op1_no_bwd(&CpuMatmul(packed)),
            LinearWeight::Transposed { weight_t, bias } => {
                let y = x.to_dtype(weight_t.dtype())?.matmul(weight_t)?;
                match bias {
                    Some(bias) => y.broadcast_add(bias),
                    None => Ok(y),
                }
            }
            LinearWeight::Loaded { .. } => candle_core::bail!("Linear::forward before pack_for_cpu"),
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
