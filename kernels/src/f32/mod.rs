//! Float32 products of activations by constant weights on the CPU: each weight is packed once, at
//! load, into column panels for the kernel family chosen at run time (AVX-512 or AVX2+FMA), so a
//! forward packs only its few activation rows; every product runs on the calling rayon pool.
//!
//! Why not candle's matmul (the `gemm` crate): it repacks the weight on every call and splits few
//! rows poorly across threads; on one 64-token row that made the matrix products about twice as slow
//! as these kernels (docs/benchmarks.md). Other devices and precisions keep candle's matmul.

use rayon::prelude::*;

use crate::CpuKernels;
use crate::CpuWeight;
use crate::bf16::{Bf16Kernel, Bf16Weight};
use crate::driver::{NextSlices, bias_rows, in_column_blocks};
use crate::geglu::{GROUP, GeGlu, grouped_column, groups_fit};
use crate::int8::{Int8Kernel, QuantizedWeight};

#[cfg(target_arch = "x86_64")]
mod simd;
#[cfg(test)]
pub(crate) mod tests;
mod tile;

pub(crate) use tile::TileCall;
use tile::{NARROW_ROWS, WIDE_ROWS};

#[cfg(target_arch = "x86_64")]
use simd::{narrow_tile, wide_tile};

/// Depth of one pass: a weight panel's slice of `KC` rows stays in L1 while every row tile uses it.
const KC: usize = 256;

/// A weight `[k, n]` (the transposed PyTorch `[out, in]`) packed for one kernel family: panel `p`
/// holds columns `p·nr .. p·nr + nr` (zero past `n`), row after row.
pub struct PackedWeight {
    kernels: CpuKernels,
    k: usize,
    n: usize,
    nr: usize,
    panels: Vec<f32>,
    bias: Option<Vec<f32>>,
    /// Columns grouped for GeGLU (`crate::geglu`): products give `[m, n / 2]`, GeGLU applied.
    geglu: bool,
}

impl PackedWeight {
    /// Packs `weight_t` (`[k, n]` row-major) and an optional bias `[n]` for `kernels` (not `Gemm`):
    /// the tests' way in; a load packs the file's layout with [`PackedWeight::pack_out_in`].
    #[cfg(test)]
    pub(crate) fn pack(weight_t: &[f32], k: usize, n: usize, bias: Option<Vec<f32>>, kernels: CpuKernels) -> Self {
        let nr = kernels.panel_width();
        let count = n.div_ceil(nr);
        let mut panels = vec![0f32; count * k * nr];
        panels
            .par_chunks_mut((k * nr).max(1))
            .enumerate()
            .for_each(|(p, panel)| {
                let width = nr.min(n - p * nr);
                for (row, dst) in panel.chunks_exact_mut(nr).enumerate() {
                    let src = &weight_t[row * n + p * nr..row * n + p * nr + width];
                    dst[..width].copy_from_slice(src);
                }
            });
        Self {
            kernels,
            k,
            n,
            nr,
            panels,
            bias,
            geglu: false,
        }
    }

    /// Packs `weight` as the file holds it, `[n, k]` (PyTorch's `[out, in]`): the same panels as
    /// `PackedWeight::pack` (the tests' way in) of its transpose, without the transpose. With
    /// `scale = (start, len, factor)`, outputs `start..start + len` are multiplied by `factor` on
    /// the way.
    pub fn pack_out_in(
        weight: &[f32],
        k: usize,
        n: usize,
        bias: Option<Vec<f32>>,
        kernels: CpuKernels,
        scale: Option<(usize, usize, f64)>,
    ) -> Self {
        Self::pack_columns(weight, k, n, bias, kernels, scale, false)
    }

    /// [`Self::pack_out_in`] for a GeGLU projection (`[2·I, k]`, no bias: the input half's columns,
    /// then the gate half's), its columns grouped (`crate::geglu`) so that products apply GeGLU as
    /// they write and give `[m, I]`; the int8 and bf16 weights made from it do too. `None` where
    /// the panels cannot hold whole pairs of groups (the `avx2` family's 16-column panels, `I` not
    /// a multiple of 16): the caller keeps a plain weight and its own GeGLU.
    pub fn pack_out_in_geglu(weight: &[f32], k: usize, n: usize, kernels: CpuKernels) -> Option<Self> {
        let fits = groups_fit(n) && kernels.panel_width().is_multiple_of(2 * GROUP);
        fits.then(|| Self::pack_columns(weight, k, n, None, kernels, None, true))
    }

    /// Whether products apply GeGLU ([`Self::pack_out_in_geglu`]).
    pub fn applies_geglu(&self) -> bool {
        self.geglu
    }

    fn pack_columns(
        weight: &[f32],
        k: usize,
        n: usize,
        bias: Option<Vec<f32>>,
        kernels: CpuKernels,
        scale: Option<(usize, usize, f64)>,
        geglu: bool,
    ) -> Self {
        let nr = kernels.panel_width();
        let count = n.div_ceil(nr);
        let mut panels = vec![0f32; count * k * nr];
        panels
            .par_chunks_mut((k * nr).max(1))
            .enumerate()
            .for_each(|(p, panel)| {
                for c in 0..nr.min(n - p * nr) {
                    let col = if geglu {
                        grouped_column(p * nr + c, n / 2)
                    } else {
                        p * nr + c
                    };
                    let row = &weight[col * k..(col + 1) * k];
                    let factor = match scale {
                        Some((start, len, factor)) if (start..start + len).contains(&col) => Some(factor as f32),
                        _ => None,
                    };
                    let column = panel.iter_mut().skip(c).step_by(nr);
                    match factor {
                        Some(factor) => column.zip(row).for_each(|(dst, &v)| *dst = v * factor),
                        None => column.zip(row).for_each(|(dst, &v)| *dst = v),
                    }
                }
            });
        Self {
            kernels,
            k,
            n,
            nr,
            panels,
            bias,
            geglu,
        }
    }

    /// The weight rounded to bf16 for the bf16 kernel beside its family
    /// ([`Bf16Kernel::for_family`]; the widened kernel's portable twin beside a family that has
    /// none), read straight from the panels.
    pub fn to_bf16(&self) -> Bf16Weight {
        let kernel = Bf16Kernel::for_family(self.kernels).unwrap_or(Bf16Kernel::Widened);
        let rounded = Bf16Weight::pack_with(self.depth_row(), self.k, self.n, self.bias.clone(), kernel);
        rounded.with_geglu(self.geglu.then_some(GeGlu(self.kernels)))
    }

    /// Entries `(depth, first ..)` of the weight into `out`, copied from the panels they lie in.
    fn depth_row(&self) -> impl Fn(usize, usize, &mut [f32]) + Sync + '_ {
        let (k, nr, panels) = (self.k, self.nr, &self.panels);
        move |depth: usize, first: usize, out: &mut [f32]| {
            let mut done = 0;
            while done < out.len() {
                let (panel, column) = ((first + done) / nr, (first + done) % nr);
                let count = (nr - column).min(out.len() - done);
                let start = (panel * k + depth) * nr + column;
                out[done..done + count].copy_from_slice(&panels[start..start + count]);
                done += count;
            }
        }
    }

    /// The weight quantized to int8 for `kernel`, read straight from the panels.
    pub fn quantize(&self, kernel: Int8Kernel) -> QuantizedWeight {
        QuantizedWeight::quantize_with(self.depth_row(), self.k, self.n, self.bias.clone(), kernel)
            .with_geglu(self.geglu.then_some(GeGlu(self.kernels)))
    }

    /// `x · W (+ bias)` for `x` `[m, k]` row-major; returns `[m, n]` row-major (a weight packed
    /// for GeGLU: its GeGLU, `[m, n / 2]`).
    pub fn matmul(&self, x: &[f32], m: usize) -> Vec<f32> {
        let (k, n, nr) = (self.k, self.n, self.nr);
        if m == 0 || n == 0 || k == 0 {
            return bias_rows(self.bias.as_deref(), m, self.dims().1);
        }
        let packed_x = pack_rows(x, m, k, self.kernels.f32_tile_rows());
        let geglu = self.geglu.then_some(GeGlu(self.kernels));
        in_column_blocks(m, n, nr, self.bias.as_deref(), geglu, |first, count, block| {
            self.block(&packed_x, m, first, count, block);
        })
    }

    /// Panels `first .. first + count` for every row into `block` (`[m, count·nr]`). Per depth
    /// pass, each row tile (in L1) meets every panel slice of the task (in L2).
    fn block(&self, packed_x: &[f32], m: usize, first: usize, count: usize, block: &mut [f32]) {
        let (k, nr, mr) = (self.k, self.nr, self.kernels.f32_tile_rows());
        let stride = count * nr;
        let next = NextSlices {
            panels: &self.panels,
            panel_units: k,
            unit: nr,
            pass: KC,
            count,
            tiles: m.div_ceil(mr),
        };
        let mut depth = 0;
        while depth < k {
            let kc = KC.min(k - depth);
            let prefetch = next.pass(depth, kc);
            for (tile, row) in (0..m).step_by(mr).enumerate() {
                let rows = mr.min(m - row);
                let x = &packed_x[(tile * k + depth) * mr..(tile * k + depth + kc) * mr];
                for p in 0..count {
                    let start = (first + p) * k * nr;
                    let call = TileCall {
                        x,
                        panel: &self.panels[start + depth * nr..start + (depth + kc) * nr],
                        out: &mut block[row * stride + p * nr..],
                        stride,
                        accumulate: depth > 0,
                        prefetch: prefetch.share(first + p, tile),
                    };
                    self.run(rows, call);
                }
            }
            depth += kc;
        }
    }

    fn run(&self, rows: usize, call: TileCall<'_>) {
        self.kernels.tile(rows, self.nr, call);
    }
}

impl CpuKernels {
    /// Rows of activations one f32 kernel call multiplies by a panel: as many as the registers
    /// hold two accumulators for, beside the panel's two and a broadcast. AVX-512's 32 registers
    /// take 14 rows (28 accumulators), AVX2's 16 take 6 (12): more accumulators hide more of the
    /// loads' latency; 14 rows against 6 made the products ~14% faster on an Intel Xeon
    /// (docs/benchmarks/notes.md, "Fourteen rows a tile").
    pub fn f32_tile_rows(self) -> usize {
        match self {
            CpuKernels::Amx | CpuKernels::Avx512 => WIDE_ROWS,
            CpuKernels::Avx2 | CpuKernels::Gemm => NARROW_ROWS,
        }
    }

    /// One micro-kernel call of this family on `rows` (at most [`CpuKernels::f32_tile_rows`])
    /// rows, panels `nr` wide.
    pub(crate) fn tile(self, rows: usize, nr: usize, call: TileCall<'_>) {
        match self {
            #[cfg(target_arch = "x86_64")]
            CpuKernels::Amx | CpuKernels::Avx512 => match pulp::x86::V4::try_new() {
                Some(simd) => wide_tile(simd, rows, call),
                None => scalar_tile(rows, nr, WIDE_ROWS, call),
            },
            #[cfg(target_arch = "x86_64")]
            CpuKernels::Avx2 => match pulp::x86::V3::try_new() {
                Some(simd) => narrow_tile(simd, rows, call),
                None => scalar_tile(rows, nr, NARROW_ROWS, call),
            },
            _ => scalar_tile(rows, nr, self.f32_tile_rows(), call),
        }
    }
}

/// The tile without SIMD, for a family the CPU lacks (the engine refuses those at load; this keeps
/// a mistake slow rather than wrong); `x` holds `mr` values per depth.
fn scalar_tile(rows: usize, nr: usize, mr: usize, call: TileCall<'_>) {
    let TileCall {
        x,
        panel,
        out,
        stride,
        accumulate,
        prefetch: _,
    } = call;
    for r in 0..rows {
        let dst = &mut out[r * stride..r * stride + nr];
        if !accumulate {
            dst.fill(0.0);
        }
        for (w, a) in panel.chunks_exact(nr).zip(x.chunks_exact(mr)) {
            for (o, &w) in dst.iter_mut().zip(w) {
                *o = a[r].mul_add(w, *o);
            }
        }
    }
}

/// `x` `[m, k]` as row tiles of `mr`: tile `t` holds, for each depth, its `mr` values (zero past `m`).
fn pack_rows(x: &[f32], m: usize, k: usize, mr: usize) -> Vec<f32> {
    let tiles = m.div_ceil(mr);
    let mut packed = vec![0f32; tiles * k * mr];
    packed.par_chunks_mut(k * mr).enumerate().for_each(|(t, dst)| {
        for r in 0..mr.min(m - t * mr) {
            let row = &x[(t * mr + r) * k..(t * mr + r + 1) * k];
            for (d, &v) in dst.chunks_exact_mut(mr).zip(row) {
                d[r] = v;
            }
        }
    });
    packed
}

impl CpuWeight for PackedWeight {
    const NAME: &'static str = "laya-packed-matmul";

    fn dims(&self) -> (usize, usize) {
        (self.k, if self.geglu { self.n / 2 } else { self.n })
    }

    fn matmul(&self, x: &[f32], m: usize) -> Vec<f32> {
        PackedWeight::matmul(self, x, m)
    }
}
