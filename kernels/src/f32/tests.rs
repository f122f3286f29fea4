use super::*;
use crate::geglu::{GROUP, geglu_row};
use crate::int8::Int8Activations;

/// `x · W (+ bias)` in float64, rounded to f32: the reference both kernels' tests compare with.
pub(crate) fn reference(x: &[f32], w: &[f32], m: usize, k: usize, n: usize, bias: Option<&[f32]>) -> Vec<f32> {
    let mut out = vec![0f32; m * n];
    for i in 0..m {
        for j in 0..n {
            let sum: f64 = (0..k).map(|d| f64::from(x[i * k + d]) * f64::from(w[d * n + j])).sum();
            out[i * n + j] = sum as f32 + bias.map_or(0.0, |b| b[j]);
        }
    }
    out
}

fn values(len: usize, seed: usize) -> Vec<f32> {
    (0..len)
        .map(|i| (((i * 7919 + seed * 104_729) % 2001) as f32 - 1000.0) / 1000.0)
        .collect()
}

/// Every available family, odd shapes (row tiles, panels and depth passes with remainders),
/// with and without a bias, against a float64 reference.
#[test]
fn every_family_matches_a_reference_product() {
    let families: Vec<CpuKernels> = [CpuKernels::Amx, CpuKernels::Avx512, CpuKernels::Avx2]
        .into_iter()
        .filter(|k| k.available())
        .collect();
    let pool = rayon::ThreadPoolBuilder::new().num_threads(3).build().expect("pool");
    for &(m, k, n) in &[(1, 5, 3), (7, 300, 37), (13, 513, 70), (64, 64, 33)] {
        let x = values(m * k, 1);
        let w = values(k * n, 2);
        let bias = values(n, 3);
        for &kernels in &families {
            for with_bias in [false, true] {
                let packed = PackedWeight::pack(&w, k, n, with_bias.then(|| bias.clone()), kernels);
                let got = pool.install(|| packed.matmul(&x, m));
                let want = reference(&x, &w, m, k, n, with_bias.then_some(bias.as_slice()));
                let worst = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
                assert!(worst < 1e-4, "{kernels} {m}x{k}x{n} bias {with_bias}: {worst}");
            }
        }
    }
}

/// Every row count a tile can be called with (1 to 14 on AVX-512, 1 to 6 on AVX2) and one past
/// the tallest tile, over depths with and without a second pass, against the reference.
#[test]
fn every_row_count_of_each_tile_height() {
    let families: Vec<CpuKernels> = [CpuKernels::Avx512, CpuKernels::Avx2]
        .into_iter()
        .filter(|k| k.available())
        .collect();
    for kernels in families {
        for m in 1..=kernels.f32_tile_rows() + 1 {
            for &(k, n) in &[(19, 40), (300, 33)] {
                let (x, w) = (values(m * k, 9), values(k * n, 10));
                let packed = PackedWeight::pack(&w, k, n, None, kernels);
                let got = packed.matmul(&x, m);
                let want = reference(&x, &w, m, k, n, None);
                let worst = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
                assert!(worst < 1e-4, "{kernels} {m}x{k}x{n}: {worst}");
            }
        }
    }
}

/// The reused column-block buffers carry nothing from one product into the next (a wide
/// product, then narrower ones on the same threads; one past the reuse limit), and a product
/// with no depth gives its bias.
#[test]
fn reused_block_buffers_and_empty_depths() {
    let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().expect("pool");
    for kernels in [CpuKernels::Avx512, CpuKernels::Avx2]
        .into_iter()
        .filter(|k| k.available())
    {
        for &(m, k, n) in &[(9, 40, 700), (2, 7, 3), (5, 33, 65), (300, 3, 7000), (1, 5, 31)] {
            let (x, w) = (values(m * k, 6), values(k * n, 7));
            let bias = values(n, 8);
            let packed = PackedWeight::pack(&w, k, n, Some(bias.clone()), kernels);
            let got = pool.install(|| packed.matmul(&x, m));
            let want = reference(&x, &w, m, k, n, Some(&bias));
            let worst = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
            assert!(worst < 1e-4, "{kernels} {m}x{k}x{n}: {worst}");
        }
        let no_depth = PackedWeight::pack(&[], 0, 4, Some(vec![1.5; 4]), kernels);
        assert_eq!(pool.install(|| no_depth.matmul(&[], 3)), vec![1.5; 12]);
        assert_eq!(
            PackedWeight::pack(&[], 0, 2, None, kernels).matmul(&[], 2),
            vec![0.0; 4]
        );
    }
}

/// Packing the file's `[out, in]` layout gives the panels of packing its transpose (with the
/// output scale applied to its rows), and quantizing the panels gives what quantizing the
/// matrix does.
#[test]
fn packing_the_files_layout_matches_packing_the_transpose() {
    let (k, n) = (70, 45);
    let w = values(k * n, 4);
    let mut out_in = vec![0f32; n * k];
    for d in 0..k {
        for c in 0..n {
            out_in[c * k + d] = w[d * n + c];
        }
    }
    let mut scaled = w.clone();
    for d in 0..k {
        for c in 10..20 {
            scaled[d * n + c] *= 0.125;
        }
    }
    let families = [CpuKernels::Amx, CpuKernels::Avx512, CpuKernels::Avx2];
    for kernels in families.into_iter().filter(|k| k.available()) {
        let direct = PackedWeight::pack_out_in(&out_in, k, n, None, kernels, None);
        assert_eq!(direct.panels, PackedWeight::pack(&w, k, n, None, kernels).panels);
        let direct = PackedWeight::pack_out_in(&out_in, k, n, None, kernels, Some((10, 10, 0.125)));
        assert_eq!(direct.panels, PackedWeight::pack(&scaled, k, n, None, kernels).panels);
        let x = values(3 * k, 5);
        for int8 in [
            Int8Kernel::Amx,
            Int8Kernel::Avx512Vnni,
            Int8Kernel::AvxVnni,
            Int8Kernel::Avx2,
            Int8Kernel::Scalar,
        ] {
            if !int8.available() {
                continue;
            }
            let from_panels = direct.quantize(int8).matmul(&x, 3);
            let from_matrix = QuantizedWeight::quantize(&scaled, k, n, None, int8).matmul(&x, 3);
            assert_eq!(from_panels, from_matrix, "{kernels} {int8:?}");
        }
    }
}

// GeGLU applied by the products (`crate::geglu`), for every format made from a packed weight.

/// Deterministic values in [−1.5, 1.5), different per seed.
fn geglu_values(len: usize, seed: usize) -> Vec<f32> {
    (0..len)
        .map(|i| ((i * 7919 + seed * 104_729) % 1009) as f32 / 1009.0 * 3.0 - 1.5)
        .collect()
}

/// GeGLU of a plain product's `[m, 2·half]` output, row by row, as the worker's op runs it.
fn plain_geglu(kernels: CpuKernels, y: &[f32], m: usize, half: usize) -> Vec<f32> {
    let mut out = vec![0f32; m * half];
    for (row, out) in y.chunks_exact(2 * half).zip(out.chunks_exact_mut(half)) {
        let (input, gate) = row.split_at(half);
        geglu_row(kernels, input, gate, out);
    }
    out
}

fn bits(values: &[f32]) -> Vec<u32> {
    values.iter().map(|v| v.to_bits()).collect()
}

#[test]
fn grouped_products_give_the_plain_products_geglu_bit_for_bit() {
    let families = [CpuKernels::detect(), CpuKernels::Avx512, CpuKernels::Amx];
    for family in families.into_iter().filter(|f| f.panel_width() == 2 * GROUP) {
        // Depths past one pass and not a multiple of the quad or pair; rows past a tile.
        for (seed, (k, half, m)) in [(40, 48, 1), (67, 32, 7), (600, 80, 19)].into_iter().enumerate() {
            let weight = geglu_values(2 * half * k, seed);
            let x = geglu_values(m * k, seed + 10);
            let plain = PackedWeight::pack_out_in(&weight, k, 2 * half, None, family, None);
            let grouped = PackedWeight::pack_out_in_geglu(&weight, k, 2 * half, family).expect("whole groups");
            assert_eq!(grouped.dims(), (k, half));
            let want = plain_geglu(family, &plain.matmul(&x, m), m, half);
            assert_eq!(
                bits(&grouped.matmul(&x, m)),
                bits(&want),
                "f32 {family} {k}×{half}, {m} rows"
            );
            if crate::bf16::Bf16Kernel::for_family(family).is_some() {
                let (plain, grouped) = (plain.to_bf16(), grouped.to_bf16());
                assert_eq!(grouped.dims(), (k, half));
                let want = plain_geglu(family, &plain.matmul(&x, m), m, half);
                assert_eq!(bits(&grouped.matmul(&x, m)), bits(&want), "bf16 {family} {k}×{half}");
            }
            let kernels = [Int8Kernel::for_family(family), Int8Kernel::Avx2, Int8Kernel::Scalar];
            for kernel in kernels.into_iter().filter(|k| k.available()) {
                for activations in [
                    Int8Activations::U8,
                    Int8Activations::U16,
                    Int8Activations::U8Outliers(3),
                ] {
                    let (mut plain, mut grouped) = (plain.quantize(kernel), grouped.quantize(kernel));
                    plain.set_activations(activations);
                    grouped.set_activations(activations);
                    assert_eq!(grouped.dims(), (k, half));
                    let want = plain_geglu(family, &plain.matmul(&x, m), m, half);
                    let got = grouped.matmul(&x, m);
                    assert_eq!(
                        bits(&got),
                        bits(&want),
                        "int8 {kernel:?} {activations} {k}×{half}, {m} rows"
                    );
                }
            }
        }
    }
}

#[test]
fn only_whole_pairs_of_groups_are_grouped() {
    let weight = geglu_values(2 * 40 * 8, 0);
    // Half of 80 columns is not a multiple of 16; the avx2 family's panels hold one group.
    assert!(PackedWeight::pack_out_in_geglu(&weight, 8, 80, CpuKernels::Avx512).is_none());
    let weight = geglu_values(64 * 8, 0);
    assert!(PackedWeight::pack_out_in_geglu(&weight, 8, 64, CpuKernels::Avx2).is_none());
    assert!(PackedWeight::pack_out_in_geglu(&weight, 8, 64, CpuKernels::Avx512).is_some());
}
