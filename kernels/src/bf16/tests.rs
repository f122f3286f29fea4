use super::*;
use crate::f32::tests::reference;

fn values(len: usize, seed: usize) -> Vec<f32> {
    (0..len)
        .map(|i| (((i * 7919 + seed * 104_729) % 2001) as f32 - 1000.0) / 1000.0)
        .collect()
}

#[test]
fn rounding_to_bf16_is_to_nearest_even() {
    assert_eq!(to_bf16(1.0), 0x3f80);
    assert_eq!(from_bf16(to_bf16(1.0 + 1.0 / 256.0)), 1.0, "a tie rounds to even");
    assert_eq!(
        from_bf16(to_bf16(1.0 + 3.0 / 256.0)),
        1.0 + 4.0 / 256.0,
        "a tie rounds to even"
    );
    assert_eq!(from_bf16(to_bf16(-2.5)), -2.5);
    assert!(from_bf16(to_bf16(f32::NAN)).is_nan());
    assert_eq!(from_bf16(to_bf16(f32::INFINITY)), f32::INFINITY);
}

/// The SIMD kernel (where the CPU has it) and the portable one, against a float64 product:
/// within 1% of the size of the terms (`Σ |x|·|w|`; bf16 keeps 8 bits of mantissa).
#[test]
fn bf16_products_match_float_products() {
    let pool = rayon::ThreadPoolBuilder::new().num_threads(3).build().expect("pool");
    if !available() {
        eprintln!("this CPU has no AVX512_BF16: only the portable kernel is tested");
    }
    for &(m, k, n) in &[(1, 5, 3), (7, 300, 37), (13, 513, 70), (64, 64, 33), (9, 1, 40)] {
        let x = values(m * k, 1);
        let w = values(k * n, 2);
        let bias = values(n, 3);
        let abs = |v: &[f32]| v.iter().map(|v| v.abs()).collect::<Vec<_>>();
        let magnitude = reference(&abs(&x), &abs(&w), m, k, n, None);
        let want = reference(&x, &w, m, k, n, Some(&bias));
        for tiles in [false, true] {
            let weight = Bf16Weight::pack_with(|d, c| w[d * n + c], k, n, Some(bias.clone()), tiles);
            for portable in [false, true] {
                let got = pool.install(|| weight.matmul_with(&x, m, portable));
                let worst = got
                    .iter()
                    .zip(&want)
                    .zip(&magnitude)
                    .map(|((a, b), s)| (a - b).abs() / s.max(1e-6))
                    .fold(0f32, f32::max);
                assert!(worst < 0.01, "{m}x{k}x{n} tiles {tiles} portable {portable}: {worst}");
            }
            // The SIMD and portable sums differ at most by f32 rounding.
            let (a, b) = pool.install(|| (weight.matmul_with(&x, m, false), weight.matmul_with(&x, m, true)));
            let worst = a
                .iter()
                .zip(&b)
                .zip(&magnitude)
                .map(|((a, b), s)| (a - b).abs() / s.max(1e-6))
                .fold(0f32, f32::max);
            assert!(worst < 1e-5, "{m}x{k}x{n} tiles {tiles}: SIMD vs portable {worst}");
            // AMX's tiles give the tile model's sums bit for bit.
            if tiles && crate::amx::Amx::detect().is_ok() {
                assert!(
                    a.iter().zip(&b).all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{m}x{k}x{n}: AMX vs its model"
                );
            }
        }
    }
}

/// The kernel's row packing gives the portable words exactly (odd depths, tails, ties, ±0,
/// NaN, ±∞, the largest finite values), except that subnormal values flush to zero; a product
/// with no depth gives its bias.
#[test]
fn simd_row_packing_equals_the_portable_one() {
    for tiles in [false, true] {
        let no_depth = Bf16Weight::pack_with(|_, _| 0.0, 0, 3, Some(vec![0.5; 3]), tiles);
        assert_eq!(no_depth.matmul(&[], 2), vec![0.5; 6]);
    }
    if !available() {
        eprintln!("this CPU has no AVX512_BF16: skipped");
        return;
    }
    let mut special = vec![
        0.0,
        -0.0,
        1.0 + 1.0 / 256.0,
        1.0 + 3.0 / 256.0,
        -2.5,
        f32::NAN,
        f32::INFINITY,
    ];
    special.extend([f32::NEG_INFINITY, f32::MAX, f32::MIN, 1e-30, -3.4e38]);
    for k in [1, 2, 15, 16, 17, 31, 32, 33, 64, 100, special.len()] {
        let m = 3;
        let mut x = values(m * k, k);
        if k == special.len() {
            x[k..2 * k].copy_from_slice(&special);
        }
        for tiles in [false, true] {
            let weight = Bf16Weight::pack_with(|_, _| 1.0, k, 5, None, tiles);
            assert_eq!(
                weight.pack_rows(&x, m, false),
                weight.pack_rows(&x, m, true),
                "k = {k} tiles {tiles}"
            );
        }
    }
    let weight = Bf16Weight::pack_with(|_, _| 1.0, 2, 1, None, false);
    let subnormal = f32::MIN_POSITIVE / 4.0;
    assert_eq!(weight.pack_rows(&[subnormal, -subnormal], 1, false)[0], 0x8000_0000);
    assert_ne!(weight.pack_rows(&[subnormal, -subnormal], 1, true)[0], 0x8000_0000);
}

#[test]
fn availability_follows_the_cpu() {
    #[cfg(target_arch = "x86_64")]
    assert_eq!(
        available(),
        std::arch::is_x86_feature_detected!("avx512bf16") && std::arch::is_x86_feature_detected!("avx512bw")
    );
    let empty = Bf16Weight::pack_with(|_, _| 1.0, 3, 2, None, true);
    assert!(empty.matmul(&[], 0).is_empty());
}
