//! Laya's typed decision head on top of the encoder (spec §4.3, upstream `DecisionModel.forward`):
//! question-type embedding, pre-norm transformer layers, the per-option scorer and the act head.
//!
//! The act features (softmax over the padded option slots, entropy, top-two gap) are a handful of
//! floats per row; they are computed on the host in float32, between the scorer and the act head.

use candle_core::{DType, Tensor};
use layad_cpu_kernels::CpuKernels;
use layad_cpu_kernels::int8::{Int8Activations, Int8Kernel};
use layad_proto::RowOutput;

use crate::error::LoadError;
use crate::layers::attention::attend;
use crate::layers::linear::{Linear, MatrixFormat, finish_all};
use crate::layers::norm::LayerNorm;
use crate::model::batch::PaddedBatch;
use crate::model::modernbert::{merge_heads, split_heads};
use crate::weights::Weights;

/// PyTorch's default LayerNorm epsilon, used by the head and the scorer.
const HEAD_NORM_EPS: f64 = 1e-5;
/// Width of the act head's hidden layer (fixed upstream).
const ACT_HIDDEN: usize = 256;
/// Logit upstream writes into option slots a row does not have.
const PADDED_SLOT_LOGIT: f32 = -1e4;

/// One `nn.TransformerEncoderLayer(norm_first=True, activation=relu)` in eval mode.
pub(crate) struct HeadLayer {
    norm1: LayerNorm,
    in_proj: Linear,
    out_proj: Linear,
    norm2: LayerNorm,
    linear1: Linear,
    linear2: Linear,
}

impl HeadLayer {
    /// The layer's four matrices: in_proj, out_proj, linear1, linear2.
    fn matrices(&mut self) -> [&mut Linear; 4] {
        [
            &mut self.in_proj,
            &mut self.out_proj,
            &mut self.linear1,
            &mut self.linear2,
        ]
    }
}

/// What a load hands each head layer to in float32 ([`DecisionHead::load`]), with the head built
/// so far and whether it is the last layer; it returns whether the load keeps the layer.
pub(crate) type HeadLayerHook<'a> = dyn FnMut(&DecisionHead, &HeadLayer, bool) -> candle_core::Result<bool> + 'a;

/// What the head computed for a batch, per row.
pub(crate) struct HeadOutput {
    /// The row's option logits (its first `#markers` slots), float32.
    pub(crate) logits: Vec<Vec<f32>>,
    /// The raw act-head logits.
    pub(crate) act_logits: Vec<Vec<f32>>,
}

impl HeadOutput {
    /// The rows' answers: option logits, act probabilities (float32 softmax).
    pub(crate) fn into_rows(self) -> Vec<RowOutput> {
        self.logits
            .into_iter()
            .zip(self.act_logits)
            .map(|(logits, act_logits)| RowOutput {
                logits,
                act_probabilities: softmax(&act_logits),
            })
            .collect()
    }
}

/// `type_emb`, the head layers, `scorer` and `act_head`.
pub(crate) struct DecisionHead {
    type_emb: Tensor,
    layers: Vec<HeadLayer>,
    heads: usize,
    head_dim: usize,
    scorer_norm: LayerNorm,
    scorer_dense: Linear,
    scorer_out: Linear,
    act_dense: Linear,
    act_out: Linear,
}

impl DecisionHead {
    /// Takes `type_emb.`, `head.layers.{0..head_layers}.` (matmul weights in `dtype`, each layer's
    /// finished for `kernels` in `format` as it is read), `scorer.`, `act_head.` (finished in
    /// float32) and the unused `temperature` buffer. `n_act` is read from `act_head.2.weight`.
    ///
    /// With `float32_layer`, each head layer is first finished in float32 and handed to it (with
    /// the head built so far and whether it is the last layer), then reduced and kept, or dropped
    /// where the hook returns `false`, as the encoder's load does for the gate's reference rows.
    pub(crate) fn load(
        weights: &mut Weights,
        hidden: usize,
        head_layers: usize,
        (dtype, kernels, format): (DType, CpuKernels, MatrixFormat),
        mut float32_layer: Option<&mut HeadLayerHook<'_>>,
    ) -> Result<Self, LoadError> {
        let d = hidden;
        let heads = (d / 64).max(1);
        let n_act = weights.shape_of("act_head.2.weight")?.first().copied().unwrap_or(0);
        // Read for the strict load only: the runtime takes temperatures from rl_agent_config.json.
        weights.take("temperature", &[3], DType::F32)?;
        // The scorer and act head see `kmax` and one vectors per row, so float32 costs nothing there,
        // and keeps half-precision logits from being rounded to f16/bf16 steps (2^-6 at 3.0 in bf16).
        let mut head = Self {
            type_emb: weights.take("type_emb.weight", &[3, d], DType::F32)?,
            layers: Vec::with_capacity(head_layers),
            heads,
            head_dim: d / heads,
            scorer_norm: LayerNorm::load(weights, "scorer.0", d, true, HEAD_NORM_EPS)?,
            scorer_dense: Linear::load(weights, "scorer.1", (d, d), true, DType::F32)?,
            scorer_out: Linear::load(weights, "scorer.3", (1, d), true, DType::F32)?,
            act_dense: Linear::load(weights, "act_head.0", (ACT_HIDDEN, d + 4), true, DType::F32)?,
            act_out: Linear::load(weights, "act_head.2", (n_act, ACT_HIDDEN), true, DType::F32)?,
        };
        let scorer_and_act = [
            &mut head.scorer_dense,
            &mut head.scorer_out,
            &mut head.act_dense,
            &mut head.act_out,
        ];
        finish_all(scorer_and_act, kernels, MatrixFormat::Float32, "scorer, act_head")?;
        for j in 0..head_layers {
            let p = format!("head.layers.{j}");
            let mut in_proj = Linear::load_named(
                weights,
                &format!("{p}.self_attn.in_proj_weight"),
                Some(&format!("{p}.self_attn.in_proj_bias")),
                (3 * d, d),
                dtype,
            )?;
            // The attention scale folded into the query rows, as in the encoder.
            in_proj
                .scale_outputs(0, d, ((d / heads) as f64).powf(-0.5))
                .map_err(|e| LoadError::Device(format!("{p}.self_attn.in_proj_weight: {e}")))?;
            let mut layer = HeadLayer {
                norm1: LayerNorm::load(weights, &format!("{p}.norm1"), d, true, HEAD_NORM_EPS)?,
                in_proj,
                out_proj: Linear::load(weights, &format!("{p}.self_attn.out_proj"), (d, d), true, dtype)?,
                norm2: LayerNorm::load(weights, &format!("{p}.norm2"), d, true, HEAD_NORM_EPS)?,
                linear1: Linear::load(weights, &format!("{p}.linear1"), (4 * d, d), true, dtype)?,
                linear2: Linear::load(weights, &format!("{p}.linear2"), (d, 4 * d), true, dtype)?,
            };
            if let Some(hook) = float32_layer.as_deref_mut() {
                finish_all(layer.matrices(), kernels, MatrixFormat::Float32, &p)?;
                let keep = hook(&head, &layer, j + 1 == head_layers)
                    .map_err(|e| LoadError::Device(format!("{p}: running rows through it in float32: {e}")))?;
                if !keep {
                    continue;
                }
            }
            finish_all(layer.matrices(), kernels, format, &p)?;
            head.layers.push(layer);
        }
        Ok(head)
    }

    /// Replaces the head layers' matrices (in_proj, out_proj, linear1, linear2: about as many
    /// multiply-adds per token as one encoder layer, for the first head layer) by their int8
    /// quantization for `kernel` (`dtype = "int8"`); the scorer and the act head, which see a few
    /// rows, stay float32.
    pub(crate) fn quantize_for_cpu(&mut self, kernel: Int8Kernel) -> candle_core::Result<()> {
        for linear in self.layer_matrices() {
            linear.quantize_for_cpu(kernel)?;
        }
        Ok(())
    }

    /// Replaces the head layers' matrices by their bf16 rounding for the bf16 kernels
    /// (`dtype = "bf16"` on such a CPU), as [`Self::quantize_for_cpu`] does for int8.
    pub(crate) fn round_to_bf16_for_cpu(&mut self) -> candle_core::Result<()> {
        for linear in self.layer_matrices() {
            linear.round_to_bf16_for_cpu()?;
        }
        Ok(())
    }

    /// The head layers' four matrices each (in_proj, out_proj, linear1, linear2), layer by layer.
    fn layer_matrices(&mut self) -> impl Iterator<Item = &mut Linear> {
        self.layers.iter_mut().flat_map(HeadLayer::matrices)
    }

    /// How the quantized head matrices (VNNI layout) quantize their activation rows.
    pub(crate) fn set_int8_activations(&mut self, bits: Int8Activations) {
        for linear in self.layer_matrices() {
            linear.set_int8_activations(bits);
        }
    }

    /// Runs the head on the encoder output `hidden` `[rows·len, d]` (float32).
    pub(crate) fn forward(
        &self,
        hidden: &Tensor,
        batch: &PaddedBatch,
        key_padding: Option<&Tensor>,
    ) -> candle_core::Result<HeadOutput> {
        let mut h = self.typed(hidden, batch)?;
        if self.layers.is_empty() {
            h = h.index_select(&batch.selected, 0)?;
        }
        for (j, layer) in self.layers.iter().enumerate() {
            h = self.layer_step(layer, &h, batch, key_padding, j + 1 == self.layers.len())?;
        }
        self.score(&h, batch)
    }

    /// The encoder output `hidden` `[rows·len, d]` plus each row's question-type embedding: the
    /// first head layer's input.
    pub(crate) fn typed(&self, hidden: &Tensor, batch: &PaddedBatch) -> candle_core::Result<Tensor> {
        let (rows, len) = (batch.rows(), batch.len);
        let d = hidden.dim(1)?;
        let typed = self.type_emb.index_select(&batch.qtypes, 0)?.unsqueeze(1)?;
        hidden
            .reshape((rows, len, d))?
            .broadcast_add(&typed)?
            .reshape((rows * len, d))
    }

    /// One head layer on `h` `[rows·len, d]`. Only the first token and the markers are read after
    /// the head, so the `last` layer's queries, output projection and FFN run on those rows alone
    /// (its keys cover every token): it returns `[rows·(1 + kmax), d]`.
    pub(crate) fn layer_step(
        &self,
        layer: &HeadLayer,
        h: &Tensor,
        batch: &PaddedBatch,
        key_padding: Option<&Tensor>,
        last: bool,
    ) -> candle_core::Result<Tensor> {
        let queries = last.then_some(&batch.selected);
        self.layer_forward(layer, h, (batch.rows(), batch.len), key_padding, queries)
    }

    /// The scorer and the act head on the head's output at the selected positions
    /// `[rows·(1 + kmax), d]` (per row its first token, then its markers).
    pub(crate) fn score(&self, selected: &Tensor, batch: &PaddedBatch) -> candle_core::Result<HeadOutput> {
        let (rows, kmax) = (batch.rows(), batch.kmax);
        let d = selected.dim(1)?;
        let selected = selected.reshape((rows, 1 + kmax, d))?;
        let options = selected.narrow(1, 1, kmax)?.reshape((rows * kmax, d))?;
        let scored = self.scorer_dense.forward(&self.scorer_norm.forward(&options)?)?;
        let slot_logits = self
            .scorer_out
            .forward(&scored.gelu_erf()?)?
            .flatten_all()?
            .to_vec1::<f32>()?;
        let mut logits = Vec::with_capacity(rows);
        let mut features = Vec::with_capacity(rows * 4);
        for (row, &count) in batch.marker_counts.iter().enumerate() {
            let mut slots = slot_logits[row * kmax..(row + 1) * kmax].to_vec();
            slots[count..].fill(PADDED_SLOT_LOGIT);
            features.extend(act_features(&slots, count));
            slots.truncate(count);
            logits.push(slots);
        }
        let features = Tensor::from_vec(features, (rows, 4), selected.device())?;
        let pooled = selected.narrow(1, 0, 1)?.squeeze(1)?;
        let act_input = Tensor::cat(&[&pooled, &features], 1)?;
        let act_logits = self
            .act_out
            .forward(&self.act_dense.forward(&act_input)?.gelu_erf()?)?
            .to_vec2::<f32>()?;
        Ok(HeadOutput { logits, act_logits })
    }

    /// The head as the Neural Engine graph contract runs it on one row padded to `len`: `hidden`
    /// `[len, d]` (f32, the encoder output), `type_vector` `[d]`, `mask` an additive f32 mask that
    /// broadcasts to `[1, heads, len(query), len(key)]`, `marker_map` `[len, slots]` one-hot (an unused
    /// slot is a zero column, so it gathers a zero vector). Returns the scorer's logit for every slot
    /// and the head output at position 0, both f32; the act head is left to the caller.
    pub(crate) fn forward_graph(
        &self,
        hidden: &Tensor,
        type_vector: &Tensor,
        mask: &Tensor,
        marker_map: &Tensor,
    ) -> candle_core::Result<(Vec<f32>, Vec<f32>)> {
        let (len, d) = hidden.dims2()?;
        let mut h = hidden.broadcast_add(&type_vector.to_dtype(DType::F32)?.reshape((1, d))?)?;
        for layer in &self.layers {
            h = self.layer_forward(layer, &h, (1, len), Some(mask), None)?;
        }
        // The gather as a product with the one-hot map, like the graph: exact, each sum has one term.
        let options = marker_map.to_dtype(DType::F32)?.t()?.matmul(&h)?;
        let scored = self.scorer_dense.forward(&self.scorer_norm.forward(&options)?)?;
        let slot_logits = self
            .scorer_out
            .forward(&scored.gelu_erf()?)?
            .flatten_all()?
            .to_vec1::<f32>()?;
        let cls = h.narrow(0, 0, 1)?.flatten_all()?.to_vec1::<f32>()?;
        Ok((slot_logits, cls))
    }

    /// One head layer on `x` `[rows·len, d]`. With `queries` (flat positions, the same number per
    /// row) only those positions are computed and returned, `[#queries, d]`.
    fn layer_forward(
        &self,
        layer: &HeadLayer,
        x: &Tensor,
        (rows, len): (usize, usize),
        key_padding: Option<&Tensor>,
        queries: Option<&Tensor>,
    ) -> candle_core::Result<Tensor> {
        let projected = layer.in_proj.forward(&layer.norm1.forward(x)?)?;
        let [q, k, v] = split_heads(&projected, (rows, len), self.heads, self.head_dim)?;
        let (x, q) = match queries {
            None => (x.clone(), q),
            Some(positions) => {
                let per_row = positions.dim(0)? / rows;
                let [q, _, _] = split_heads(
                    &projected.index_select(positions, 0)?,
                    (rows, per_row),
                    self.heads,
                    self.head_dim,
                )?;
                (x.index_select(positions, 0)?, q)
            }
        };
        let attended = attend(&q.contiguous()?, &k.contiguous()?, &v, key_padding)?;
        let x = (x + layer.out_proj.forward(&merge_heads(&attended)?)?.to_dtype(DType::F32)?)?;
        let ffn = layer
            .linear2
            .forward(&layer.linear1.forward(&layer.norm2.forward(&x)?)?.relu()?)?;
        x + ffn.to_dtype(DType::F32)?
    }
}

/// Upstream's act features for one row from its `kmax` slot logits (padded slots already at
/// −1e4) and its number of options: `[top1, top1 − top2, entropy / ln k, k / 255]` with
/// `p = softmax(slots)`, `k = max(2, options)`, `top2 = 0` when there is a single slot.
pub(crate) fn act_features(slots: &[f32], options: usize) -> [f32; 4] {
    let p = softmax(slots);
    let k = options.max(2) as f32;
    let entropy = -p.iter().map(|&pi| pi * pi.max(1e-9).ln()).sum::<f32>() / k.ln();
    let mut sorted = p;
    sorted.sort_by(|a, b| b.total_cmp(a));
    let top1 = sorted.first().copied().unwrap_or(0.0);
    let top2 = sorted.get(1).copied().unwrap_or(0.0);
    [top1, top1 - top2, entropy, k / 255.0]
}

/// Softmax in float32 (upstream's `torch.softmax` on float32 logits).
pub(crate) fn softmax(logits: &[f32]) -> Vec<f32> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let exps: Vec<f32> = logits.iter().map(|x| (x - max).exp()).collect();
    let sum: f32 = exps.iter().sum();
    exps.iter().map(|e| e / sum).collect()
}

#[cfg(test)]
mod tests {
    use super::act_features;

    #[test]
    fn act_features_follow_upstream() {
        let [top1, gap, entropy, k] = act_features(&[0.0, 0.0], 2);
        assert_eq!((top1, gap, k), (0.5, 0.0, 2.0 / 255.0));
        assert!((entropy - 1.0).abs() < 1e-6);
        // One option alone: p = [1], top2 = 0, and k is still 2.
        assert_eq!(act_features(&[3.5], 1), [1.0, 1.0, 0.0, 2.0 / 255.0]);
        // A padded slot (−1e4) gets probability 0 and does not count toward k.
        let [top1, gap, entropy, k] = act_features(&[1.0, 2.0, -1e4], 2);
        let p2 = 1.0 / (1.0 + (-1.0f32).exp());
        assert!((top1 - p2).abs() < 1e-6 && (gap - (2.0 * p2 - 1.0)).abs() < 1e-6);
        let h = -(p2 * p2.ln() + (1.0 - p2) * (1.0 - p2).ln()) / 2f32.ln();
        assert!((entropy - h).abs() < 1e-6, "{entropy} vs {h}");
        assert_eq!(k, 2.0 / 255.0);
        let [_, _, _, k] = act_features(&[0.0; 12], 12);
        assert_eq!(k, 12.0 / 255.0);
    }
}
