use super::activations::*;
use super::*;
use crate::f32::tests::reference;

/// Pseudo-random values in [−1, 1] with a few larger outliers, like real activations.
fn values(len: usize, seed: u64) -> Vec<f32> {
    let mut state = seed
        .wrapping_mul(6_364_136_223_846_793_005)
        .wrapping_add(1_442_695_040_888_963_407);
    (0..len)
        .map(|i| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            let v = ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0;
            if i % 97 == 0 { 4.0 * v } else { v }
        })
        .collect()
}

/// A row quantizer under test: `(row, levels, hi, lo)` as [`quantize_row`].
#[cfg(target_arch = "x86_64")]
type QuantizeRow = Box<dyn Fn(&[f32], f32, &mut [u8], Option<&mut [u8]>) -> Option<RowQuant>>;

/// Rows chosen for AMX too: 1, 2 (and their 16-bit planes' 2 and 4) run on VNNI alone; 34 and 36
/// end in 2 and 4 rows past a whole 32-row block, which AMX leaves to VNNI, and their 16-bit
/// planes in 4 and 8 (the latter on tiles of 8 rows).
const SHAPES: [(usize, usize, usize); 11] = [
    (1, 5, 3),
    (7, 300, 37),
    (13, 513, 70),
    (64, 64, 33),
    (6, 1, 16),
    (2, 1024, 17),
    (34, 128, 45),
    (36, 200, 40),
    // Several panels a task on two threads, with AMX's last rows on VNNI.
    (66, 256, 600),
    (3, 64, 300),
    // Two rows, an odd number of depth quads.
    (2, 36, 40),
];

/// Every kernel this CPU runs, with each activation choice of the quad layout: `(kernel,
/// activations, tolerance)`.
fn variants() -> Vec<(Int8Kernel, Option<Int8Activations>, f32)> {
    let mut variants = vec![(Int8Kernel::Scalar, None, 0.01)];
    if Int8Kernel::Avx2.available() {
        variants.push((Int8Kernel::Avx2, None, 0.01));
    }
    if Int8Kernel::Avx512Vnni.available() {
        variants.push((Int8Kernel::Avx512Vnni, Some(Int8Activations::U8), 0.02));
        variants.push((Int8Kernel::Avx512Vnni, Some(Int8Activations::U16), 0.01));
        variants.push((Int8Kernel::Avx512Vnni, Some(Int8Activations::U8_OUTLIERS), 0.02));
        variants.push((Int8Kernel::Avx512Vnni, Some(Int8Activations::U8Outliers(1)), 0.02));
        variants.push((Int8Kernel::Avx512Vnni, Some(Int8Activations::U8Outliers(40)), 0.02));
    } else {
        eprintln!("this CPU has no AVX512-VNNI: its kernel is not tested here");
    }
    if Int8Kernel::Amx.available() {
        variants.push((Int8Kernel::Amx, Some(Int8Activations::U8), 0.02));
        variants.push((Int8Kernel::Amx, Some(Int8Activations::U16), 0.01));
        variants.push((Int8Kernel::Amx, Some(Int8Activations::U8_OUTLIERS), 0.02));
    } else {
        eprintln!("AMX not granted or absent: the AMX-INT8 products are tested through the tile model only");
        variants.push((Int8Kernel::Amx, Some(Int8Activations::U8), 0.02));
    }
    if Int8Kernel::AvxVnni.available() {
        variants.push((Int8Kernel::AvxVnni, Some(Int8Activations::U8), 0.02));
        variants.push((Int8Kernel::AvxVnni, Some(Int8Activations::U16), 0.01));
        variants.push((Int8Kernel::AvxVnni, Some(Int8Activations::U8_OUTLIERS), 0.02));
    } else {
        eprintln!("this CPU has no AVX-VNNI: its kernel is not tested here");
    }
    variants
}

fn quantized(
    w: &[f32],
    k: usize,
    n: usize,
    bias: Option<Vec<f32>>,
    kernel: Int8Kernel,
    bits: Option<Int8Activations>,
) -> QuantizedWeight {
    let mut weight = QuantizedWeight::quantize(w, k, n, bias, kernel);
    if let Some(bits) = bits {
        weight.set_activations(bits);
    }
    assert_eq!(weight.activations(), bits);
    weight
}

/// Against a float64 product: the error of each output is within 1% (2% with 8-bit
/// activations) of the size of its terms (`Σ |x|·|w|`), the bound 8-bit weights and the
/// activations' levels give.
#[test]
fn quantized_products_match_float_products() {
    let pool = rayon::ThreadPoolBuilder::new().num_threads(3).build().expect("pool");
    for (kernel, bits, tolerance) in variants() {
        let mut worst_seen = 0f32;
        for &(m, k, n) in &SHAPES {
            let x = values(m * k, 1);
            let w = values(k * n, 2);
            let bias = values(n, 3);
            let abs = |v: &[f32]| v.iter().map(|v| v.abs()).collect::<Vec<_>>();
            let magnitude = reference(&abs(&x), &abs(&w), m, k, n, None);
            for with_bias in [false, true] {
                let weight = quantized(&w, k, n, with_bias.then(|| bias.clone()), kernel, bits);
                let got = pool.install(|| weight.matmul(&x, m));
                let want = reference(&x, &w, m, k, n, with_bias.then_some(bias.as_slice()));
                let worst = got
                    .iter()
                    .zip(&want)
                    .zip(&magnitude)
                    .map(|((a, b), s)| (a - b).abs() / s.max(1e-6))
                    .fold(0f32, f32::max);
                assert!(
                    worst < tolerance,
                    "{kernel:?} {bits:?} {m}x{k}x{n} bias {with_bias}: relative error {worst}"
                );
                worst_seen = worst_seen.max(worst);
            }
        }
        eprintln!("{kernel:?} {bits:?}: worst relative error {worst_seen:.5}");
    }
}

/// 16-bit activations are far closer to the float product than 8-bit ones (256 times finer
/// steps, so about 65536 times less squared error) where the weights round exactly.
#[test]
fn sixteen_bit_activations_are_closer_than_eight() {
    if !Int8Kernel::Avx512Vnni.available() {
        eprintln!("this CPU has no AVX512-VNNI: skipped");
        return;
    }
    let (m, k, n) = (13, 513, 70);
    // Weights on the int8 grid (each column's largest at ±1), so only activations round.
    let mut w: Vec<f32> = values(k * n, 8)
        .iter()
        .map(|v| (v.clamp(-1.0, 1.0) * 127.0).round() / 127.0)
        .collect();
    w[..n].fill(1.0);
    let x = values(m * k, 7);
    let want = reference(&x, &w, m, k, n, None);
    let error = |bits| {
        let got = quantized(&w, k, n, None, Int8Kernel::Avx512Vnni, Some(bits)).matmul(&x, m);
        got.iter()
            .zip(&want)
            .map(|(a, b)| f64::from(a - b).powi(2))
            .sum::<f64>()
    };
    let (eight, sixteen) = (error(Int8Activations::U8), error(Int8Activations::U16));
    assert!(sixteen < eight / 1000.0, "u16 {sixteen} vs u8 {eight}");
}

/// Outliers held apart are exact: a row of small values with a few huge ones is as close to the
/// float product with outliers as the same row without the huge values is with plain 8 bits,
/// far closer than plain 8 bits on the row with them; a row whose only nonzero values are
/// outliers is exact up to float rounding; the largest magnitudes are the ones held.
#[test]
fn outliers_held_apart_are_exact() {
    if !Int8Kernel::Avx512Vnni.available() {
        eprintln!("this CPU has no AVX512-VNNI: skipped");
        return;
    }
    let (m, k, n) = (5, 300, 70);
    let w: Vec<f32> = values(k * n, 12)
        .iter()
        .map(|v| (v.clamp(-1.0, 1.0) * 127.0).round() / 127.0)
        .collect();
    let mut w = w;
    w[..n].fill(1.0);
    let small: Vec<f32> = values(m * k, 13).iter().map(|v| v.clamp(-1.0, 1.0)).collect();
    let mut spiky = small.clone();
    for r in 0..m {
        spiky[r * k + 17 * r + 3] = 300.0;
        spiky[r * k + 11 * r + 200] = -450.0;
    }
    let error = |x: &[f32], bits| {
        let got = quantized(&w, k, n, None, Int8Kernel::Avx512Vnni, Some(bits)).matmul(x, m);
        let want = reference(x, &w, m, k, n, None);
        got.iter()
            .zip(&want)
            .map(|(a, b)| f64::from(a - b).powi(2))
            .sum::<f64>()
    };
    let plain_small = error(&small, Int8Activations::U8);
    let held_spiky = error(&spiky, Int8Activations::U8Outliers(2));
    let plain_spiky = error(&spiky, Int8Activations::U8);
    assert!(
        held_spiky < 2.0 * plain_small + 1e-6,
        "held {held_spiky} vs {plain_small}"
    );
    assert!(
        held_spiky * 100.0 < plain_spiky,
        "held {held_spiky} vs plain {plain_spiky}"
    );
    // Only outliers (and zeros): the products are the float products.
    let mut sparse = vec![0f32; m * k];
    sparse[5] = 2.5;
    sparse[k + 9] = -1.25;
    let got = quantized(
        &w,
        k,
        n,
        None,
        Int8Kernel::Avx512Vnni,
        Some(Int8Activations::U8Outliers(1)),
    )
    .matmul(&sparse, m);
    let want = reference(&sparse, &w, m, k, n, None);
    for (a, b) in got.iter().zip(&want) {
        assert!((a - b).abs() <= 1e-5 * b.abs().max(1.0), "{a} vs {b}");
    }
    // The held values are the largest magnitudes, ties kept inside.
    let row = [0.5, -8.0, 0.25, 8.0, 3.0, -3.0, 0.0, 1.0];
    let mut bytes = vec![0u8; 8];
    let mut held = vec![(0, 0f32); 3];
    let quant =
        quantize_row_with_outliers(&Portable, &row, 255.0, &mut bytes, &mut held, &mut Vec::new()).expect("finite row");
    // The 4th largest magnitude is 3: ±8 leave, ±3 tie with it and stay.
    assert_eq!(quant.outliers, 2);
    assert_eq!(held[..2], [(1, -8.0), (3, 8.0)]);
    assert_eq!((bytes[1], bytes[3]), (quant.zero as u8, quant.zero as u8));
    assert!((quant.scale - 6.0 / 255.0).abs() < 1e-7);
}

/// Each SIMD kernel's i32 sums equal the portable code's on the same layout, so the outputs
/// are identical.
#[test]
fn the_simd_kernels_give_the_portable_kernels_sums() {
    let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().expect("pool");
    for (kernel, bits, _) in variants() {
        for &(m, k, n) in &SHAPES {
            let x = values(m * k, 4);
            let w = values(k * n, 5);
            for bias in [None, Some(values(n, 6))] {
                let with_bias = bias.is_some();
                let weight = quantized(&w, k, n, bias, kernel, bits);
                let (a, b) = pool.install(|| (weight.matmul(&x, m), weight.matmul_with(&x, m, true)));
                assert!(
                    a.iter().zip(&b).all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{kernel:?} {bits:?} {m}x{k}x{n}, bias {with_bias}"
                );
            }
        }
    }
    // The pair layout's portable kernel is also the AVX2 kernel's: same sums from both weights.
    if Int8Kernel::Avx2.available() {
        let (m, k, n) = (13, 513, 70);
        let (x, w) = (values(m * k, 4), values(k * n, 5));
        let simd = QuantizedWeight::quantize(&w, k, n, None, Int8Kernel::Avx2).matmul(&x, m);
        let scalar = QuantizedWeight::quantize(&w, k, n, None, Int8Kernel::Scalar).matmul(&x, m);
        assert!(simd.iter().zip(&scalar).all(|(a, b)| a.to_bits() == b.to_bits()));
    }
}

/// AMX's route (activations row by row, the rows past the last whole 32-row block on the VNNI tile
/// or on tiles of fewer rows) gives the sums of the VNNI layout's portable route (activations in
/// tiles of 8 rows), so the same outputs bit for bit: on the tiles where this process has them,
/// else through the tile model.
#[test]
fn amx_products_give_the_vnni_layouts_outputs() {
    let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().expect("pool");
    for bits in [Int8Activations::U8, Int8Activations::U16, Int8Activations::U8_OUTLIERS] {
        for &(m, k, n) in &SHAPES {
            let x = values(m * k, 9);
            let w = values(k * n, 10);
            let amx = quantized(&w, k, n, None, Int8Kernel::Amx, Some(bits));
            let vnni = quantized(&w, k, n, None, Int8Kernel::Avx512Vnni, Some(bits));
            let (a, b) = pool.install(|| (amx.matmul(&x, m), vnni.matmul_with(&x, m, true)));
            assert!(
                a.iter().zip(&b).all(|(a, b)| a.to_bits() == b.to_bits()),
                "{bits:?} {m}x{k}x{n}"
            );
        }
    }
}

/// The AVX-512 and AVX2 row quantizations give the portable code's levels and zero point
/// exactly, on rows with tails, ties, negative zeros, a constant row and non-finite values.
#[test]
fn simd_row_quantization_equals_the_portable_one() {
    #[cfg(target_arch = "x86_64")]
    {
        let mut rows: Vec<Vec<f32>> = [1usize, 7, 8, 9, 15, 16, 17, 100, 1024, 2624]
            .iter()
            .map(|&k| values(k, k as u64))
            .collect();
        rows.push(vec![0.0; 33]);
        rows.push(vec![-0.0, 0.0, 1.5, -2.5, 0.5, 65535.0 / 65536.0]);
        rows.push(vec![-0.0, 0.0, 1.5, -2.5, 0.5, 65535.0 / 65536.0, 0.25, -0.0, 3.0]);
        for at in [3, 37] {
            let mut with_nan = values(40, 9);
            with_nan[at] = f32::NAN;
            rows.push(with_nan);
            let mut with_inf = values(40, 10);
            with_inf[at] = f32::NEG_INFINITY;
            rows.push(with_inf);
        }
        let quantizers: [(&str, Option<QuantizeRow>); 2] = [
            (
                "avx512",
                vnni::Vnni::try_new().map(|simd| {
                    Box::new(move |row: &[f32], levels, hi: &mut [u8], lo: Option<&mut [u8]>| {
                        simd.quantize_row(row, levels, hi, lo)
                    }) as QuantizeRow
                }),
            ),
            (
                "avx2",
                avx_vnni::AvxVnni::try_new().map(|simd| {
                    Box::new(move |row: &[f32], levels, hi: &mut [u8], lo: Option<&mut [u8]>| {
                        simd.quantize_row(row, levels, hi, lo)
                    }) as QuantizeRow
                }),
            ),
        ];
        for (name, quantize) in &quantizers {
            let Some(quantize) = quantize else {
                eprintln!("this CPU has no {name} row quantization: not tested here");
                continue;
            };
            for bits in [Int8Activations::U8, Int8Activations::U16] {
                for row in &rows {
                    let quads = row.len().div_ceil(4) * 4;
                    let (mut hi, mut lo) = (vec![0u8; quads], vec![0u8; quads]);
                    let (mut hi2, mut lo2) = (vec![0u8; quads], vec![0u8; quads]);
                    let two = bits == Int8Activations::U16;
                    let portable = quantize_row(row, bits.levels(), &mut hi, two.then_some(&mut lo[..]));
                    let fast = quantize(row, bits.levels(), &mut hi2, two.then_some(&mut lo2[..]));
                    let key = |q: Option<RowQuant>| q.map(|q| (q.scale.to_bits(), q.zero));
                    assert_eq!(key(portable), key(fast), "{name} {bits:?} {} values", row.len());
                    assert_eq!((hi, lo), (hi2, lo2), "{name} {bits:?} {} values", row.len());
                }
            }
        }
        let Some(simd) = vnni::Vnni::try_new() else {
            eprintln!("this CPU has no AVX512-VNNI: its outlier passes are not tested here");
            return;
        };
        // With outliers: the AVX-512 levels inside the clipped range, the same bytes and outliers.
        rows.push(vec![0.0, 0.0, 7.0, 0.0, -9.0]);
        rows.push(vec![3.0; 20]);
        for apart in [1, 4, 40] {
            for row in &rows {
                let quads = row.len().div_ceil(4) * 4;
                let (mut bytes, mut bytes2) = (vec![0u8; quads], vec![0u8; quads]);
                let (mut held, mut held2) = (vec![(0, 0f32); apart], vec![(0, 0f32); apart]);
                let mut scratch = Vec::new();
                let portable = quantize_row_with_outliers(&Portable, row, 255.0, &mut bytes, &mut held, &mut scratch);
                let simd_found = quantize_row_with_outliers(&simd, row, 255.0, &mut bytes2, &mut held2, &mut scratch);
                let key = |q: Option<RowQuant>| q.map(|q| (q.scale.to_bits(), q.zero, q.outliers));
                assert_eq!(key(portable), key(simd_found), "{apart} apart, {} values", row.len());
                assert_eq!(bytes, bytes2, "{apart} apart, {} values", row.len());
                let count = portable.map_or(0, |q| q.outliers as usize);
                assert_eq!(held[..count], held2[..count]);
                assert!(count <= apart.min(row.len() - 1));
            }
        }
    }
}

#[test]
fn small_rounding_rounds_to_the_nearest_level() {
    for (v, want) in [
        (0.4f32, 0.0f32),
        (0.6, 1.0),
        (-0.6, -1.0),
        (126.7, 127.0),
        (-126.7, -127.0),
        (65534.6, 65535.0),
        (2.5, 2.0),
        (3.5, 4.0),
    ] {
        assert_eq!(round_small(v), want, "{v}");
    }
}

/// The integer kernel follows the float family and the CPU: VNNI only where it was detected.
#[test]
fn the_integer_kernel_follows_the_family_and_the_cpu() {
    #[cfg(target_arch = "x86_64")]
    {
        let vnni = std::arch::is_x86_feature_detected!("avx512vnni")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512f");
        assert_eq!(Int8Kernel::Avx512Vnni.available(), vnni);
        assert_eq!(
            Int8Kernel::for_family(CpuKernels::Avx512) == Int8Kernel::Avx512Vnni,
            vnni
        );
        let avx_vnni = std::arch::is_x86_feature_detected!("avxvnni");
        assert_eq!(Int8Kernel::AvxVnni.available(), avx_vnni);
        assert_eq!(
            Int8Kernel::for_family(CpuKernels::Avx2) == Int8Kernel::AvxVnni,
            avx_vnni
        );
        if avx_vnni && !vnni {
            assert_eq!(Int8Kernel::for_family(CpuKernels::Avx512), Int8Kernel::AvxVnni);
        }
    }
    assert_ne!(Int8Kernel::for_family(CpuKernels::Avx2), Int8Kernel::Avx512Vnni);
    // AMX only beside the AMX family, and there wherever the CPU and the kernel grant it.
    #[cfg(target_arch = "x86_64")]
    assert_eq!(
        Int8Kernel::Amx.available(),
        Int8Kernel::Avx512Vnni.available() && Amx::detect().is_ok()
    );
    assert_eq!(
        Int8Kernel::for_family(CpuKernels::Amx) == Int8Kernel::Amx,
        Int8Kernel::Amx.available()
    );
    for family in [CpuKernels::Avx512, CpuKernels::Avx2, CpuKernels::Gemm] {
        assert_ne!(Int8Kernel::for_family(family), Int8Kernel::Amx);
    }
    assert!(Int8Kernel::detect().available());
    assert_eq!(Int8Activations::parse(" U16 "), Ok(Int8Activations::U16));
    assert_eq!(Int8Activations::parse("u8o"), Ok(Int8Activations::U8_OUTLIERS));
    assert_eq!(Int8Activations::parse("u8o:12"), Ok(Int8Activations::U8Outliers(12)));
    for bits in [
        Int8Activations::U8,
        Int8Activations::U16,
        Int8Activations::U8Outliers(7),
    ] {
        assert_eq!(Int8Activations::parse(&bits.to_string()), Ok(bits));
    }
    for bad in ["u4", "u8o:0", "u8o:257", "u8o:x", "u8o:"] {
        assert!(Int8Activations::parse(bad).is_err(), "{bad}");
    }
}

#[test]
fn empty_inputs_zero_weights_and_non_finite_rows() {
    for (kernel, bits, _) in variants() {
        let w = values(8 * 5, 6);
        let weight = quantized(&w, 8, 5, Some(vec![1.0; 5]), kernel, bits);
        assert!(weight.matmul(&[], 0).is_empty());
        // A zero row gives the bias; a row with a NaN or an infinity gives NaN, the others are unharmed.
        let mut x = vec![0f32; 3 * 8];
        x[8] = f32::NAN;
        x[16] = f32::INFINITY;
        let y = weight.matmul(&x, 3);
        assert_eq!(&y[..5], &[1.0; 5], "{kernel:?} {bits:?}");
        assert!(y[5..].iter().all(|v| v.is_nan()), "{kernel:?} {bits:?}");
        let zero = quantized(&[0.0; 12], 3, 4, None, kernel, bits);
        assert_eq!(zero.matmul(&[1.0, 2.0, 3.0], 1), vec![0.0; 4]);
        // No depth at all: the bias, whatever the reused sum buffers held before.
        let _ = weight.matmul(&values(64 * 8, 7), 64);
        let no_depth = quantized(&[], 0, 5, Some(vec![2.0; 5]), kernel, bits);
        assert_eq!(no_depth.matmul(&[], 3), vec![2.0; 15], "{kernel:?} {bits:?}");
    }
}

/// The worst case of the overflow bound: every activation and weight at its largest level.
#[test]
fn the_sums_do_not_overflow_at_full_scale() {
    for (kernel, bits, _) in variants() {
        let k = 4099;
        let weight = quantized(&vec![-1.0; k * 3], k, 3, None, kernel, bits);
        for x in [1.0, -1.0] {
            let y = weight.matmul(&vec![x; k], 1);
            assert!(
                y.iter().all(|&v| (v + x * k as f32).abs() < 1e-3 * k as f32),
                "{kernel:?} {bits:?} {y:?}"
            );
        }
    }
}
