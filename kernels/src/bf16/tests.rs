use super::*;
use crate::f32::tests::reference;

/// Every kernel: each falls back to its portable twin where the CPU lacks it.
const KERNELS: [Bf16Kernel; 4] = [
    Bf16Kernel::DotPairs,
    Bf16Kernel::Halves,
    Bf16Kernel::Widened,
    Bf16Kernel::Tiles,
];

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

#[test]
fn rounding_to_f16_is_to_nearest_even() {
    // Every f16 value converts to its value and back.
    for bits in 0..=u16::MAX {
        let value = from_f16(bits);
        if value.is_nan() {
            assert!(from_f16(to_f16(f64::from(value))).is_nan(), "{bits:#06x}");
        } else {
            assert_eq!(to_f16(f64::from(value)), bits, "{bits:#06x} = {value}");
        }
    }
    assert_eq!(to_f16(1.0), 0x3c00);
    assert_eq!(from_f16(to_f16(1.0 + 1.0 / 2048.0)), 1.0, "a tie rounds to even");
    assert_eq!(
        from_f16(to_f16(1.0 + 3.0 / 2048.0)),
        1.0 + 4.0 / 2048.0,
        "a tie rounds to even"
    );
    assert_eq!(from_f16(to_f16(1.0 + 1.1 / 2048.0)), 1.0 + 2.0 / 2048.0);
    assert_eq!(from_f16(to_f16(2047.5)), 2048.0, "rounding carries into the exponent");
    assert_eq!(from_f16(to_f16(65519.9)), 65504.0, "the largest finite value");
    assert_eq!(from_f16(to_f16(-65520.0)), f32::NEG_INFINITY, "halfway past it: ∞");
    let quantum = 2f64.powi(-24);
    assert_eq!(to_f16(quantum), 1, "the smallest subnormal value");
    assert_eq!(to_f16(quantum / 2.0), 0, "a tie rounds to even: zero");
    assert_eq!(to_f16(quantum * 1.5), 2, "a tie rounds to even");
    assert_eq!(to_f16(-quantum / 4.0), 0x8000, "negative zero keeps its sign");
    assert_eq!(
        to_f16(quantum * 1023.6),
        0x0400,
        "rounding carries into the normal values"
    );
    assert_eq!(to_f16(f64::NAN) & 0x7e00, 0x7e00);
}

/// The SIMD kernel (where the CPU has it) and the portable one, against a float64 product:
/// within 1% of the size of the terms (`Σ |x|·|w|`; bf16 keeps 8 bits of mantissa).
#[test]
fn bf16_products_match_float_products() {
    let pool = rayon::ThreadPoolBuilder::new().num_threads(3).build().expect("pool");
    if !dot_pairs_available() {
        eprintln!("this CPU has no AVX512_BF16: only the portable vdpbf16ps tile is tested");
    }
    for &(m, k, n) in &[(1, 5, 3), (7, 300, 37), (13, 513, 70), (64, 64, 33), (9, 1, 40)] {
        let x = values(m * k, 1);
        let w = values(k * n, 2);
        let bias = values(n, 3);
        let abs = |v: &[f32]| v.iter().map(|v| v.abs()).collect::<Vec<_>>();
        let magnitude = reference(&abs(&x), &abs(&w), m, k, n, None);
        let want = reference(&x, &w, m, k, n, Some(&bias));
        for kernel in KERNELS {
            let weight = Bf16Weight::pack_with(
                |d, first, out: &mut [f32]| out.copy_from_slice(&w[d * n + first..][..out.len()]),
                k,
                n,
                Some(bias.clone()),
                kernel,
            );
            for portable in [false, true] {
                let got = pool.install(|| weight.matmul_with(&x, m, portable));
                let worst = got
                    .iter()
                    .zip(&want)
                    .zip(&magnitude)
                    .map(|((a, b), s)| (a - b).abs() / s.max(1e-6))
                    .fold(0f32, f32::max);
                assert!(worst < 0.01, "{m}x{k}x{n} {kernel:?} portable {portable}: {worst}");
            }
            // The SIMD and portable sums differ at most by f32 rounding.
            let (a, b) = pool.install(|| (weight.matmul_with(&x, m, false), weight.matmul_with(&x, m, true)));
            let worst = a
                .iter()
                .zip(&b)
                .zip(&magnitude)
                .map(|((a, b), s)| (a - b).abs() / s.max(1e-6))
                .fold(0f32, f32::max);
            assert!(worst < 1e-5, "{m}x{k}x{n} {kernel:?}: SIMD vs portable {worst}");
            // AMX's tiles give the tile model's sums bit for bit, and the widened kernel its
            // portable twin's (the same fused multiply-adds in the same order).
            let exact = match kernel {
                Bf16Kernel::Tiles => crate::amx::Amx::detect().is_ok(),
                Bf16Kernel::Halves | Bf16Kernel::Widened => true,
                Bf16Kernel::DotPairs => false,
            };
            if exact {
                assert!(
                    a.iter().zip(&b).all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{m}x{k}x{n}: {kernel:?} vs its portable twin"
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
    for kernel in KERNELS {
        let no_depth = Bf16Weight::pack_with(|_, _, out: &mut [f32]| out.fill(0.0), 0, 3, Some(vec![0.5; 3]), kernel);
        assert_eq!(no_depth.matmul(&[], 2), vec![0.5; 6]);
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
    // Past 256 depths the rows are packed a block of depths at a time (`PACK_DEPTHS`).
    for k in [1, 2, 15, 16, 17, 31, 32, 33, 64, 100, 517, 600, special.len()] {
        let m = 3;
        let mut x = values(m * k, k);
        if k == special.len() {
            x[k..2 * k].copy_from_slice(&special);
        }
        for kernel in KERNELS {
            let weight = Bf16Weight::pack_with(|_, _, out: &mut [f32]| out.fill(1.0), k, 5, None, kernel);
            let (simd, portable) = (weight.pack_rows(&x, m, false), weight.pack_rows(&x, m, true));
            assert_eq!(simd.words, portable.words, "k = {k} {kernel:?}");
            assert_eq!(simd.scales, portable.scales, "k = {k} {kernel:?}");
            // `vdpbf16ps`' rows are pair words, a pair's rows together; the widened kernel's the
            // rounded values themselves, a depth's rows together; the f16 kernel's the scaled
            // values rounded to f16, twice in a word, the row's largest finite magnitude scaled
            // into [2^9, 2^10).
            if kernel == Bf16Kernel::DotPairs {
                for (d, r) in (0..k).step_by(2).flat_map(|d| (0..m).map(move |r| (d, r))) {
                    let pair = &x[r * k + d..r * k + (d + 2).min(k)];
                    assert_eq!(
                        portable.words[d / 2 * MR + r],
                        pair_word(pair),
                        "k = {k}: depth {d} row {r}"
                    );
                }
            }
            let values = matches!(kernel, Bf16Kernel::Widened | Bf16Kernel::Halves);
            for (d, r) in (0..k).flat_map(|d| (0..m).map(move |r| (d, r))).filter(|_| values) {
                let (got, value) = (portable.words[d * MW + r], x[r * k + d]);
                if kernel == Bf16Kernel::Widened {
                    assert_eq!(got, u32::from(to_bf16(value)) << 16, "k = {k}: depth {d} row {r}");
                }
                if kernel == Bf16Kernel::Halves {
                    let half = to_f16(f64::from(value / portable.scales[r]));
                    assert_eq!(got, u32::from(half) * 0x1_0001, "k = {k}: depth {d} row {r}");
                }
            }
            if kernel == Bf16Kernel::Halves {
                for r in 0..m {
                    let row = &x[r * k..(r + 1) * k];
                    let peak = finite_peak(row);
                    let scaled = peak / portable.scales[r];
                    assert!(
                        (512.0..1024.0).contains(&scaled),
                        "k = {k} row {r}: {peak} scaled {scaled}"
                    );
                }
            }
        }
    }
    let subnormal = f32::MIN_POSITIVE / 4.0;
    let weight = Bf16Weight::pack_with(|_, _, out: &mut [f32]| out.fill(1.0), 2, 1, None, Bf16Kernel::DotPairs);
    if dot_pairs_available() {
        assert_eq!(
            weight.pack_rows(&[subnormal, -subnormal], 1, false).words[0],
            0x8000_0000
        );
    }
    assert_ne!(
        weight.pack_rows(&[subnormal, -subnormal], 1, true).words[0],
        0x8000_0000
    );
    // The widened kernel's rounding keeps them, as the portable one does.
    let weight = Bf16Weight::pack_with(|_, _, out: &mut [f32]| out.fill(1.0), 2, 1, None, Bf16Kernel::Widened);
    assert_ne!(weight.pack_rows(&[subnormal, -subnormal], 1, false).words[0], 0);
}

/// Rows and weights far outside f16's range (and far inside it): the f16 kernel's scales keep its
/// sums finite and as close as bf16's, as every other kernel's, SIMD and portable; rows of
/// different magnitudes in one tile, columns of different magnitudes in one weight.
#[test]
fn products_hold_at_any_magnitude() {
    let (m, k, n) = (5, 300, 70);
    let row_sizes = [1e6f32, 1.0, 1e-7, 3e4, 1e-30];
    let column_sizes = |c: usize| if c < 32 { 1e3f32 } else { 1e-6 };
    let x: Vec<f32> = values(m * k, 4)
        .iter()
        .enumerate()
        .map(|(i, v)| v * row_sizes[i / k])
        .collect();
    let w: Vec<f32> = values(k * n, 5)
        .iter()
        .enumerate()
        .map(|(i, v)| v * column_sizes(i % n))
        .collect();
    let abs = |v: &[f32]| v.iter().map(|v| v.abs()).collect::<Vec<_>>();
    let magnitude = reference(&abs(&x), &abs(&w), m, k, n, None);
    let want = reference(&x, &w, m, k, n, None);
    for kernel in KERNELS {
        let weight = Bf16Weight::pack_with(
            |d, first, out: &mut [f32]| out.copy_from_slice(&w[d * n + first..][..out.len()]),
            k,
            n,
            None,
            kernel,
        );
        for portable in [false, true] {
            let got = weight.matmul_with(&x, m, portable);
            for (i, ((a, b), s)) in got.iter().zip(&want).zip(&magnitude).enumerate() {
                assert!(
                    (a - b).abs() <= 0.01 * s,
                    "{kernel:?} portable {portable}: row {} column {}: {a} vs {b} (size {s})",
                    i / n,
                    i % n
                );
            }
        }
    }
}

#[test]
fn the_kernel_follows_the_family_and_the_cpu() {
    #[cfg(target_arch = "x86_64")]
    assert_eq!(
        dot_pairs_available(),
        std::arch::is_x86_feature_detected!("avx512bf16") && std::arch::is_x86_feature_detected!("avx512bw")
    );
    // The vendor read from CPUID, as Linux reads it.
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    if let Ok(info) = std::fs::read_to_string("/proc/cpuinfo") {
        assert_eq!(half_rate_dot_pairs(), info.contains("GenuineIntel"));
    }
    assert_eq!(Bf16Kernel::for_family(CpuKernels::Avx2), None);
    assert_eq!(Bf16Kernel::for_family(CpuKernels::Gemm), None);
    #[cfg(target_arch = "x86_64")]
    assert_eq!(
        halves_available(),
        std::arch::is_x86_feature_detected!("avx512fp16") && std::arch::is_x86_feature_detected!("avx512bw")
    );
    let avx512 = Bf16Kernel::for_family(CpuKernels::Avx512);
    let expected = if !CpuKernels::Avx512.available() {
        Some(Bf16Kernel::Widened) // the family is only named here: its portable twin runs
    } else if dot_pairs_available() && !half_rate_dot_pairs() {
        Some(Bf16Kernel::DotPairs)
    } else if halves_available() {
        Some(Bf16Kernel::Halves)
    } else {
        Some(Bf16Kernel::Widened)
    };
    assert_eq!(avx512, expected);
    if CpuKernels::Amx.available() {
        assert_eq!(Bf16Kernel::for_family(CpuKernels::Amx), Some(Bf16Kernel::Tiles));
    }
    let names: Vec<_> = KERNELS.iter().map(|k| k.as_str()).collect();
    assert_eq!(names, ["avx512-bf16", "avx512-fp16", "avx512-bf16-widened", "amx-bf16"]);
    let empty = Bf16Weight::pack_with(|_, _, out: &mut [f32]| out.fill(1.0), 3, 2, None, Bf16Kernel::Tiles);
    assert!(empty.matmul(&[], 0).is_empty());
}

/// Rows laid out one at a time into a tile (the attention's products): the kernel and the portable
/// code, each against a float64 product of the same bf16 values within f32 rounding, for row counts
/// up to the most and odd depths, two panels 5 words apart, an output wider than the panels; the
/// sums are stored over whatever `out` held (NaN here), and the tile's other rows (NaN) unread.
#[test]
fn rows_products_match_float_products() {
    let kernels = [RowsKernel::detect(false), RowsKernel::portable(false)];
    for &(rows, depth) in &[(1usize, 1usize), (3, 7), (MAX_ROWS, 64), (5, 130), (2, 2)] {
        let pairs = depth.div_ceil(2);
        let x = values(rows * depth, rows + depth);
        let w = values(depth * PANEL_COLUMNS, depth);
        // Two panels 5 words apart past the first's end: per depth pair, per column, its two
        // values (zero past `depth`); the second panel is the first's columns negated.
        let panel_stride = pairs * PANEL_COLUMNS + 5;
        let mut weights = vec![0u32; 2 * panel_stride];
        for d in 0..depth {
            for c in 0..PANEL_COLUMNS {
                let value = w[d * PANEL_COLUMNS + c];
                let at = (d / 2) * PANEL_COLUMNS + c;
                weights[at] |= u32::from(to_bf16(value)) << (16 * (d % 2));
                weights[panel_stride + at] |= u32::from(to_bf16(-value)) << (16 * (d % 2));
            }
        }
        let row_values = |r: usize| &x[r * depth..(r + 1) * depth];
        for kernel in kernels {
            // The rows as one tile, the words of rows past `rows` left as they were.
            let mut tile = vec![u32::MAX; pairs * MAX_ROWS];
            for r in 0..rows {
                kernel.pair_words(row_values(r), &mut tile[r..], MAX_ROWS);
            }
            let stride = 2 * PANEL_COLUMNS + 3;
            let mut out = vec![f32::NAN; (rows - 1) * stride + 2 * PANEL_COLUMNS];
            kernel.run(RowsProduct {
                tile: &tile,
                rows,
                pairs,
                panels: 2,
                panel_stride,
                weights: &weights,
                out: &mut out,
                stride,
            });
            for r in 0..rows {
                for c in 0..PANEL_COLUMNS {
                    assert_eq!(
                        out[r * stride + PANEL_COLUMNS + c].to_bits(),
                        (-out[r * stride + c]).to_bits(),
                        "{rows}x{depth} row {r} column {c}: the negated panel"
                    );
                    let (mut want, mut size) = (0f64, 0f64);
                    for d in 0..depth {
                        let term = f64::from(from_bf16(to_bf16(row_values(r)[d])))
                            * f64::from(from_bf16(to_bf16(w[d * PANEL_COLUMNS + c])));
                        want += term;
                        size += term.abs();
                    }
                    let got = f64::from(out[r * stride + c]);
                    assert!(
                        (got - want).abs() <= 1e-5 * size.max(1e-6),
                        "{rows}x{depth} row {r} column {c}: {got} vs {want}"
                    );
                }
            }
        }
    }
}

/// Interleaved words (two rows' values as the halves of each word): the kernel's equal the
/// portable ones bit for bit, ties, NaN, infinities and a `high` shorter than `low` included.
#[test]
fn interleaved_words_equal_the_portable_ones() {
    let (simd, portable) = (RowsKernel::detect(false), RowsKernel::portable(false));
    let mut low = values(40, 5);
    low[..5].copy_from_slice(&[1.0 + 1.0 / 256.0, f32::NAN, f32::INFINITY, -0.0, f32::MAX]);
    let high = values(40, 6);
    for (len, high_len) in [(40, 40), (40, 21), (17, 0), (16, 16), (1, 1), (0, 0)] {
        let mut words = [vec![7u32; 41], vec![7u32; 41]];
        for (kernel, words) in [simd, portable].into_iter().zip(&mut words) {
            kernel.interleaved_words(&low[..len], &high[..high_len], words);
        }
        assert_eq!(words[0], words[1], "{len} values, {high_len} high ones");
        assert!(words[0][len..].iter().all(|&w| w == 7), "words past {len} untouched");
        for c in 0..len {
            let high = if c < high_len { to_bf16(high[c]) } else { 0 };
            assert_eq!(words[1][c] >> 16, u32::from(high), "{len}: the high half of word {c}");
        }
    }
}
