//! The u8 × s8 quad layout's products: the depth × row tile × panel loop with its prefetching for
//! the VNNI microkernels (`vnni`, `avx_vnni`), AMX's tile products on the same panels
//! (`crate::amx`), and the portable tile every one of them is tested against.

#[cfg(target_arch = "x86_64")]
use super::activations::RowQuant;
#[cfg(target_arch = "x86_64")]
use super::combine::Combine;
use super::{Int8Kernel, KC_Q, MR_Q, NR_Q, Panels, QuantizedWeight};
#[cfg(target_arch = "x86_64")]
use super::{avx_vnni, vnni};
use crate::amx::{Int8Tiles, TileProduct, row_stride};
use crate::driver::{NextSlices, Prefetch};

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
        if self.kernel == Int8Kernel::Amx {
            let product = TileProduct::<Int8Tiles> {
                a: packed_x,
                a_stride: row_stride(quads),
                rows,
                words: quads,
                panels: &panels[first * quads * 4 * NR_Q..(first + count) * quads * 4 * NR_Q],
                out: sums,
                stride,
            };
            product.run(portable);
            return;
        }
        #[cfg(target_arch = "x86_64")]
        let simd = self.quad_simd(portable);
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
            for (tile, row) in (0..rows).step_by(MR_Q).enumerate() {
                let height = MR_Q.min(rows - row);
                let x = &packed_x[(tile * quads + depth) * MR_Q..(tile * quads + depth + kc) * MR_Q];
                for p in 0..count {
                    let start = (first + p) * quads * 4 * NR_Q;
                    let call = QuadTileCall {
                        x,
                        panel: &panels[start + depth * 4 * NR_Q..start + (depth + kc) * 4 * NR_Q],
                        out: &mut sums[row * stride + p * NR_Q..],
                        stride,
                        accumulate: depth > 0,
                        prefetch: prefetch.share(first + p, tile),
                    };
                    #[cfg(target_arch = "x86_64")]
                    match simd {
                        Some(simd) => simd.tile(height, call),
                        None => scalar_quad_tile(height, call),
                    }
                    #[cfg(not(target_arch = "x86_64"))]
                    scalar_quad_tile(height, call);
                }
            }
            depth += kc;
        }
    }
}

/// One quad-kernel call: `rows` plane rows of packed u8 quads (`MR_Q` words per quad) times one
/// panel slice (`4·NR_Q` bytes per quad), into `out` (rows `stride` apart, `NR_Q` sums each),
/// added to what `out` holds when `accumulate`.
pub(super) struct QuadTileCall<'a> {
    pub(super) x: &'a [u32],
    pub(super) panel: &'a [i8],
    pub(super) out: &'a mut [i32],
    pub(super) stride: usize,
    pub(super) accumulate: bool,
    /// Weights to request into L2 during the call ([`NextSlices`]).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(super) prefetch: Prefetch<'a, i8>,
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

    pub(super) fn combine(self, combine: Combine<'_>, dst: &mut [f32]) {
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
