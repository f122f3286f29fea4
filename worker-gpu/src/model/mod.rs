//! One Laya checkpoint as a candle model: the ModernBERT encoder plus the decision head, loaded
//! strictly from `model.safetensors` and run on a padded batch of prompt rows.

pub(crate) mod batch;
pub(crate) mod decision_head;
pub(crate) mod modernbert;

use candle_core::{DType, Device};
use laya::checkpoint::Checkpoint;
use layad_proto::{EngineOutput, EngineRow};

use crate::error::LoadError;
use crate::weights::Weights;
use batch::PaddedBatch;
use decision_head::DecisionHead;
use modernbert::Encoder;

/// A loaded decision model on one device, in one precision.
pub struct LayaModel {
    encoder: Encoder,
    head: DecisionHead,
    device: Device,
    /// Ids must be below this.
    pub vocab_size: usize,
    /// Longest row accepted (`rl_agent_config.json` `max_len`).
    pub max_len: usize,
}

impl LayaModel {
    /// Builds the model described by `checkpoint`'s configs from its weights file, with matmul
    /// weights in `dtype`, on `device`. `name` only labels errors.
    pub fn load(name: &str, checkpoint: &Checkpoint, device: &Device, dtype: DType) -> Result<Self, LoadError> {
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
        let max_len = checkpoint.agent.max_len;
        let mut weights = Weights::read(&checkpoint.weights.path, device)?;
        let encoder = Encoder::load(&mut weights, config, max_len, dtype)?;
        let head = DecisionHead::load(&mut weights, config.hidden_size, checkpoint.agent.head_layers, dtype)?;
        weights.finish()?;
        Ok(Self {
            encoder,
            head,
            device: device.clone(),
            vocab_size: config.vocab_size,
            max_len,
        })
    }

    /// Runs `rows` as one right-padded batch. Rows must be valid for this model (see the engine).
    pub fn forward(&self, rows: &[EngineRow]) -> candle_core::Result<Vec<EngineOutput>> {
        if rows.is_empty() {
            return Ok(Vec::new());
        }
        let batch = PaddedBatch::new(rows, &self.device)?;
        let masks = self.encoder.masks(&batch.lengths, batch.len, &self.device)?;
        let hidden = self.encoder.forward(&batch.ids, (batch.rows(), batch.len), &masks)?;
        let out = self.head.forward(&hidden, &batch, masks.key_padding.as_ref())?;
        Ok(out
            .logits
            .into_iter()
            .zip(out.act_logits)
            .map(|(logits, act_logits)| EngineOutput {
                logits,
                act_probabilities: decision_head::softmax(&act_logits),
            })
            .collect())
    }
}
