//! Intel AMX tile products: `C[rows, 32·count] = A[rows, words] · B` where `A` is row-major
//! activation words and `B` is `count` packed weight panels, on the tile registers.
//!
//! A 32-bit *word* holds four u8 activations (int8) or two bf16 (bf16) of consecutive depths, the
//! unit both `tdpbusd` and `tdpbf16ps` multiply; weights are packed the same way, so one driver
//! serves both formats ([`TileFormat`]). A weight panel holds 32 columns: per depth word, column
//! `c`'s word at `c` — 128 bytes a depth word, which is the panel layout the worker already packs
//! for its VNNI and AVX512_BF16 kernels. Read with a row stride of 128 bytes, the panel's first 64
//! bytes of 16 depth words are one `B` tile (columns 0–15), the next 64 the other (columns 16–31):
//! the tiles read the panels in place, no second copy of the weights.
//!
//! The driver keeps four accumulator tiles (32 rows × 32 columns) and walks the depth 16 words
//! (64 bytes of each row) at a time: two `A` tiles, two `B` tiles, four tile products. Depths are
//! whole tiles (`words` a multiple of [`TILE_WORDS`], the packers pad with zeros) and `A` holds
//! its rows rounded up to [`TILE_ROWS`] (zero rows past `rows`); a last block of fewer rows runs
//! on tiles configured to just those rows (for every panel after their full blocks, under one
//! configuration), so `out` holds exactly `rows` rows.
//!
//! Not every CPU with AMX may use it: Linux grants the tile registers' state to a process only
//! when asked ([`Amx::detect`]); the reason it is refused is kept and reported.

mod permission;
mod product;
#[cfg(target_arch = "x86_64")]
mod tiles;

pub use product::{
    Bf16Tiles, Bf16Words, Int8Tiles, PANEL_COLUMNS, TILE_ROWS, TILE_WORDS, TileFormat, TileProduct, row_stride,
};

use std::sync::OnceLock;

/// Proof that this process may run AMX's int8 and bf16 tile products: the CPU has AMX-TILE,
/// AMX-INT8 and AMX-BF16 and the operating system granted the tile registers to the process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Amx(());

/// Why AMX is not used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AmxUnavailable {
    /// The CPU lacks one of the three features (or is not x86-64).
    #[error("the CPU has no AMX-TILE, AMX-INT8 and AMX-BF16")]
    NotInCpu,
    /// The CPU has AMX, but the kernel did not grant the tile registers.
    #[error("AMX refused: {0}")]
    Refused(String),
}

impl Amx {
    /// AMX for this process, asking the kernel for the tile registers once per process; the answer
    /// (and the reason for a refusal) is kept.
    pub fn detect() -> Result<Self, AmxUnavailable> {
        static ANSWER: OnceLock<Result<Amx, AmxUnavailable>> = OnceLock::new();
        ANSWER
            .get_or_init(|| {
                if !permission::cpu_has_amx() {
                    return Err(AmxUnavailable::NotInCpu);
                }
                permission::request_tile_data().map_err(AmxUnavailable::Refused)?;
                Ok(Self(()))
            })
            .clone()
    }

    /// `product.out = product.a · product.panels` on the tile registers. Panics if the slices do
    /// not have the lengths [`TileProduct`] describes (the tiles would read or write outside them).
    pub fn multiply<F: TileFormat>(self, product: TileProduct<'_, F>) {
        product.check();
        #[cfg(target_arch = "x86_64")]
        tiles::multiply(product);
        #[cfg(not(target_arch = "x86_64"))]
        unreachable!("an Amx exists only on x86-64");
    }
}

impl<F: TileFormat> TileProduct<'_, F> {
    /// Runs the product on AMX's tiles where this process has them, else (or when `portable`, the
    /// tests' way to compare the two) in the tile model: slow, not wrong, also for a weight packed
    /// for AMX in a process whose tile permission was then refused.
    pub fn run(self, portable: bool) {
        match Amx::detect() {
            Ok(amx) if !portable => amx.multiply(self),
            _ => self.model(),
        }
    }
}

#[cfg(test)]
mod tests;
