//! Float32 products of activations by constant weights on the CPU: each weight is packed once, at
//! load, into column panels for the kernel family chosen at run time (AVX-512 or AVX2+FMA), so a
//! forward packs only its few activation rows; every product runs on the calling rayon pool.
//!
//! Why not candle's matmul (the `gemm` crate): it repacks the weight on every call and splits few
//! rows poorly across threads; on one 64-token row that made the matrix products about twice as slow
//! as these kernels (docs/benchmarks.md). Other devices and precisions keep candle's matmul.

use std::cell::RefCell;
use std::fmt;

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp1, Layout, Shape};
#[cfg(target_arch = "x86_64")]
use pulp::Simd;
use pulp::WithSimd;
use rayon::prelude::*;

use crate::layers::cpu_matmul_bf16::Bf16Weight;
use crate::layers::cpu_matmul_int8::{Int8Kernel, QuantizedWeight};

/// Rows of the activation tile one kernel call computes.
pub(crate) const MR: usize = 6;
/// Depth of one pass: a weight panel's slice of `KC` rows stays in L1 while every row tile uses it.
const KC: usize = 256;
/// Most column panels one parallel task computes.
const MAX_PANELS_PER_TASK: usize = 8;

/// The SIMD kernels a CPU forward uses for its matrix products.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CpuKernels {
    /// The AVX-512 float32 kernels, with the int8 and bf16 products on AMX's tile registers
    /// (`layad_cpu_kernels::amx`: Sapphire Rapids and later Xeons, where Linux grants the tiles).
    Amx,
    /// 512-bit AVX-512F kernels (x86-64 CPUs that have them).
    Avx512,
    /// 256-bit AVX2 + FMA kernels (x86-64 since about 2013).
    Avx2,
    /// candle's matmul (the `gemm` crate and its own run-time dispatch): other CPUs (Apple, Arm).
    Gemm,
}

impl CpuKernels {
    /// The best family this CPU runs.
    pub fn detect() -> Self {
        [Self::Amx, Self::Avx512, Self::Avx2]
            .into_iter()
            .find(|k| k.available())
            .unwrap_or(Self::Gemm)
    }

    /// Parses `auto` (the best available: `None`), `amx`, `avx512`, `avx2` or `gemm`.
    pub fn parse(text: &str) -> Result<Option<Self>, String> {
        match text.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(None),
            "amx" => Ok(Some(Self::Amx)),
            "avx512" => Ok(Some(Self::Avx512)),
            "avx2" => Ok(Some(Self::Avx2)),
            "gemm" => Ok(Some(Self::Gemm)),
            _ => Err(format!(
                "unknown CPU kernels '{text}'; expected auto, amx, avx512, avx2 or gemm"
            )),
        }
    }

    /// Whether this CPU can run the family.
    pub fn available(self) -> bool {
        match self {
            #[cfg(target_arch = "x86_64")]
            Self::Amx => pulp::x86::V4::try_new().is_some() && layad_cpu_kernels::amx::Amx::detect().is_ok(),
            #[cfg(target_arch = "x86_64")]
            Self::Avx512 => pulp::x86::V4::try_new().is_some(),
            #[cfg(target_arch = "x86_64")]
            Self::Avx2 => pulp::x86::V3::try_new().is_some(),
            #[cfg(not(target_arch = "x86_64"))]
            Self::Amx | Self::Avx512 | Self::Avx2 => false,
            Self::Gemm => true,
        }
    }

    /// `amx`, `avx512`, `avx2` or `gemm`: what the worker reports in its start-up line and in
    /// `/health`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Amx => "amx",
            Self::Avx512 => "avx512",
            Self::Avx2 => "avx2",
            Self::Gemm => "gemm",
        }
    }

    /// What the worker reports in `/health`: [`CpuKernels::as_str`], and where the CPU has AMX but
    /// the operating system refused its tiles, why (`avx512 (AMX refused: …)`), so an operator
    /// sees why a Xeon with AMX runs slower kernels.
    pub fn report(self) -> String {
        match layad_cpu_kernels::amx::Amx::detect() {
            Err(refused @ layad_cpu_kernels::amx::AmxUnavailable::Refused(_)) if self != Self::Amx => {
                format!("{} ({refused})", self.as_str())
            }
            _ => self.as_str().to_owned(),
        }
    }

    /// Runs `op` with this family's SIMD: AVX-512 (also beside AMX) or AVX2 as named (portable code
    /// if the CPU lacks it), and for `Gemm` whatever `pulp` finds best on this CPU.
    pub(crate) fn dispatch<Op: WithSimd>(self, op: Op) -> Op::Output {
        match self {
            #[cfg(target_arch = "x86_64")]
            Self::Amx | Self::Avx512 => match pulp::x86::V4::try_new() {
                Some(simd) => Simd::vectorize(simd, op),
                None => Simd::vectorize(pulp::Scalar::new(), op),
            },
            #[cfg(target_arch = "x86_64")]
            Self::Avx2 => match pulp::x86::V3::try_new() {
                Some(simd) => Simd::vectorize(simd, op),
                None => Simd::vectorize(pulp::Scalar::new(), op),
            },
            _ => pulp::Arch::new().dispatch(op),
        }
    }

    /// Columns per packed panel: two registers of the family's width.
    pub(crate) fn panel_width(self) -> usize {
        match self {
            Self::Amx | Self::Avx512 => 32,
            Self::Avx2 | Self::Gemm => 16,
        }
    }
}

impl fmt::Display for CpuKernels {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A weight `[k, n]` (the transposed PyTorch `[out, in]`) packed for one kernel family: panel `p`
/// holds columns `p·nr .. p·nr + nr` (zero past `n`), row after row.
pub(crate) struct PackedWeight {
    kernels: CpuKernels,
    k: usize,
    n: usize,
    nr: usize,
    panels: Vec<f32>,
    bias: Option<Vec<f32>>,
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
        }
    }

    /// Packs `weight` as the file holds it, `[n, k]` (PyTorch's `[out, in]`): the same panels as
    /// [`PackedWeight::pack`] of its transpose, without the transpose. With `scale = (start, len,
    /// factor)`, outputs `start..start + len` are multiplied by `factor` on the way.
    pub(crate) fn pack_out_in(
        weight: &[f32],
        k: usize,
        n: usize,
        bias: Option<Vec<f32>>,
        kernels: CpuKernels,
        scale: Option<(usize, usize, f64)>,
    ) -> Self {
        let nr = kernels.panel_width();
        let count = n.div_ceil(nr);
        let mut panels = vec![0f32; count * k * nr];
        panels
            .par_chunks_mut((k * nr).max(1))
            .enumerate()
            .for_each(|(p, panel)| {
                for c in 0..nr.min(n - p * nr) {
                    let col = p * nr + c;
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
        }
    }

    /// The weight rounded to bf16 for the AVX512_BF16 kernel (AMX's tiles for the `amx` family),
    /// read straight from the panels.
    pub(crate) fn to_bf16(&self) -> Bf16Weight {
        let (k, nr, panels) = (self.k, self.nr, &self.panels);
        let value = |depth: usize, col: usize| panels[(col / nr) * k * nr + depth * nr + col % nr];
        Bf16Weight::pack_with(
            value,
            self.k,
            self.n,
            self.bias.clone(),
            self.kernels == CpuKernels::Amx,
        )
    }

    /// The weight quantized to int8 for `kernel`, read straight from the panels.
    pub(crate) fn quantize(&self, kernel: Int8Kernel) -> QuantizedWeight {
        let (k, nr, panels) = (self.k, self.nr, &self.panels);
        let value = |depth: usize, col: usize| panels[(col / nr) * k * nr + depth * nr + col % nr];
        QuantizedWeight::quantize_with(value, self.k, self.n, self.bias.clone(), kernel)
    }

    /// `x · W (+ bias)` for `x` `[m, k]` row-major; returns `[m, n]` row-major.
    pub(crate) fn matmul(&self, x: &[f32], m: usize) -> Vec<f32> {
        let (k, n, nr) = (self.k, self.n, self.nr);
        if m == 0 || n == 0 || k == 0 {
            return bias_rows(self.bias.as_deref(), m, n);
        }
        let packed_x = pack_rows(x, m, k);
        in_column_blocks(m, n, nr, self.bias.as_deref(), |first, count, block| {
            self.block(&packed_x, m, first, count, block);
        })
    }

    /// Panels `first .. first + count` for every row into `block` (`[m, count·nr]`). Per depth
    /// pass, each row tile (in L1) meets every panel slice of the task (in L2).
    fn block(&self, packed_x: &[f32], m: usize, first: usize, count: usize, block: &mut [f32]) {
        let (k, nr) = (self.k, self.nr);
        let stride = count * nr;
        let next = NextSlices {
            panels: &self.panels,
            panel_units: k,
            unit: nr,
            pass: KC,
            count,
            tiles: m.div_ceil(MR),
        };
        let mut depth = 0;
        while depth < k {
            let kc = KC.min(k - depth);
            let prefetch = next.pass(depth, kc);
            for (tile, row) in (0..m).step_by(MR).enumerate() {
                let rows = MR.min(m - row);
                let x = &packed_x[(tile * k + depth) * MR..(tile * k + depth + kc) * MR];
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
    /// One micro-kernel call of this family on `rows` (at most `MR`) rows, panels `nr` wide.
    pub(crate) fn tile(self, rows: usize, nr: usize, call: TileCall<'_>) {
        match self {
            #[cfg(target_arch = "x86_64")]
            CpuKernels::Amx | CpuKernels::Avx512 => match pulp::x86::V4::try_new() {
                Some(simd) => simd_tile(simd, rows, call),
                None => scalar_tile(rows, nr, call),
            },
            #[cfg(target_arch = "x86_64")]
            CpuKernels::Avx2 => match pulp::x86::V3::try_new() {
                Some(simd) => simd_tile(simd, rows, call),
                None => scalar_tile(rows, nr, call),
            },
            _ => scalar_tile(rows, nr, call),
        }
    }
}

/// The tile without SIMD, for a family the CPU lacks (the engine refuses those at load; this keeps
/// a mistake slow rather than wrong).
fn scalar_tile(rows: usize, nr: usize, call: TileCall<'_>) {
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
        for (w, a) in panel.chunks_exact(nr).zip(x.chunks_exact(MR)) {
            for (o, &w) in dst.iter_mut().zip(w) {
                *o = a[r].mul_add(w, *o);
            }
        }
    }
}

/// A product `[m, n]` computed in parallel column blocks (f32, bf16, int8): `block(first, count, out)`
/// fills panels `first .. first + count` of `nr` columns into `out` (`[m, count·nr]`), storing every
/// value (its first depth pass does not accumulate); the blocks are then copied into place, rows in
/// parallel, with `bias` added. An empty depth (`k = 0`) is the caller's: no pass would store.
pub(crate) fn in_column_blocks(
    m: usize,
    n: usize,
    nr: usize,
    bias: Option<&[f32]>,
    block: impl Fn(usize, usize, &mut [f32]) + Sync,
) -> Vec<f32> {
    if m == 0 || n == 0 {
        return vec![0f32; m * n];
    }
    let panels = n.div_ceil(nr);
    let per_task = panels_per_task(panels);
    // Task `t`'s block starts at `t · task_len` (the last one may be narrower).
    let task_len = m * per_task * nr;
    with_blocks(panels.div_ceil(per_task) * task_len, |blocks| {
        blocks.par_chunks_mut(task_len).enumerate().for_each(|(t, out)| {
            let first = t * per_task;
            let count = per_task.min(panels - first);
            block(first, count, &mut out[..m * count * nr]);
        });
        gather_rows(blocks, (m, n, nr, per_task), bias)
    })
}

/// A product `[m, n]` computed in parallel column blocks written in place: `block(first, count,
/// columns)` fills, through `columns`, every column of panels `first .. first + count` (`nr` wide,
/// the last one cut at `n`) in every row. For kernels whose last step writes exactly the real
/// columns (the int8 combine): no block buffer, and no copy of it into place afterwards (that
/// copy and its pass over the pool were ~4% of an int8 forward).
pub(crate) fn in_column_ranges(
    m: usize,
    n: usize,
    nr: usize,
    block: impl Fn(usize, usize, &mut ColumnRange<'_>) + Sync,
) -> Vec<f32> {
    if m == 0 || n == 0 {
        return vec![0f32; m * n];
    }
    let panels = n.div_ceil(nr);
    let per_task = panels_per_task(panels);
    // Not zeroed here: each task zeroes its own columns first, in parallel and in its cache,
    // where a zeroed allocation was cleared on the calling thread alone (a third of the 12% of a
    // forward of 8 rows that ran on one thread).
    let mut out: Vec<f32> = Vec::with_capacity(m * n);
    let target = OutputRows {
        ptr: out.as_mut_ptr(),
        m,
        n,
    };
    (0..panels.div_ceil(per_task)).into_par_iter().for_each(|t| {
        let first = t * per_task;
        let count = per_task.min(panels - first);
        let start = first * nr;
        let mut columns = ColumnRange::zeroed(&target, start, (count * nr).min(n - start));
        block(first, count, &mut columns);
    });
    // SAFETY: the tasks' ranges, panels `t · per_task ..` for every `t`, cover columns `0..n` of
    // every row, and each zeroed its range before anything read it: all `m · n` values are
    // initialised. (A task that panicked re-raises here, before this line.)
    #[allow(unsafe_code)]
    unsafe {
        out.set_len(m * n)
    };
    out
}

/// The `[m, n]` output [`in_column_ranges`]' tasks write into, each its own columns.
struct OutputRows {
    ptr: *mut f32,
    m: usize,
    n: usize,
}

// SAFETY: the pointer is only dereferenced through `ColumnRange::zeroed` and `row`, for columns no
// other task is given (see there), while `in_column_ranges` holds the output borrowed.
#[allow(unsafe_code)]
unsafe impl Sync for OutputRows {}

/// Columns `start .. start + width` of every row of the output: one task's share.
pub(crate) struct ColumnRange<'a> {
    rows: &'a OutputRows,
    start: usize,
    width: usize,
}

impl<'a> ColumnRange<'a> {
    /// Columns `start .. start + width` of every row of `rows`, set to zero.
    #[allow(unsafe_code)] // SAFETY below
    fn zeroed(rows: &'a OutputRows, start: usize, width: usize) -> Self {
        assert!(start + width <= rows.n, "column range outside the output");
        for r in 0..rows.m {
            // SAFETY: inside the `[m, n]` allocation (checked above; `r < m`), and no other task's
            // range overlaps these columns (see `row`); writing needs no initialised values.
            unsafe { rows.ptr.add(r * rows.n + start).write_bytes(0, width) };
        }
        Self { rows, start, width }
    }

    /// Row `r`'s columns of this range (`width` values).
    #[allow(unsafe_code)] // SAFETY below
    pub(crate) fn row(&mut self, r: usize) -> &mut [f32] {
        assert!(r < self.rows.m, "row outside the output");
        // SAFETY: the values lie inside the `[m, n]` output (`zeroed` checked the columns), which
        // outlives every task, and are initialised (zeroed when this range was made); the tasks'
        // column ranges are disjoint (their panels are), so no other task reaches them, and
        // `&mut self` keeps one row of this range borrowed at a time.
        unsafe { std::slice::from_raw_parts_mut(self.rows.ptr.add(r * self.rows.n + self.start), self.width) }
    }
}

/// The row-major `[m, n]` product from the column blocks `in_column_blocks` laid out (task `t`'s
/// block `[m, count·nr]` at `t · m · per_task · nr`), with `bias` added: rows in parallel.
fn gather_rows(blocks: &[f32], (m, n, nr, per_task): (usize, usize, usize, usize), bias: Option<&[f32]>) -> Vec<f32> {
    let task_len = m * per_task * nr;
    // A large zeroed allocation is fresh zero pages (no memset); each row is written once below.
    let mut out = vec![0f32; m * n];
    out.par_chunks_mut(n).enumerate().for_each(|(row, dst)| {
        for (t, dst) in dst.chunks_mut(per_task * nr).enumerate() {
            let stride = per_task.min(n.div_ceil(nr) - t * per_task) * nr;
            let at = t * task_len + row * stride;
            dst.copy_from_slice(&blocks[at..at + dst.len()]);
            if let Some(bias) = bias {
                for (o, b) in dst.iter_mut().zip(&bias[t * per_task * nr..]) {
                    *o += b;
                }
            }
        }
    });
    out
}

/// `m` rows of `bias` (zeros without one): a product with no depth.
pub(crate) fn bias_rows(bias: Option<&[f32]>, m: usize, n: usize) -> Vec<f32> {
    match bias {
        Some(bias) => bias.repeat(m),
        None => vec![0f32; m * n],
    }
}

/// Most f32 a thread keeps for the column blocks of its products (8 MiB: one 64-token row's widest
/// product needs 1.3 MiB); a larger product allocates its own.
const REUSED_BLOCKS: usize = 1 << 21;

thread_local! {
    /// The column blocks of one product, reused across products on the thread that runs it. Every
    /// block is stored before it is read, so the buffer is never cleared: cleared per block, these
    /// buffers were 2–3% of a bf16 forward's time in `memset`, and their copy into place ran on
    /// one thread (docs/benchmarks.md).
    static BLOCKS: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Runs `work` on a buffer of `len` f32 whose contents are unspecified (reused, or zero).
fn with_blocks<R>(len: usize, work: impl FnOnce(&mut [f32]) -> R) -> R {
    with_reused(&BLOCKS, len, REUSED_BLOCKS, work)
}

/// Runs `work` on `len` values of the thread's `buffer` (grown as needed, contents unspecified: the
/// callers store before they read), or on a fresh zeroed buffer past `limit` values or when this
/// thread's buffer is already lent out (rayon may run a product inside another's while it waits).
pub(crate) fn with_reused<T: Copy + Default + 'static, R>(
    buffer: &'static std::thread::LocalKey<RefCell<Vec<T>>>,
    len: usize,
    limit: usize,
    work: impl FnOnce(&mut [T]) -> R,
) -> R {
    if len > limit {
        return work(&mut vec![T::default(); len]);
    }
    buffer.with(|cell| match cell.try_borrow_mut() {
        Ok(mut reused) => {
            if reused.len() < len {
                reused.resize(len, T::default());
            }
            work(&mut reused[..len])
        }
        Err(_) => work(&mut vec![T::default(); len]),
    })
}

/// How many of `panels` column panels one parallel task of a product computes (f32 and int8):
/// enough tasks for every thread of the current pool to get several (they finish unevenly), few
/// enough that a task's panels amortise reading the packed rows.
pub(crate) fn panels_per_task(panels: usize) -> usize {
    let threads = rayon::current_num_threads().max(1);
    panels.div_ceil(4 * threads).clamp(1, MAX_PANELS_PER_TASK)
}

/// The part of a weight's panels the next kernel calls read, requested into L2 while the current
/// ones compute. A product of a few rows reads each weight once per forward, mostly from memory
/// (the whole model does not fit any cache): the first row tile of every depth pass then ran at
/// memory's pace (docs/benchmarks.md, "Streaming the weights"). Each call of a depth pass
/// prefetches its row tile's share of the slice the same panel reads next: its next pass, or
/// after its last the first pass of the panel `count` on (the pool's next task most often
/// takes the next block of panels).
pub(crate) struct NextSlices<'a, T> {
    /// Every panel, `panel_units` depth units of `unit` elements each.
    pub(crate) panels: &'a [T],
    pub(crate) panel_units: usize,
    pub(crate) unit: usize,
    /// Depth units of one pass.
    pub(crate) pass: usize,
    /// Panels of the task.
    pub(crate) count: usize,
    /// Row tiles of a pass, which share the prefetching.
    pub(crate) tiles: usize,
}

impl<'a, T> NextSlices<'a, T> {
    /// What the calls of the pass from `depth` (`steps` depth units) prefetch; worked out once
    /// per pass, not in each kernel call (two divisions each, ~170,000 calls per 64-token int8
    /// forward).
    pub(crate) fn pass(&self, depth: usize, steps: usize) -> NextPass<'a, T> {
        let (panel_offset, next_depth) = if depth + self.pass < self.panel_units {
            (0, depth + self.pass)
        } else {
            (self.count, 0)
        };
        let len = self.pass.min(self.panel_units - next_depth) * self.unit;
        let line = (64 / size_of::<T>()).max(1);
        let share = len.div_ceil(line).div_ceil(self.tiles.max(1)) * line;
        NextPass {
            panels: self.panels,
            first: next_depth * self.unit,
            panel_len: self.panel_units * self.unit,
            panel_offset,
            len,
            share,
            per_step: (share / line).div_ceil(steps.max(1)) * line,
        }
    }
}

/// One depth pass's prefetching ([`NextSlices::pass`]).
pub(crate) struct NextPass<'a, T> {
    panels: &'a [T],
    /// Where the slice read next starts inside its panel, and each panel's length.
    first: usize,
    panel_len: usize,
    /// The panel read next: the same (0), or `count` on.
    panel_offset: usize,
    /// The slice's length, and each row tile's share of it (whole cache lines).
    len: usize,
    share: usize,
    per_step: usize,
}

impl<'a, T> NextPass<'a, T> {
    /// Row tile `tile`'s share of what follows panel `panel`'s pass (empty past the last panel).
    #[inline(always)]
    pub(crate) fn share(&self, panel: usize, tile: usize) -> Prefetch<'a, T> {
        let start = (panel + self.panel_offset) * self.panel_len + self.first;
        let (from, to) = (
            (tile * self.share).min(self.len),
            ((tile + 1) * self.share).min(self.len),
        );
        Prefetch {
            data: self.panels.get(start + from..start + to).unwrap_or(&[]),
            per_step: self.per_step,
        }
    }
}

/// Data a kernel call requests into L2 over its depth steps, a few cache lines per step. Only the
/// x86-64 kernels prefetch (elsewhere the CPU products are candle's).
#[derive(Clone, Copy)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) struct Prefetch<'a, T> {
    data: &'a [T],
    per_step: usize,
}

#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
impl<'a, T> Prefetch<'a, T> {
    /// Nothing to prefetch.
    pub(crate) const NONE: Self = Prefetch { data: &[], per_step: 0 };

    /// Requests step `step`'s lines into L2: a hint, which reads nothing into the program and
    /// cannot fault.
    #[inline(always)]
    #[allow(unsafe_code)] // the one intrinsic outside the kernels' modules; SAFETY below
    pub(crate) fn step(&self, step: usize) {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::x86_64::{_MM_HINT_T1, _mm_prefetch};
            let line = (64 / size_of::<T>()).max(1);
            let mut at = step * self.per_step;
            while at < ((step + 1) * self.per_step).min(self.data.len()) {
                // SAFETY: SSE, the instruction's feature, is part of the x86-64 baseline; the
                // pointer is into `data`, and a prefetch neither reads into the program nor faults.
                unsafe { _mm_prefetch::<_MM_HINT_T1>(std::ptr::from_ref(&self.data[at]).cast::<i8>()) };
                at += line;
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = step;
    }
}

/// `x` `[m, k]` as row tiles of `MR`: tile `t` holds, for each depth, its `MR` values (zero past `m`).
pub(crate) fn pack_rows(x: &[f32], m: usize, k: usize) -> Vec<f32> {
    let tiles = m.div_ceil(MR);
    let mut packed = vec![0f32; tiles * k * MR];
    packed.par_chunks_mut(k * MR).enumerate().for_each(|(t, dst)| {
        for r in 0..MR.min(m - t * MR) {
            let row = &x[(t * MR + r) * k..(t * MR + r + 1) * k];
            for (d, &v) in dst.chunks_exact_mut(MR).zip(row) {
                d[r] = v;
            }
        }
    });
    packed
}

/// One kernel call: `R` rows of packed activations times one panel slice, into `out` (rows `stride`
/// apart), added to what `out` holds when `accumulate`.
pub(crate) struct TileCall<'a> {
    /// Packed activation rows (`MR` values per depth), as [`pack_rows`] lays them out.
    pub(crate) x: &'a [f32],
    /// One panel: `nr` values per depth, as many depths as `x` has.
    pub(crate) panel: &'a [f32],
    /// The first output row; row `r` starts at `r·stride`, `nr` values each.
    pub(crate) out: &'a mut [f32],
    pub(crate) stride: usize,
    pub(crate) accumulate: bool,
    /// Weights to request into L2 during the call ([`NextSlices`]).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(crate) prefetch: Prefetch<'a, f32>,
}

/// The SIMD tile for `rows` rows (x86-64 only: elsewhere the CPU path is candle's, and the
/// families that call this are never chosen).
#[cfg(target_arch = "x86_64")]
fn simd_tile<S: Simd>(simd: S, rows: usize, call: TileCall<'_>) {
    match rows {
        6 => simd.vectorize(Tile::<6>(call)),
        5 => simd.vectorize(Tile::<5>(call)),
        4 => simd.vectorize(Tile::<4>(call)),
        3 => simd.vectorize(Tile::<3>(call)),
        2 => simd.vectorize(Tile::<2>(call)),
        _ => simd.vectorize(Tile::<1>(call)),
    }
}

/// The micro-kernel for `R` rows: `R × 2` accumulator registers, one broadcast activation times two
/// weight registers per row and depth. `R` is a constant so the accumulators stay in registers.
#[cfg(target_arch = "x86_64")]
struct Tile<'a, const R: usize>(TileCall<'a>);

#[cfg(target_arch = "x86_64")]
impl<const R: usize> WithSimd for Tile<'_, R> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: Simd>(self, simd: S) {
        let TileCall {
            x,
            panel,
            out,
            stride,
            accumulate,
            prefetch,
        } = self.0;
        let lanes = S::F32_LANES;
        let (weights, _) = S::as_simd_f32s(panel);
        let zero = simd.splat_f32s(0.0);
        let mut acc = [[zero; 2]; R];
        if accumulate {
            for (r, acc) in acc.iter_mut().enumerate() {
                let (held, _) = S::as_simd_f32s(&out[r * stride..r * stride + 2 * lanes]);
                *acc = [held[0], held[1]];
            }
        }
        for (i, (w, a)) in weights.chunks_exact(2).zip(x.chunks_exact(MR)).enumerate() {
            prefetch.step(i);
            let (w0, w1) = (w[0], w[1]);
            for r in 0..R {
                let v = simd.splat_f32s(a[r]);
                acc[r][0] = simd.mul_add_f32s(v, w0, acc[r][0]);
                acc[r][1] = simd.mul_add_f32s(v, w1, acc[r][1]);
            }
        }
        for (r, acc) in acc.iter().enumerate() {
            let (dst, _) = S::as_mut_simd_f32s(&mut out[r * stride..r * stride + 2 * lanes]);
            dst[0] = acc[0];
            dst[1] = acc[1];
        }
    }
}

/// A constant weight `[k, n]` prepared for the CPU kernels (packed f32, or int8 in
/// `cpu_matmul_int8`): what [`CpuMatmul`] needs to run it as a candle op.
pub(crate) trait CpuWeight: Sync {
    /// The op's name in candle's errors.
    const NAME: &'static str;
    /// Input features (`k`) and output features (`n`).
    fn dims(&self) -> (usize, usize);
    /// `x · W (+ bias)` for `x` `[m, k]` row-major; returns `[m, n]` row-major.
    fn matmul(&self, x: &[f32], m: usize) -> Vec<f32>;
}

impl CpuWeight for PackedWeight {
    const NAME: &'static str = "laya-packed-matmul";

    fn dims(&self) -> (usize, usize) {
        (self.k, self.n)
    }

    fn matmul(&self, x: &[f32], m: usize) -> Vec<f32> {
        PackedWeight::matmul(self, x, m)
    }
}

/// `x · W (+ bias)` as a candle op on a contiguous f32 `[.., k]` input, giving `[.., n]`.
pub(crate) struct CpuMatmul<'a, W>(pub(crate) &'a W);

impl<W: CpuWeight> CustomOp1 for CpuMatmul<'_, W> {
    fn name(&self) -> &'static str {
        W::NAME
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let CpuStorage::F32(data) = storage else {
            candle_core::bail!("{}: expected f32, got {:?}", W::NAME, storage.dtype())
        };
        let Some((start, end)) = layout.contiguous_offsets() else {
            candle_core::bail!("{}: expected a contiguous input", W::NAME)
        };
        let dims = layout.dims();
        let (k, n) = self.0.dims();
        match dims.split_last() {
            Some((&last, _)) if last == k => {}
            _ => candle_core::bail!("{}: input {dims:?} vs weight [{k}, {n}]", W::NAME),
        }
        let m = (end - start) / k.max(1);
        let out = self.0.matmul(&data[start..end], m);
        let mut shape = dims.to_vec();
        if let Some(last) = shape.last_mut() {
            *last = n;
        }
        Ok((CpuStorage::F32(out), Shape::from(shape)))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// `x · W (+ bias)` in float64, rounded to f32: the reference both kernels' tests compare with.
    pub(crate) fn reference(x: &[f32], w: &[f32], m: usize, k: usize, n: usize, bias: Option<&[f32]>) -> Vec<f32> {
        let mut out = vec![0f32; m * n];
        for i in 0..m {
            for j in 0..n {
                let sum: f64 = (0..k).map(|d| f64::from(x[i * k + d]) * f64::from(w[d * n + j])).sum();
                out[i * n + j] = sum as f32 + bias.map_or(0.0, |b| b[j]);
            }
        }
        out
    }

    fn values(len: usize, seed: usize) -> Vec<f32> {
        (0..len)
            .map(|i| (((i * 7919 + seed * 104_729) % 2001) as f32 - 1000.0) / 1000.0)
            .collect()
    }

    /// Every available family, odd shapes (row tiles, panels and depth passes with remainders),
    /// with and without a bias, against a float64 reference.
    #[test]
    fn every_family_matches_a_reference_product() {
        let families: Vec<CpuKernels> = [CpuKernels::Amx, CpuKernels::Avx512, CpuKernels::Avx2]
            .into_iter()
            .filter(|k| k.available())
            .collect();
        let pool = rayon::ThreadPoolBuilder::new().num_threads(3).build().expect("pool");
        for &(m, k, n) in &[(1, 5, 3), (7, 300, 37), (13, 513, 70), (64, 64, 33)] {
            let x = values(m * k, 1);
            let w = values(k * n, 2);
            let bias = values(n, 3);
            for &kernels in &families {
                for with_bias in [false, true] {
                    let packed = PackedWeight::pack(&w, k, n, with_bias.then(|| bias.clone()), kernels);
                    let got = pool.install(|| packed.matmul(&x, m));
                    let want = reference(&x, &w, m, k, n, with_bias.then_some(bias.as_slice()));
                    let worst = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
                    assert!(worst < 1e-4, "{kernels} {m}x{k}x{n} bias {with_bias}: {worst}");
                }
            }
        }
    }

    /// The reused column-block buffers carry nothing from one product into the next (a wide
    /// product, then narrower ones on the same threads; one past the reuse limit), and a product
    /// with no depth gives its bias.
    #[test]
    fn reused_block_buffers_and_empty_depths() {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().expect("pool");
        for kernels in [CpuKernels::Avx512, CpuKernels::Avx2]
            .into_iter()
            .filter(|k| k.available())
        {
            for &(m, k, n) in &[(9, 40, 700), (2, 7, 3), (5, 33, 65), (300, 3, 7000), (1, 5, 31)] {
                let (x, w) = (values(m * k, 6), values(k * n, 7));
                let bias = values(n, 8);
                let packed = PackedWeight::pack(&w, k, n, Some(bias.clone()), kernels);
                let got = pool.install(|| packed.matmul(&x, m));
                let want = reference(&x, &w, m, k, n, Some(&bias));
                let worst = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
                assert!(worst < 1e-4, "{kernels} {m}x{k}x{n}: {worst}");
            }
            let no_depth = PackedWeight::pack(&[], 0, 4, Some(vec![1.5; 4]), kernels);
            assert_eq!(pool.install(|| no_depth.matmul(&[], 3)), vec![1.5; 12]);
            assert_eq!(
                PackedWeight::pack(&[], 0, 2, None, kernels).matmul(&[], 2),
                vec![0.0; 4]
            );
        }
    }

    /// Packing the file's `[out, in]` layout gives the panels of packing its transpose (with the
    /// output scale applied to its rows), and quantizing the panels gives what quantizing the
    /// matrix does.
    #[test]
    fn packing_the_files_layout_matches_packing_the_transpose() {
        let (k, n) = (70, 45);
        let w = values(k * n, 4);
        let mut out_in = vec![0f32; n * k];
        for d in 0..k {
            for c in 0..n {
                out_in[c * k + d] = w[d * n + c];
            }
        }
        let mut scaled = w.clone();
        for d in 0..k {
            for c in 10..20 {
                scaled[d * n + c] *= 0.125;
            }
        }
        let families = [CpuKernels::Amx, CpuKernels::Avx512, CpuKernels::Avx2];
        for kernels in families.into_iter().filter(|k| k.available()) {
            let direct = PackedWeight::pack_out_in(&out_in, k, n, None, kernels, None);
            assert_eq!(direct.panels, PackedWeight::pack(&w, k, n, None, kernels).panels);
            let direct = PackedWeight::pack_out_in(&out_in, k, n, None, kernels, Some((10, 10, 0.125)));
            assert_eq!(direct.panels, PackedWeight::pack(&scaled, k, n, None, kernels).panels);
            let x = values(3 * k, 5);
            for int8 in [
                Int8Kernel::Amx,
                Int8Kernel::Avx512Vnni,
                Int8Kernel::AvxVnni,
                Int8Kernel::Avx2,
                Int8Kernel::Scalar,
            ] {
                if !int8.available() {
                    continue;
                }
                let from_panels = direct.quantize(int8).matmul(&x, 3);
                let from_matrix = QuantizedWeight::quantize(&scaled, k, n, None, int8).matmul(&x, 3);
                assert_eq!(from_panels, from_matrix, "{kernels} {int8:?}");
            }
        }
    }

    #[test]
    fn parses_and_detects_families() {
        assert_eq!(CpuKernels::parse("auto"), Ok(None));
        assert_eq!(CpuKernels::parse(" AVX2 "), Ok(Some(CpuKernels::Avx2)));
        assert_eq!(CpuKernels::parse("avx512"), Ok(Some(CpuKernels::Avx512)));
        assert_eq!(CpuKernels::parse("gemm"), Ok(Some(CpuKernels::Gemm)));
        assert_eq!(CpuKernels::parse("AMX"), Ok(Some(CpuKernels::Amx)));
        assert!(CpuKernels::parse("sse").is_err_and(|e| e.contains("'sse'")));
        let best = CpuKernels::detect();
        assert!(best.available());
        #[cfg(target_arch = "x86_64")]
        assert_eq!(
            matches!(best, CpuKernels::Amx | CpuKernels::Avx512),
            std::arch::is_x86_feature_detected!("avx512f")
        );
        assert_eq!(
            best == CpuKernels::Amx,
            CpuKernels::Avx512.available() && layad_cpu_kernels::amx::Amx::detect().is_ok()
        );
    }
}
