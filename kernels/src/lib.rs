//! layad's CPU matrix kernels, free of candle: slices in, slices out. The worker (`worker-gpu`)
//! keeps the candle adapters, the weights' formats and the choice of CPU or device.
//!
//! Layout:
//! - [`amx`]: Intel AMX (Sapphire Rapids and later Xeons): the CPU's tile permission and why it was
//!   refused ([`amx::Amx::detect`]), and one driver that multiplies row-major activation words by
//!   packed 32-column weight panels on the tile registers, for two formats:
//!   - `tdpbusd`: u8 activations × s8 weights, four depths per 32-bit word, exact i32 sums
//!     ([`amx::Int8Tiles`]);
//!   - `tdpbf16ps`: bf16 activations × bf16 weights, two depths per word, f32 sums
//!     ([`amx::Bf16Tiles`]).
//!
//!   The same products run in a portable model of the tile operation ([`amx::TileFormat::model`]),
//!   which is how the tests check the packing and the tile layout on every CPU, and the AMX code
//!   against it bit for bit where the CPU has AMX.
//!
//! `unsafe` lives only in the modules that execute tile instructions (`amx::tiles`) and in the
//! permission request (`amx::permission`), each use with its SAFETY note.

pub mod amx;
