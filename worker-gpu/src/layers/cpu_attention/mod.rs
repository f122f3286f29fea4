//! One encoder layer's attention on the CPU as a single op: the fused q/k/v projection in (f32),
//! RoPE, scores, masked softmax (key padding, sliding window) and values, heads merged out. The
//! products run in f32 here, or in bf16 in a bf16 pool (`bf16.rs`; on AMX's tiles where the pool's
//! weights run there, `tiles.rs`); `tests.rs` checks each against plain attention in f64.
//!
//! Each (row, head) is one task on the rayon pool, with a micro-kernel like the f32 matmul's
//! (`layad_cpu_kernels::f32`) that reads its rows in place for q·kᵀ and p·v; a sliding-window layer
//! computes only the key panels its window reaches. The composed candle version materialises and
//! copies every intermediate and syncs its thread pool per op (about 20 per layer). Padded
//! positions neither attend nor are attended to; their outputs are zero.

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp1, Layout, Shape};
use layad_cpu_kernels::CpuKernels;
use layad_cpu_kernels::bf16::RowsKernel;
use pulp::{Simd, WithSimd};
use rayon::prelude::*;

mod bf16;
mod tiles;

/// Rows of q (or of probabilities) one product computes: one generic tile serves both x86-64
/// families here, so AVX2's 16 registers set it (12 accumulators; the weight products' AVX-512
/// tile takes 14 rows).
const MR: usize = 6;

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
    /// Products in bf16 on this kernel (a bf16 pool: `bf16.rs`); `None`: in f32.
    pub(crate) bf16: Option<RowsKernel>,
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
        let width = self.len * d;
        let mut out: Vec<f32> = Vec::with_capacity(rows * width);
        let target = HeadOutputs {
            ptr: out.as_mut_ptr(),
            len: rows * width,
            width,
        };
        (0..rows * self.heads).into_par_iter().for_each(|task| {
            let (row, head) = (task / self.heads, task % self.heads);
            // Borrowed here, outside the SIMD dispatch: a closure run by `LocalKey::with` inside the
            // task would be compiled without the family's target features.
            HEAD_SCRATCH.with_borrow_mut(|scratch| {
                self.kernels.dispatch(HeadTask {
                    op: self,
                    qkv,
                    row,
                    head,
                    scratch,
                    out: &target,
                });
            });
        });
        // SAFETY: task (row, head) wrote its head's `head_dim` values of every position of its row
        // (attended values, or zeros past the row's length): the tasks cover all `rows · width`
        // values (a task that panicked re-raises before this line).
        #[allow(unsafe_code)]
        unsafe {
            out.set_len(rows * width)
        };
        Ok((CpuStorage::F32(out), Shape::from((rows * self.len, d))))
    }
}

/// The op's output, `rows` rows of `width` values (`len` positions × every head's values): each
/// (row, head) task writes its head's columns of its row's positions straight into place, where
/// they were first collected per task and then copied.
struct HeadOutputs {
    ptr: *mut f32,
    /// Values the output holds (its capacity).
    len: usize,
    width: usize,
}

// SAFETY: the pointer is only written through `HeadOutputs::write`, by tasks whose ranges are
// disjoint (one (row, head) each), while `cpu_fwd` holds the output.
#[allow(unsafe_code)]
unsafe impl Sync for HeadOutputs {}

impl HeadOutputs {
    /// `count` values of `row` from `at` (a position's offset plus a head's first column): `values`
    /// (`count` of them), or zeros.
    ///
    /// # Safety
    /// No other task writes those values.
    #[allow(unsafe_code)]
    unsafe fn write(&self, row: usize, at: usize, count: usize, values: Option<&[f32]>) {
        let start = row * self.width + at;
        assert!(
            at + count <= self.width && start + count <= self.len,
            "a head's values outside the attention's output"
        );
        // SAFETY: the range lies inside the output's capacity (checked) and is this task's alone
        // (the caller's); `values` holds `count` floats (checked), and all-zero bytes are 0.0.
        unsafe {
            let dst = self.ptr.add(start);
            match values {
                Some(values) => {
                    assert_eq!(values.len(), count, "a head's values");
                    std::ptr::copy_nonoverlapping(values.as_ptr(), dst, count);
                }
                None => std::ptr::write_bytes(dst, 0, count),
            }
        }
    }
}

/// Per pool thread, the buffers of one head task (q, keys, values, scores, the attended values),
/// kept between tasks: allocated and zeroed per task, their `memset` was 9% of the attention's
/// samples in an 8-row int8 forward on AMX (docs/benchmarks/notes.md, "Attention's buffers kept,
/// activation words copied whole (issue 36, stop 50)"). Every value a task reads it wrote first, or
/// it lies in a padded lane whose result is never read.
#[derive(Default)]
struct HeadScratch {
    q: Vec<f32>,
    keys: Vec<f32>,
    values: Vec<f32>,
    rotated: Vec<f32>,
    scores: Vec<f32>,
    out: Vec<f32>,
    /// The bf16 head's operands as pair words (`bf16.rs`).
    words: Words,
}

/// The bf16 head's pair words, per pool thread (with the f32 buffers of [`HeadScratch`]).
#[derive(Default)]
struct Words {
    q: Vec<u32>,
    keys: Vec<u32>,
    values: Vec<u32>,
    probabilities: Vec<u32>,
}

/// The first `len` values of `buffer`, grown (with zeros) when it holds fewer.
fn first_values<T: Copy + Default>(buffer: &mut Vec<T>, len: usize) -> &mut [T] {
    if buffer.len() < len {
        buffer.resize(len, T::default());
    }
    &mut buffer[..len]
}

thread_local! {
    static HEAD_SCRATCH: std::cell::RefCell<HeadScratch> = std::cell::RefCell::default();
}

/// One (row, head) task, compiled for the family's SIMD (`pulp` dispatch) so that the compiler
/// vectorises RoPE, the packing and the softmax's passes; the products call the micro-kernels.
struct HeadTask<'a> {
    op: &'a AttentionOp<'a>,
    qkv: &'a [f32],
    row: usize,
    head: usize,
    scratch: &'a mut HeadScratch,
    out: &'a HeadOutputs,
}

impl WithSimd for HeadTask<'_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: Simd>(self, simd: S) {
        let op = self.op;
        match op.bf16 {
            Some(kernel) => match kernel.tiles() {
                Some(tiles) => op.head_bf16_tiles(simd, kernel, tiles, self),
                None => op.head_bf16(simd, kernel, self),
            },
            None => op.head(simd, self),
        }
    }
}

impl AttentionOp<'_> {
    /// The attended values of the task's head of its row into its output (positions past the row's
    /// length `n`: zeros). Serial: the op's parallelism is across (row, head) tasks, so nothing here
    /// forks on the pool (and the task's scratch, this thread's, is not borrowed twice).
    #[inline(always)]
    fn head<S: Simd>(&self, simd: S, task: HeadTask<'_>) {
        let (qkv, row, head, scratch, target) = (task.qkv, task.row, task.head, task.scratch, task.out);
        let (hd, n) = (self.head_dim, self.lengths[row]);
        let d = self.heads * hd;
        let nr = self.kernels.panel_width();
        let key_panels = n.div_ceil(nr);
        let value_panels = hd.div_ceil(nr);
        let padded = key_panels * nr;
        // q rows with RoPE, row-major (the products read them in place); keys with RoPE as panels
        // (nr keys per depth); values as panels (nr dimensions per key). Lanes past `n` and `hd`
        // hold whatever an earlier task left: the scores of keys past `n` and the values past `hd`
        // are computed and never read.
        let HeadScratch {
            q,
            keys,
            values,
            rotated,
            scores,
            out,
            words: _,
        } = scratch;
        let q = first_values(q, n * hd);
        let keys = first_values(keys, key_panels * hd * nr);
        let values = first_values(values, value_panels * n * nr);
        let rotated = first_values(rotated, hd);
        let scores = first_values(scores, MR * padded);
        let out = first_values(out, n * value_panels * nr);
        for t in 0..n {
            let at = (row * self.len + t) * 3 * d + head * hd;
            self.rotate(&qkv[at..at + hd], t, &mut q[t * hd..(t + 1) * hd]);
            self.rotate(&qkv[at + d..at + d + hd], t, rotated);
            let (panel, lane) = (t / nr, t % nr);
            for (depth, &k) in rotated.iter().enumerate() {
                keys[(panel * hd + depth) * nr + lane] = k;
            }
            for (panel, v) in qkv[at + 2 * d..at + 2 * d + hd].chunks(nr).enumerate() {
                values[(panel * n + t) * nr..][..v.len()].copy_from_slice(v);
            }
        }
        for first in (0..n).step_by(MR) {
            let rows = MR.min(n - first);
            let (lo, hi) = self.tile_keys(first, rows, n);
            for panel in lo / nr..hi.div_ceil(nr) {
                let product = RowsProduct {
                    x: &q[first * hd..],
                    x_stride: hd,
                    depth: hd,
                    panel: &keys[panel * hd * nr..(panel + 1) * hd * nr],
                    out: &mut scores[panel * nr..],
                    stride: padded,
                };
                product.run(simd, rows, nr);
            }
            // Softmax over each row's own keys; zero elsewhere inside the tile's key range.
            for r in 0..rows {
                let i = first + r;
                let (from, to) = self.row_keys(i, n);
                let line = &mut scores[r * padded..(r + 1) * padded];
                softmax(simd, &mut line[from..to]);
                line[lo..from].fill(0.0);
                line[to..hi].fill(0.0);
            }
            // p · v over the tile's key range, the probabilities read in place.
            for panel in 0..value_panels {
                let product = RowsProduct {
                    x: &scores[lo..],
                    x_stride: padded,
                    depth: hi - lo,
                    panel: &values[(panel * n + lo) * nr..(panel * n + hi) * nr],
                    out: &mut out[first * value_panels * nr + panel * nr..],
                    stride: value_panels * nr,
                };
                product.run(simd, rows, nr);
            }
        }
        self.write_head(target, row, head, out, value_panels * nr);
    }

    /// Keys any row of the tile of `rows` queries from `first` may see, of a row's `n`.
    fn tile_keys(&self, first: usize, rows: usize, n: usize) -> (usize, usize) {
        match self.half_window {
            Some(w) => (first.saturating_sub(w), (first + rows + w).min(n)),
            None => (0, n),
        }
    }

    /// Keys query `i` sees, of a row's `n`.
    fn row_keys(&self, i: usize, n: usize) -> (usize, usize) {
        match self.half_window {
            Some(w) => (i.saturating_sub(w), (i + w + 1).min(n)),
            None => (0, n),
        }
    }

    /// One head's attended values of `row` into `target`: position `t < n` from `out[t·stride..]`
    /// (`head_dim` values), zeros past the row's length `n`.
    fn write_head(&self, target: &HeadOutputs, row: usize, head: usize, out: &[f32], stride: usize) {
        let (hd, n) = (self.head_dim, self.lengths[row]);
        let d = self.heads * hd;
        for t in 0..self.len {
            let values = (t < n).then(|| &out[t * stride..t * stride + hd]);
            // SAFETY: the `hd` columns from `head · hd` of position `t` of `row` are this task's
            // alone (one task per (row, head)).
            #[allow(unsafe_code)]
            unsafe {
                target.write(row, t * d + head * hd, hd, values)
            };
        }
    }

    /// RoPE ("rotate half") of one head vector at position `t`, as transformers computes it in f32.
    #[inline(always)]
    fn rotate(&self, x: &[f32], t: usize, out: &mut [f32]) {
        let half = self.head_dim / 2;
        let (cos, sin) = (&self.cos[t * half..(t + 1) * half], &self.sin[t * half..(t + 1) * half]);
        let (x1, x2) = x.split_at(half);
        let (o1, o2) = out.split_at_mut(half);
        // Zipped, not indexed: without bounds checks the compiler vectorises both halves.
        for (((o, &a), &b), (&c, &s)) in o1.iter_mut().zip(x1).zip(x2).zip(cos.iter().zip(sin)) {
            *o = a * c - b * s;
        }
        for (((o, &a), &b), (&c, &s)) in o2.iter_mut().zip(x2).zip(x1).zip(cos.iter().zip(sin)) {
            *o = a * c + b * s;
        }
    }
}

/// One product of the attention: up to `MR` rows read in place, row `r`'s value at depth `d` at
/// `x[r·x_stride + d]` (q rows, or a tile's probabilities), times one panel (`nr` columns per
/// depth) into `out` (rows `stride` apart, `nr` values each). The weight products' tile reads
/// rows packed first instead; packing these few rows, one scattered store per value, took as
/// long as the product. Same multiply-adds in the same order as that tile.
struct RowsProduct<'a> {
    x: &'a [f32],
    x_stride: usize,
    depth: usize,
    panel: &'a [f32],
    out: &'a mut [f32],
    stride: usize,
}

impl RowsProduct<'_> {
    #[inline(always)]
    fn run<S: Simd>(self, simd: S, rows: usize, nr: usize) {
        if nr != 2 * S::F32_LANES {
            // Not this family's registers (a CPU without it: the engine refuses that at load).
            return self.scalar(rows, nr);
        }
        match rows {
            6 => simd.vectorize(RowsTile::<6>(self)),
            5 => simd.vectorize(RowsTile::<5>(self)),
            4 => simd.vectorize(RowsTile::<4>(self)),
            3 => simd.vectorize(RowsTile::<3>(self)),
            2 => simd.vectorize(RowsTile::<2>(self)),
            _ => simd.vectorize(RowsTile::<1>(self)),
        }
    }

    fn scalar(self, rows: usize, nr: usize) {
        for r in 0..rows {
            let x = &self.x[r * self.x_stride..r * self.x_stride + self.depth];
            let dst = &mut self.out[r * self.stride..r * self.stride + nr];
            dst.fill(0.0);
            for (w, &a) in self.panel.chunks_exact(nr).zip(x) {
                for (o, &w) in dst.iter_mut().zip(w) {
                    *o = a.mul_add(w, *o);
                }
            }
        }
    }
}

/// [`RowsProduct`] for `R` rows: `R × 2` accumulator registers, as the f32 matmul's tile (`layad_cpu_kernels::f32`).
struct RowsTile<'a, const R: usize>(RowsProduct<'a>);

impl<const R: usize> WithSimd for RowsTile<'_, R> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: Simd>(self, simd: S) {
        let RowsProduct {
            x,
            x_stride,
            depth,
            panel,
            out,
            stride,
        } = self.0;
        const { assert!(R >= 1 && R <= MR) };
        let lanes = S::F32_LANES;
        let rows: [&[f32]; R] = std::array::from_fn(|r| &x[r * x_stride..r * x_stride + depth]);
        let (weights, _) = S::as_simd_f32s(&panel[..depth * 2 * lanes]);
        let zero = simd.splat_f32s(0.0);
        let mut acc = [[zero; 2]; R];
        for (d, w) in weights.chunks_exact(2).enumerate() {
            for r in 0..R {
                let v = simd.splat_f32s(rows[r][d]);
                acc[r][0] = simd.mul_add_f32s(v, w[0], acc[r][0]);
                acc[r][1] = simd.mul_add_f32s(v, w[1], acc[r][1]);
            }
        }
        for (r, acc) in acc.iter().enumerate() {
            let (dst, _) = S::as_mut_simd_f32s(&mut out[r * stride..r * stride + 2 * lanes]);
            dst[0] = acc[0];
            dst[1] = acc[1];
        }
    }
}

/// `line` replaced by its softmax: [`exponentials`], divided by their sum.
#[inline(always)]
fn softmax<S: Simd>(simd: S, line: &mut [f32]) {
    let sum = exponentials(simd, line);
    let (body, tail) = S::as_mut_simd_f32s(line);
    let inv = simd.splat_f32s(1.0 / sum);
    for v in body.iter_mut() {
        *v = simd.mul_f32s(*v, inv);
    }
    for v in tail.iter_mut() {
        *v *= 1.0 / sum;
    }
}

/// `line` replaced by the exponentials of its differences to its maximum, on SIMD lanes
/// ([`exp_simd`]; the row's tail on masked lanes); returns their sum (over lanes).
#[inline(always)]
fn exponentials<S: Simd>(simd: S, line: &mut [f32]) -> f32 {
    let (body, tail) = S::as_mut_simd_f32s(line);
    let mut lanes = simd.splat_f32s(f32::NEG_INFINITY);
    for &v in body.iter() {
        lanes = simd.max_f32s(lanes, v);
    }
    let max = tail.iter().copied().fold(simd.reduce_max_f32s(lanes), f32::max);
    let shift = simd.splat_f32s(max);
    let mut sums = simd.splat_f32s(0.0);
    for v in body.iter_mut() {
        *v = exp_simd(simd, simd.sub_f32s(*v, shift));
        sums = simd.add_f32s(sums, *v);
    }
    let mut sum = simd.reduce_sum_f32s(sums);
    if !tail.is_empty() {
        // The tail's lanes through the same polynomial, masked, instead of a libm call per value
        // (a 66-token int8 forward 2-23% faster in four paired runs: docs/benchmarks/notes.md).
        let exps = exp_simd(simd, simd.sub_f32s(simd.partial_load_f32s(tail), shift));
        simd.partial_store_f32s(tail, exps);
        for &v in tail.iter() {
            sum += v;
        }
    }
    sum
}

/// Below this, `exp` is under f32's smallest normal number; inputs are raised to it.
const EXP_LOWEST: f32 = -87.336_54;
/// 1.5 · 2²³: added to a float below 2²², it leaves the nearest integer in the low mantissa bits.
const ROUND_TO_INTEGER: f32 = 12_582_912.0;
/// ln 2 in two parts (Cephes' `expf`): `n · LN2_HIGH` is exact for the `n` that occur.
const LN2_HIGH: f32 = 0.693_359_4;
const LN2_LOW: f32 = -2.121_944_4e-4;
/// Cephes' `expf` polynomial for `e^r − 1 − r` over `r²`, |r| ≤ ln 2 / 2, highest degree first.
const EXP_POLY: [f32; 6] = [
    1.987_569_1e-4,
    1.398_199_9e-3,
    8.333_452e-3,
    4.166_579_6e-2,
    0.166_666_65,
    0.5,
];

/// `e^x` on SIMD lanes for `x ≤ 88` (within a few ulp of libm; a softmax's differences to its
/// maximum are ≤ 0): `x = n·ln 2 + r`, a polynomial for `e^r`, `2^n` built in the exponent bits.
#[inline(always)]
fn exp_simd<S: Simd>(simd: S, x: S::f32s) -> S::f32s {
    let x = simd.max_f32s(x, simd.splat_f32s(EXP_LOWEST));
    let shifted = simd.mul_add_f32s(
        x,
        simd.splat_f32s(std::f32::consts::LOG2_E),
        simd.splat_f32s(ROUND_TO_INTEGER),
    );
    let n = simd.sub_f32s(shifted, simd.splat_f32s(ROUND_TO_INTEGER));
    let r = simd.mul_add_f32s(n, simd.splat_f32s(-LN2_HIGH), x);
    let r = simd.mul_add_f32s(n, simd.splat_f32s(-LN2_LOW), r);
    let mut poly = simd.splat_f32s(0.0);
    for c in EXP_POLY {
        poly = simd.mul_add_f32s(poly, r, simd.splat_f32s(c));
    }
    let y = simd.add_f32s(simd.mul_add_f32s(poly, simd.mul_f32s(r, r), r), simd.splat_f32s(1.0));
    // The low bits of `shifted` hold n (two's complement); n + 127 moved into the exponent field
    // is 2ⁿ (−126 ≤ n ≤ 127 here), the rounding constant's own bits shifted out.
    let biased = simd.add_u32s(simd.transmute_u32s_f32s(shifted), simd.splat_u32s(127));
    let scale = simd.wrapping_dyn_shl_u32s(biased, simd.splat_u32s(23));
    simd.mul_f32s(y, simd.transmute_f32s_u32s(scale))
}

#[cfg(test)]
mod tests;
