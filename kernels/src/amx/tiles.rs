//! The tile code: configures the eight tile registers and runs [`TileProduct`]s on them. Tile
//! instructions have no stable Rust intrinsics, so they are inline assembly; one `asm!` block holds
//! a whole depth loop, so the tile registers carry nothing from one block to the next but the
//! configuration, which every product loads first.
//!
//! Registers: `tmm0`–`tmm3` accumulate (rows 0–15 and 16–31 × columns 0–15 and 16–31), `tmm4`
//! and `tmm5` hold the two row tiles of activations, `tmm6` and `tmm7` the panel's two column
//! tiles. Every tile is 16 rows of 64 bytes.

// Inline assembly is `unsafe`; each block says why its memory accesses hold.
#![allow(unsafe_code)]

use std::arch::asm;

use super::product::{Instruction, PANEL_COLUMNS, TILE_ROWS, TILE_WORDS, TileFormat, TileProduct};

/// Bytes of one depth word of a panel: 32 columns of 4 bytes.
const PANEL_ROW_BYTES: usize = PANEL_COLUMNS * 4;

/// The 64-byte tile configuration (`ldtilecfg`): palette 1, eight tiles of 16 rows × 64 bytes.
#[repr(C, align(64))]
struct TileConfig([u8; 64]);

const CONFIG: TileConfig = {
    let mut bytes = [0u8; 64];
    bytes[0] = 1;
    let mut tile = 0;
    while tile < 8 {
        // Bytes per row (u16 at 16 + 2·tile), rows (u8 at 48 + tile).
        bytes[16 + 2 * tile] = 64;
        bytes[48 + tile] = TILE_ROWS as u8;
        tile += 1;
    }
    TileConfig(bytes)
};

/// Sums of one 32 × 32 block whose rows run past the product's, stored here first.
#[repr(C, align(64))]
struct Spill([u32; 2 * TILE_ROWS * PANEL_COLUMNS]);

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
    let mut spill = Spill([0; 2 * TILE_ROWS * PANEL_COLUMNS]);
    // SAFETY: CONFIG is 64 readable, 64-byte aligned bytes; loading a tile configuration only
    // changes the tile registers' shapes (this process holds the tile permission: an `Amx` exists).
    unsafe { asm!("ldtilecfg [{}]", in(reg) CONFIG.0.as_ptr(), options(nostack, readonly)) };
    for p in 0..count {
        // Panel `p` starts `p · words · 128` bytes into the weights.
        let b = panels.as_ptr().cast::<u8>().wrapping_add(p * words * PANEL_ROW_BYTES);
        let mut row = 0;
        while row < rows {
            let height = if rows - row > TILE_ROWS {
                2 * TILE_ROWS
            } else {
                TILE_ROWS
            };
            let a_rows = a.as_ptr().cast::<u8>().wrapping_add(row * a_stride);
            let inside = row + height <= rows;
            let target = if inside {
                Store {
                    ptr: out
                        .as_mut_ptr()
                        .cast::<u8>()
                        .wrapping_add((row * stride + p * PANEL_COLUMNS) * 4),
                    stride: out_stride,
                }
            } else {
                Store {
                    ptr: spill.0.as_mut_ptr().cast::<u8>(),
                    stride: PANEL_ROW_BYTES,
                }
            };
            // SAFETY: `check` made `a` hold `rows` rounded up to 16 rows of `words` words
            // (`a_stride` words apart), so the `height` rows from `row` (16, or 32 when more than
            // 16 rows are left) are inside it, 64 bytes per step for `steps` steps; `panels` holds `count` whole panels of `words`
            // rows of 128 bytes; the store goes to the spill buffer (32 rows of 128 bytes) or, when
            // all `height` rows are real, to `out`, which holds `rows` rows of `stride` ≥ 32·count
            // values from column 32·p.
            unsafe {
                match (F::INSTRUCTION, height) {
                    (Instruction::Tdpbusd, 32) => two_row_tiles_tdpbusd(a_rows, a_stride, b, steps, &target),
                    (Instruction::Tdpbusd, _) => one_row_tile_tdpbusd(a_rows, a_stride, b, steps, &target),
                    (Instruction::Tdpbf16ps, 32) => two_row_tiles_tdpbf16ps(a_rows, a_stride, b, steps, &target),
                    (Instruction::Tdpbf16ps, _) => one_row_tile_tdpbf16ps(a_rows, a_stride, b, steps, &target),
                }
            }
            if !inside {
                let real = rows - row;
                for r in 0..real {
                    let src = &spill.0[r * PANEL_COLUMNS..(r + 1) * PANEL_COLUMNS];
                    let dst = &mut out[(row + r) * stride + p * PANEL_COLUMNS..][..PANEL_COLUMNS];
                    for (d, &s) in dst.iter_mut().zip(src) {
                        // SAFETY: a sum is 4 bytes (i32 or f32, sealed formats), every bit pattern valid.
                        *d = unsafe { std::mem::transmute_copy::<u32, F::Sum>(&s) };
                    }
                }
            }
            row += height;
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
                    // The next step's 2 KiB of weights requested into L1 ahead of its tile
                    // loads, then each product right after the loads it needs, so that it runs while the next tile loads
                    // (the tiles are not renamed: a load waits for the products that read its
                    // register). Loading all four first, no prefetch: 0.47-0.58 T int8
                    // products/s on one core (hot blocks of 64 or 512 rows); reordered
                    // 0.59-0.68; with the prefetch 0.68-0.79.
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
