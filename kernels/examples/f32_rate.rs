//! The f32 products' rate at a forward's shapes (ModernBERT-large: the fused q/k/v, the attention's
//! output, the GeGLU input and output), for tuning the kernel without building the engine:
//!
//!     cargo run --release -p layad-cpu-kernels --example f32_rate -- [ROWS] [THREADS] [FAMILY]
//!
//! No bias, as in ModernBERT's layers. Prints, per shape, the best of several products in ms and its multiply-adds per second.

use std::time::Instant;

use layad_cpu_kernels::CpuKernels;
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
    println!("{rows} rows, {threads} threads, {kernels}");
    let mut total = 0.0;
    for (k, n) in [(1024, 3072), (1024, 1024), (1024, 5248), (2624, 1024)] {
        let weight: Vec<f32> = (0..k * n).map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5).collect();
        let x: Vec<f32> = (0..rows * k)
            .map(|i| ((i * 104_729) % 997) as f32 / 997.0 - 0.5)
            .collect();
        let packed = PackedWeight::pack_out_in(&weight, k, n, None, kernels, None);
        let best = pool.install(|| {
            (0..7)
                .map(|_| {
                    let start = Instant::now();
                    std::hint::black_box(packed.matmul(&x, rows));
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
