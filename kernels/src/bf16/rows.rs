//! bf16 products of a few rows by a right-hand side that is not a constant weight: the attention's
//! q·kᵀ and p·v in a bf16 pool. The caller lays its right-hand side out as panels of
//! [`PANEL_COLUMNS`] columns of pair words, per depth pair and column (the weights' panels' layout,
//! one word where those hold two bf16), and its rows as pair words in a tile of [`MAX_ROWS`] rows
//! (the activations' layout), both through [`RowsKernel::pair_words`]; the products run on the
//! weight products' `vdpbf16ps` tile where the CPU has AVX512_BF16, in portable code elsewhere (the
//! weights' portable tile reads two u16 per column, this one a word). The rows were first read in
//! place, through a tile generic over where its words come from; that cost the weight products'
//! tile its broadcasts from memory (it gathered each pair's words into a register and shuffled them
//! out), so the rows are laid out as the weights' activations are.
//!
//! Where the pool's weights run on AMX's tiles, so can these products ([`RowsKernel::tiles`],
//! [`RowTiles`]): the same panels (`tdpbf16ps` reads a panel of pair words as it reads a bf16
//! weight's), the rows one after another instead of in a tile of [`MAX_ROWS`], and the depth in
//! whole tiles of [`TILE_WORDS`](crate::amx::TILE_WORDS) words.

#[cfg(target_arch = "x86_64")]
use super::avx512;
use super::tile::{MR, NR};
use super::words::{from_bf16, pair_word};
use crate::amx::{Bf16Words, TileProduct};

/// Columns of one panel: two AVX-512 registers of f32 sums.
pub const PANEL_COLUMNS: usize = NR;
/// Most rows one [`RowsProduct`] computes.
pub const MAX_ROWS: usize = MR;

/// The kernel [`RowsProduct`]s run on, chosen once ([`RowsKernel::detect`]) by the caller.
#[derive(Clone, Copy, Debug)]
pub struct RowsKernel {
    #[cfg(target_arch = "x86_64")]
    simd: Option<avx512::Bf16Dp>,
    tiles: Option<RowTiles>,
}

impl RowsKernel {
    /// `vdpbf16ps` where the CPU has AVX512_BF16, else portable code; blocks of rows on AMX's
    /// tiles when `tiles` (the pool's weights run there: the `amx` kernel family).
    pub fn detect(tiles: bool) -> Self {
        Self {
            #[cfg(target_arch = "x86_64")]
            simd: avx512::Bf16Dp::try_new(),
            tiles: tiles.then_some(RowTiles { portable: false }),
        }
    }

    /// Portable code on every CPU (the tests' reference); with `tile_model`, the tiles' layout
    /// run in their portable model ([`TileProduct::model`]), how the tests check it on any CPU.
    pub fn portable(tile_model: bool) -> Self {
        Self {
            #[cfg(target_arch = "x86_64")]
            simd: None,
            tiles: tile_model.then_some(RowTiles { portable: true }),
        }
    }

    /// Where blocks of rows are multiplied on AMX's tiles (or their model), the way to do it.
    pub fn tiles(self) -> Option<RowTiles> {
        self.tiles
    }

    /// `values` as depth-pair words `bf16(values[2i]) | bf16(values[2i + 1]) << 16` (a missing
    /// last value is zero), word `i` into `words[i·step]`: with `step` [`MAX_ROWS`], one row of a
    /// tile of rows ([`RowsProduct::tile`]); with [`PANEL_COLUMNS`], one column of a panel. Rounded
    /// to nearest even (the kernel flushes subnormal values to zero).
    pub fn pair_words(self, values: &[f32], words: &mut [u32], step: usize) {
        let count = values.len().div_ceil(2);
        assert!(
            step > 0 && (count == 0 || words.len() > (count - 1) * step),
            "{count} pair words {step} apart do not fit in {} words",
            words.len()
        );
        #[cfg(target_arch = "x86_64")]
        if let Some(simd) = self.simd {
            return simd.pack_row(values, words, step);
        }
        for (i, pair) in values.chunks(2).enumerate() {
            words[i * step] = pair_word(pair);
        }
    }

    /// `words[c] = bf16(low[c]) | bf16(high[c]) << 16` for every `c < low.len()` (`high` past its
    /// end reads as zeros): the depth pairs of columns whose two depths arrive as separate rows
    /// (two positions' values), rounded as [`RowsKernel::pair_words`].
    pub fn interleaved_words(self, low: &[f32], high: &[f32], words: &mut [u32]) {
        assert!(
            words.len() >= low.len(),
            "{} interleaved words do not fit in {}",
            low.len(),
            words.len()
        );
        #[cfg(target_arch = "x86_64")]
        if let Some(simd) = self.simd {
            return simd.interleave(low, high, words);
        }
        for (c, (word, &lo)) in words.iter_mut().zip(low).enumerate() {
            *word = pair_word(&[lo, high.get(c).copied().unwrap_or(0.0)]);
        }
    }

    /// Runs one product (panics if its slices do not hold what it describes).
    pub fn run(self, product: RowsProduct<'_>) {
        let RowsProduct {
            tile,
            rows,
            pairs,
            panels,
            panel_stride,
            weights,
            out,
            stride,
        } = product;
        assert!((1..=MAX_ROWS).contains(&rows), "{rows} rows in one bf16 product");
        assert!(
            tile.len() >= pairs * MR && (panels == 0 || weights.len() >= (panels - 1) * panel_stride + pairs * NR),
            "bf16 product operands shorter than {panels} panels of {pairs} depth pairs"
        );
        assert!(
            panels == 0 || out.len() >= (rows - 1) * stride + panels * NR,
            "bf16 product output too short"
        );
        let tile = &tile[..pairs * MR];
        for p in 0..panels {
            let panel = &weights[p * panel_stride..p * panel_stride + pairs * NR];
            let out = &mut out[p * NR..];
            #[cfg(target_arch = "x86_64")]
            if let Some(simd) = self.simd {
                simd.tile_of_words(rows, tile, panel, out, stride);
                continue;
            }
            for r in 0..rows {
                let dst = &mut out[r * stride..r * stride + NR];
                dst.fill(0.0);
                for (w, a) in panel.chunks_exact(NR).zip(tile.chunks_exact(MR)) {
                    let (lo, hi) = (from_bf16(a[r] as u16), from_bf16((a[r] >> 16) as u16));
                    for (o, &w) in dst.iter_mut().zip(w) {
                        *o += lo * from_bf16(w as u16) + hi * from_bf16((w >> 16) as u16);
                    }
                }
            }
        }
    }
}

/// The first `rows` rows of a tile of [`MAX_ROWS`] rows of pair words ([`RowsKernel::pair_words`])
/// times `panels` panels of `pairs` depth pairs each, into `out`: row `r`'s sums for panel `p`
/// ([`PANEL_COLUMNS`] of them) at `out[r·stride + p·PANEL_COLUMNS..]`, stored (not added to what
/// `out` held).
pub struct RowsProduct<'a> {
    /// The rows' pair words, pair `i` of row `r` at `i·MAX_ROWS + r` (at least `pairs` of each).
    pub tile: &'a [u32],
    /// Rows of the tile multiplied (1 to [`MAX_ROWS`]).
    pub rows: usize,
    /// Depth pairs summed over.
    pub pairs: usize,
    /// Panels multiplied.
    pub panels: usize,
    /// Words from one panel's start to the next one's in `weights`.
    pub panel_stride: usize,
    /// The right-hand side, panel `p` from word `p·panel_stride`: per depth pair, per column, the
    /// word `bf16(v(2d, c)) | bf16(v(2d + 1, c)) << 16`.
    pub weights: &'a [u32],
    /// Where the sums go.
    pub out: &'a mut [f32],
    /// Values between the starts of two rows of `out`.
    pub stride: usize,
}

/// Products of row-major pair-word rows by panels of pair words on AMX's tiles, for a
/// [`RowsKernel`] whose pool runs its weights there ([`RowsKernel::tiles`]).
#[derive(Clone, Copy, Debug)]
pub struct RowTiles {
    /// Run in the tiles' portable model (the tests), else on the tiles where this process has them.
    portable: bool,
}

impl RowTiles {
    /// `product.out = product.a · product.panels` ([`TileProduct`]: the rows one after another,
    /// the depth in whole tiles); panics where its slices do not hold what it describes.
    pub fn run(self, product: TileProduct<'_, Bf16Words>) {
        product.run(self.portable);
    }
}
