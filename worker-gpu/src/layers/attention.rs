//! Scaled dot-product attention over padded batches: scores, additive masks and softmax in float32
//! (as fused attention kernels accumulate them), probabilities times values in the compute precision.
//! Sliding-window layers use a band mask cached per length, or from `BANDED_FROM_WINDOWS` windows
//! on, a banded computation over query blocks.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use candle_core::{DType, Device, Tensor};

/// Additive mask value for a forbidden key. Finite (two of them still are) so that a padded query
/// whose keys are all forbidden gets a uniform, not NaN, distribution that nothing reads.
pub(crate) const MASKED: f32 = -1e30;

/// The banded path pays for gathering key windows; it wins once a row spans this many windows.
const BANDED_FROM_WINDOWS: usize = 2;

/// `softmax(q·kᵀ + mask)·v` for `q, k, v` `[batch, heads, len, head_dim]` in the compute dtype, `q`
/// already multiplied by the scale; `mask` is float32 and broadcasts to `[batch, heads, len, len]`.
/// The result is in `v`'s dtype.
pub(crate) fn attend(q: &Tensor, k: &Tensor, v: &Tensor, mask: Option<&Tensor>) -> candle_core::Result<Tensor> {
    let scores = q.to_dtype(DType::F32)?.matmul(&k.to_dtype(DType::F32)?.t()?)?;
    let scores = match mask {
        Some(mask) => scores.broadcast_add(mask)?,
        None => scores,
    };
    candle_nn::ops::softmax_last_dim(&scores)?
        .to_dtype(v.dtype())?
        .matmul(v)
}

/// Additive key-padding mask `[batch, 1, 1, len]` for rows of `lengths` padded to `len`, or `None`
/// when no row is padded.
pub(crate) fn key_padding_mask(lengths: &[usize], len: usize, device: &Device) -> candle_core::Result<Option<Tensor>> {
    if lengths.iter().all(|&l| l == len) {
        return Ok(None);
    }
    let mask: Vec<f32> = lengths
        .iter()
        .flat_map(|&l| (0..len).map(move |j| if j < l { 0.0 } else { MASKED }))
        .collect();
    Tensor::from_vec(mask, (lengths.len(), 1, 1, len), device).map(Some)
}

/// The sliding-window pattern of one model (`|i − j| ≤ half_window`) and its cached tensors.
pub(crate) struct SlidingWindow {
    half_window: usize,
    /// Query block of the banded path; its keys are the block widened by `half_window` each side.
    block: usize,
    device: Device,
    /// `[block, block + 2·half_window]`: 0 where the key is inside the query's window.
    block_mask: Tensor,
    /// Band masks `[len, len]` per row length.
    band_masks: Mutex<HashMap<usize, Tensor>>,
    /// Key-window gather indices per number of query blocks (see [`BandedPlan`]).
    window_indices: Mutex<HashMap<usize, Tensor>>,
}

impl SlidingWindow {
    /// The window of a model with `local_attention` (transformers' `sliding_window` is half of it).
    pub(crate) fn new(local_attention: usize, device: &Device) -> candle_core::Result<Self> {
        let half_window = local_attention / 2;
        let block = half_window.max(16);
        let width = block + 2 * half_window;
        let block_mask: Vec<f32> = (0..block)
            .flat_map(|r| {
                (0..width).map(move |t| {
                    if t >= r && t - r <= 2 * half_window {
                        0.0
                    } else {
                        MASKED
                    }
                })
            })
            .collect();
        Ok(Self {
            half_window,
            block,
            device: device.clone(),
            block_mask: Tensor::from_vec(block_mask, (block, width), device)?,
            band_masks: Mutex::new(HashMap::new()),
            window_indices: Mutex::new(HashMap::new()),
        })
    }

    /// Keys within this distance of a query are inside its window.
    pub(crate) fn half_window(&self) -> usize {
        self.half_window
    }

    /// Whether rows padded to `len` take the banded path.
    pub(crate) fn banded_at(&self, len: usize) -> bool {
        len >= BANDED_FROM_WINDOWS * (self.block + 2 * self.half_window)
    }

    /// How the sliding layers of one forward attend, for rows of `lengths` padded to `len`.
    pub(crate) fn plan(
        &self,
        lengths: &[usize],
        len: usize,
        key_padding: Option<&Tensor>,
        banded: bool,
    ) -> candle_core::Result<SlidingPlan> {
        if !banded {
            let band = self.band_mask(len)?;
            let mask = match key_padding {
                Some(padding) => band.unsqueeze(0)?.unsqueeze(0)?.broadcast_add(padding)?,
                None => band.unsqueeze(0)?.unsqueeze(0)?,
            };
            return Ok(SlidingPlan::Masked(mask));
        }
        let blocks = len.div_ceil(self.block);
        let width = self.block + 2 * self.half_window;
        // Key slot t of block b holds position b·block − half_window + t; it counts when that is a
        // real token of the row.
        let key_mask: Vec<f32> = lengths
            .iter()
            .flat_map(|&l| {
                (0..blocks).flat_map(move |b| {
                    (0..width).map(move |t| {
                        let position = (b * self.block + t).checked_sub(self.half_window);
                        if position.is_some_and(|p| p < l) { 0.0 } else { MASKED }
                    })
                })
            })
            .collect();
        Ok(SlidingPlan::Banded(BandedPlan {
            len,
            blocks,
            block: self.block,
            half_window: self.half_window,
            block_mask: self.block_mask.clone(),
            key_mask: Tensor::from_vec(key_mask, (lengths.len(), 1, blocks, 1, width), &self.device)?,
            window_index: self.window_index(blocks)?,
        }))
    }

    fn band_mask(&self, len: usize) -> candle_core::Result<Tensor> {
        let mut cache = self.band_masks.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(mask) = cache.get(&len) {
            return Ok(mask.clone());
        }
        let w = self.half_window;
        let mask: Vec<f32> = (0..len)
            .flat_map(|i| (0..len).map(move |j| if i.abs_diff(j) <= w { 0.0 } else { MASKED }))
            .collect();
        let mask = Tensor::from_vec(mask, (len, len), &self.device)?;
        cache.insert(len, mask.clone());
        Ok(mask)
    }

    fn window_index(&self, blocks: usize) -> candle_core::Result<Tensor> {
        let mut cache = self.window_indices.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(index) = cache.get(&blocks) {
            return Ok(index.clone());
        }
        let width = self.block + 2 * self.half_window;
        let index: Vec<u32> = (0..blocks)
            .flat_map(|b| (0..width).map(move |t| (b * self.block + t) as u32))
            .collect();
        let index = Tensor::from_vec(index, blocks * width, &self.device)?;
        cache.insert(blocks, index.clone());
        Ok(index)
    }
}

/// How sliding-window layers attend in one forward.
pub(crate) enum SlidingPlan {
    /// Full attention with the band (and key padding) as an additive `[batch, 1, len, len]` mask.
    Masked(Tensor),
    /// Query blocks against their key windows only.
    Banded(BandedPlan),
}

impl SlidingPlan {
    /// Attention for `q, k, v` `[batch, heads, len, head_dim]`, `q` pre-scaled.
    pub(crate) fn attend(&self, q: &Tensor, k: &Tensor, v: &Tensor) -> candle_core::Result<Tensor> {
        match self {
            Self::Masked(mask) => attend(q, k, v, Some(mask)),
            Self::Banded(plan) => plan.attend(q, k, v),
        }
    }
}

/// The banded computation: queries are cut into blocks of `block`; block b sees the keys of padded
/// positions `b·block .. b·block + width` (width = block + 2·half_window) after the keys were padded
/// by `half_window` in front, i.e. real positions `b·block − half_window ..`.
pub(crate) struct BandedPlan {
    len: usize,
    blocks: usize,
    block: usize,
    half_window: usize,
    block_mask: Tensor,
    /// `[batch, 1, blocks, 1, width]`: 0 where the key slot holds a real token of the row.
    key_mask: Tensor,
    /// `[blocks · width]` positions into the padded keys.
    window_index: Tensor,
}

impl BandedPlan {
    fn attend(&self, q: &Tensor, k: &Tensor, v: &Tensor) -> candle_core::Result<Tensor> {
        let (batch, heads, len, head_dim) = q.dims4()?;
        let width = self.block + 2 * self.half_window;
        let padded_len = self.blocks * self.block;
        let windows = |x: &Tensor| -> candle_core::Result<Tensor> {
            x.pad_with_zeros(2, self.half_window, padded_len - len + self.half_window)?
                .index_select(&self.window_index, 2)?
                .reshape((batch * heads, self.blocks, width, head_dim))
        };
        let (k, v) = (windows(k)?, windows(v)?);
        let q =
            q.pad_with_zeros(2, 0, padded_len - len)?
                .reshape((batch * heads, self.blocks, self.block, head_dim))?;
        let scores = q
            .to_dtype(DType::F32)?
            .matmul(&k.to_dtype(DType::F32)?.t()?)?
            .reshape((batch, heads, self.blocks, self.block, width))?
            .broadcast_add(&self.block_mask)?
            .broadcast_add(&self.key_mask)?;
        let probs = candle_nn::ops::softmax_last_dim(&scores)?
            .to_dtype(v.dtype())?
            .reshape((batch * heads, self.blocks, self.block, width))?;
        probs
            .matmul(&v)?
            .reshape((batch, heads, padded_len, head_dim))?
            .narrow(2, 0, self.len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn max_abs_diff(a: &Tensor, b: &Tensor) -> f32 {
        (a - b)
            .and_then(|d| d.abs())
            .and_then(|d| d.flatten_all())
            .and_then(|d| d.max(0))
            .and_then(|d| d.to_scalar::<f32>())
            .expect("diff")
    }

    /// The banded path and the band-mask path agree on padded rows, for lengths that are and are not
    /// multiples of the block, and padded queries stay finite.
    #[test]
    fn banded_matches_masked() -> candle_core::Result<()> {
        let device = Device::Cpu;
        let window = SlidingWindow::new(8, &device)?;
        for (lengths, len) in [(vec![50, 23, 1], 50), (vec![64, 64], 64), (vec![97], 97)] {
            let shape = (lengths.len(), 3, len, 8);
            let q = (Tensor::randn(0f32, 1.0, shape, &device)? * 0.35)?;
            let k = Tensor::randn(0f32, 1.0, shape, &device)?;
            let v = Tensor::randn(0f32, 1.0, shape, &device)?;
            let padding = key_padding_mask(&lengths, len, &device)?;
            let masked = window
                .plan(&lengths, len, padding.as_ref(), false)?
                .attend(&q, &k, &v)?;
            let banded = window.plan(&lengths, len, padding.as_ref(), true)?.attend(&q, &k, &v)?;
            assert_eq!(banded.dims(), masked.dims());
            let finite = banded.flatten_all()?.to_vec1::<f32>()?.iter().all(|x| x.is_finite());
            assert!(finite, "lengths {lengths:?}");
            for (row, &l) in lengths.iter().enumerate() {
                let real = |t: &Tensor| t.narrow(0, row, 1).and_then(|t| t.narrow(2, 0, l));
                let diff = max_abs_diff(&real(&masked)?, &real(&banded)?);
                assert!(diff < 1e-5, "lengths {lengths:?} row {row}: {diff}");
            }
        }
        Ok(())
    }

    /// A query sees exactly the keys within half the window, and no padded key.
    #[test]
    fn window_and_padding_are_respected() -> candle_core::Result<()> {
        let device = Device::Cpu;
        let window = SlidingWindow::new(4, &device)?;
        let (len, lengths) = (12, [12usize, 7]);
        // Values are one-hot positions: the output of a query is the attention distribution itself.
        let v = Tensor::eye(len, DType::F32, &device)?
            .broadcast_as((2, 1, len, len))?
            .contiguous()?;
        let zeros = Tensor::zeros((2, 1, len, len), DType::F32, &device)?;
        let padding = key_padding_mask(&lengths, len, &device)?;
        for banded in [false, true] {
            let probs = window
                .plan(&lengths, len, padding.as_ref(), banded)?
                .attend(&zeros, &zeros, &v)?
                .squeeze(1)?
                .to_vec3::<f32>()?;
            for (row, (&l, queries)) in lengths.iter().zip(&probs).enumerate() {
                for (i, keys) in queries.iter().enumerate().take(l) {
                    let allowed: Vec<usize> = (0..l).filter(|j| i.abs_diff(*j) <= 2).collect();
                    for (j, &got) in keys.iter().enumerate() {
                        let want = if allowed.contains(&j) {
                            1.0 / allowed.len() as f32
                        } else {
                            0.0
                        };
                        assert!(
                            (got - want).abs() < 1e-6,
                            "banded {banded} row {row} q {i} k {j}: {got}"
                        );
                    }
                }
            }
        }
        Ok(())
    }
}
