//! The f32 (or bf16) products' rate at a forward's shapes (ModernBERT-large: the fused q/k/v, the
//! attention's output, the GeGLU input and output), for tuning the kernels without building the
//! engine:
//!
//!     cargo run --release -p layad-cpu-kernels --example f32_rate -- [ROWS] [THREADS] [FAMILY] [BF16]
//!
//! `BF16` runs the weights rounded to bf16 instead: `bf16` (the kernel beside the family),
//! `amx-bf16`, `avx512-bf16`, `avx512-fp16` or `avx512-bf16-widened`. No bias, as in ModernBERT's layers. Prints,
//! per shape, the best of several products in ms and its multiply-adds per second.

use std::time::Instant;

use layad_cpu_kernels::CpuKernels;
use layad_cpu_kernels::bf16::{Bf16Kernel, Bf16Weight};
use layad_cpu_kernels::f32::PackedWeight;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rows: usize = args.first().and_then(|a| a.parse().ok()).unwrap_or(512);
    let threads: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(2);
    let kernels = match args.get(2).map(|a| CpuKernels::parse(a)) {
        Some(Ok(Some(kernels))) => kernels,
        _ => CpuKernels::detect(),
    };
    let pool = match rayon::ThreadPoolBuilder::new().num_threads(threads).build() {
        Ok(pool) => pool,
        Err(err) => return eprintln!("thread pool: {err}"),
    };
    let bf16 = match args.get(3).map(String::as_str) {
        None => None,
        Some("bf16") => Bf16Kernel::for_family(kernels),
        Some(name) => [
            Bf16Kernel::Tiles,
            Bf16Kernel::DotPairs,
            Bf16Kernel::Halves,
            Bf16Kernel::Widened,
        ]
        .into_iter()
        .find(|k| k.as_str() == name),
    };
    if args.len() > 3 && bf16.is_none() {
        return eprintln!("no bf16 kernel '{}' beside {kernels}", args[3]);
    }
    let precision = bf16.map_or("f32", Bf16Kernel::as_str);
    println!("{rows} rows, {threads} threads, {kernels}, {precision}");
    let mut total = 0.0;
    for (k, n) in [(1024, 3072), (1024, 1024), (1024, 5248), (2624, 1024)] {
        let weight: Vec<f32> = (0..k * n).map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5).collect();
        let x: Vec<f32> = (0..rows * k)
            .map(|i| ((i * 104_729) % 997) as f32 / 997.0 - 0.5)
            .collect();
        let packed = PackedWeight::pack_out_in(&weight, k, n, None, kernels, None);
        let rounded = bf16.map(|kernel| {
            let row = |d: usize, first: usize, out: &mut [f32]| {
                for (c, o) in out.iter_mut().enumerate() {
                    *o = weight[(first + c) * k + d];
                }
            };
            Bf16Weight::pack_with(row, k, n, None, kernel)
        });
        let best = pool.install(|| {
            (0..7)
                .map(|_| {
                    let start = Instant::now();
                    match &rounded {
                        Some(rounded) => std::hint::black_box(rounded.matmul(&x, rows)),
                        None => std::hint::black_box(packed.matmul(&x, rows)),
                    };
                    start.elapsed().as_secs_f64()
                })
                .fold(f64::INFINITY, f64::min)
        });
        total += best;
        let rate = (rows * k * n) as f64 / best / 1e9;
        println!("[{rows}, {k}] x [{k}, {n}]: {:.2} ms, {rate:.1} G MAC/s", best * 1e3);
    }
    println!("per layer: {:.1} ms; 28 layers: {:.0} ms", total * 1e3, total * 28e3);
}
