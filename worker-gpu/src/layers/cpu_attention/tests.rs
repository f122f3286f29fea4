use super::*;
use layad_cpu_kernels::bf16::RowsKernel;

fn values(len: usize, seed: u64) -> Vec<f32> {
    let mut state = seed;
    (0..len)
        .map(|_| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            ((state >> 40) as f32 / (1u64 << 24) as f32) * 4.0 - 2.0
        })
        .collect()
}

struct ExpLanes<'a>(&'a mut [f32]);

impl WithSimd for ExpLanes<'_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: Simd>(self, simd: S) {
        let (body, tail) = S::as_mut_simd_f32s(self.0);
        assert!(tail.is_empty(), "whole lanes only");
        for v in body {
            *v = exp_simd(simd, *v);
        }
    }
}

#[test]
fn simd_exp_follows_libm_on_every_family() {
    // Every 1/1024 from −100 (below the smallest normal result) to +20, lane-aligned.
    let inputs: Vec<f32> = (-102_400..20_480 + 32).map(|i| i as f32 / 1024.0).collect();
    for kernels in [CpuKernels::Avx512, CpuKernels::Avx2, CpuKernels::Gemm] {
        if !kernels.available() {
            continue;
        }
        let mut out = inputs.clone();
        let whole = out.len() - out.len() % 16;
        kernels.dispatch(ExpLanes(&mut out[..whole]));
        let mut worst = 0f64;
        for (&x, &y) in inputs.iter().zip(&out[..whole]) {
            let exact = f64::from(x.max(EXP_LOWEST)).exp();
            worst = worst.max((f64::from(y) - exact).abs() / exact);
        }
        assert!(worst < 4e-7, "{kernels}: relative error {worst}");
    }
}

struct RowsRun<'a>(RowsProduct<'a>, usize);

impl WithSimd for RowsRun<'_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: Simd>(self, simd: S) {
        self.0.run(simd, self.1, 2 * S::F32_LANES);
    }
}

#[test]
fn the_in_place_rows_tile_equals_its_portable_loop() {
    // Rows 9 apart over a depth of 7, every row count up to MR, both families' panel widths.
    let x = values(9 * MR, 3);
    for kernels in [CpuKernels::Avx512, CpuKernels::Avx2] {
        if !kernels.available() {
            continue;
        }
        let nr = kernels.panel_width();
        let panel = values(7 * nr, 4);
        for rows in 1..=MR {
            fn product<'a>(x: &'a [f32], panel: &'a [f32], out: &'a mut [f32], nr: usize) -> RowsProduct<'a> {
                RowsProduct {
                    x,
                    x_stride: 9,
                    depth: 7,
                    panel,
                    out,
                    stride: nr + 3,
                }
            }
            let (mut simd, mut portable) = (vec![1f32; MR * (nr + 3)], vec![1f32; MR * (nr + 3)]);
            kernels.dispatch(RowsRun(product(&x, &panel, &mut simd, nr), rows));
            product(&x, &panel, &mut portable, nr).scalar(rows, nr);
            assert!(
                simd.iter().zip(&portable).all(|(a, b)| a.to_bits() == b.to_bits()),
                "{kernels} rows {rows}"
            );
            assert!(
                simd[rows * (nr + 3)..].iter().all(|&v| v == 1.0),
                "rows past {rows} untouched"
            );
        }
    }
}

/// Plain attention in f64 for one row: RoPE, scores over the visible keys, softmax, values.
fn reference(op: &AttentionOp<'_>, qkv: &[f32], row: usize) -> Vec<f32> {
    let (hd, d, n) = (op.head_dim, op.heads * op.head_dim, op.lengths[row]);
    let half = hd / 2;
    let rope = |x: &[f32], t: usize| -> Vec<f64> {
        let mut out = vec![0f64; hd];
        for j in 0..half {
            let (c, s) = (f64::from(op.cos[t * half + j]), f64::from(op.sin[t * half + j]));
            out[j] = f64::from(x[j]) * c - f64::from(x[j + half]) * s;
            out[j + half] = f64::from(x[j + half]) * c + f64::from(x[j]) * s;
        }
        out
    };
    let mut out = vec![0f32; op.len * d];
    for h in 0..op.heads {
        let at = |t: usize, part: usize| (row * op.len + t) * 3 * d + part * d + h * hd;
        for i in 0..n {
            let q = rope(&qkv[at(i, 0)..at(i, 0) + hd], i);
            let visible: Vec<usize> = (0..n)
                .filter(|&j| op.half_window.is_none_or(|w| i.abs_diff(j) <= w))
                .collect();
            let scores: Vec<f64> = visible
                .iter()
                .map(|&j| {
                    let k = rope(&qkv[at(j, 1)..at(j, 1) + hd], j);
                    q.iter().zip(&k).map(|(a, b)| a * b).sum()
                })
                .collect();
            let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
            let total: f64 = weights.iter().sum();
            for dim in 0..hd {
                let v: f64 = visible
                    .iter()
                    .zip(&weights)
                    .map(|(&j, w)| w * f64::from(qkv[at(j, 2) + dim]))
                    .sum();
                out[i * d + h * hd + dim] = (v / total) as f32;
            }
        }
    }
    out
}

#[test]
fn fused_attention_matches_plain_attention() -> candle_core::Result<()> {
    // A head size that fills no whole tile depth (20 pairs) and ModernBERT's (64), two seeds.
    for (heads, head_dim, len, seed) in [(3, 40, 80, 7), (2, 64, 130, 11)] {
        attention_case(heads, head_dim, len, seed)?;
    }
    Ok(())
}

fn attention_case(heads: usize, head_dim: usize, len: usize, seed: u64) -> candle_core::Result<()> {
    let d = heads * head_dim;
    let half = head_dim / 2;
    let angles: Vec<f32> = (0..len * half)
        .map(|i| (i / half) as f32 * 0.1 / (1 + i % half) as f32)
        .collect();
    let cos: Vec<f32> = angles.iter().map(|a| a.cos()).collect();
    let sin: Vec<f32> = angles.iter().map(|a| a.sin()).collect();
    // Lengths: a full row (past two blocks of 32 queries: a sliding window's block then starts
    // past the first key panel), padded rows of one key and of a tile and a half, one longer than
    // a panel.
    let lengths = [len, 1, 9, 37];
    let qkv = values(lengths.len() * len * 3 * d, seed);
    for kernels in [CpuKernels::Avx512, CpuKernels::Avx2] {
        if !kernels.available() {
            continue;
        }
        // f32 products, then bf16 on this CPU's kernel and in portable code: those round q, the
        // keys, the values and the probabilities to 8 bits of mantissa, so they are held to a
        // bound a few times the error measured here instead of f32's, on inputs a quarter the size
        // (scores of ±2 or so, as a trained model's: at ±2 inputs the scores reach ±30 and a
        // rounding moves a near one-hot softmax by 6%).
        let small: Vec<f32> = qkv.iter().map(|v| v / 4.0).collect();
        let precisions = [
            (None, &qkv, 2e-5),
            (Some(RowsKernel::detect(false)), &small, 4e-3),
            (Some(RowsKernel::portable(false)), &small, 4e-3),
            // The tiles' layout: on AMX's tiles where this CPU has them, else in their model.
            (Some(RowsKernel::detect(true)), &small, 4e-3),
            (Some(RowsKernel::portable(true)), &small, 4e-3),
        ];
        for (bf16, qkv, bound) in precisions {
            // Odd and even windows: a tile's first key odd or even.
            for half_window in [None, Some(4), Some(5), Some(20), Some(64)] {
                let op = AttentionOp {
                    lengths: &lengths,
                    len,
                    heads,
                    head_dim,
                    cos: &cos,
                    sin: &sin,
                    half_window,
                    kernels,
                    bf16,
                };
                let layout = Layout::contiguous((lengths.len() * len, 3 * d));
                // The same input with no padding first: its output (no zeros) freed, the next one
                // of the same size most likely gets that memory back, so a padded position the op
                // failed to write would show a value.
                let full = [len; 4];
                drop(AttentionOp { lengths: &full, ..op }.cpu_fwd(&CpuStorage::F32(qkv.to_vec()), &layout)?);
                let (CpuStorage::F32(out), shape) = op.cpu_fwd(&CpuStorage::F32(qkv.to_vec()), &layout)? else {
                    panic!("attention returned another dtype")
                };
                assert_eq!(shape.dims(), [lengths.len() * len, d]);
                for (row, &n) in lengths.iter().enumerate() {
                    let expected = reference(&op, qkv, row);
                    let got = &out[row * len * d..(row + 1) * len * d];
                    // `f32::max` below would pass over a NaN.
                    assert!(
                        got.iter().all(|v| v.is_finite()),
                        "{kernels} bf16 {bf16:?} window {half_window:?} row {row}: not finite"
                    );
                    let worst = got
                        .iter()
                        .zip(&expected)
                        .map(|(a, b)| (a - b).abs())
                        .fold(0f32, f32::max);
                    assert!(
                        worst < bound,
                        "{kernels} bf16 {bf16:?} window {half_window:?} row {row} (length {n}): {worst}"
                    );
                    assert!(got[n * d..].iter().all(|&v| v == 0.0), "padded positions are zero");
                }
            }
        }
    }
    Ok(())
}
