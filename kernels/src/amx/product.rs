//! What a tile product is, apart from the AMX code that runs it: the tile and panel sizes, the two
//! formats ([`TileFormat`]), one block of products ([`TileProduct`]) with its bounds check and its
//! portable model. `amx/mod.rs` runs a block on the tiles (`tiles.rs`) or in the model; both take
//! these definitions from here.

/// Depth words in one tile row (64 bytes).
pub const TILE_WORDS: usize = 16;
/// Rows of one tile.
pub const TILE_ROWS: usize = 16;
/// Columns of one weight panel: two tiles of 16.
pub const PANEL_COLUMNS: usize = 32;

/// One format of tile product: what a word holds and how two words multiply.
pub trait TileFormat: private::Sealed {
    /// A packed weight element (`i8`, or `u16` bf16 bits).
    type Weight: Copy;
    /// A sum (`i32`, or `f32`).
    type Sum: Copy + Default;
    /// The instruction that runs it.
    #[doc(hidden)]
    const INSTRUCTION: private::Instruction;
    /// One tile instruction's share of one sum: `sum` plus the products of [`TILE_WORDS`]
    /// activation words `a` by the weight words `b(0..16)`, added as the instruction adds them
    /// (the portable model of the tile operation).
    fn tile_dot(sum: Self::Sum, a: &[u32], b: impl Fn(usize) -> u32) -> Self::Sum;
    /// Four bytes of weights as one word, in memory order.
    fn weight_word(weights: &[Self::Weight]) -> u32;
}

/// u8 activations × s8 weights, four depths a word, i32 sums (`tdpbusd`): exact, and wrapping
/// where i32 wraps (the packers keep depths short enough that it never does).
#[derive(Debug)]
pub enum Int8Tiles {}

/// bf16 activations × bf16 weights, two depths a word, f32 sums (`tdpbf16ps`).
#[derive(Debug)]
pub enum Bf16Tiles {}

/// [`Bf16Tiles`]' product with a right-hand side that arrives as pair words rather than as bf16
/// halves: the attention's keys and values in a bf16 pool (`bf16::RowsKernel`), laid out by
/// `RowsKernel::pair_words` in the weights' panel layout. The same bytes, the same instruction.
#[derive(Debug)]
pub enum Bf16Words {}

impl TileFormat for Int8Tiles {
    type Weight = i8;
    type Sum = i32;
    const INSTRUCTION: private::Instruction = private::Instruction::Tdpbusd;

    fn tile_dot(sum: i32, a: &[u32], b: impl Fn(usize) -> u32) -> i32 {
        a.iter().enumerate().fold(sum, |sum, (d, &a)| {
            let (a, b) = (a.to_le_bytes(), b(d).to_le_bytes());
            (0..4).fold(sum, |sum, j| sum.wrapping_add(i32::from(a[j]) * i32::from(b[j] as i8)))
        })
    }

    fn weight_word(weights: &[i8]) -> u32 {
        u32::from_le_bytes([weights[0] as u8, weights[1] as u8, weights[2] as u8, weights[3] as u8])
    }
}

impl TileFormat for Bf16Tiles {
    type Weight = u16;
    type Sum = f32;
    const INSTRUCTION: private::Instruction = private::Instruction::Tdpbf16ps;

    /// Intel's definition of `tdpbf16ps`: the even and the odd bf16 of the words are summed
    /// apart, product by product in depth order, each addition rounded to nearest even (a bf16
    /// product is exact in f32); then their sum is added to `sum`. Subnormal inputs and results
    /// count as zero.
    fn tile_dot(sum: f32, a: &[u32], b: impl Fn(usize) -> u32) -> f32 {
        let low = |word: u32| flush(f32::from_bits(word << 16));
        let high = |word: u32| flush(f32::from_bits(word & 0xffff_0000));
        let (mut even, mut odd) = (0f32, 0f32);
        for (d, &a) in a.iter().enumerate() {
            let b = b(d);
            even = flush(even + low(a) * low(b));
            odd = flush(odd + high(a) * high(b));
        }
        flush(sum + flush(even + odd))
    }

    fn weight_word(weights: &[u16]) -> u32 {
        u32::from(weights[0]) | u32::from(weights[1]) << 16
    }
}

impl TileFormat for Bf16Words {
    type Weight = u32;
    type Sum = f32;
    const INSTRUCTION: private::Instruction = private::Instruction::Tdpbf16ps;

    fn tile_dot(sum: f32, a: &[u32], b: impl Fn(usize) -> u32) -> f32 {
        Bf16Tiles::tile_dot(sum, a, b)
    }

    fn weight_word(weights: &[u32]) -> u32 {
        weights[0]
    }
}

/// `v`, or zero of its sign when it is subnormal (AMX's denormals-are-zero and flush-to-zero).
#[inline(always)]
fn flush(v: f32) -> f32 {
    if v.is_subnormal() { 0.0f32.copysign(v) } else { v }
}

/// The distance between activation rows of `words` words that [`TileProduct::a_stride`] should
/// use: one cache line more than the row, so that the 32 rows two tiles load do not fall into the
/// same few L1 sets (rows of 1024 or 2048 bytes, the model's depths, all would: measured on the
/// tile loads of a 512 × 2048-byte block, 0.66 → 0.79 T int8 products per second on one core).
pub fn row_stride(words: usize) -> usize {
    words + TILE_WORDS
}

/// One block of tile products.
pub struct TileProduct<'a, F: TileFormat> {
    /// Activations, row-major: `rows` rounded up to [`TILE_ROWS`] rows of `words` words, `a_stride`
    /// words apart (the rows past `rows` are read and their sums dropped).
    pub a: &'a [u32],
    /// Distance between activation rows, at least `words`; [`row_stride`] gives a good one.
    pub a_stride: usize,
    /// Rows of the product.
    pub rows: usize,
    /// Depth words: a positive multiple of [`TILE_WORDS`].
    pub words: usize,
    /// Weight panels, one after another: per depth word, [`PANEL_COLUMNS`] words (4 bytes each).
    pub panels: &'a [F::Weight],
    /// The sums: `rows` rows, `stride` apart; panel `p`'s 32 columns start at `32·p`. Every value
    /// of those columns is stored (not added to).
    pub out: &'a mut [F::Sum],
    /// Distance between output rows, at least 32 columns per panel.
    pub stride: usize,
}

impl<F: TileFormat> TileProduct<'_, F> {
    /// Weight elements in one word.
    pub(super) const PER_WORD: usize = 4 / size_of::<F::Weight>();

    /// Panels in the block.
    pub fn panels(&self) -> usize {
        self.panels.len() / (self.words * PANEL_COLUMNS * Self::PER_WORD).max(1)
    }

    /// Panics unless every tile the product reads or writes lies inside its slices.
    pub(super) fn check(&self) {
        let panel = self.words * PANEL_COLUMNS * Self::PER_WORD;
        assert!(
            self.words > 0 && self.words.is_multiple_of(TILE_WORDS),
            "tile depth {} is not a positive multiple of {TILE_WORDS} words",
            self.words
        );
        let a_len = (self.rows.next_multiple_of(TILE_ROWS).max(1) - 1) * self.a_stride + self.words;
        assert!(
            self.a_stride >= self.words && self.a.len() >= a_len,
            "activations hold {} words, {} rows of {} words {} apart need {a_len}",
            self.a.len(),
            self.rows,
            self.words,
            self.a_stride,
        );
        assert!(
            self.panels.len().is_multiple_of(panel),
            "weights hold {} elements, not whole panels of {panel}",
            self.panels.len()
        );
        let width = self.panels() * PANEL_COLUMNS;
        assert!(
            self.stride >= width,
            "output stride {} under {width} columns",
            self.stride
        );
        assert!(
            self.rows == 0 || self.out.len() >= (self.rows - 1) * self.stride + width,
            "output holds {} sums, {} rows of stride {} need {}",
            self.out.len(),
            self.rows,
            self.stride,
            (self.rows.max(1) - 1) * self.stride + width
        );
    }

    /// The same product in portable code, tile instruction by tile instruction ([`TileFormat::tile_dot`]). What the tests check the tile layout and
    /// the AMX code against, on every CPU.
    pub fn model(self) {
        self.check();
        let words = self.words;
        let panel_len = words * PANEL_COLUMNS * Self::PER_WORD;
        for (p, panel) in self.panels.chunks_exact(panel_len).enumerate() {
            for row in 0..self.rows {
                let a = &self.a[row * self.a_stride..row * self.a_stride + words];
                for col in 0..PANEL_COLUMNS {
                    let mut sum = F::Sum::default();
                    for (step, a) in a.chunks_exact(TILE_WORDS).enumerate() {
                        let b = |d: usize| {
                            let at = ((step * TILE_WORDS + d) * PANEL_COLUMNS + col) * Self::PER_WORD;
                            F::weight_word(&panel[at..at + Self::PER_WORD])
                        };
                        sum = F::tile_dot(sum, a, b);
                    }
                    self.out[row * self.stride + p * PANEL_COLUMNS + col] = sum;
                }
            }
        }
    }
}

// The tile code (x86-64 only) matches on it.
#[cfg(target_arch = "x86_64")]
pub(super) use private::Instruction;

mod private {
    /// Only this crate's formats: the tile code trusts their sizes.
    pub trait Sealed {}
    impl Sealed for super::Int8Tiles {}
    impl Sealed for super::Bf16Tiles {}
    impl Sealed for super::Bf16Words {}

    /// The tile instruction of a format.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum Instruction {
        /// u8 × s8 quads into i32.
        Tdpbusd,
        /// bf16 pairs into f32.
        Tdpbf16ps,
    }
}
