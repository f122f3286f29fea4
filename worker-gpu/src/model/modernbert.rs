//! The ModernBERT encoder as transformers 5.17 runs it in eval mode (spec §4.2): embeddings and
//! norm, layers alternating full and sliding-window attention with RoPE, GeGLU MLP, final norm.
//!
//! The residual stream is float32; matmuls run in the compute precision, norms, softmax and RoPE in
//! float32 — torch autocast's split. Rows are right-padded; see `layers::attention` for the masks.

use candle_core::{DType, Device, Tensor};
use laya::config::{EncoderConfig, LayerType};
use layad_cpu_kernels::CpuKernels;
use layad_cpu_kernels::bf16::{Bf16Kernel, RowsKernel};
use layad_cpu_kernels::int8::{Int8Activations, Int8Kernel};

use crate::error::LoadError;
use crate::layers::attention::{SlidingPlan, SlidingWindow, attend};
use crate::layers::cpu_attention::AttentionOp;
use crate::layers::cpu_kernels::{AddOp, GeGluOp};
use crate::layers::linear::{Linear, MatrixFormat, finish_all};
use crate::layers::norm::LayerNorm;
use crate::layers::rotary::RopeTable;
use crate::weights::Weights;

/// Masks of one forward, shared by every layer (and the decision head's key padding).
pub(crate) struct ForwardMasks {
    /// Additive `[batch, 1, 1, len]` key-padding mask, `None` when no row is padded.
    pub(crate) key_padding: Option<Tensor>,
    /// How sliding-window layers attend; `None` when the encoder has none.
    pub(crate) sliding: Option<SlidingPlan>,
    /// Real length of each row, when the batch is described by lengths (not by explicit masks):
    /// then float32 CPU forwards run the fused attention op instead of the masks above.
    pub(crate) lengths: Option<Vec<usize>>,
}

/// Splits `qkv` `[batch·len, 3·heads·head_dim]` into `q, k, v` `[batch, heads, len, head_dim]`
/// (PyTorch's order: q rows first, then k, then v).
pub(crate) fn split_heads(
    qkv: &Tensor,
    (batch, len): (usize, usize),
    heads: usize,
    head_dim: usize,
) -> candle_core::Result<[Tensor; 3]> {
    let qkv = qkv.reshape((batch, len, 3, heads, head_dim))?;
    let part = |i: usize| qkv.narrow(2, i, 1)?.squeeze(2)?.transpose(1, 2);
    Ok([part(0)?, part(1)?, part(2)?.contiguous()?])
}

/// `[batch, heads, len, head_dim]` back to `[batch·len, heads·head_dim]`.
pub(crate) fn merge_heads(x: &Tensor) -> candle_core::Result<Tensor> {
    let (batch, heads, len, head_dim) = x.dims4()?;
    x.transpose(1, 2)?.reshape((batch * len, heads * head_dim))
}

pub(crate) struct EncoderLayer {
    /// Absent in layer 0, where transformers uses an identity.
    attn_norm: Option<LayerNorm>,
    wqkv: Linear,
    wo: Linear,
    mlp_norm: LayerNorm,
    /// Projects to `[input | gate]`, each `intermediate` wide.
    wi: Linear,
    mlp_wo: Linear,
    kind: LayerType,
}

/// What a bf16 encoder's attention products run on: blocks of rows on AMX's tiles where the
/// weights run there, `vdpbf16ps` where it does; float32 beside the f16 and widened kernels
/// (`vdpbf16ps` at half float32's speed there, or missing; the attention's products are a small
/// share of the forward's).
fn bf16_attention(kernels: CpuKernels) -> Option<RowsKernel> {
    match Bf16Kernel::for_family(kernels)? {
        Bf16Kernel::Tiles => Some(RowsKernel::detect(true)),
        Bf16Kernel::DotPairs => Some(RowsKernel::detect(false)),
        Bf16Kernel::Halves | Bf16Kernel::Widened => None,
    }
}

impl EncoderLayer {
    /// The layer's four matrices: Wqkv, attention Wo, MLP Wi, MLP Wo.
    fn matrices(&mut self) -> [&mut Linear; 4] {
        [&mut self.wqkv, &mut self.wo, &mut self.wi, &mut self.mlp_wo]
    }
}

/// What a load hands each encoder layer to in float32 ([`Encoder::load`]), with the encoder built
/// so far; it returns whether the load keeps the layer.
pub(crate) type EncoderLayerHook<'a> = dyn FnMut(&Encoder, &EncoderLayer) -> candle_core::Result<bool> + 'a;

/// The encoder with its RoPE tables and sliding-window caches.
pub(crate) struct Encoder {
    tok_embeddings: Tensor,
    embed_norm: LayerNorm,
    layers: Vec<EncoderLayer>,
    final_norm: LayerNorm,
    global_rope: RopeTable,
    local_rope: RopeTable,
    window: Option<SlidingWindow>,
    heads: usize,
    head_dim: usize,
    intermediate: usize,
    /// SIMD family of the CPU kernels the weights were packed for.
    kernels: CpuKernels,
    /// The attention's products in bf16 on this kernel (set where the matrices are rounded to bf16).
    attention_bf16: Option<RowsKernel>,
}

impl Encoder {
    /// Takes the `encoder.` tensors, each layer's matrices finished for `kernels` in `format`
    /// ([`Linear::finish_for_cpu`]) before the next layer is read. RoPE tables cover positions
    /// `0..max_len`.
    ///
    /// With `float32_layer`, each layer is first finished in float32 and handed to it (with the
    /// encoder built so far: embeddings, norms, tables), then reduced to `format` and kept, or
    /// dropped where the hook returns `false`: the gate runs its reference rows through the float32
    /// layers one at a time (`super::layerwise`), so the float32 model never exists whole.
    pub(crate) fn load(
        weights: &mut Weights,
        config: &EncoderConfig,
        max_len: usize,
        (dtype, kernels, format): (DType, CpuKernels, MatrixFormat),
        mut float32_layer: Option<&mut EncoderLayerHook<'_>>,
    ) -> Result<Self, LoadError> {
        let (d, inter) = (config.hidden_size, config.intermediate_size);
        let eps = config.norm_eps;
        let device_error = |e: candle_core::Error| LoadError::Device(format!("building attention tables: {e}"));
        // An f16/bf16 table is kept as stored, in every precision: the norm after the gather
        // converts each row to f32 first, exactly, so the outputs are those of a table converted
        // at load, and the table takes half the memory (the full-size ModernBERT-large's: 103 MB
        // instead of 206 MB, in every worker). Half precision adds no rounding to the embeddings
        // that upstream's autocast would not.
        let embedding_name = "encoder.embeddings.tok_embeddings.weight";
        let embedding_dtype = match weights.dtype_of(embedding_name)? {
            stored @ (DType::F16 | DType::BF16) => stored,
            _ => dtype,
        };
        let tok_embeddings = weights.take(embedding_name, &[config.vocab_size, d], embedding_dtype)?;
        let embed_norm = LayerNorm::load(weights, "encoder.embeddings.norm", d, false, eps)?;
        let final_norm = LayerNorm::load(weights, "encoder.final_norm", d, false, eps)?;
        let device = weights.device().clone();
        let head_dim = config.head_dim();
        let rope = |theta| RopeTable::new(theta, head_dim, max_len, &device).map_err(device_error);
        let window = if config.layer_types.contains(&LayerType::Sliding) {
            Some(SlidingWindow::new(config.local_attention, &device).map_err(device_error)?)
        } else {
            None
        };
        let mut encoder = Self {
            tok_embeddings,
            embed_norm,
            layers: Vec::with_capacity(config.num_hidden_layers),
            final_norm,
            global_rope: rope(config.global_rope_theta)?,
            local_rope: rope(config.local_rope_theta)?,
            window,
            heads: config.num_attention_heads,
            head_dim,
            intermediate: inter,
            kernels,
            // Set once every layer is in: a float32 layer handed out runs its attention in f32.
            attention_bf16: None,
        };
        for (i, &kind) in config.layer_types.iter().enumerate() {
            let p = format!("encoder.layers.{i}");
            let attn_norm = if i == 0 {
                None
            } else {
                Some(LayerNorm::load(weights, &format!("{p}.attn_norm"), d, false, eps)?)
            };
            let mut wqkv = Linear::load(weights, &format!("{p}.attn.Wqkv"), (3 * d, d), false, dtype)?;
            // softmax(q·kᵀ·s) = softmax((s·q)·kᵀ), and RoPE is linear: scale the query rows once here.
            wqkv.scale_outputs(0, d, (config.head_dim() as f64).powf(-0.5))
                .map_err(|e| LoadError::Device(format!("{p}.attn.Wqkv: {e}")))?;
            let mut layer = EncoderLayer {
                attn_norm,
                wqkv,
                wo: Linear::load(weights, &format!("{p}.attn.Wo"), (d, d), false, dtype)?,
                mlp_norm: LayerNorm::load(weights, &format!("{p}.mlp_norm"), d, false, eps)?,
                wi: {
                    let mut wi = Linear::load(weights, &format!("{p}.mlp.Wi"), (2 * inter, d), false, dtype)?;
                    wi.fuse_geglu();
                    wi
                },
                mlp_wo: Linear::load(weights, &format!("{p}.mlp.Wo"), (d, inter), false, dtype)?,
                kind,
            };
            if let Some(hook) = float32_layer.as_deref_mut() {
                finish_all(layer.matrices(), kernels, MatrixFormat::Float32, &p)?;
                let keep = hook(&encoder, &layer)
                    .map_err(|e| LoadError::Device(format!("{p}: running rows through it in float32: {e}")))?;
                if !keep {
                    continue;
                }
            }
            finish_all(layer.matrices(), kernels, format, &p)?;
            encoder.layers.push(layer);
        }
        encoder.attention_bf16 = (format == MatrixFormat::Bf16)
            .then(|| bf16_attention(kernels))
            .flatten();
        Ok(encoder)
    }

    /// The integer kernel that goes with the packed float family (for the decision head too).
    pub(crate) fn int8_kernel_choice(&self) -> Int8Kernel {
        Int8Kernel::for_family(self.kernels)
    }

    /// The float family the weights were packed for.
    pub(crate) fn kernels(&self) -> CpuKernels {
        self.kernels
    }

    /// Replaces every encoder matrix by its int8 quantization (`dtype = "int8"`, CPU only), for the
    /// integer kernel that goes with the packed float family.
    pub(crate) fn quantize_for_cpu(&mut self) -> candle_core::Result<()> {
        let kernel = self.int8_kernel_choice();
        for linear in self.layer_matrices() {
            linear.quantize_for_cpu(kernel)?;
        }
        Ok(())
    }

    /// Replaces every packed encoder matrix by its bf16 rounding for the bf16 kernels, and (except
    /// beside the f16 and widened kernels) runs the attention's products in bf16 too (rows
    /// multiplied where they lie, on the same instruction).
    pub(crate) fn round_to_bf16_for_cpu(&mut self) -> candle_core::Result<()> {
        for linear in self.layer_matrices() {
            linear.round_to_bf16_for_cpu()?;
        }
        self.attention_bf16 = bf16_attention(self.kernels);
        Ok(())
    }

    /// How the quantized matrices (VNNI layout) quantize their activation rows.
    pub(crate) fn set_int8_activations(&mut self, bits: Int8Activations) {
        for linear in self.layer_matrices() {
            linear.set_int8_activations(bits);
        }
    }

    /// Every layer's four matrices (Wqkv, attention Wo, MLP Wi, MLP Wo), layer by layer.
    fn layer_matrices(&mut self) -> impl Iterator<Item = &mut Linear> {
        self.layers.iter_mut().flat_map(EncoderLayer::matrices)
    }

    /// The activations of the quantized matrices when they run the VNNI kernel.
    pub(crate) fn int8_activations(&self) -> Option<Int8Activations> {
        self.layers.first().and_then(|layer| layer.wqkv.int8_activations())
    }

    /// The integer kernel and activations of the quantized matrices (`None` before quantizing).
    pub(crate) fn int8_kernel(&self) -> Option<String> {
        self.layers.first().and_then(|layer| layer.wqkv.int8_kernel())
    }

    /// The masks for rows of `lengths` padded to `len`.
    pub(crate) fn masks(&self, lengths: &[usize], len: usize, device: &Device) -> candle_core::Result<ForwardMasks> {
        let key_padding = crate::layers::attention::key_padding_mask(lengths, len, device)?;
        let sliding = match &self.window {
            Some(window) => Some(window.plan(lengths, len, key_padding.as_ref(), window.banded_at(len))?),
            None => None,
        };
        Ok(ForwardMasks {
            key_padding,
            sliding,
            lengths: Some(lengths.to_vec()),
        })
    }

    /// `ids` `[batch·len]` (right-padded rows) to the final hidden states `[batch·len, hidden]`, f32.
    pub(crate) fn forward(
        &self,
        ids: &Tensor,
        shape: (usize, usize),
        masks: &ForwardMasks,
    ) -> candle_core::Result<Tensor> {
        self.forward_embedded(&self.tok_embeddings.index_select(ids, 0)?, shape, masks)
    }

    /// `ids` `[batch·len]` to the first layer's input: the token embeddings, normed.
    pub(crate) fn embedded(&self, ids: &Tensor) -> candle_core::Result<Tensor> {
        self.embed_norm.forward(&self.tok_embeddings.index_select(ids, 0)?)
    }

    /// The last layer's output to the encoder's: the final norm.
    pub(crate) fn normed_output(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        self.final_norm.forward(x)
    }

    /// Token-embedding rows `[batch·len, hidden]` (before the embedding norm, any float dtype) to the
    /// final hidden states `[batch·len, hidden]`, f32: the encoder after its gather, for callers that
    /// gather on their own (the Neural Engine worker's graph contract).
    pub(crate) fn forward_embedded(
        &self,
        embeddings: &Tensor,
        shape: (usize, usize),
        masks: &ForwardMasks,
    ) -> candle_core::Result<Tensor> {
        let mut x = self.embed_norm.forward(embeddings)?;
        for layer in &self.layers {
            x = self.layer_forward(layer, &x, shape, masks)?;
        }
        self.final_norm.forward(&x)
    }

    /// One layer on `x` `[batch·len, hidden]`.
    pub(crate) fn layer_forward(
        &self,
        layer: &EncoderLayer,
        x: &Tensor,
        shape: (usize, usize),
        masks: &ForwardMasks,
    ) -> candle_core::Result<Tensor> {
        let normed = match &layer.attn_norm {
            Some(norm) => norm.forward(x)?,
            None => x.clone(),
        };
        let qkv = layer.wqkv.forward(&normed)?;
        let rope = match layer.kind {
            LayerType::Full => &self.global_rope,
            LayerType::Sliding => &self.local_rope,
        };
        let fused = qkv.device().is_cpu() && qkv.dtype() == DType::F32 && self.kernels != CpuKernels::Gemm;
        let merged = match &masks.lengths {
            Some(lengths) if fused => {
                let (cos, sin) = rope.host_tables();
                let op = AttentionOp {
                    lengths,
                    len: shape.1,
                    heads: self.heads,
                    head_dim: self.head_dim,
                    cos,
                    sin,
                    half_window: match (layer.kind, &self.window) {
                        (LayerType::Sliding, Some(window)) => Some(window.half_window()),
                        _ => None,
                    },
                    kernels: self.kernels,
                    bf16: self.attention_bf16,
                };
                qkv.contiguous()?.apply_op1_no_bwd(&op)?
            }
            _ => {
                let [q, k, v] = split_heads(&qkv, shape, self.heads, self.head_dim)?;
                let (q, k) = (rope.apply(&q)?, rope.apply(&k)?);
                let attended = match (layer.kind, &masks.sliding) {
                    (LayerType::Sliding, Some(plan)) => plan.attend(&q, &k, &v)?,
                    _ => attend(&q, &k, &v, masks.key_padding.as_ref())?,
                };
                merge_heads(&attended)?
            }
        };
        let x = residual(x, &layer.wo.forward(&merged)?.to_dtype(DType::F32)?)?;
        let projected = layer.wi.forward(&layer.mlp_norm.forward(&x)?)?;
        let activated = if layer.wi.applies_geglu() {
            projected
        } else if projected.device().is_cpu() && projected.dtype() == DType::F32 {
            projected.apply_op1_no_bwd(&GeGluOp(self.kernels))?
        } else {
            let input = projected.narrow(1, 0, self.intermediate)?;
            (input.gelu_erf()? * projected.narrow(1, self.intermediate, self.intermediate)?)?
        };
        residual(&x, &layer.mlp_wo.forward(&activated)?.to_dtype(DType::F32)?)
    }
}

/// `x + y` (f32): the fused add on the CPU, candle's elsewhere.
fn residual(x: &Tensor, y: &Tensor) -> candle_core::Result<Tensor> {
    if x.device().is_cpu() && x.dtype() == DType::F32 && y.dtype() == DType::F32 {
        x.contiguous()?.apply_op2_no_bwd(&y.contiguous()?, &AddOp)
    } else {
        x + y
    }
}
