//! The tile code: configures the eight tile registers and runs [`TileProduct`]s on them. Tile
//! instructions have no stable Rust intrinsics, so they are inline assembly; one `asm!` block holds
//! a whole depth loop, so the tile registers carry nothing from one block to the next but the
//! configuration, which every product loads first.
//!
//! Registers: `tmm0`–`tmm3` accumulate (rows 0–15 and 16–31 × columns 0–15 and 16–31), `tmm4`
//! and `tmm5` hold the two row tiles of activations, `tmm6` and `tmm7` the panel's two column
//! tiles. Every tile is 16 rows of 64 bytes, but for a product's last block of rows when it holds
//! fewer real rows: its row tiles are configured to just those rows.

// Inline assembly is `unsafe`; each block says why its memory accesses hold.
#![allow(unsafe_code)]

use std::arch::asm;

use super::product::{Instruction, PANEL_COLUMNS, TILE_ROWS, TILE_WORDS, TileFormat, TileProduct};

/// Bytes of one depth word of a panel: 32 columns of 4 bytes.
const PANEL_ROW_BYTES: usize = PANEL_COLUMNS * 4;

/// A 64-byte tile configuration (`ldtilecfg`): palette 1, eight tiles of 64-byte rows.
#[repr(C, align(64))]
struct TileConfig([u8; 64]);

impl TileConfig {
    /// The accumulators and activation tile of the first row tile (`tmm0`, `tmm1`, `tmm4`) `first`
    /// rows high, those of the second (`tmm2`, `tmm3`, `tmm5`) `second` rows, the weight tiles
    /// (`tmm6`, `tmm7`) 16 depth words. A tile of fewer rows loads, multiplies and stores only
    /// those rows: a block's last rows need no padded products and no spill buffer.
    const fn rows(first: usize, second: usize) -> Self {
        let mut bytes = [0u8; 64];
        bytes[0] = 1;
        let mut tile = 0;
        while tile < 8 {
            let rows = match tile {
                0 | 1 | 4 => first,
                2 | 3 | 5 => second,
                _ => TILE_ROWS,
            };
            // Bytes per row (u16 at 16 + 2·tile), rows (u8 at 48 + tile).
            bytes[16 + 2 * tile] = 64;
            bytes[48 + tile] = rows as u8;
            tile += 1;
        }
        TileConfig(bytes)
    }

    /// Loads this configuration into the tile registers (their contents become zero).
    fn load(&self) {
        // SAFETY: `self` is 64 readable, 64-byte aligned bytes; loading a tile configuration only
        // changes the tile registers' shapes (this process holds the tile permission: an `Amx`
        // exists), every row count is 1 to 16 and every row 64 bytes.
        unsafe { asm!("ldtilecfg [{}]", in(reg) self.0.as_ptr(), options(nostack, readonly)) };
    }
}

/// Every tile 16 rows: the blocks whose rows are all real.
const FULL: TileConfig = TileConfig::rows(TILE_ROWS, TILE_ROWS);

/// Where one block's accumulators are stored: `rows` rows from `ptr`, `stride` bytes apart.
struct Store {
    ptr: *mut u8,
    stride: usize,
}

/// Runs `product` (already checked by [`TileProduct::check`]) on the tiles.
pub(super) fn multiply<F: TileFormat>(product: TileProduct<'_, F>) {
    let TileProduct {
        a,
        a_stride,
        rows,
        words,
        panels,
        out,
        stride,
    } = product;
    let count = std::mem::size_of_val(panels) / (words * PANEL_ROW_BYTES);
    let steps = words / TILE_WORDS;
    let a_stride = a_stride * 4;
    let out_stride = stride * 4;
    // Rows are taken 32 at a time (two row tiles) while more than 16 are left, then 16; the last
    // block may hold fewer real rows, and runs with tiles of just those rows. Those last blocks run
    // after every panel's full blocks, under one configuration: configured and restored per panel,
    // the two `ldtilecfg`s were 3% of a 66-token int8 forward's CPU time.
    let last = rows % (2 * TILE_ROWS);
    let partial = match last {
        0 | TILE_ROWS => None,
        r if r < TILE_ROWS => Some(TileConfig::rows(r, TILE_ROWS)),
        r => Some(TileConfig::rows(TILE_ROWS, r - TILE_ROWS)),
    };
    let full_rows = if partial.is_some() { rows - last } else { rows };
    let out = out.as_mut_ptr().cast::<u8>();
    let block = |p: usize, row: usize| {
        let height = (rows - row).min(2 * TILE_ROWS);
        // Panel `p` starts `p · words · 128` bytes into the weights.
        let b = panels.as_ptr().cast::<u8>().wrapping_add(p * words * PANEL_ROW_BYTES);
        let a_rows = a.as_ptr().cast::<u8>().wrapping_add(row * a_stride);
        let target = Store {
            ptr: out.wrapping_add((row * stride + p * PANEL_COLUMNS) * 4),
            stride: out_stride,
        };
        // SAFETY: `check` made `a` hold `rows` rounded up to 16 rows of `words` words (`a_stride`
        // words apart), so the `height` rows from `row` that the tiles load (the configuration's
        // rows: 16 or 32, or the last block's real rows, which the caller configured) are inside
        // it, 64 bytes per step for `steps` steps; `panels` holds `count` whole panels of `words`
        // rows of 128 bytes; the store writes the same `height` rows to `out`, which holds `rows`
        // rows of `stride` ≥ 32·count values from column 32·p (`out` is the product's own
        // `&mut`, not used otherwise while the blocks run).
        unsafe {
            match (F::INSTRUCTION, height > TILE_ROWS) {
                (Instruction::Tdpbusd, true) => two_row_tiles_tdpbusd(a_rows, a_stride, b, steps, &target),
                (Instruction::Tdpbusd, false) => one_row_tile_tdpbusd(a_rows, a_stride, b, steps, &target),
                (Instruction::Tdpbf16ps, true) => two_row_tiles_tdpbf16ps(a_rows, a_stride, b, steps, &target),
                (Instruction::Tdpbf16ps, false) => one_row_tile_tdpbf16ps(a_rows, a_stride, b, steps, &target),
            }
        }
    };
    FULL.load();
    for p in 0..count {
        for row in (0..full_rows).step_by(2 * TILE_ROWS) {
            block(p, row);
        }
    }
    if let Some(config) = partial {
        config.load();
        for p in 0..count {
            block(p, full_rows);
        }
    }
    // Back to the initial tile state: a context switch then saves none of it.
    // SAFETY: releasing the tiles touches no memory.
    unsafe { asm!("tilerelease", options(nostack, nomem)) };
}

/// Requests the next step's weights into L1 ahead of their tile loads: the 32 cache lines from
/// `{b} + 2048` (one step is 16 depth words × 128 bytes). A prefetch never faults, also past the
/// panels' end. One template string for both block functions' loops.
macro_rules! prefetch_next_step {
    () => {
        concat!(
            "prefetcht0 [{b} + 2048]\n",
            "prefetcht0 [{b} + 2112]\n",
            "prefetcht0 [{b} + 2176]\n",
            "prefetcht0 [{b} + 2240]\n",
            "prefetcht0 [{b} + 2304]\n",
            "prefetcht0 [{b} + 2368]\n",
            "prefetcht0 [{b} + 2432]\n",
            "prefetcht0 [{b} + 2496]\n",
            "prefetcht0 [{b} + 2560]\n",
            "prefetcht0 [{b} + 2624]\n",
            "prefetcht0 [{b} + 2688]\n",
            "prefetcht0 [{b} + 2752]\n",
            "prefetcht0 [{b} + 2816]\n",
            "prefetcht0 [{b} + 2880]\n",
            "prefetcht0 [{b} + 2944]\n",
            "prefetcht0 [{b} + 3008]\n",
            "prefetcht0 [{b} + 3072]\n",
            "prefetcht0 [{b} + 3136]\n",
            "prefetcht0 [{b} + 3200]\n",
            "prefetcht0 [{b} + 3264]\n",
            "prefetcht0 [{b} + 3328]\n",
            "prefetcht0 [{b} + 3392]\n",
            "prefetcht0 [{b} + 3456]\n",
            "prefetcht0 [{b} + 3520]\n",
            "prefetcht0 [{b} + 3584]\n",
            "prefetcht0 [{b} + 3648]\n",
            "prefetcht0 [{b} + 3712]\n",
            "prefetcht0 [{b} + 3776]\n",
            "prefetcht0 [{b} + 3840]\n",
            "prefetcht0 [{b} + 3904]\n",
            "prefetcht0 [{b} + 3968]\n",
            "prefetcht0 [{b} + 4032]\n",
        )
    };
}

/// Requests the next step's activation lines into L1: one line of each of 16 rows, from `{pa}` (the
/// next step's line of the first row), `{a_stride}` bytes apart; `{t}` is clobbered. Past the
/// last step these lines lie past the rows' words (or past `a`): a prefetch never faults.
macro_rules! prefetch_next_rows {
    () => {
        concat!(
            "mov {t}, {pa}\n",
            ".rept 15\n",
            "prefetcht0 [{t}]\n",
            "add {t}, {a_stride}\n",
            ".endr\n",
            "prefetcht0 [{t}]\n",
        )
    };
}

/// Generates the two block functions of one tile instruction: 32 rows (four accumulators) and 16
/// rows (two), over `steps` depth steps of 16 words.
macro_rules! tile_blocks {
    ($two:ident, $one:ident, $op:literal) => {
        /// 32 rows × 32 columns: `a` 32 rows `a_stride` bytes apart, `b` a panel (128-byte rows).
        ///
        /// # Safety
        /// The CPU runs AMX and the process holds the tile permission; the 16-row tile
        /// configuration is loaded; `a`, `b` and the store hold what [`multiply`] says.
        #[inline(never)]
        unsafe fn $two(a: *const u8, a_stride: usize, b: *const u8, steps: usize, target: &Store) {
            // SAFETY: the caller's.
            unsafe {
                asm!(
                    "tilezero tmm0",
                    "tilezero tmm1",
                    "tilezero tmm2",
                    "tilezero tmm3",
                    "2:",
                    // The next step's activations (a line of each of the 32 rows) and its 2 KiB
                    // of weights requested into L1 ahead of their tile loads, then each product
                    // right after the loads it needs, so that it runs while the next tile loads
                    // (the tiles are not renamed: a load waits for the products that read its
                    // register). Loading all four first, no prefetch: 0.47-0.58 T int8
                    // products/s on one core (hot blocks of 64 or 512 rows); reordered
                    // 0.59-0.68; with the weights' prefetch 0.68-0.79. The activations' rows
                    // came from L2 on every step (a product's rows outgrow L1 and are read again
                    // for each panel): prefetched too, a layer's products 2-21% faster at 66 to
                    // 512 rows (docs/benchmarks/notes.md).
                    "lea {pa}, [{a} + 64]",
                    prefetch_next_rows!(),
                    "lea {pa}, [{a2} + 64]",
                    prefetch_next_rows!(),
                    prefetch_next_step!(),
                    "tileloadd tmm4, [{a} + {a_stride}*1]",
                    "tileloadd tmm6, [{b} + {b_stride}*1]",
                    concat!($op, " tmm0, tmm4, tmm6"),
                    "tileloadd tmm7, [{b} + {b_stride}*1 + 64]",
                    concat!($op, " tmm1, tmm4, tmm7"),
                    "tileloadd tmm5, [{a2} + {a_stride}*1]",
                    concat!($op, " tmm2, tmm5, tmm6"),
                    concat!($op, " tmm3, tmm5, tmm7"),
                    "add {a}, 64",
                    "add {a2}, 64",
                    "add {b}, 2048",
                    "dec {steps}",
                    "jnz 2b",
                    "tilestored [{c} + {c_stride}*1], tmm0",
                    "tilestored [{c} + {c_stride}*1 + 64], tmm1",
                    "tilestored [{c2} + {c_stride}*1], tmm2",
                    "tilestored [{c2} + {c_stride}*1 + 64], tmm3",
                    a = inout(reg) a => _,
                    a2 = inout(reg) a.wrapping_add(TILE_ROWS * a_stride) => _,
                    pa = out(reg) _,
                    t = out(reg) _,
                    a_stride = in(reg) a_stride,
                    b = inout(reg) b => _,
                    b_stride = in(reg) PANEL_ROW_BYTES,
                    steps = inout(reg) steps => _,
                    c = in(reg) target.ptr,
                    c2 = in(reg) target.ptr.wrapping_add(TILE_ROWS * target.stride),
                    c_stride = in(reg) target.stride,
                    out("tmm0") _, out("tmm1") _, out("tmm2") _, out("tmm3") _,
                    out("tmm4") _, out("tmm5") _, out("tmm6") _, out("tmm7") _,
                    options(nostack),
                );
            }
        }

        /// 16 rows × 32 columns, as the 32-row block.
        ///
        /// # Safety
        /// As the 32-row block's.
        #[inline(never)]
        unsafe fn $one(a: *const u8, a_stride: usize, b: *const u8, steps: usize, target: &Store) {
            // SAFETY: the caller's.
            unsafe {
                asm!(
                    "tilezero tmm0",
                    "tilezero tmm1",
                    "2:",
                    "lea {pa}, [{a} + 64]",
                    prefetch_next_rows!(),
                    prefetch_next_step!(),
                    "tileloadd tmm4, [{a} + {a_stride}*1]",
                    "tileloadd tmm6, [{b} + {b_stride}*1]",
                    concat!($op, " tmm0, tmm4, tmm6"),
                    "tileloadd tmm7, [{b} + {b_stride}*1 + 64]",
                    concat!($op, " tmm1, tmm4, tmm7"),
                    "add {a}, 64",
                    "add {b}, 2048",
                    "dec {steps}",
                    "jnz 2b",
                    "tilestored [{c} + {c_stride}*1], tmm0",
                    "tilestored [{c} + {c_stride}*1 + 64], tmm1",
                    a = inout(reg) a => _,
                    pa = out(reg) _,
                    t = out(reg) _,
                    a_stride = in(reg) a_stride,
                    b = inout(reg) b => _,
                    b_stride = in(reg) PANEL_ROW_BYTES,
                    steps = inout(reg) steps => _,
                    c = in(reg) target.ptr,
                    c_stride = in(reg) target.stride,
                    out("tmm0") _, out("tmm1") _, out("tmm4") _, out("tmm6") _, out("tmm7") _,
                    options(nostack),
                );
            }
        }
    };
}

tile_blocks!(two_row_tiles_tdpbusd, one_row_tile_tdpbusd, "tdpbusd");
tile_blocks!(two_row_tiles_tdpbf16ps, one_row_tile_tdpbf16ps, "tdpbf16ps");
