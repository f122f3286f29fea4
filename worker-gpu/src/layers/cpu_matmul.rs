//! The CPU matrix products as a candle op: [`CpuMatmul`] runs any weight of `layad-cpu-kernels`
//! (packed f32, bf16 or int8: [`CpuWeight`]) on a contiguous f32 input. The packing, quantization
//! and kernels are that crate's; this is the adapter.
//!
//! Why not candle's matmul (the `gemm` crate): it repacks the weight on every call and splits few
//! rows poorly across threads; on one 64-token row that made the matrix products about twice as slow
//! as these kernels (docs/benchmarks.md). Other devices and precisions keep candle's matmul.

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp1, Layout, Shape};
use layad_cpu_kernels::CpuWeight;

/// `x · W (+ bias)` as a candle op on a contiguous f32 `[.., k]` input, giving `[.., n]`.
pub(crate) struct CpuMatmul<'a, W>(pub(crate) &'a W);

impl<W: CpuWeight> CustomOp1 for CpuMatmul<'_, W> {
    fn name(&self) -> &'static str {
        W::NAME
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let CpuStorage::F32(data) = storage else {
            candle_core::bail!("{}: expected f32, got {:?}", W::NAME, storage.dtype())
        };
        let Some((start, end)) = layout.contiguous_offsets() else {
            candle_core::bail!("{}: expected a contiguous input", W::NAME)
        };
        let dims = layout.dims();
        let (k, n) = self.0.dims();
        match dims.split_last() {
            Some((&last, _)) if last == k => {}
            _ => candle_core::bail!("{}: input {dims:?} vs weight [{k}, {n}]", W::NAME),
        }
        let m = (end - start) / k.max(1);
        let out = self.0.matmul(&data[start..end], m);
        let mut shape = dims.to_vec();
        if let Some(last) = shape.last_mut() {
            *last = n;
        }
        Ok((CpuStorage::F32(out), Shape::from(shape)))
    }
}
