//! The u8 × s8 quad layout's products: the rows quantized into u8 planes and packed (as tiles for
//! VNNI, row-major for AMX), the depth × row tile × panel loop with its prefetching for the VNNI
//! microkernels (`vnni`, `avx_vnni`, chosen through `QuadSimd`), AMX's tile products on the same
//! panels (`crate::amx`), and the portable tile every one of them is tested against.

use rayon::prelude::*;

use super::activations::{Portable, RowOutliers, RowQuant, quantize_row, quantize_row_with_outliers};
#[cfg(target_arch = "x86_64")]
use super::combine::Combine;
use super::layout::{Int8Activations, Int8Kernel, KC_Q, MR_Q, NR_Q, Panels, QuadTileCall, QuantizedWeight};
#[cfg(target_arch = "x86_64")]
use super::{avx_vnni, vnni};
use crate::amx::{Int8Tiles, TILE_ROWS, TileProduct, row_stride};
use crate::driver::{NextSlices, Prefetch};

/// Most rows past a product's last whole 32-row block that AMX's int8 products leave to the VNNI
/// tile (docs/benchmarks/notes.md, "Fewer tile configurations, the last rows on VNNI, activations
/// prefetched": 4 and 8 measured alike).
const AMX_TAIL_ON_VNNI: usize = 4;

impl QuantizedWeight {
    /// Quad layout: each row of `x` to unsigned levels between its minimum and maximum (zero
    /// included; with outliers, those of the row without them), as one (8-bit) or two (16-bit: high
    /// byte, then low byte) plane rows, packed as tiles of `MR_Q` plane rows: tile `t` holds, per
    /// depth quad, `MR_Q` u32 words of four u8 (zero past the rows and `k`). Returns the packed
    /// tiles, each row's quantization and its outliers (for AMX the plane rows one after another,
    /// `amx::row_stride` words apart, padded to 16 rows). With VNNI (and not `portable`) rows are
    /// quantized with AVX-512, to the same levels exactly.
    pub(super) fn quantize_quads(
        &self,
        x: &[f32],
        m: usize,
        bits: Int8Activations,
        portable: bool,
    ) -> (Vec<u32>, Vec<RowQuant>, RowOutliers) {
        let Panels::Quads { quads, .. } = &self.panels else {
            return (Vec::new(), vec![RowQuant::default(); m], RowOutliers::default());
        };
        let (k, quads) = (self.k, *quads);
        let planes = bits.planes();
        let levels = bits.levels();
        // A row of `k` values keeps at least one inside the range.
        let per_row = bits.outliers().min(k.saturating_sub(1));
        let plane_rows = m * planes;
        // AMX loads plane rows row by row, 16 at a time: its rows are padded to whole tiles (two
        // of these tiles of 8), and each row's words follow each other.
        let row_major = self.kernel == Int8Kernel::Amx;
        let (tiles, row_words) = if row_major {
            (plane_rows.next_multiple_of(TILE_ROWS) / MR_Q, row_stride(quads))
        } else {
            (plane_rows.div_ceil(MR_Q), quads)
        };
        let mut packed = vec![0u32; tiles * row_words * MR_Q];
        // MR_Q is a multiple of both plane counts, so a row's planes share one tile.
        let rows_per_tile = MR_Q / planes;
        let mut quants = vec![RowQuant::default(); tiles * rows_per_tile];
        let mut outliers = RowOutliers {
            per_row,
            held: vec![(0, 0.0); tiles * rows_per_tile * per_row.max(1)],
        };
        #[cfg(target_arch = "x86_64")]
        let simd = self.quad_simd(portable);
        #[cfg(not(target_arch = "x86_64"))]
        let _ = portable;
        packed
            .par_chunks_mut(row_words * MR_Q)
            .zip(quants.par_chunks_mut(rows_per_tile))
            .zip(outliers.held.par_chunks_mut(rows_per_tile * per_row.max(1)))
            .enumerate()
            .for_each(|(t, ((dst, quants), held))| {
                let first = t * rows_per_tile;
                // One row's levels as byte planes (high, then low), zero past `k`.
                let mut bytes = vec![0u8; planes * quads * 4];
                let mut magnitudes = Vec::new();
                #[cfg(target_arch = "x86_64")]
                let plain = |row: &[f32], hi: &mut [u8], lo: Option<&mut [u8]>| match simd {
                    Some(simd) => simd.quantize_row(row, levels, hi, lo),
                    None => quantize_row(row, levels, hi, lo),
                };
                #[cfg(not(target_arch = "x86_64"))]
                let plain = |row: &[f32], hi: &mut [u8], lo: Option<&mut [u8]>| quantize_row(row, levels, hi, lo);
                for (r, quant) in quants
                    .iter_mut()
                    .enumerate()
                    .take(rows_per_tile.min(m.saturating_sub(first)))
                {
                    let row = &x[(first + r) * k..(first + r + 1) * k];
                    let (hi_plane, lo_plane) = bytes.split_at_mut(quads * 4);
                    let lo_plane = (planes == 2).then_some(lo_plane);
                    let found = if per_row > 0 {
                        let held = &mut held[r * per_row..(r + 1) * per_row];
                        #[cfg(target_arch = "x86_64")]
                        let found = match simd.and_then(QuadSimd::avx512) {
                            Some(simd) => {
                                quantize_row_with_outliers(&simd, row, levels, hi_plane, held, &mut magnitudes)
                            }
                            None => quantize_row_with_outliers(&Portable, row, levels, hi_plane, held, &mut magnitudes),
                        };
                        #[cfg(not(target_arch = "x86_64"))]
                        let found = quantize_row_with_outliers(&Portable, row, levels, hi_plane, held, &mut magnitudes);
                        found
                    } else {
                        plain(row, hi_plane, lo_plane)
                    };
                    // A row with a non-finite value (NaN scale) or a constant one: its words stay zero.
                    let Some(found) = found else {
                        *quant = RowQuant {
                            scale: if row.iter().all(|v| v.is_finite()) {
                                0.0
                            } else {
                                f32::NAN
                            },
                            zero: 0,
                            outliers: 0,
                        };
                        continue;
                    };
                    *quant = found;
                    let word = |bytes: &[u8]| u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
                    for (p, plane) in bytes.chunks_exact(quads * 4).enumerate() {
                        let plane_row = r * planes + p;
                        if row_major {
                            // One contiguous run of words: zipped, a plain copy (indexed word by
                            // word, the layout chosen per word and every index checked, this loop
                            // was 3-4% of an 8-row int8 forward on AMX).
                            let words = &mut dst[plane_row * row_words..plane_row * row_words + quads];
                            for (w, bytes) in words.iter_mut().zip(plane.chunks_exact(4)) {
                                *w = word(bytes);
                            }
                        } else {
                            for (d, bytes) in plane.chunks_exact(4).enumerate() {
                                dst[d * MR_Q + plane_row] = word(bytes);
                            }
                        }
                    }
                }
            });
        quants.truncate(m);
        (packed, quants, outliers)
    }
}

impl QuantizedWeight {
    /// The SIMD code of this quad-layout weight's kernel (`None`: the portable code, also when
    /// `portable`), checked once per product or block.
    #[cfg(target_arch = "x86_64")]
    pub(super) fn quad_simd(&self, portable: bool) -> Option<QuadSimd> {
        match (portable, self.kernel) {
            (false, Int8Kernel::Amx | Int8Kernel::Avx512Vnni) => vnni::Vnni::try_new().map(QuadSimd::Avx512),
            (false, Int8Kernel::AvxVnni) => avx_vnni::AvxVnni::try_new().map(QuadSimd::Avx256),
            _ => None,
        }
    }

    /// Quad layout: panels `first .. first + count` for every plane row (`rows` of them) into
    /// `sums` (`[rows, count·NR_Q]`). The CPU check is made once per block.
    pub(super) fn block_quads(
        &self,
        packed_x: &[u32],
        rows: usize,
        first: usize,
        count: usize,
        sums: &mut [i32],
        portable: bool,
    ) {
        let Panels::Quads { quads, panels, .. } = &self.panels else {
            return;
        };
        let quads = *quads;
        let stride = count * NR_Q;
        #[cfg(target_arch = "x86_64")]
        let simd = self.quad_simd(portable);
        // One VNNI tile of `rows` plane rows (the portable one without the SIMD kernel).
        let tile = |rows: usize, call: QuadTileCall<'_>| {
            #[cfg(target_arch = "x86_64")]
            match simd {
                Some(simd) => simd.tile(rows, call),
                None => scalar_quad_tile(rows, call),
            }
            #[cfg(not(target_arch = "x86_64"))]
            scalar_quad_tile(rows, call);
        };
        if self.kernel == Int8Kernel::Amx {
            // A few rows past the last whole tile block go through the VNNI tile instead: on the
            // tiles they cost a whole block's weight-tile loads (2 rows of 66: 11% of the tile
            // time), on VNNI a few `vpdpbusd` per quad. The same sums exactly.
            let tail = match rows % (2 * TILE_ROWS) {
                tail if tail <= AMX_TAIL_ON_VNNI => tail,
                _ => 0,
            };
            let tile_rows = rows - tail;
            let block_panels = &panels[first * quads * 4 * NR_Q..(first + count) * quads * 4 * NR_Q];
            let (tile_sums, tail_sums) = sums.split_at_mut(tile_rows * stride);
            if tile_rows > 0 {
                let product = TileProduct::<Int8Tiles> {
                    a: packed_x,
                    a_stride: row_stride(quads),
                    rows: tile_rows,
                    words: quads,
                    panels: block_panels,
                    out: tile_sums,
                    stride,
                };
                product.run(portable);
            }
            if tail > 0 {
                // The tail's rows from AMX's row-major words into one VNNI tile's (per quad, a
                // word per row).
                let row_words = row_stride(quads);
                let mut x = vec![0u32; quads * MR_Q];
                for r in 0..tail {
                    let row = &packed_x[(tile_rows + r) * row_words..(tile_rows + r) * row_words + quads];
                    for (d, &word) in row.iter().enumerate() {
                        x[d * MR_Q + r] = word;
                    }
                }
                for (p, panel) in block_panels.chunks_exact(quads * 4 * NR_Q).enumerate() {
                    let call = QuadTileCall {
                        x: &x,
                        panel,
                        out: &mut tail_sums[p * NR_Q..],
                        stride,
                        accumulate: false,
                        prefetch: Prefetch::NONE,
                    };
                    tile(tail, call);
                }
            }
            return;
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = portable;
        let next = NextSlices {
            panels,
            panel_units: quads,
            unit: 4 * NR_Q,
            pass: KC_Q,
            count,
            tiles: rows.div_ceil(MR_Q),
        };
        let mut depth = 0;
        while depth < quads {
            let kc = KC_Q.min(quads - depth);
            let prefetch = next.pass(depth, kc);
            // Each panel's slice of the pass (16 KiB) stays in L1 while every row tile meets it, the
            // tiles' packed rows read from L2: on an Intel Xeon (AVX512-VNNI, one thread) the tile
            // ran ~8% faster than with each row tile meeting every slice from L2; Zen 4 ran the two
            // orders alike (docs/benchmarks/notes.md, "The int8 tile's loops", stop 61).
            for p in 0..count {
                let start = (first + p) * quads * 4 * NR_Q;
                for (row_tile, row) in (0..rows).step_by(MR_Q).enumerate() {
                    let height = MR_Q.min(rows - row);
                    let x = &packed_x[(row_tile * quads + depth) * MR_Q..(row_tile * quads + depth + kc) * MR_Q];
                    let call = QuadTileCall {
                        x,
                        panel: &panels[start + depth * 4 * NR_Q..start + (depth + kc) * 4 * NR_Q],
                        out: &mut sums[row * stride + p * NR_Q..],
                        stride,
                        accumulate: depth > 0,
                        prefetch: prefetch.share(first + p, row_tile),
                    };
                    tile(height, call);
                }
            }
            depth += kc;
        }
    }
}

/// The SIMD code a quad-layout weight runs, one of the two proofs that the CPU has its VNNI: the
/// AVX512-VNNI kernel with AVX-512 rows (quantizing activations, outliers, combining sums), or the
/// AVX-VNNI kernel with AVX2 rows and portable outliers, so `cpu_kernels = "avx2"` runs no 512-bit
/// code.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
pub(super) enum QuadSimd {
    Avx512(vnni::Vnni),
    Avx256(avx_vnni::AvxVnni),
}

#[cfg(target_arch = "x86_64")]
impl QuadSimd {
    pub(super) fn tile(self, rows: usize, call: QuadTileCall<'_>) {
        match self {
            Self::Avx512(simd) => simd.tile(rows, call),
            Self::Avx256(simd) => simd.tile(rows, call),
        }
    }

    pub(super) fn quantize_row(
        self,
        row: &[f32],
        levels: f32,
        hi: &mut [u8],
        lo: Option<&mut [u8]>,
    ) -> Option<RowQuant> {
        match self {
            Self::Avx512(simd) => simd.quantize_row(row, levels, hi, lo),
            Self::Avx256(simd) => simd.quantize_row(row, levels, hi, lo),
        }
    }

    pub(super) fn combine(self, combine: &Combine<'_>, dst: &mut [std::mem::MaybeUninit<f32>]) {
        match self {
            Self::Avx512(simd) => simd.combine(combine, dst),
            Self::Avx256(simd) => simd.combine(combine, dst),
        }
    }

    /// The AVX-512 code, for what only it has (outliers).
    pub(super) fn avx512(self) -> Option<vnni::Vnni> {
        match self {
            Self::Avx512(simd) => Some(simd),
            Self::Avx256(_) => None,
        }
    }
}

/// The quad tile in portable integer code: the same sums as the VNNI tiles, exactly (a CPU without
/// VNNI never packs this layout outside the tests; this keeps a mistake slow rather than wrong).
fn scalar_quad_tile(rows: usize, call: QuadTileCall<'_>) {
    let QuadTileCall {
        x,
        panel,
        out,
        stride,
        accumulate,
        prefetch: _,
    } = call;
    for r in 0..rows {
        let dst = &mut out[r * stride..r * stride + NR_Q];
        if !accumulate {
            dst.fill(0);
        }
        for (w, a) in panel.chunks_exact(4 * NR_Q).zip(x.chunks_exact(MR_Q)) {
            let bytes = a[r].to_le_bytes();
            for (o, w) in dst.iter_mut().zip(w.chunks_exact(4)) {
                let sum: i32 = bytes.iter().zip(w).map(|(&u, &w)| i32::from(u) * i32::from(w)).sum();
                *o = o.wrapping_add(sum);
            }
        }
    }
}
