//! One Laya checkpoint as a candle model: the ModernBERT encoder plus the decision head, loaded
//! strictly from `model.safetensors` and run on a padded batch of prompt rows.

pub(crate) mod batch;
pub(crate) mod decision_head;
mod layerwise;
pub(crate) mod modernbert;

use std::borrow::Borrow;
use std::time::Instant;

use candle_core::{DType, Device, Tensor};
use laya::checkpoint::Checkpoint;
use layad_cpu_kernels::CpuKernels;
use layad_cpu_kernels::bf16::Bf16Kernel;
use layad_cpu_kernels::int8::Int8Activations;
use layad_proto::{Row, RowOutput};

use crate::error::LoadError;
use crate::layers::attention::SlidingPlan;
pub use crate::layers::linear::MatrixFormat;
use crate::weights::Weights;
use batch::PaddedBatch;
use decision_head::{DecisionHead, HeadLayer, HeadLayerHook};
use layerwise::LayerwiseForward;
use modernbert::{Encoder, EncoderLayer, EncoderLayerHook, ForwardMasks};

/// Inputs of [`LayaModel::forward_graph`] for one row padded to `len`, on the model's device.
pub struct GraphRowInputs<'a> {
    /// `[len, hidden]` token-embedding rows before the embedding norm; padding rows are zero.
    pub embeddings: &'a Tensor,
    /// `[len(query), len(key)]` additive mask of full-attention layers and of the head layers.
    pub full_mask: &'a Tensor,
    /// `[len(query), len(key)]` additive mask of sliding-window layers (window and padding).
    pub local_mask: &'a Tensor,
    /// `[hidden]` the question type's row of `type_emb`.
    pub type_vector: &'a Tensor,
    /// `[len, slots]` one-hot: 1 at (marker position, slot); an unused slot is a zero column.
    pub marker_map: &'a Tensor,
}

/// Outputs of [`LayaModel::forward_graph`], float32.
#[derive(Clone, Debug, PartialEq)]
pub struct GraphRowOutputs {
    /// The scorer's logit for every slot (unused slots included; callers keep the first k).
    pub slot_logits: Vec<f32>,
    /// The head output at position 0, the act head's pooled input.
    pub cls: Vec<f32>,
}

/// Upstream's act features from a row's slot logits (padded slots at −1e4) and its number of
/// options: `[top1, top1 − top2, entropy / ln k, k / 255]` (spec §4.3 step 5), as the head computes them.
pub fn act_features(slots: &[f32], options: usize) -> [f32; 4] {
    decision_head::act_features(slots, options)
}

/// Float32 softmax, as the engine applies it to act logits.
pub fn act_softmax(logits: &[f32]) -> Vec<f32> {
    decision_head::softmax(logits)
}

/// A loaded decision model on one device, in one precision.
pub struct LayaModel {
    encoder: Encoder,
    head: DecisionHead,
    device: Device,
    /// Ids must be below this.
    pub vocab_size: usize,
    /// Longest row accepted: the checkpoint's `max_len`, or upstream 0.4.x's token budget
    /// (8192) when that is longer, since a request may raise its own `max_len` to it. Rotary
    /// positions have no table to outgrow; only the RoPE tables are sized for it.
    pub max_len: usize,
    /// Lower-case hex SHA-256 of the `model.safetensors` bytes it was loaded from.
    pub weights_sha256: String,
}

impl LayaModel {
    /// Builds the model described by `checkpoint`'s configs from its weights file, with matmul
    /// weights in `dtype`, on `device`. `name` only labels errors.
    /// On the CPU in f32 the matrices are packed for the best kernels this CPU has.
    pub fn load(name: &str, checkpoint: &Checkpoint, device: &Device, dtype: DType) -> Result<Self, LoadError> {
        Self::load_with_positions(name, checkpoint, device, dtype, checkpoint.agent.max_len)
    }

    /// [`LayaModel::load`] with the CPU kernel family chosen by the caller (one the CPU has; see
    /// [`CpuKernels::available`]).
    pub fn load_with_kernels(
        name: &str,
        checkpoint: &Checkpoint,
        device: &Device,
        dtype: DType,
        kernels: CpuKernels,
    ) -> Result<Self, LoadError> {
        let finish = (kernels, MatrixFormat::Float32);
        Self::load_inner(
            name,
            checkpoint,
            device,
            dtype,
            checkpoint.agent.max_len,
            finish,
            None,
            None,
        )
    }

    /// A float32 CPU load whose encoder and head-layer matrices are left in `format` ([`Self::quantize_encoder`]
    /// or [`Self::bf16_encoder`] after [`Self::load_with_kernels`] give the same model), each reduced
    /// as soon as it is read: the float32 weights of the whole model never exist at once (an int8
    /// start of the full-size ModernBERT-large peaked at 1.77 GB building them, for a model of
    /// 0.6 GB). For a start that needs no float32 forward, the gate's reference being kept.
    /// `weights_sha256`, when the caller already hashed the file, is not computed again.
    pub fn load_reduced(
        name: &str,
        checkpoint: &Checkpoint,
        kernels: CpuKernels,
        format: MatrixFormat,
        weights_sha256: Option<String>,
    ) -> Result<Self, LoadError> {
        let finish = (kernels, format);
        let positions = checkpoint.agent.max_len;
        Self::load_inner(
            name,
            checkpoint,
            &Device::Cpu,
            DType::F32,
            positions,
            finish,
            weights_sha256,
            None,
        )
    }

    /// [`Self::load_reduced`] that also runs `batches` (the gate's rows) through the float32
    /// model, one layer at a time as it loads: each layer runs in float32 before it is reduced
    /// (`layerwise`). Returns the model in `format` and the rows' float32 outputs in row order,
    /// which [`Self::forward`] on the float32 model gives bit for bit, without the float32 model
    /// ever existing whole.
    pub fn load_reduced_with_reference(
        name: &str,
        checkpoint: &Checkpoint,
        kernels: CpuKernels,
        format: MatrixFormat,
        weights_sha256: Option<String>,
        batches: &[Vec<Row>],
    ) -> Result<(Self, Vec<RowOutput>), LoadError> {
        Self::load_running_rows(name, checkpoint, (kernels, format), weights_sha256, batches, true)
    }

    /// The float32 outputs of `batches` on `checkpoint`, run on the CPU one layer at a time while
    /// the weights are read, each layer dropped once it ran: what [`Self::forward`] on a float32
    /// load packed for `kernels` gives, bit for bit, with one float32 layer (and the embeddings)
    /// in memory at a time instead of the whole model. The gate's reference for a model that is
    /// not reduced from float32 on the CPU (f16 or bf16 on a GPU, or through candle's CPU ops).
    /// `weights_sha256`, when the caller knows it, is not computed again.
    pub fn float32_outputs(
        name: &str,
        checkpoint: &Checkpoint,
        kernels: CpuKernels,
        weights_sha256: Option<String>,
        batches: &[Vec<Row>],
    ) -> Result<Vec<RowOutput>, LoadError> {
        let finish = (kernels, MatrixFormat::Float32);
        // The model comes back without its layers, and is dropped here.
        Self::load_running_rows(name, checkpoint, finish, weights_sha256, batches, false).map(|(_, outputs)| outputs)
    }

    /// A CPU load whose matrices are finished in `format`, `batches` run through each layer in
    /// float32 before it is reduced, and kept (`keep_layers`) or dropped; the rows' outputs.
    fn load_running_rows(
        name: &str,
        checkpoint: &Checkpoint,
        finish: (CpuKernels, MatrixFormat),
        weights_sha256: Option<String>,
        batches: &[Vec<Row>],
        keep_layers: bool,
    ) -> Result<(Self, Vec<RowOutput>), LoadError> {
        let mut reference = LayerwiseForward::new(batches, &Device::Cpu, keep_layers)
            .map_err(|e| LoadError::Device(format!("laying out the reference rows: {e}")))?;
        let model = Self::load_inner(
            name,
            checkpoint,
            &Device::Cpu,
            DType::F32,
            checkpoint.agent.max_len,
            finish,
            weights_sha256,
            Some(&mut reference),
        )?;
        let outputs = reference
            .outputs(&model.head)
            .map_err(|e| LoadError::Device(format!("the reference rows' scores: {e}")))?;
        Ok((model, outputs))
    }

    /// [`LayaModel::load`] with RoPE tables for at least `positions` positions, for callers that pad
    /// rows beyond the checkpoint's `max_len` (a fixed length bucket larger than it).
    pub fn load_with_positions(
        name: &str,
        checkpoint: &Checkpoint,
        device: &Device,
        dtype: DType,
        positions: usize,
    ) -> Result<Self, LoadError> {
        let finish = (CpuKernels::detect(), MatrixFormat::Float32);
        Self::load_inner(name, checkpoint, device, dtype, positions, finish, None, None)
    }

    /// The load behind every constructor; with `reference`, its rows run through each float32
    /// layer before the layer is reduced (their outputs are left for the caller to read).
    #[allow(clippy::too_many_arguments)] // the constructors' settings, passed through
    fn load_inner(
        name: &str,
        checkpoint: &Checkpoint,
        device: &Device,
        dtype: DType,
        positions: usize,
        (kernels, format): (CpuKernels, MatrixFormat),
        weights_sha256: Option<String>,
        mut reference: Option<&mut LayerwiseForward>,
    ) -> Result<Self, LoadError> {
        if !kernels.available() {
            return Err(LoadError::Device(format!("this CPU has no {kernels} kernels")));
        }
        // Every load that leaves its matrices in bf16 (with or without the reference rows).
        if format == MatrixFormat::Bf16 && Bf16Kernel::for_family(kernels).is_none() {
            return Err(LoadError::Device(format!(
                "the bf16 kernels need the avx512 or amx family, not {kernels}"
            )));
        }
        let config = &checkpoint.encoder;
        if config.biases {
            return Err(LoadError::Unsupported {
                name: name.to_owned(),
                problem: "encoder/config.json asks for attention/MLP/norm biases; Laya encoders have none".to_owned(),
            });
        }
        if config.hidden_activation != "gelu" {
            return Err(LoadError::Unsupported {
                name: name.to_owned(),
                problem: format!(
                    "encoder/config.json hidden_activation '{}' is not supported (only exact 'gelu')",
                    config.hidden_activation
                ),
            });
        }
        if !config.head_dim().is_multiple_of(2) {
            return Err(LoadError::Unsupported {
                name: name.to_owned(),
                problem: format!("head dimension {} is odd; RoPE needs an even one", config.head_dim()),
            });
        }
        let max_len = checkpoint.agent.max_len.max(laya::request::DEFAULT_MAX_TOKEN_BUDGET);
        // Each phase's time is logged: start-up is part of what an operator waits for.
        let started = Instant::now();
        let mut weights = Weights::read(&checkpoint.weights.path, device, weights_sha256)?;
        let read_ms = started.elapsed().as_secs_f64() * 1e3;
        let finish = (dtype, kernels, format);
        let encoder = {
            let mut run = reference
                .as_deref_mut()
                .map(|rows| move |encoder: &Encoder, layer: &EncoderLayer| rows.encoder_layer(encoder, layer));
            let hook = run.as_mut().map(|run| run as &mut EncoderLayerHook<'_>);
            Encoder::load(&mut weights, config, max_len.max(positions), finish, hook)?
        };
        let head = {
            let mut run = match reference {
                Some(rows) => {
                    rows.encoded(&encoder)
                        .map_err(|e| LoadError::Device(format!("encoder.final_norm: running rows through it: {e}")))?;
                    Some(move |head: &DecisionHead, layer: &HeadLayer, last| rows.head_layer(head, layer, last))
                }
                None => None,
            };
            let hook = run.as_mut().map(|run| run as &mut HeadLayerHook<'_>);
            DecisionHead::load(
                &mut weights,
                config.hidden_size,
                checkpoint.agent.head_layers,
                finish,
                hook,
            )?
        };
        let weights_sha256 = weights.sha256()?;
        weights.finish()?;
        let total_ms = started.elapsed().as_secs_f64() * 1e3;
        tracing::info!(
            checkpoint = name,
            read_ms,
            build_ms = total_ms - read_ms,
            total_ms,
            matrices = ?format,
            "weights loaded"
        );
        Ok(Self {
            encoder,
            head,
            device: device.clone(),
            vocab_size: config.vocab_size,
            max_len,
            weights_sha256,
        })
    }

    /// Switches the encoder's (and the head layers') matrix products to int8 weights (`dtype =
    /// "int8"`): each matrix is quantized per output column from the loaded float32 weights, which
    /// are then dropped.
    /// The decision head's layers are quantized the same way (their first layer costs about what an
    /// encoder layer does per token); embeddings, norms, attention, the scorer and the act head stay
    /// float32. CPU and f32 models only.
    /// The integer kernel follows the float family the model was packed for: AVX512-VNNI (u8 × s8,
    /// 8-bit activations until [`LayaModel::set_int8_activations`] says otherwise) beside AVX-512
    /// where the CPU has VNNI; AVX-VNNI (the same u8 × s8 quads on 256-bit registers) beside AVX2
    /// where the CPU has it, else the AVX2 i16 kernel.
    pub fn quantize_encoder(&mut self) -> candle_core::Result<()> {
        if !self.device.is_cpu() {
            candle_core::bail!("int8 runs on the CPU only")
        }
        self.encoder.quantize_for_cpu()?;
        self.head.quantize_for_cpu(self.encoder.int8_kernel_choice())
    }

    /// Switches the matrix products of the encoder and of the decision head's layers to bf16
    /// weights and activations with the bf16 kernel beside the model's family (`dtype = "bf16"`
    /// on an AVX-512 CPU, [`Bf16Kernel::for_family`]): the packed float32 weights are rounded to
    /// bf16 and dropped; the encoder's attention multiplies in bf16 too where the kernel pays
    /// there (not the f16 or widened ones'). Embeddings, norms, the softmax, the decision head's
    /// attention, the scorer and the act head stay float32. CPU models packed for AVX-512 only.
    pub fn bf16_encoder(&mut self) -> candle_core::Result<()> {
        if !self.device.is_cpu() || Bf16Kernel::for_family(self.encoder.kernels()).is_none() {
            candle_core::bail!("the bf16 kernels need a CPU model packed for the avx512 or amx family")
        }
        self.encoder.round_to_bf16_for_cpu()?;
        self.head.round_to_bf16_for_cpu()
    }

    /// The bf16 kernel [`LayaModel::bf16_encoder`] runs: `amx-bf16` (AMX tiles, the `amx` family),
    /// `avx512-bf16`, `avx512-fp16` or `avx512-bf16-widened` ([`Bf16Kernel::as_str`]).
    pub fn bf16_kernel(&self) -> &'static str {
        Bf16Kernel::for_family(self.encoder.kernels()).map_or("none", Bf16Kernel::as_str)
    }

    /// How the int8 matrices quantize their activation rows (VNNI kernel only; the AVX2 kernel's
    /// are always ~14-bit): 8 bits (with or without outliers held apart), or 16 bits as two u8
    /// planes.
    pub fn set_int8_activations(&mut self, bits: Int8Activations) {
        self.encoder.set_int8_activations(bits);
        self.head.set_int8_activations(bits);
    }

    /// The activations of the int8 matrices when they run the VNNI kernel (`None` for the AVX2 and
    /// portable kernels, and before quantizing).
    pub fn int8_activations(&self) -> Option<Int8Activations> {
        self.encoder.int8_activations()
    }

    /// The int8 kernel and its activations (`avx512-vnni u8 activations`), once quantized.
    pub fn int8_kernel(&self) -> Option<String> {
        self.encoder.int8_kernel()
    }

    /// The in-graph part of the Neural Engine worker's `bc1s-masked` contract on one row padded to
    /// `len`, from inputs the caller gathered and built itself: embedding norm, every encoder layer,
    /// final norm, type vector, head layers, marker gather and scorer. Agrees with [`LayaModel::forward`]
    /// on the real positions (the worker-ane tests compare the two).
    pub fn forward_graph(&self, inputs: &GraphRowInputs<'_>) -> candle_core::Result<GraphRowOutputs> {
        let (len, _) = inputs.embeddings.dims2()?;
        let as_mask = |mask: &Tensor| mask.to_dtype(DType::F32)?.reshape((1, 1, len, len));
        let full = as_mask(inputs.full_mask)?;
        let masks = ForwardMasks {
            key_padding: Some(full.clone()),
            sliding: Some(SlidingPlan::Masked(as_mask(inputs.local_mask)?)),
            lengths: None,
        };
        let hidden = self.encoder.forward_embedded(inputs.embeddings, (1, len), &masks)?;
        let (slot_logits, cls) = self
            .head
            .forward_graph(&hidden, inputs.type_vector, &full, inputs.marker_map)?;
        Ok(GraphRowOutputs { slot_logits, cls })
    }

    /// Runs `rows` as one right-padded batch. Rows must be valid for this model (see the engine).
    pub fn forward(&self, rows: &[Row]) -> candle_core::Result<Vec<RowOutput>> {
        self.forward_padded(rows, 0)
    }

    /// Like [`LayaModel::forward`], every row padded to at least `pad_to` tokens (a length bucket);
    /// padded positions are masked, so answers change only by float rounding.
    pub fn forward_padded<R: Borrow<Row>>(&self, rows: &[R], pad_to: usize) -> candle_core::Result<Vec<RowOutput>> {
        if rows.is_empty() {
            return Ok(Vec::new());
        }
        let batch = PaddedBatch::new(rows, pad_to, &self.device)?;
        let masks = self.encoder.masks(&batch.lengths, batch.len, &self.device)?;
        let hidden = self.encoder.forward(&batch.ids, (batch.rows(), batch.len), &masks)?;
        let out = self.head.forward(&hidden, &batch, masks.key_padding.as_ref())?;
        Ok(out.into_rows())
    }
}
