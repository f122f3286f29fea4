//! One (row, head) task of the attention with its products in bf16, for a bf16 pool: q·kᵀ and p·v
//! on `vdpbf16ps` (`layad_cpu_kernels::bf16::RowsProduct`), twice the products of an f32 FMA per
//! instruction, as the pool's weight products. RoPE, the scores, the softmax and the sums stay f32;
//! q, the keys, the values and the softmax's exponentials are rounded to bf16 (to nearest even) on
//! their way into the products, and each row's attended values are divided by its exponentials'
//! sum afterwards (`hd` divisions instead of a pass over its keys). At 512 tokens the attention was
//! ~10% of a bf16 forward on Zen 4 and ~16% on an AMX Xeon (docs/benchmarks/notes.md).
//!
//! Pair words hold two bf16 of one depth pair: for q·kᵀ the depth is the head dimension (q rows,
//! keys as panels of 32 keys), for p·v it is the key position (rows of exponentials from an even
//! key, values as panels of 32 dimensions, each word two consecutive positions' values).

use layad_cpu_kernels::bf16::{MAX_ROWS, PANEL_COLUMNS, RowsKernel, RowsProduct};
use pulp::Simd;

use super::{AttentionOp, HeadScratch, HeadTask, exponentials, first_values};

impl AttentionOp<'_> {
    /// As [`AttentionOp::head`], with the products in bf16 on `kernel`.
    #[inline(always)]
    pub(super) fn head_bf16<S: Simd>(&self, simd: S, kernel: RowsKernel, task: HeadTask<'_>) {
        let (qkv, row, head, scratch, target) = (task.qkv, task.row, task.head, task.scratch, task.out);
        let (hd, n) = (self.head_dim, self.lengths[row]);
        let d = self.heads * hd;
        let nr = PANEL_COLUMNS;
        let head_pairs = hd.div_ceil(2);
        let key_panels = n.div_ceil(nr);
        let value_panels = hd.div_ceil(nr);
        let key_pairs = n.div_ceil(2);
        let padded = key_panels * nr;
        let HeadScratch {
            rotated,
            scores,
            out,
            words,
            ..
        } = scratch;
        let q = first_values(&mut words.q, n.div_ceil(MAX_ROWS) * head_pairs * MAX_ROWS);
        let keys = first_values(&mut words.keys, key_panels * head_pairs * nr);
        let values = first_values(&mut words.values, value_panels * key_pairs * nr);
        let probabilities = first_values(&mut words.probabilities, padded / 2 * MAX_ROWS);
        let rotated = first_values(rotated, hd);
        let scores = first_values(scores, MAX_ROWS * padded);
        let out = first_values(out, n * value_panels * nr);
        // q rows with RoPE as pair words in tiles of `MAX_ROWS` rows; keys with RoPE as panels (per
        // depth pair, the words of `nr` keys). Keys past `n` in the last panel hold whatever an
        // earlier task left (finite): their scores are computed and never read.
        let tile_words = head_pairs * MAX_ROWS;
        for t in 0..n {
            let at = (row * self.len + t) * 3 * d + head * hd;
            self.rotate(&qkv[at..at + hd], t, rotated);
            let tile = t / MAX_ROWS;
            let in_tile = &mut q[tile * tile_words..(tile + 1) * tile_words];
            kernel.pair_words(rotated, &mut in_tile[t % MAX_ROWS..], MAX_ROWS);
            self.rotate(&qkv[at + d..at + d + hd], t, rotated);
            let (panel, lane) = (t / nr, t % nr);
            kernel.pair_words(rotated, &mut keys[panel * head_pairs * nr + lane..], nr);
        }
        self.value_words(kernel, qkv, row, head, key_pairs, values);
        for first in (0..n).step_by(MAX_ROWS) {
            let rows = MAX_ROWS.min(n - first);
            let (lo, hi) = self.tile_keys(first, rows, n);
            let first_panel = lo / nr;
            let tile = first / MAX_ROWS;
            kernel.run(RowsProduct {
                tile: &q[tile * tile_words..(tile + 1) * tile_words],
                rows,
                pairs: head_pairs,
                panels: hi.div_ceil(nr) - first_panel,
                panel_stride: head_pairs * nr,
                weights: &keys[first_panel * head_pairs * nr..],
                out: &mut scores[first_panel * nr..],
                stride: padded,
            });
            // The softmax's exponentials over each row's own keys, as pair words from the even key
            // at or below `lo` to the even one at or past `hi`, zero outside the row's keys; the
            // division by their sum waits for the row's `hd` attended values (one pass over the
            // keys fewer).
            let (from_pair, to_pair) = (lo / 2, hi.div_ceil(2));
            let width = to_pair - from_pair;
            let mut sums = [0f32; MAX_ROWS];
            for (r, sum) in sums.iter_mut().enumerate().take(rows) {
                let (from, to) = self.row_keys(first + r, n);
                let line = &mut scores[r * padded..(r + 1) * padded];
                *sum = exponentials(simd, &mut line[from..to]);
                line[2 * from_pair..from].fill(0.0);
                line[to..2 * to_pair].fill(0.0);
                kernel.pair_words(&line[2 * from_pair..2 * to_pair], &mut probabilities[r..], MAX_ROWS);
            }
            let stride = value_panels * nr;
            kernel.run(RowsProduct {
                tile: probabilities,
                rows,
                pairs: width,
                panels: value_panels,
                panel_stride: key_pairs * nr,
                weights: &values[from_pair * nr..],
                out: &mut out[first * stride..],
                stride,
            });
            divide_by_sums(&mut out[first * stride..], &sums[..rows], stride, hd);
        }
        self.write_head(target, row, head, out, value_panels * nr);
    }

    /// The values of `row`'s `head` as pair words for p·v, two positions a word: per value panel,
    /// `pairs` (at least the row's) pairs of positions, each the words of the panel's `nr`
    /// dimensions. The position past an odd length, the pairs past the row's and the dimensions
    /// past `hd` are zero, so that a zero probability never meets a stale value (0 · ∞ would be
    /// NaN).
    pub(super) fn value_words(
        &self,
        kernel: RowsKernel,
        qkv: &[f32],
        row: usize,
        head: usize,
        pairs: usize,
        values: &mut [u32],
    ) {
        let (hd, n) = (self.head_dim, self.lengths[row]);
        let (d, nr) = (self.heads * hd, PANEL_COLUMNS);
        let (key_pairs, value_panels) = (n.div_ceil(2), hd.div_ceil(nr));
        let value = |t: usize| {
            let at = (row * self.len + t) * 3 * d + 2 * d + head * hd;
            &qkv[at..at + hd]
        };
        for pair in 0..key_pairs {
            let (low, high) = (
                value(2 * pair),
                if 2 * pair + 1 < n { value(2 * pair + 1) } else { &[] },
            );
            for panel in 0..value_panels {
                let columns = panel * nr..((panel + 1) * nr).min(hd);
                let words = &mut values[(panel * pairs + pair) * nr..][..nr];
                let (real, past) = words.split_at_mut(columns.len());
                kernel.interleaved_words(&low[columns.clone()], high.get(columns).unwrap_or(&[]), real);
                past.fill(0);
            }
        }
        for panel in 0..value_panels {
            values[(panel * pairs + key_pairs) * nr..(panel + 1) * pairs * nr].fill(0);
        }
    }
}

/// Each of the rows of `out` (`stride` apart, as many as `sums`) divided by its exponentials' sum:
/// its `hd` attended values.
pub(super) fn divide_by_sums(out: &mut [f32], sums: &[f32], stride: usize, hd: usize) {
    for (r, sum) in sums.iter().enumerate() {
        let inv = 1.0 / sum;
        for v in &mut out[r * stride..r * stride + hd] {
            *v *= inv;
        }
    }
}
