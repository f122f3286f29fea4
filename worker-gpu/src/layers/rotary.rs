//! Rotary position embedding ("rotate half", NeoX layout) with cos/sin tables computed once in
//! float32 per theta, for every position up to the checkpoint's `max_len`, on the model's device.

use candle_core::{DType, Device, Tensor};

/// cos/sin tables `[positions, head_dim / 2]` for one theta.
pub(crate) struct RopeTable {
    cos: Tensor,
    sin: Tensor,
    /// The same tables in host memory, for the fused CPU attention.
    host_cos: Vec<f32>,
    host_sin: Vec<f32>,
}

impl RopeTable {
    /// Tables for positions `0..positions`, computed the way transformers does: `inv_freq =
    /// 1 / theta^(2j / head_dim)` and `freq = position · inv_freq`, both in float32.
    pub(crate) fn new(theta: f64, head_dim: usize, positions: usize, device: &Device) -> candle_core::Result<Self> {
        let half = head_dim / 2;
        let inv_freq: Vec<f32> = (0..half)
            .map(|j| 1.0 / (theta as f32).powf((2 * j) as f32 / head_dim as f32))
            .collect();
        let mut cos = Vec::with_capacity(positions * half);
        let mut sin = Vec::with_capacity(positions * half);
        for position in 0..positions {
            for f in &inv_freq {
                let angle = position as f32 * f;
                cos.push(angle.cos());
                sin.push(angle.sin());
            }
        }
        Ok(Self {
            cos: Tensor::from_vec(cos.clone(), (positions, half), device)?,
            sin: Tensor::from_vec(sin.clone(), (positions, half), device)?,
            host_cos: cos,
            host_sin: sin,
        })
    }

    /// `(cos, sin)`, `[positions, head_dim / 2]` row-major, in host memory.
    pub(crate) fn host_tables(&self) -> (&[f32], &[f32]) {
        (&self.host_cos, &self.host_sin)
    }

    /// Rotates `x` `[batch, heads, len, head_dim]` in float32, returning it in `x`'s dtype.
    pub(crate) fn apply(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let x32 = x.to_dtype(DType::F32)?.contiguous()?;
        candle_nn::rotary_emb::rope(&x32, &self.cos, &self.sin)?.to_dtype(x.dtype())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_rotate_half_by_hand() -> candle_core::Result<()> {
        let (theta, head_dim, len) = (10_000.0, 4, 3);
        let table = RopeTable::new(theta, head_dim, 8, &Device::Cpu)?;
        let x: Vec<f32> = (0..len * head_dim).map(|i| i as f32 * 0.5 - 1.0).collect();
        let rotated = table
            .apply(&Tensor::from_vec(x.clone(), (1, 1, len, head_dim), &Device::Cpu)?)?
            .flatten_all()?
            .to_vec1::<f32>()?;
        for t in 0..len {
            for j in 0..head_dim / 2 {
                let angle = t as f64 * theta.powf(-((2 * j) as f64) / head_dim as f64);
                let (a, b) = (x[t * head_dim + j] as f64, x[t * head_dim + j + head_dim / 2] as f64);
                let want = [a * angle.cos() - b * angle.sin(), b * angle.cos() + a * angle.sin()];
                let got = [rotated[t * head_dim + j], rotated[t * head_dim + j + head_dim / 2]];
                for (w, g) in want.iter().zip(got) {
                    assert!((w - g as f64).abs() < 1e-5, "position {t} pair {j}: {w} vs {g}");
                }
            }
        }
        Ok(())
    }
}
