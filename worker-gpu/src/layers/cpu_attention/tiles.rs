//! One (row, head) task of a bf16 pool's attention where the pool's weights run on AMX's tiles:
//! q·kᵀ and p·v on `tdpbf16ps` ([`RowTiles`]) instead of `vdpbf16ps`. On an AMX Xeon the weight
//! products moved to the tiles and the attention did not: at 512 tokens, still in f32, it was ~16%
//! of a bf16 forward there (docs/benchmarks/notes.md; not measured there since `bf16.rs`, nor with
//! this: no AMX machine since). The arithmetic is `bf16.rs`'s (q, the keys, the
//! values and the softmax's exponentials rounded to bf16, f32 sums, each row divided by its
//! exponentials' sum afterwards); what changes is the layout the tiles read:
//! - q's rows one after another as pair words ([`row_stride`] apart), in blocks of 32 rows (the
//!   tile driver's two row tiles) instead of tiles of 8;
//! - every depth in whole tiles of [`TILE_WORDS`] words: q padded with zero pairs past the head's
//!   dimension, and p·v run over whole 32-key panels, the probabilities of keys a
//!   row does not see zero and the values of positions past the row's length zero (a zero
//!   probability must not meet a stale value: 0 · ∞ would be NaN).

use layad_cpu_kernels::amx::{Bf16Words, PANEL_COLUMNS, TILE_ROWS, TILE_WORDS, TileProduct, row_stride};
use layad_cpu_kernels::bf16::{RowTiles, RowsKernel};
use pulp::Simd;

use super::bf16::divide_by_sums;
use super::{AttentionOp, HeadScratch, HeadTask, exponentials, first_values};

/// Query rows of one block: the tile driver's two row tiles.
const BLOCK: usize = 2 * TILE_ROWS;

// The value panels `bf16.rs` builds are the tiles' panels.
const _: () = assert!(PANEL_COLUMNS == layad_cpu_kernels::bf16::PANEL_COLUMNS);

impl AttentionOp<'_> {
    /// As [`AttentionOp::head_bf16`], with the products on `tiles`; `kernel` rounds to bf16.
    #[inline(always)]
    pub(super) fn head_bf16_tiles<S: Simd>(&self, simd: S, kernel: RowsKernel, tiles: RowTiles, task: HeadTask<'_>) {
        let (qkv, row, head, scratch, target) = (task.qkv, task.row, task.head, task.scratch, task.out);
        let (hd, n) = (self.head_dim, self.lengths[row]);
        let d = self.heads * hd;
        let nr = PANEL_COLUMNS;
        let head_pairs = hd.div_ceil(2);
        let head_words = head_pairs.next_multiple_of(TILE_WORDS);
        let key_panels = n.div_ceil(nr);
        let padded = key_panels * nr;
        // Key pairs of whole panels: 16 words, one tile's depth, a panel.
        let key_words = padded / 2;
        let value_panels = hd.div_ceil(nr);
        let (q_stride, p_stride) = (row_stride(head_words), row_stride(key_words));
        let HeadScratch {
            rotated,
            scores,
            out,
            words,
            ..
        } = scratch;
        let q = first_values(&mut words.q, n.next_multiple_of(TILE_ROWS) * q_stride);
        let keys = first_values(&mut words.keys, key_panels * head_words * nr);
        let values = first_values(&mut words.values, value_panels * key_words * nr);
        let probabilities = first_values(&mut words.probabilities, BLOCK * p_stride);
        let rotated = first_values(rotated, hd);
        let scores = first_values(scores, BLOCK * padded);
        let out = first_values(out, n * value_panels * nr);
        // q and the keys with RoPE. q's pairs past the head's dimension are zero, so the keys'
        // (whatever an earlier task left, finite) add nothing; so do the keys past `n` in the last
        // panel, whose scores are computed and never read.
        for t in 0..n {
            let at = (row * self.len + t) * 3 * d + head * hd;
            self.rotate(&qkv[at..at + hd], t, rotated);
            let q_row = &mut q[t * q_stride..t * q_stride + head_words];
            kernel.pair_words(rotated, q_row, 1);
            q_row[head_pairs..].fill(0);
            self.rotate(&qkv[at + d..at + d + hd], t, rotated);
            let (panel, lane) = (t / nr, t % nr);
            kernel.pair_words(rotated, &mut keys[panel * head_words * nr + lane..], nr);
        }
        // The values for p·v over whole panels of keys: zero past `n`.
        self.value_words(kernel, qkv, row, head, key_words, values);
        let stride = value_panels * nr;
        for first in (0..n).step_by(BLOCK) {
            let rows = BLOCK.min(n - first);
            let (lo, hi) = self.tile_keys(first, rows, n);
            // Whole panels: p·v's depth is their key pairs, whole tiles.
            let (first_panel, end_panel) = (lo / nr, hi.div_ceil(nr));
            let (from_key, to_key) = (first_panel * nr, end_panel * nr);
            tiles.run(TileProduct::<Bf16Words> {
                a: &q[first * q_stride..],
                a_stride: q_stride,
                rows,
                words: head_words,
                panels: &keys[first_panel * head_words * nr..end_panel * head_words * nr],
                out: &mut scores[from_key..],
                stride: padded,
            });
            // The exponentials over each row's own keys, zero elsewhere in the block's panels; the
            // division by their sum waits for the row's `hd` attended values.
            let mut sums = [0f32; BLOCK];
            for (r, sum) in sums.iter_mut().enumerate().take(rows) {
                let (from, to) = self.row_keys(first + r, n);
                let line = &mut scores[r * padded..(r + 1) * padded];
                *sum = exponentials(simd, &mut line[from..to]);
                line[from_key..from].fill(0.0);
                line[to..to_key].fill(0.0);
                kernel.pair_words(&line[from_key..to_key], &mut probabilities[r * p_stride..], 1);
            }
            let width = (to_key - from_key) / 2;
            for panel in 0..value_panels {
                let start = panel * key_words + from_key / 2;
                tiles.run(TileProduct::<Bf16Words> {
                    a: probabilities,
                    a_stride: p_stride,
                    rows,
                    words: width,
                    panels: &values[start * nr..(start + width) * nr],
                    out: &mut out[first * stride + panel * nr..],
                    stride,
                });
            }
            divide_by_sums(&mut out[first * stride..], &sums[..rows], stride, hd);
        }
        self.write_head(target, row, head, out, stride);
    }
}
