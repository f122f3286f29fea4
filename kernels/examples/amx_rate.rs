//! The int8 and bf16 products' time at a forward's shapes (ModernBERT-large's four products of a
//! layer) on the kernels this CPU runs for them (AMX's tiles where it has them), for tuning the
//! tile code without building the engine:
//!
//!     cargo run --release -p layad-cpu-kernels --example amx_rate -- [ROWS] [THREADS] [LAYERS]
//!
//! Prints the best of 40 products per shape, summed over the layer, in ms: one layer's weights,
//! used again and again, stay in the last-level cache. With LAYERS > 1 each shape gets LAYERS
//! weights of its own and a pass runs a forward's order (every layer's four products, layer after
//! layer), so that the weights stream from memory as in a forward (28 layers: ~340 MB of int8);
//! it prints the best of 5 passes per layer. `RUNS=N` in the environment replaces the 40 (a
//! profile of many runs is mostly products, not the weights' packing).

use std::time::Instant;

use layad_cpu_kernels::CpuKernels;
use layad_cpu_kernels::f32::PackedWeight;
use layad_cpu_kernels::int8::Int8Kernel;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rows: usize = args.first().and_then(|a| a.parse().ok()).unwrap_or(66);
    let threads: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(2);
    let pool = match rayon::ThreadPoolBuilder::new().num_threads(threads).build() {
        Ok(pool) => pool,
        Err(err) => return eprintln!("thread pool: {err}"),
    };
    let kernels = CpuKernels::detect();
    let int8 = Int8Kernel::for_family(kernels);
    let runs: usize = std::env::var("RUNS").ok().and_then(|r| r.parse().ok()).unwrap_or(40);
    let best = |product: &(dyn Fn() + Sync)| {
        pool.install(|| {
            (0..runs)
                .map(|_| {
                    let start = Instant::now();
                    product();
                    start.elapsed().as_secs_f64()
                })
                .fold(f64::INFINITY, f64::min)
        })
    };
    let layers: usize = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(1);
    let (mut int8_s, mut bf16_s) = (0.0, 0.0);
    let mut stack = Vec::new();
    for (k, n) in [(1024, 3072), (1024, 1024), (1024, 5248), (2624, 1024)] {
        let weight: Vec<f32> = (0..k * n).map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5).collect();
        let x: Vec<f32> = (0..rows * k)
            .map(|i| ((i * 104_729) % 997) as f32 / 997.0 - 0.5)
            .collect();
        let packed = PackedWeight::pack_out_in(&weight, k, n, None, kernels, None);
        if layers > 1 {
            let copies: Vec<_> = (0..layers).map(|_| (packed.quantize(int8), packed.to_bf16())).collect();
            stack.push((x, copies));
            continue;
        }
        let (quantized, rounded) = (packed.quantize(int8), packed.to_bf16());
        int8_s += best(&|| drop(std::hint::black_box(quantized.matmul(&x, rows))));
        bf16_s += best(&|| drop(std::hint::black_box(rounded.matmul(&x, rows))));
    }
    if layers > 1 {
        let pass = |bf16: bool| {
            pool.install(|| {
                (0..5)
                    .map(|_| {
                        let start = Instant::now();
                        for layer in 0..layers {
                            for (x, copies) in &stack {
                                let (quantized, rounded) = &copies[layer];
                                let out = if bf16 {
                                    rounded.matmul(x, rows)
                                } else {
                                    quantized.matmul(x, rows)
                                };
                                drop(std::hint::black_box(out));
                            }
                        }
                        start.elapsed().as_secs_f64() / layers as f64
                    })
                    .fold(f64::INFINITY, f64::min)
            })
        };
        (int8_s, bf16_s) = (pass(false), pass(true));
    }
    println!(
        "{rows} rows, {threads} threads, {layers} layers, {kernels}: int8 ({}) {:.2} ms per layer, bf16 {:.2} ms per layer",
        int8.as_str(),
        int8_s * 1e3,
        bf16_s * 1e3
    );
}
