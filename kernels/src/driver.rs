//! The panel driver every format shares: a product's output cut into parallel column blocks
//! ([`in_column_blocks`], or written in place through [`ColumnRange`]s: [`in_column_ranges`]), the
//! per-thread buffers they reuse, and the weight slices streamed into L2 while the current ones
//! compute ([`NextSlices`], [`NextPass`], [`Prefetch`]). The depth × row tile × panel loop itself
//! lives beside each format's microkernel call (`f32`, `int8::pairs`, `int8::quads`, `bf16`).

use std::cell::RefCell;
use std::mem::MaybeUninit;

use rayon::prelude::*;

use crate::geglu::{GROUP, GeGlu, groups_fit};

/// Most column panels one parallel task computes.
const MAX_PANELS_PER_TASK: usize = 8;

/// A product `[m, n]` computed in parallel column blocks (f32, bf16): `block(first, count, out)`
/// fills panels `first .. first + count` of `nr` columns into `out` (`[m, count·nr]`), storing every
/// value (its first depth pass does not accumulate); the task then copies its block into its
/// columns of the output, with `bias` added, while the block is still in its core's cache. The
/// blocks used to be copied in a second parallel pass over all of them, which read them back from
/// memory (a 512-token product's blocks outgrew the reused buffers, so they were also a fresh
/// zeroed allocation each time). An empty depth (`k = 0`) is the caller's: no pass would store.
///
/// With `geglu` (a weight whose columns are grouped for it, `geglu.rs`; no bias) the copy applies
/// GeGLU to each block's group pairs instead: the output is `[m, n / 2]`.
pub(crate) fn in_column_blocks(
    m: usize,
    n: usize,
    nr: usize,
    bias: Option<&[f32]>,
    geglu: Option<GeGlu>,
    block: impl Fn(usize, usize, &mut [f32]) + Sync,
) -> Vec<f32> {
    assert!(
        bias.is_none_or(|b| b.len() >= n),
        "bias shorter than the output's {n} columns"
    );
    if let Some(geglu) = geglu {
        assert!(
            bias.is_none() && groups_fit(n) && nr.is_multiple_of(2 * GROUP),
            "GeGLU on {n} columns in panels of {nr}"
        );
        let apply = |first: usize, count: usize, columns: &mut ColumnRange<'_>| {
            let stride = count * nr;
            with_blocks(m * stride, |blocks| {
                block(first, count, blocks);
                for (row, src) in blocks.chunks_exact(stride).enumerate() {
                    geglu.groups(src, columns.row(row));
                }
            });
        };
        // SAFETY: each task writes all `m` rows of its range: a range of whole panels is `stride /
        // 2` wide (`n` is whole pairs of groups), and `GeGlu::groups` writes all of it.
        #[allow(unsafe_code)]
        return unsafe { in_column_ranges(m, n / 2, nr / 2, apply) };
    }
    let copy_into_place = |first: usize, count: usize, columns: &mut ColumnRange<'_>| {
        let (start, stride) = (first * nr, count * nr);
        with_blocks(m * stride, |blocks| {
            block(first, count, blocks);
            for (row, src) in blocks.chunks_exact(stride).enumerate() {
                let dst = columns.row(row);
                match bias {
                    Some(bias) => {
                        for ((o, &v), &b) in dst.iter_mut().zip(src).zip(&bias[start..]) {
                            o.write(v + b);
                        }
                    }
                    None => {
                        for (o, &v) in dst.iter_mut().zip(src) {
                            o.write(v);
                        }
                    }
                }
            }
        });
    };
    // SAFETY: each task copies its block into all `m` rows of its range, every value of each: a
    // row of the range is at most `stride` wide (the last panel cut at `n`), the block's row is
    // `stride` long and `bias` holds at least `n` values, so each zip is the range's width.
    #[allow(unsafe_code)]
    unsafe {
        in_column_ranges(m, n, nr, copy_into_place)
    }
}

/// A product `[m, n]` computed in parallel column blocks written in place: `block(first, count,
/// columns)` writes, through `columns`, every column of panels `first .. first + count` (`nr`
/// wide, the last one cut at `n`) in every row. For kernels whose last step writes exactly the
/// real columns (the int8 combine): no block buffer, no copy of it into place afterwards (that
/// copy and its pass over the pool were ~4% of an int8 forward), and no zeroing of the output
/// first (each task zeroed its columns before: ~6% of a 64-token int8 forward's CPU time on AMX).
///
/// # Safety
/// `block` writes every value of `columns.row(r)` for every row `r < m`: the output is returned
/// as those writes left it.
#[allow(unsafe_code)]
pub(crate) unsafe fn in_column_ranges(
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
    // Not zeroed: every value is written once, by the task that owns its column.
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
        let mut columns = ColumnRange::new(&target, start, (count * nr).min(n - start));
        block(first, count, &mut columns);
    });
    // SAFETY: the tasks' ranges, panels `t · per_task ..` for every `t`, cover columns `0..n` of
    // every row, and each task's `block` wrote all of its range (the caller's contract): all
    // `m · n` values are initialised. (A task that panicked re-raises here, before this line.)
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

// SAFETY: the pointer is only dereferenced through `ColumnRange::row`, for columns no other task
// is given (see there), while `in_column_ranges` holds the output borrowed.
#[allow(unsafe_code)]
unsafe impl Sync for OutputRows {}

/// Columns `start .. start + width` of every row of the output: one task's share.
pub(crate) struct ColumnRange<'a> {
    rows: &'a OutputRows,
    start: usize,
    width: usize,
}

impl<'a> ColumnRange<'a> {
    /// Columns `start .. start + width` of every row of `rows`.
    fn new(rows: &'a OutputRows, start: usize, width: usize) -> Self {
        assert!(start + width <= rows.n, "column range outside the output");
        Self { rows, start, width }
    }

    /// Row `r`'s columns of this range (`width` values, maybe not yet initialised), to be written.
    #[allow(unsafe_code)] // SAFETY below
    pub(crate) fn row(&mut self, r: usize) -> &mut [MaybeUninit<f32>] {
        assert!(r < self.rows.m, "row outside the output");
        // SAFETY: inside the `[m, n]` output (`new` checked the columns, `r < m`), which outlives
        // every task; `MaybeUninit` needs no initialised values; the tasks' column ranges are
        // disjoint (their panels are), so no other task reaches these columns, and `&mut self`
        // keeps one row of this range borrowed at a time.
        unsafe {
            std::slice::from_raw_parts_mut(
                self.rows
                    .ptr
                    .add(r * self.rows.n + self.start)
                    .cast::<MaybeUninit<f32>>(),
                self.width,
            )
        }
    }
}

/// `m` rows of `bias` (zeros without one): a product with no depth.
pub(crate) fn bias_rows(bias: Option<&[f32]>, m: usize, n: usize) -> Vec<f32> {
    match bias {
        Some(bias) => bias.repeat(m),
        None => vec![0f32; m * n],
    }
}

/// Most f32 a thread keeps for the column block of the product task it runs (8 MiB: a block is at
/// most 8 panels of 32 columns, 1 KiB a row, so 512 rows take 512 KiB); a larger one allocates its
/// own.
const REUSED_BLOCKS: usize = 1 << 21;

thread_local! {
    /// The column block of one product task, reused across tasks on the thread that runs them.
    /// Every block is stored before it is read, so the buffer is never cleared: cleared per block,
    /// these buffers were 2–3% of a bf16 forward's time in `memset` (docs/benchmarks.md).
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
