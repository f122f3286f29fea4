//! A float32 forward of a few batches run one layer at a time while a model loads: the gate's
//! reference rows on a start that has no kept reference. Each encoder and head layer, finished in
//! float32, runs every batch's hidden states, and only then is reduced (int8, bf16) and the next
//! layer read, so the float32 model never exists whole: a first int8 start of the full-size
//! ModernBERT-large peaked at 1.8 GB building it, for a model that serves in 0.5–0.6 GB.
//!
//! The outputs are [`super::LayaModel::forward`]'s on the float32 model, bit for bit: each batch
//! goes through the same ops on the same tensors in the same order; only the order between batches
//! changes (a batch's forward does not depend on another's).

use candle_core::{Device, Tensor};
use layad_proto::{Row, RowOutput};

use super::batch::PaddedBatch;
use super::decision_head::{DecisionHead, HeadLayer};
use super::modernbert::{Encoder, EncoderLayer, ForwardMasks};

/// The batches in flight through the layers loaded so far.
pub(crate) struct LayerwiseForward {
    batches: Vec<InFlight>,
    /// Head layers run so far; `None` while the encoder runs.
    head_layers: Option<usize>,
    /// Whether the load keeps each layer once run (reduced), or drops it (the rows' outputs are
    /// all that is wanted).
    keep_layers: bool,
}

/// One batch: its rows laid out, and once the first layer ran, its masks and hidden states.
struct InFlight {
    batch: PaddedBatch,
    state: Option<(ForwardMasks, Tensor)>,
}

impl LayerwiseForward {
    /// `batches` laid out on `device`, each as one right-padded forward (as served). Empty
    /// batches have no outputs, as [`super::LayaModel::forward`] gives none.
    pub(crate) fn new(batches: &[Vec<Row>], device: &Device, keep_layers: bool) -> candle_core::Result<Self> {
        let batches = batches
            .iter()
            .filter(|rows| !rows.is_empty())
            .map(|rows| {
                Ok(InFlight {
                    batch: PaddedBatch::new(rows, 0, device)?,
                    state: None,
                })
            })
            .collect::<candle_core::Result<_>>()?;
        Ok(Self {
            batches,
            head_layers: None,
            keep_layers,
        })
    }

    /// Every batch through the next encoder layer (the token embeddings first, before layer 0);
    /// returns whether the load keeps the layer.
    pub(crate) fn encoder_layer(&mut self, encoder: &Encoder, layer: &EncoderLayer) -> candle_core::Result<bool> {
        for flight in &mut self.batches {
            let shape = (flight.batch.rows(), flight.batch.len);
            let (masks, hidden) = flight.embedded(encoder)?;
            *hidden = encoder.layer_forward(layer, hidden, shape, masks)?;
        }
        Ok(self.keep_layers)
    }

    /// Every batch through the encoder's final norm, once its last layer ran.
    pub(crate) fn encoded(&mut self, encoder: &Encoder) -> candle_core::Result<()> {
        for flight in &mut self.batches {
            let (_, hidden) = flight.embedded(encoder)?;
            *hidden = encoder.normed_output(hidden)?;
        }
        self.head_layers = Some(0);
        Ok(())
    }

    /// Every batch through the next head layer (the question types added before layer 0); the
    /// `last` one keeps only the positions the scorer reads. Returns whether the load keeps the
    /// layer.
    pub(crate) fn head_layer(
        &mut self,
        head: &DecisionHead,
        layer: &HeadLayer,
        last: bool,
    ) -> candle_core::Result<bool> {
        let done = self
            .head_layers
            .ok_or_else(|| unexpected("a head layer before the encoder's output"))?;
        for flight in &mut self.batches {
            let (masks, hidden) = flight.state.as_mut().ok_or_else(|| unexpected("no encoder output"))?;
            if done == 0 {
                *hidden = head.typed(hidden, &flight.batch)?;
            }
            *hidden = head.layer_step(layer, hidden, &flight.batch, masks.key_padding.as_ref(), last)?;
        }
        self.head_layers = Some(done + 1);
        Ok(self.keep_layers)
    }

    /// The rows' outputs, batch after batch in row order, once every head layer ran.
    pub(crate) fn outputs(self, head: &DecisionHead) -> candle_core::Result<Vec<RowOutput>> {
        let done = self
            .head_layers
            .ok_or_else(|| unexpected("outputs before the encoder's output"))?;
        let mut outputs = Vec::new();
        for flight in self.batches {
            let (_, mut hidden) = flight.state.ok_or_else(|| unexpected("no encoder output"))?;
            if done == 0 {
                hidden = head
                    .typed(&hidden, &flight.batch)?
                    .index_select(&flight.batch.selected, 0)?;
            }
            outputs.extend(head.score(&hidden, &flight.batch)?.into_rows());
        }
        Ok(outputs)
    }
}

impl InFlight {
    /// The batch's masks and hidden states: the normed token embeddings before the first layer.
    fn embedded(&mut self, encoder: &Encoder) -> candle_core::Result<(&ForwardMasks, &mut Tensor)> {
        if self.state.is_none() {
            let batch = &self.batch;
            let masks = encoder.masks(&batch.lengths, batch.len, batch.ids.device())?;
            self.state = Some((masks, encoder.embedded(&batch.ids)?));
        }
        let (masks, hidden) = self.state.as_mut().ok_or_else(|| unexpected("no embeddings"))?;
        Ok((masks, hidden))
    }
}

/// A step called out of order (a bug of the load that drives it).
fn unexpected(what: &str) -> candle_core::Error {
    candle_core::Error::Msg(format!("layer-by-layer forward: {what}"))
}
