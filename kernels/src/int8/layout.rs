//! What the int8 modules share, apart from the code that runs it: the layouts' sizes, the kernel a
//! weight runs, the packed weight itself, how its activations are quantized and one quad-kernel
//! call. The weight's code lives beside its layouts (`mod.rs` quantizes, multiplies and combines,
//! `pairs.rs` and `quads.rs` run each layout, `activations.rs` quantizes rows); they all take these
//! definitions from here and none from `mod.rs`, so no module imports from one that imports it.

use crate::driver::Prefetch;
use crate::geglu::GeGlu;

/// Columns per packed panel of the i16 pair layout (two AVX2 registers of i32 sums).
pub(super) const NR: usize = 16;
/// Rows of the activation tile one pair-kernel call computes.
pub(super) const MR: usize = 6;
/// Depth pairs of one pass: a panel slice of `KC` pairs (8 KiB) stays in L1.
pub(super) const KC: usize = 128;
/// Columns per packed panel of the u8 × s8 quad layout (two AVX-512 registers of i32 sums).
pub(super) const NR_Q: usize = 32;
/// (Plane) rows of the activation tile one quad-kernel call computes: 16 accumulator registers of
/// the 32 AVX-512 has, two for the weights.
pub(super) const MR_Q: usize = 8;
/// Depth quads of one pass: a panel slice of `KC_Q` quads (16 KiB) stays in L1.
pub(super) const KC_Q: usize = 128;
/// Deepest product the quad layout sums in i32 without overflow.
pub(super) const MAX_QUAD_DEPTH: usize = i32::MAX as usize / (255 * WEIGHT_LEVELS as usize);
/// Largest weight level: symmetric int8 without −128.
pub(super) const WEIGHT_LEVELS: i32 = 127;
/// Largest activation level (i16, symmetric) of the pair layout.
pub(super) const MAX_ACTIVATION_LEVELS: i32 = i16::MAX as i32;

/// The integer kernel a quantized weight runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Int8Kernel {
    /// `tdpbusd` on AMX tiles (with AVX512-VNNI for the rows' quantization and the combine): u8 ×
    /// s8 quads, the VNNI layout's panels.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    Amx,
    /// `vpdpbusd` on 512-bit registers (AVX512-VNNI, with AVX-512F/BW): u8 × s8 quads.
    // Elsewhere only the tests name it (they skip it where the CPU lacks it).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    Avx512Vnni,
    /// `vpdpbusd` on 256-bit registers (AVX-VNNI, with AVX2 and FMA: Alder Lake and later Intel
    /// cores, Zen 5): the same u8 × s8 quads and packed panels, four registers per 32 columns.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    AvxVnni,
    /// `_mm256_madd_epi16` through pulp's AVX2 token (x86-64 with AVX2 + FMA): i16 pairs.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    Avx2,
    /// Portable integer code on the i16 pair layout: other CPUs.
    Scalar,
}

/// The packed integer weights, in the layout of the kernel that runs them.
pub(super) enum Panels {
    /// Panel `p` holds columns `p·16 .. p·16 + 16` (zero past `n`); per depth pair `d`, column `c`
    /// holds `[w(2d, c), w(2d + 1, c)]` (zero past `k`), so one `madd_epi16` by a broadcast
    /// activation pair gives 8 columns' sums of two products.
    Pairs {
        /// `k` rounded up to pairs.
        pairs: usize,
        panels: Vec<i16>,
        /// Activation levels: rows are quantized to `−levels ..= levels`.
        activation_levels: i32,
    },
    /// Panel `p` holds columns `p·32 .. p·32 + 32` (zero past `n`); per depth quad `q`, column `c`
    /// holds the bytes `w(4q .. 4q + 4, c)` (zero past `k`), so one `vpdpbusd` by a broadcast quad
    /// of u8 activations gives 16 columns' sums of four products.
    Quads {
        /// `k` rounded up to quads.
        quads: usize,
        panels: Vec<i8>,
        /// `Σ_d w(d, c)` of the quantized weights: the zero point's correction.
        column_sums: Vec<i32>,
        activations: Int8Activations,
    },
}

/// A weight `[k, n]` (the transposed PyTorch `[out, in]`) quantized per column and packed for one
/// integer kernel.
pub struct QuantizedWeight {
    pub(super) kernel: Int8Kernel,
    pub(super) k: usize,
    pub(super) n: usize,
    pub(super) panels: Panels,
    /// `max|w[.., c]| / 127` per column.
    pub(super) column_scales: Vec<f32>,
    pub(super) bias: Option<Vec<f32>>,
    /// GeGLU applied as the combine writes (columns grouped for it, `crate::geglu`).
    pub(super) geglu: Option<GeGlu>,
}

/// How a u8 × s8 (quad layout) product quantizes its activation rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Int8Activations {
    /// 8 bits: 256 levels between the row's minimum and maximum (zero included).
    U8,
    /// 8 bits over the range of the row *without* its largest-magnitude values (at most this many
    /// per row): those are set to the zero point's level and added back exactly, in f32, from the
    /// same packed weights (`Σ x_j · w(j, c)` over the outliers) when the sums are combined.
    U8Outliers(u16),
    /// 16 bits, as a high and a low u8 plane: 65536 levels, twice the dot products.
    U16,
}

impl Int8Activations {
    /// Outliers per row of `u8o` when the count is not given.
    pub const DEFAULT_OUTLIERS: u16 = 4;

    /// 8 bits with [`Self::DEFAULT_OUTLIERS`] outliers per row.
    pub const U8_OUTLIERS: Self = Self::U8Outliers(Self::DEFAULT_OUTLIERS);

    /// Parses `u8`, `u16`, `u8o` (8 bits with the default outlier count) or `u8o:N` (N outliers
    /// per row, 1 to 256).
    pub fn parse(text: &str) -> Result<Self, String> {
        let text = text.trim().to_ascii_lowercase();
        match text.as_str() {
            "u8" | "8" => Ok(Self::U8),
            "u16" | "16" => Ok(Self::U16),
            "u8o" => Ok(Self::U8_OUTLIERS),
            _ => match text.strip_prefix("u8o:").map(str::parse::<u16>) {
                Some(Ok(count @ 1..=256)) => Ok(Self::U8Outliers(count)),
                _ => Err(format!(
                    "unknown int8 activations '{text}'; expected u8, u16, u8o or u8o:N (1 ≤ N ≤ 256 outliers per row)"
                )),
            },
        }
    }

    pub(super) fn planes(self) -> usize {
        match self {
            Self::U8 | Self::U8Outliers(_) => 1,
            Self::U16 => 2,
        }
    }

    pub(super) fn levels(self) -> f32 {
        match self {
            Self::U8 | Self::U8Outliers(_) => 255.0,
            Self::U16 => 65535.0,
        }
    }

    /// Largest-magnitude values per row taken out of the 8-bit range.
    pub(super) fn outliers(self) -> usize {
        match self {
            Self::U8Outliers(count) => usize::from(count),
            Self::U8 | Self::U16 => 0,
        }
    }
}

/// `u8`, `u16` or `u8o:N`: what [`Int8Activations::parse`] reads back.
impl std::fmt::Display for Int8Activations {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::U8 => f.write_str("u8"),
            Self::U16 => f.write_str("u16"),
            Self::U8Outliers(count) => write!(f, "u8o:{count}"),
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
    /// Weights to request into L2 during the call (`driver::NextSlices`).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(super) prefetch: Prefetch<'a, i8>,
}
