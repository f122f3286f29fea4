//! One encoder layer's attention on the CPU in float32 as a single op: the fused q/k/v projection
//! in, RoPE, scores, masked softmax (key padding, sliding window) and values, heads merged out.
//!
//! Each (row, head) is one task on the rayon pool, using `cpu_matmul`'s micro-kernels for q·kᵀ and
//! p·v; a sliding-window layer computes only the key panels its window reaches. The composed candle
//! version materialises and copies every intermediate and syncs its thread pool per op (about 20
//! per layer). Padded positions neither attend nor are attended to; their outputs are zero.

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp1, Layout, Shape};
use pulp::{Simd, WithSimd};
use rayon::prelude::*;

use crate::layers::cpu_matmul::{CpuKernels, MR, TileCall, pack_rows};

/// The attention of one layer over a right-padded batch.
pub(crate) struct AttentionOp<'a> {
    /// Real length of each row.
    pub(crate) lengths: &'a [usize],
    /// Every row is padded to this.
    pub(crate) len: usize,
    pub(crate) heads: usize,
    pub(crate) head_dim: usize,
    /// RoPE `cos` and `sin` tables, `[positions, head_dim / 2]`.
    pub(crate) cos: &'a [f32],
    pub(crate) sin: &'a [f32],
    /// Keys within this distance of the query (sliding-window layers); `None`: every key.
    pub(crate) half_window: Option<usize>,
    /// The micro-kernel family (not `Gemm`).
    pub(crate) kernels: CpuKernels,
}

impl CustomOp1 for AttentionOp<'_> {
    fn name(&self) -> &'static str {
        "laya-attention"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let CpuStorage::F32(data) = storage else {
            candle_core::bail!("attention: expected f32, got {:?}", storage.dtype())
        };
        let Some((start, end)) = layout.contiguous_offsets() else {
            candle_core::bail!("attention: expected a contiguous input")
        };
        let qkv = &data[start..end];
        let d = self.heads * self.head_dim;
        let rows = self.lengths.len();
        let half = self.head_dim / 2;
        if layout.dims() != [rows * self.len, 3 * d] {
            candle_core::bail!(
                "attention: input {:?}, expected [{}, {}]",
                layout.dims(),
                rows * self.len,
                3 * d
            )
        }
        if self.lengths.iter().any(|&l| l > self.len)
            || self.cos.len() < self.len * half
            || self.sin.len() != self.cos.len()
        {
            candle_core::bail!("attention: lengths or RoPE tables do not cover {} positions", self.len)
        }
        let heads: Vec<(usize, usize, Vec<f32>)> = (0..rows * self.heads)
            .into_par_iter()
            .map(|task| {
                let (row, head) = (task / self.heads, task % self.heads);
                let values = self.kernels.dispatch(HeadTask {
                    op: self,
                    qkv,
                    row,
                    head,
                });
                (row, head, values)
            })
            .collect();
        let mut out = vec![0f32; rows * self.len * d];
        for (row, head, values) in heads {
            for (t, v) in values.chunks_exact(self.head_dim).enumerate() {
                let at = (row * self.len + t) * d + head * self.head_dim;
                out[at..at + self.head_dim].copy_from_slice(v);
            }
        }
        Ok((CpuStorage::F32(out), Shape::from((rows * self.len, d))))
    }
}

/// One (row, head) task, compiled for the family's SIMD (`pulp` dispatch) so that the compiler
/// vectorises RoPE, the packing and the softmax's passes; the products call the micro-kernels.
struct HeadTask<'a> {
    op: &'a AttentionOp<'a>,
    qkv: &'a [f32],
    row: usize,
    head: usize,
}

impl WithSimd for HeadTask<'_> {
    type Output = Vec<f32>;

    #[inline(always)]
    fn with_simd<S: Simd>(self, _: S) -> Vec<f32> {
        self.op.head(self.qkv, self.row, self.head)
    }
}

impl AttentionOp<'_> {
    /// The attended values `[n, head_dim]` of one head of one row (`n` its real length).
    #[inline(always)]
    fn head(&self, qkv: &[f32], row: usize, head: usize) -> Vec<f32> {
        let (hd, n) = (self.head_dim, self.lengths[row]);
        let d = self.heads * hd;
        let nr = self.kernels.panel_width();
        let key_panels = n.div_ceil(nr);
        let value_panels = hd.div_ceil(nr);
        let padded = key_panels * nr;
        // q rows with RoPE; keys with RoPE as panels (nr keys per depth); values as panels (nr
        // dimensions per key).
        let mut q = vec![0f32; n * hd];
        let mut keys = vec![0f32; key_panels * hd * nr];
        let mut values = vec![0f32; value_panels * n * nr];
        let mut rotated = vec![0f32; hd];
        for t in 0..n {
            let at = (row * self.len + t) * 3 * d + head * hd;
            self.rotate(&qkv[at..at + hd], t, &mut q[t * hd..(t + 1) * hd]);
            self.rotate(&qkv[at + d..at + d + hd], t, &mut rotated);
            let (panel, lane) = (t / nr, t % nr);
            for (depth, &k) in rotated.iter().enumerate() {
                keys[(panel * hd + depth) * nr + lane] = k;
            }
            for (dim, &v) in qkv[at + 2 * d..at + 2 * d + hd].iter().enumerate() {
                values[((dim / nr) * n + t) * nr + dim % nr] = v;
            }
        }
        let q = pack_rows(&q, n, hd);
        let mut scores = vec![0f32; MR * padded];
        let mut out = vec![0f32; n * value_panels * nr];
        for (tile, first) in (0..n).step_by(MR).enumerate() {
            let rows = MR.min(n - first);
            // Keys any row of the tile may see.
            let (lo, hi) = match self.half_window {
                Some(w) => (first.saturating_sub(w), (first + rows + w).min(n)),
                None => (0, n),
            };
            for panel in lo / nr..hi.div_ceil(nr) {
                let call = TileCall {
                    x: &q[tile * hd * MR..(tile + 1) * hd * MR],
                    panel: &keys[panel * hd * nr..(panel + 1) * hd * nr],
                    out: &mut scores[panel * nr..],
                    stride: padded,
                    accumulate: false,
                };
                self.kernels.tile(rows, nr, call);
            }
            // Softmax over each row's own keys; zero elsewhere inside the tile's key range.
            for r in 0..rows {
                let i = first + r;
                let (from, to) = match self.half_window {
                    Some(w) => (i.saturating_sub(w), (i + w + 1).min(n)),
                    None => (0, n),
                };
                let line = &mut scores[r * padded..(r + 1) * padded];
                let max = line[from..to].iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let mut sum = 0f32;
                for s in &mut line[from..to] {
                    *s = (*s - max).exp();
                    sum += *s;
                }
                let inv = 1.0 / sum;
                for s in &mut line[from..to] {
                    *s *= inv;
                }
                line[lo..from].fill(0.0);
                line[to..hi].fill(0.0);
            }
            // p · v over the tile's key range.
            let mut p = vec![0f32; (hi - lo) * MR];
            for r in 0..rows {
                for (j, &s) in scores[r * padded + lo..r * padded + hi].iter().enumerate() {
                    p[j * MR + r] = s;
                }
            }
            for panel in 0..value_panels {
                let call = TileCall {
                    x: &p,
                    panel: &values[(panel * n + lo) * nr..(panel * n + hi) * nr],
                    out: &mut out[first * value_panels * nr + panel * nr..],
                    stride: value_panels * nr,
                    accumulate: false,
                };
                self.kernels.tile(rows, nr, call);
            }
        }
        if value_panels * nr == hd {
            return out;
        }
        out.chunks_exact(value_panels * nr)
            .flat_map(|r| &r[..hd])
            .copied()
            .collect()
    }

    /// RoPE ("rotate half") of one head vector at position `t`, as transformers computes it in f32.
    #[inline(always)]
    fn rotate(&self, x: &[f32], t: usize, out: &mut [f32]) {
        let half = self.head_dim / 2;
        let (cos, sin) = (&self.cos[t * half..(t + 1) * half], &self.sin[t * half..(t + 1) * half]);
        let (x1, x2) = x.split_at(half);
        let (o1, o2) = out.split_at_mut(half);
        for j in 0..half {
            o1[j] = x1[j] * cos[j] - x2[j] * sin[j];
            o2[j] = x2[j] * cos[j] + x1[j] * sin[j];
        }
    }
}
