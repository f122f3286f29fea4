use super::*;

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
