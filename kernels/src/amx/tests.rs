use super::*;

/// Deterministic pseudo-random words.
fn words(len: usize, seed: u64) -> Vec<u32> {
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 16) as u32
        })
        .collect()
}

/// bf16 bits of values in about ±2 (no subnormals, no NaN).
fn bf16_values(len: usize, seed: u64) -> Vec<u16> {
    words(len, seed)
        .into_iter()
        .map(|w| {
            let v = (f64::from(w % 4001) - 2000.0) / 1000.0;
            ((v as f32).to_bits() >> 16) as u16
        })
        .collect()
}

/// Shapes with partial row blocks (1, 15, 17, 33 rows), several depth steps and panels, and an
/// output wider than the block.
const SHAPES: &[(usize, usize, usize, usize)] = &[
    // (rows, words, panels, extra output columns)
    (1, 16, 1, 0),
    (15, 32, 2, 5),
    (16, 16, 1, 0),
    (17, 48, 3, 0),
    (32, 16, 2, 32),
    (33, 64, 1, 1),
    (64, 32, 2, 0),
];

/// `a · b` of the int8 format in plain integer arithmetic, `[rows, panels·32]`.
fn int8_reference(a: &[u32], rows: usize, words: usize, panels: &[i8], count: usize) -> Vec<i32> {
    let width = count * PANEL_COLUMNS;
    let mut out = vec![0i32; rows * width];
    for r in 0..rows {
        for col in 0..width {
            let (p, c) = (col / PANEL_COLUMNS, col % PANEL_COLUMNS);
            let mut sum = 0i32;
            for d in 0..words * 4 {
                let act = a[r * words + d / 4].to_le_bytes()[d % 4];
                let w = panels[p * words * PANEL_COLUMNS * 4 + (d / 4) * PANEL_COLUMNS * 4 + 4 * c + d % 4];
                sum += i32::from(act) * i32::from(w);
            }
            out[r * width + col] = sum;
        }
    }
    out
}

/// Activations (rows `a_stride` words apart) and panels of one int8 product.
fn int8_case(rows: usize, words_deep: usize, count: usize, seed: u64, a_stride: usize) -> (Vec<u32>, Vec<i8>) {
    let mut a = words(rows.next_multiple_of(TILE_ROWS) * a_stride, seed);
    // The rows past `rows` are read by the tiles: make them differ from zero, so a sum that took
    // them in would show.
    a.iter_mut().skip(rows * a_stride).for_each(|w| *w |= 0x0101_0101);
    let panels = words(count * words_deep * PANEL_COLUMNS, seed + 1)
        .into_iter()
        .flat_map(u32::to_le_bytes)
        .map(|b| b as i8)
        .collect();
    (a, panels)
}

#[test]
fn the_int8_tile_model_sums_the_panel_layout_exactly() {
    for (i, &(rows, depth, count, extra)) in SHAPES.iter().enumerate() {
        let (a, panels) = int8_case(rows, depth, count, i as u64, depth);
        let stride = count * PANEL_COLUMNS + extra;
        let mut out = vec![-7i32; rows * stride];
        TileProduct::<Int8Tiles> {
            a: &a,
            a_stride: depth,
            rows,
            words: depth,
            panels: &panels,
            out: &mut out,
            stride,
        }
        .model();
        let want = int8_reference(&a, rows, depth, &panels, count);
        for r in 0..rows {
            let width = count * PANEL_COLUMNS;
            assert_eq!(
                &out[r * stride..r * stride + width],
                &want[r * width..(r + 1) * width],
                "{rows}x{depth}x{count} row {r}"
            );
            assert!(
                out[r * stride + width..(r + 1) * stride].iter().all(|&v| v == -7),
                "columns past the block stay"
            );
        }
    }
}

#[test]
fn the_bf16_tile_model_is_close_to_a_float64_product() {
    for (i, &(rows, depth, count, _)) in SHAPES.iter().enumerate() {
        let a: Vec<u32> = bf16_values(rows.next_multiple_of(TILE_ROWS) * depth * 2, i as u64)
            .chunks_exact(2)
            .map(|p| u32::from(p[0]) | u32::from(p[1]) << 16)
            .collect();
        let panels = bf16_values(count * depth * PANEL_COLUMNS * 2, i as u64 + 7);
        let stride = count * PANEL_COLUMNS;
        let mut out = vec![0f32; rows * stride];
        TileProduct::<Bf16Tiles> {
            a: &a,
            a_stride: depth,
            rows,
            words: depth,
            panels: &panels,
            out: &mut out,
            stride,
        }
        .model();
        let value = |bits: u16| f64::from(f32::from_bits(u32::from(bits) << 16));
        for r in 0..rows {
            for col in 0..stride {
                let (p, c) = (col / PANEL_COLUMNS, col % PANEL_COLUMNS);
                let (mut want, mut size) = (0f64, 0f64);
                for d in 0..depth * 2 {
                    let x = value((a[r * depth + d / 2] >> (16 * (d % 2))) as u16);
                    let w = value(panels[p * depth * PANEL_COLUMNS * 2 + (d / 2) * PANEL_COLUMNS * 2 + 2 * c + d % 2]);
                    want += x * w;
                    size += (x * w).abs();
                }
                let got = f64::from(out[r * stride + col]);
                assert!(
                    (got - want).abs() <= 1e-6 * size.max(1.0),
                    "{rows}x{depth} ({r}, {col}): {got} vs {want}"
                );
            }
        }
    }
}

/// Where the CPU has AMX and the kernel grants it: the tiles give the model's sums bit for bit.
#[test]
fn amx_tiles_equal_the_tile_model() {
    let amx = match Amx::detect() {
        Ok(amx) => amx,
        Err(reason) => {
            eprintln!("AMX not run: {reason}");
            return;
        }
    };
    for (i, &(rows, depth, count, extra)) in SHAPES.iter().enumerate() {
        let stride = count * PANEL_COLUMNS + extra;
        // Rows one cache line apart more than their length, as the worker lays them out.
        let a_stride = row_stride(depth);
        let (a, panels) = int8_case(rows, depth, count, 100 + i as u64, a_stride);
        let (mut got, mut want) = (vec![-3i32; rows * stride], vec![-3i32; rows * stride]);
        amx.multiply(TileProduct::<Int8Tiles> {
            a: &a,
            a_stride,
            rows,
            words: depth,
            panels: &panels,
            out: &mut got,
            stride,
        });
        TileProduct::<Int8Tiles> {
            a: &a,
            a_stride,
            rows,
            words: depth,
            panels: &panels,
            out: &mut want,
            stride,
        }
        .model();
        assert_eq!(got, want, "int8 {rows}x{depth}x{count}");

        let a: Vec<u32> = bf16_values(rows.next_multiple_of(TILE_ROWS) * depth * 2, 200 + i as u64)
            .chunks_exact(2)
            .map(|p| u32::from(p[0]) | u32::from(p[1]) << 16)
            .collect();
        let panels = bf16_values(count * depth * PANEL_COLUMNS * 2, 300 + i as u64);
        let (mut got, mut want) = (vec![0.5f32; rows * stride], vec![0.5f32; rows * stride]);
        amx.multiply(TileProduct::<Bf16Tiles> {
            a: &a,
            a_stride: depth,
            rows,
            words: depth,
            panels: &panels,
            out: &mut got,
            stride,
        });
        TileProduct::<Bf16Tiles> {
            a: &a,
            a_stride: depth,
            rows,
            words: depth,
            panels: &panels,
            out: &mut want,
            stride,
        }
        .model();
        let bits = |v: &[f32]| v.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&got), bits(&want), "bf16 {rows}x{depth}x{count}");
    }
}

#[test]
fn detection_follows_the_cpu() {
    match Amx::detect() {
        Ok(_) => assert!(permission::cpu_has_amx()),
        Err(AmxUnavailable::NotInCpu) => assert!(!permission::cpu_has_amx()),
        Err(AmxUnavailable::Refused(reason)) => {
            assert!(permission::cpu_has_amx());
            assert!(!reason.is_empty());
        }
    }
    assert_eq!(Amx::detect(), Amx::detect(), "asked once, the same answer");
    assert_eq!(
        AmxUnavailable::Refused("arch_prctl failed".to_owned()).to_string(),
        "AMX refused: arch_prctl failed"
    );
    #[cfg(target_arch = "x86_64")]
    assert_eq!(
        permission::cpu_has_amx(),
        std::fs::read_to_string("/proc/cpuinfo").is_ok_and(|info| {
            info.lines().find(|l| l.starts_with("flags")).is_some_and(|flags| {
                ["amx_tile", "amx_int8", "amx_bf16"]
                    .iter()
                    .all(|f| flags.split_whitespace().any(|w| w == *f))
            })
        }) || std::fs::metadata("/proc/cpuinfo").is_err()
    );
}

/// The tile model of an int8 product of zeros: `a_words` activation words for `rows` rows of
/// `words`, one panel, `out_len` sums; panics where `check` refuses the shapes.
fn model_of_zeros(a_words: usize, rows: usize, words: usize, out_len: usize) {
    let a = vec![0u32; a_words];
    let panels = vec![0i8; words * PANEL_COLUMNS * 4];
    let mut out = vec![0i32; out_len];
    TileProduct::<Int8Tiles> {
        a: &a,
        a_stride: words,
        rows,
        words,
        panels: &panels,
        out: &mut out,
        stride: PANEL_COLUMNS,
    }
    .model();
}

#[test]
#[should_panic(expected = "not a positive multiple")]
fn a_depth_of_partial_tiles_is_refused() {
    model_of_zeros(16 * 8, 16, 8, 16 * PANEL_COLUMNS);
}

#[test]
#[should_panic(expected = "activations hold")]
fn activations_without_their_padding_rows_are_refused() {
    model_of_zeros(17 * 16, 17, 16, 17 * PANEL_COLUMNS);
}

#[test]
#[should_panic(expected = "output holds")]
fn a_short_output_is_refused() {
    model_of_zeros(16 * 16, 2, 16, 2 * PANEL_COLUMNS - 1);
}

#[test]
fn a_product_of_the_right_shapes_is_taken() {
    model_of_zeros(32 * 16, 17, 16, 17 * PANEL_COLUMNS);
}

#[test]
fn pair_word_panels_give_the_bf16_panels_sums_bit_for_bit() {
    // The attention's keys and values arrive as pair words (`Bf16Words`), the weights as bf16
    // halves (`Bf16Tiles`): the same bytes must give the same sums, in the model and on the tiles.
    for (i, &(rows, depth, count, extra)) in SHAPES.iter().enumerate() {
        let a: Vec<u32> = bf16_values(rows.next_multiple_of(TILE_ROWS) * depth * 2, 400 + i as u64)
            .chunks_exact(2)
            .map(|p| u32::from(p[0]) | u32::from(p[1]) << 16)
            .collect();
        let halves = bf16_values(count * depth * PANEL_COLUMNS * 2, 500 + i as u64);
        let pair_words: Vec<u32> = halves
            .chunks_exact(2)
            .map(|p| u32::from(p[0]) | u32::from(p[1]) << 16)
            .collect();
        let stride = count * PANEL_COLUMNS + extra;
        let bits = |v: &[f32]| v.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        for portable in [true, false] {
            let (mut got, mut want) = (vec![0.5f32; rows * stride], vec![0.5f32; rows * stride]);
            TileProduct::<Bf16Words> {
                a: &a,
                a_stride: depth,
                rows,
                words: depth,
                panels: &pair_words,
                out: &mut got,
                stride,
            }
            .run(portable);
            TileProduct::<Bf16Tiles> {
                a: &a,
                a_stride: depth,
                rows,
                words: depth,
                panels: &halves,
                out: &mut want,
                stride,
            }
            .model();
            assert_eq!(bits(&got), bits(&want), "{rows}x{depth}x{count}, portable {portable}");
        }
    }
}
