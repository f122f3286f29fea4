//! bf16 products of activations by constant weights on CPUs with AVX512_BF16 (`dtype = "bf16"` on
//! the CPU): weights rounded to bf16 once at load, activation rows rounded to bf16 at each call,
//! `vdpbf16ps` (32 bf16 products summed pairwise into 16 f32 lanes per instruction, twice the
//! products of an f32 FMA), f32 sums and results.
//!
//! Why not candle's bf16 CPU path: its matmul converts and multiplies through the `gemm` crate
//! without native bf16 dot products, and every other op of a bf16 forward runs candle's slower bf16
//! elementwise code; measured 2× slower than f32 on this machine (issue 26). Here only the matrix
//! products change precision (the encoder's and the decision head's layers' weights, the encoder
//! attention's q·kᵀ and p·v): embeddings, norms, the softmax, the scorer and the act head stay f32.
//! Served only behind the parity gate against the f32 forward (`gate.rs`).
//!
//! The attention of a bf16 pool multiplies on the same tile ([`RowsProduct`], `rows.rs`): its rows
//! laid out as the activations here, its keys and values as panels the attention builds per head.
//!
//! With AMX (the `amx` kernel family) the same panels run on the tile registers instead
//! (`tdpbf16ps`, `crate::amx`): the depth padded to whole tiles of 16 pairs, the
//! activation rows laid out one after another (padded to 16 rows) instead of in tiles of 8.

use rayon::prelude::*;

use crate::CpuWeight;
use crate::amx::{Bf16Tiles, TILE_ROWS, TILE_WORDS, TileProduct, row_stride};
use crate::driver::{NextSlices, bias_rows, in_column_blocks};
use crate::geglu::GeGlu;

#[cfg(target_arch = "x86_64")]
mod avx512;
mod rows;
#[cfg(test)]
mod tests;
mod tile;
mod words;

pub use rows::{MAX_ROWS, PANEL_COLUMNS, RowTiles, RowsKernel, RowsProduct};

use tile::{Bf16TileCall, MR, NR};
use words::{from_bf16, pair_word, to_bf16};

/// Depth pairs of one pass: a panel slice of `KC` pairs (16 KiB) stays in L1.
const KC: usize = 128;

/// Whether this CPU runs the bf16 kernel (AVX-512F and AVX512_BF16).
pub fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        avx512::Bf16Dp::try_new().is_some()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// A weight `[k, n]` in bf16, packed: panel `p` holds columns `p·32 .. p·32 + 32` (zero past `n`);
/// per depth pair `d`, column `c` holds `[w(2d, c), w(2d + 1, c)]` (zero past `k`).
pub struct Bf16Weight {
    k: usize,
    n: usize,
    /// Whether the products run on AMX tiles (else the AVX512_BF16 kernel).
    tiles: bool,
    pairs: usize,
    panels: Vec<u16>,
    bias: Option<Vec<f32>>,
    /// GeGLU applied as the products write (columns grouped for it, `crate::geglu`).
    geglu: Option<GeGlu>,
}

impl Bf16Weight {
    /// Rounds and packs the weight whose entries `(depth, first ..)` `row(depth, first, out)` writes
    /// into `out` (a panel's columns, as `QuantizedWeight::quantize_with` asks), for AMX's tiles
    /// when `tiles` (else for the AVX512_BF16 kernel).
    pub fn pack_with(
        row: impl Fn(usize, usize, &mut [f32]) + Sync,
        k: usize,
        n: usize,
        bias: Option<Vec<f32>>,
        tiles: bool,
    ) -> Self {
        let pairs = if tiles {
            k.div_ceil(2 * TILE_WORDS) * TILE_WORDS
        } else {
            k.div_ceil(2)
        };
        let count = n.div_ceil(NR);
        let mut panels = vec![0u16; count * pairs * 2 * NR];
        if k > 0 {
            panels
                .par_chunks_mut(pairs * 2 * NR)
                .enumerate()
                .for_each(|(p, panel)| {
                    // Depth by depth across the panel's columns, as the sources keep them (see
                    // `QuantizedWeight::quantize_with`).
                    let width = NR.min(n - p * NR);
                    let mut values = [0f32; NR];
                    for depth in 0..k {
                        row(depth, p * NR, &mut values[..width]);
                        let at = (depth / 2) * 2 * NR + depth % 2;
                        for (c, &v) in values[..width].iter().enumerate() {
                            panel[at + 2 * c] = to_bf16(v);
                        }
                    }
                });
        }
        Self {
            k,
            n,
            tiles,
            pairs,
            panels,
            bias,
            geglu: None,
        }
    }

    /// The same weight, its products followed by `geglu` when its columns are grouped for it.
    pub(crate) fn with_geglu(self, geglu: Option<GeGlu>) -> Self {
        Self { geglu, ..self }
    }

    /// Whether products apply GeGLU (made from a weight packed for it).
    pub fn applies_geglu(&self) -> bool {
        self.geglu.is_some()
    }

    /// Output columns: `n`, or half of them with GeGLU.
    fn out_features(&self) -> usize {
        if self.geglu.is_some() { self.n / 2 } else { self.n }
    }

    /// `x · W (+ bias)` for `x` `[m, k]` row-major; returns `[m, n]` row-major (with GeGLU: its
    /// GeGLU, `[m, n / 2]`).
    pub fn matmul(&self, x: &[f32], m: usize) -> Vec<f32> {
        self.matmul_with(x, m, false)
    }

    fn matmul_with(&self, x: &[f32], m: usize, portable: bool) -> Vec<f32> {
        if m == 0 || self.n == 0 || self.k == 0 {
            return bias_rows(self.bias.as_deref(), m, self.out_features());
        }
        let packed_x = self.pack_rows(x, m, portable);
        in_column_blocks(
            m,
            self.n,
            NR,
            self.bias.as_deref(),
            self.geglu,
            |first, count, block| {
                self.block(&packed_x, m, first, count, block, portable);
            },
        )
    }

    /// Rows of `x` as bf16 pairs in tiles of `MR`: tile `t` holds, per depth pair, `MR` u32 words
    /// `bf16(x[2d]) | bf16(x[2d + 1]) << 16` (zero past `m`, `k`); for AMX the rows' words one
    /// row after another instead (`amx::row_stride` words apart), rows padded to 16. With the
    /// kernel (and not `portable`) rows are rounded by `vcvtne2ps2bf16`: the same words, except
    /// that it flushes subnormal values to zero.
    fn pack_rows(&self, x: &[f32], m: usize, portable: bool) -> Vec<u32> {
        let (k, pairs) = (self.k, self.pairs);
        // Rows per chunk of the packed words, a row's words `tile` apart, and the words per row.
        let tile = if self.tiles { 1 } else { MR };
        let (rows, row_words) = if self.tiles {
            (m.next_multiple_of(TILE_ROWS), row_stride(pairs))
        } else {
            (m.next_multiple_of(MR), pairs)
        };
        let mut packed = vec![0u32; rows * row_words];
        #[cfg(target_arch = "x86_64")]
        let simd = if portable { None } else { avx512::Bf16Dp::try_new() };
        #[cfg(not(target_arch = "x86_64"))]
        let _ = portable;
        packed
            .par_chunks_mut(row_words * tile)
            .enumerate()
            .for_each(|(t, dst)| {
                for r in 0..tile.min(m.saturating_sub(t * tile)) {
                    let row = &x[(t * tile + r) * k..(t * tile + r + 1) * k];
                    #[cfg(target_arch = "x86_64")]
                    if let Some(simd) = simd {
                        simd.pack_row(row, &mut dst[r..], tile);
                        continue;
                    }
                    for (d, pair) in row.chunks(2).enumerate() {
                        dst[d * tile + r] = pair_word(pair);
                    }
                }
            });
        packed
    }

    fn block(&self, packed_x: &[u32], m: usize, first: usize, count: usize, block: &mut [f32], portable: bool) {
        let pairs = self.pairs;
        let stride = count * NR;
        if self.tiles {
            let product = TileProduct::<Bf16Tiles> {
                a: packed_x,
                a_stride: row_stride(pairs),
                rows: m,
                words: pairs,
                panels: &self.panels[first * pairs * 2 * NR..(first + count) * pairs * 2 * NR],
                out: block,
                stride,
            };
            product.run(portable);
            return;
        }
        #[cfg(target_arch = "x86_64")]
        let simd = if portable { None } else { avx512::Bf16Dp::try_new() };
        #[cfg(not(target_arch = "x86_64"))]
        let _ = portable;
        let next = NextSlices {
            panels: &self.panels,
            panel_units: pairs,
            unit: 2 * NR,
            pass: KC,
            count,
            tiles: m.div_ceil(MR),
        };
        let mut depth = 0;
        while depth < pairs {
            let kc = KC.min(pairs - depth);
            let prefetch = next.pass(depth, kc);
            for (tile, row) in (0..m).step_by(MR).enumerate() {
                let rows = MR.min(m - row);
                let x = &packed_x[(tile * pairs + depth) * MR..(tile * pairs + depth + kc) * MR];
                for p in 0..count {
                    let start = (first + p) * pairs * 2 * NR;
                    let call = Bf16TileCall {
                        x,
                        panel: &self.panels[start + depth * 2 * NR..start + (depth + kc) * 2 * NR],
                        out: &mut block[row * stride + p * NR..],
                        stride,
                        accumulate: depth > 0,
                        prefetch: prefetch.share(first + p, tile),
                    };
                    #[cfg(target_arch = "x86_64")]
                    if let Some(simd) = simd {
                        simd.tile(rows, call);
                        continue;
                    }
                    scalar_tile(rows, call);
                }
            }
            depth += kc;
        }
    }
}

/// The tile in portable code (the same products in f32; the sums may differ from `vdpbf16ps` in
/// the last bits, which rounds differently inside a pair).
fn scalar_tile(rows: usize, call: Bf16TileCall<'_>) {
    let Bf16TileCall {
        x,
        panel,
        out,
        stride,
        accumulate,
        prefetch: _,
    } = call;
    for r in 0..rows {
        let dst = &mut out[r * stride..r * stride + NR];
        if !accumulate {
            dst.fill(0.0);
        }
        for (w, a) in panel.chunks_exact(2 * NR).zip(x.chunks_exact(MR)) {
            let (lo, hi) = (from_bf16(a[r] as u16), from_bf16((a[r] >> 16) as u16));
            for (o, w) in dst.iter_mut().zip(w.chunks_exact(2)) {
                *o += lo * from_bf16(w[0]) + hi * from_bf16(w[1]);
            }
        }
    }
}

impl CpuWeight for Bf16Weight {
    const NAME: &'static str = "laya-bf16-matmul";

    fn dims(&self) -> (usize, usize) {
        (self.k, self.out_features())
    }

    fn matmul(&self, x: &[f32], m: usize) -> Vec<f32> {
        Bf16Weight::matmul(self, x, m)
    }
}
