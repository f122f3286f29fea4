//! `layad-bench`: forward latency of the candle engine on random-weight checkpoints of the published
//! sizes, side by side with upstream PyTorch CPU fp32 and (optionally) ONNX Runtime f32 and int8
//! (`tools/bench/onnx_forward.py`) on the same files, in the same run (engine after engine, each over
//! every shape; `--rounds 2` runs them A B B A).
//!
//! Prints a markdown table (the one in `docs/benchmarks.md`) and writes every number, with the
//! machine's measured f32 GEMM peak and an output parity check against upstream, as JSON.

mod checkpoint;
mod upstream;

use std::ffi::OsStr;
use std::path::PathBuf;
use std::time::Instant;

use candle_core::{Device, Tensor};
use clap::Parser;
use laya::checkpoint::Location;
use laya::question::QuestionType;
use layad_proto::{Engine, ForwardLimits, Row};
use serde_json::{Value, json};
use worker_gpu::device::CpuThreads;
use worker_gpu::{CandleEngine, CpuKernels, DeviceRequest, EngineOptions, Int8Activations, Precision};

use checkpoint::ModelSpec;
use upstream::UpstreamSession;

/// Forward latency of the candle engine vs upstream PyTorch at the published model sizes.
#[derive(Parser, Debug)]
struct Args {
    /// Where the random checkpoints (reused across runs) and the JSON result go.
    #[arg(long, default_value = "target/bench")]
    out_dir: PathBuf,
    /// Models to run: modernbert-large, mmbert-base, modernbert-mini (the scheduling benchmark's).
    #[arg(long, value_delimiter = ',', default_value = "modernbert-large,mmbert-base")]
    models: Vec<String>,
    /// Vocabulary of the mmBERT-base checkpoint (the published one has 256000).
    #[arg(long, default_value_t = 256_000)]
    mmbert_vocab: usize,
    /// Row lengths in tokens.
    #[arg(long, value_delimiter = ',', default_value = "64,128,256,512")]
    lengths: Vec<usize>,
    /// Rows per forward.
    #[arg(long, value_delimiter = ',', default_value = "1,4,8")]
    rows: Vec<usize>,
    /// Candle precisions: f32, f16, bf16, int8 (int8 passes its load-time parity gate first).
    #[arg(long, value_delimiter = ',', default_value = "f32,bf16")]
    precisions: Vec<String>,
    /// CPU kernel families to run each precision with: auto (the best this CPU has), avx512, avx2,
    /// gemm (candle's matmul and composed attention, the engine before run-time kernels).
    #[arg(long, value_delimiter = ',', default_value = "auto")]
    cpu_kernels: Vec<String>,
    /// int8 only: activation quantization of the VNNI kernels (AVX512-VNNI, AVX-VNNI) to run each
    /// int8 engine with: auto (the engine's default: u8 where the gate's rows stay within a third of
    /// its bound, else u16), u8, u16, u8o (8 bits with the default count of outliers held apart per
    /// row), u8o:N (N outliers per row); the AVX2 i16 kernel ignores it. Each passes the gate first.
    #[arg(long, value_delimiter = ',', default_value = "auto")]
    int8_activations: Vec<String>,
    /// The candle engine's device: cpu, cuda, cuda:N, metal (a GPU that cannot be opened fails the
    /// run instead of falling back). The GEMM peak and torch stay on the CPU.
    #[arg(long, default_value = "cpu")]
    device: String,
    /// CPU threads for candle and for torch.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Timed forwards per engine and shape, at least.
    #[arg(long, default_value_t = 2)]
    min_runs: usize,
    /// Timed forwards per engine and shape, at most.
    #[arg(long, default_value_t = 15)]
    max_runs: usize,
    /// Seconds per engine and shape after which no further forward starts (beyond --min-runs).
    #[arg(long, default_value_t = 4.0)]
    budget_s: f64,
    /// Python with laya[serve]==0.3.20 and torch; `none` skips the upstream side.
    #[arg(long, default_value = "/work/upstream-venv/bin/python")]
    python: String,
    /// The upstream side of the benchmark.
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/../torch_forward.py"))]
    torch_script: PathBuf,
    /// Python with onnxruntime (tools/bench/edgejev-venv.sh) to run ONNX Runtime beside the others;
    /// `none` skips it. Needs --onnx-dir.
    #[arg(long, default_value = "none")]
    onnx_python: String,
    /// The ONNX Runtime side (`serve` mode; its `export` mode writes the models).
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/../onnx_forward.py"))]
    onnx_script: PathBuf,
    /// Where `onnx_forward.py export` wrote model-f32.onnx and model-int8.onnx for this checkpoint.
    #[arg(long)]
    onnx_dir: Option<PathBuf>,
    /// ONNX Runtime models to run: f32, int8 (dynamic quantization).
    #[arg(long, value_delimiter = ',', default_value = "f32,int8")]
    onnx_precisions: Vec<String>,
    /// Rounds over every engine; even rounds run the Python engines (torch, ONNX Runtime) before
    /// candle's, so `--rounds 2` is A B B A.
    #[arg(long, default_value_t = 1)]
    rounds: usize,
    /// Fixture Hugging Face cache lending tokenizers and config templates.
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/../../../tests/fixtures/hf-cache/hub"))]
    fixture_cache: PathBuf,
    /// Idle milliseconds before each engine's turn on a shape, so threads of what ran before have
    /// stopped spinning.
    #[arg(long, default_value_t = 300)]
    gap_ms: u64,
    /// Where the JSON result goes (default: `<out-dir>/model_forward.json`).
    #[arg(long)]
    json: Option<PathBuf>,
}

/// The timed forwards of one engine on one model and shape.
struct Cell {
    model: &'static str,
    engine: String,
    length: usize,
    rows: usize,
    /// Which round (`--rounds`) timed it.
    round: usize,
    times_ms: Vec<f64>,
    flops: f64,
}

impl Cell {
    /// Nearest-rank percentile of the timed forwards.
    fn percentile(&self, p: f64) -> f64 {
        let mut sorted = self.times_ms.clone();
        sorted.sort_by(f64::total_cmp);
        let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len().max(1));
        sorted.get(rank - 1).copied().unwrap_or(f64::NAN)
    }

    fn tokens_per_s(&self) -> f64 {
        (self.length * self.rows) as f64 / (self.percentile(0.5) / 1e3)
    }

    fn gflops(&self) -> f64 {
        self.flops / (self.percentile(0.5) / 1e3) / 1e9
    }
}

/// The bench's inputs, identical to `torch_forward.py`'s `bench_inputs`.
fn bench_rows(length: usize, rows: usize, vocab: usize) -> Vec<Row> {
    (0..rows)
        .map(|r| Row {
            ids: (0..length)
                .map(|t| ((r * 1009 + t * 7919 + 17) % vocab) as u32)
                .collect(),
            markers: vec![(length / 4) as u32, (length / 2) as u32, (3 * length / 4) as u32],
            qtype: [QuestionType::Choice, QuestionType::Score, QuestionType::Noul][r % 3],
        })
        .collect()
}

/// Milliseconds `work` takes.
fn timed<T>(work: impl FnOnce() -> T) -> (T, f64) {
    let start = Instant::now();
    let out = work();
    (out, start.elapsed().as_secs_f64() * 1e3)
}

/// Best f32 GFLOP/s of candle's matmul (weights pre-transposed, as the model stores them) on the
/// model's shapes, on the bench's thread pool.
fn gemm_peak(pool: &CpuThreads) -> Result<(f64, Vec<Value>), String> {
    let shapes = [
        (512, 1024, 5248),
        (512, 2624, 1024),
        (1024, 1024, 3072),
        (128, 1024, 5248),
    ];
    let mut best = 0f64;
    let mut details = Vec::new();
    for (m, k, n) in shapes {
        let a = Tensor::randn(0f32, 1.0, (m, k), &Device::Cpu).map_err(|e| e.to_string())?;
        let w = Tensor::randn(0f32, 1.0, (k, n), &Device::Cpu).map_err(|e| e.to_string())?;
        let mut best_ms = f64::INFINITY;
        let start = Instant::now();
        let mut runs = 0;
        while runs < 5 || (runs < 40 && start.elapsed().as_secs_f64() < 2.0) {
            let (product, ms) = pool.run(|| timed(|| a.matmul(&w)));
            product.map_err(|e| e.to_string())?;
            best_ms = best_ms.min(ms);
            runs += 1;
        }
        let gflops = 2.0 * (m * k * n) as f64 / (best_ms / 1e3) / 1e9;
        best = best.max(gflops);
        details.push(json!({"m": m, "k": k, "n": n, "best_ms": best_ms, "gflops": gflops, "runs": runs}));
    }
    Ok((best, details))
}

fn max_abs_diff(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    a.iter()
        .zip(b)
        .flat_map(|(x, y)| x.iter().zip(y).map(|(p, q)| (p - q).abs()))
        .fold(0.0, f32::max)
}

/// Outputs of one forward per shape (the first untimed one), per row: logits and act probabilities.
type RowOutputs = (Vec<Vec<f32>>, Vec<Vec<f32>>);

/// Largest difference of the softmax over each row's marker logits (the answer's probabilities
/// before temperature): the quantity the int8 gate bounds.
fn max_probability_diff(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    let softmax = |row: &[f32]| {
        let top = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let exp: Vec<f32> = row.iter().map(|x| (x - top).exp()).collect();
        let sum: f32 = exp.iter().sum();
        exp.into_iter().map(|e| e / sum).collect::<Vec<f32>>()
    };
    let a: Vec<Vec<f32>> = a.iter().map(|r| softmax(r)).collect();
    let b: Vec<Vec<f32>> = b.iter().map(|r| softmax(r)).collect();
    max_abs_diff(&a, &b)
}

/// `/proc/loadavg`'s 1-minute figure; other work on the machine distorts every number here.
fn load_average() -> Option<f64> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    text.split_whitespace().next()?.parse().ok()
}

/// What a round measured besides timings: gate results and the outputs compared afterwards.
#[derive(Default)]
struct Measured {
    cells: Vec<Cell>,
    parity_gates: Vec<Value>,
    /// candle f32's outputs per shape (first round that ran it).
    candle_f32: Vec<((usize, usize), RowOutputs)>,
    /// torch's outputs per shape.
    torch: Vec<((usize, usize), RowOutputs)>,
    /// ONNX Runtime's outputs per precision and shape.
    onnx: Vec<(String, (usize, usize), RowOutputs)>,
    upstream_meta: Vec<Value>,
}

/// One model's engines on every shape: the candle engines, or the Python ones (torch, ONNX Runtime).
struct ModelRun<'a> {
    args: &'a Args,
    spec: &'a ModelSpec,
    dir: PathBuf,
    shapes: Vec<(usize, usize)>,
    device: DeviceRequest,
    /// (precision, kernels, int8 activations) of every candle engine, in order.
    engines: Vec<(Precision, Option<CpuKernels>, Option<Int8Activations>)>,
}

impl ModelRun<'_> {
    fn keep_going(&self, n: usize, start: Instant) -> bool {
        n < self.args.min_runs || (n < self.args.max_runs && start.elapsed().as_secs_f64() < self.args.budget_s)
    }

    fn new_cell(&self, engine: String, (length, rows): (usize, usize), round: usize) -> Cell {
        Cell {
            model: self.spec.name,
            engine,
            length,
            rows,
            round,
            times_ms: Vec::new(),
            flops: self.spec.forward_flops(length, rows),
        }
    }

    fn gap(&self) {
        std::thread::sleep(std::time::Duration::from_millis(self.args.gap_ms));
    }

    /// Every candle engine, one at a time, loaded alone, as a worker runs one: sharing the process
    /// with the bf16 engine (whose CPU matmuls allocate f32 copies of the weights) slowed f32
    /// forwards by up to 30%, and alternating with torch forward by forward by 8-15%.
    fn candle(&self, round: usize, out: &mut Measured) -> Result<(), String> {
        let spec = self.spec;
        for &(precision, cpu_kernels, int8_activations) in &self.engines {
            let options = EngineOptions {
                device: self.device,
                precision: Some(precision),
                threads: Some(self.args.threads),
                cpu_kernels,
                int8_activations,
                max_rows: 64,
                max_batch_tokens: 1 << 20,
                length_buckets: Vec::new(),
                // Every load runs its gate whole, as the load-time figures always have.
                gate_cache: None,
            };
            let mut engine = CandleEngine::load(&[(spec.name.to_owned(), Location::directory(&self.dir))], options)
                .map_err(|e| e.to_string())?;
            if let Some(reason) = engine.fallback() {
                return Err(format!("--device {}: {reason}", self.device));
            }
            // int8 loaded only after its gate passed against f32; keep what the gate measured.
            for gate in engine.describe().parity {
                eprintln!(
                    "{} {precision} parity gate: {} rows, max |Δp| {:.5}, max |Δact p| {:.5}, hard mismatches {}",
                    spec.name,
                    gate.rows,
                    gate.max_probability_diff,
                    gate.max_act_probability_diff,
                    gate.hard_mismatches
                );
                out.parity_gates.push(json!({
                    "model": spec.name, "precision": precision.as_str(), "executor": gate.executor, "rows": gate.rows,
                    "round": round, "max_probability_diff": gate.max_probability_diff,
                    "max_act_probability_diff": gate.max_act_probability_diff,
                    "hard_mismatches": gate.hard_mismatches, "near_tie_flips": gate.near_tie_flips,
                }));
            }
            // int8 names its integer kernel and activations, as the gate's executor does.
            let int8_kernel = engine
                .describe()
                .parity
                .first()
                .filter(|_| precision == Precision::Int8)
                .and_then(|gate| gate.executor.strip_prefix("candle cpu int8 "))
                .and_then(|rest| rest.split(" (").next())
                .map(|kernel| format!(" ({kernel})"))
                .unwrap_or_default();
            for &shape in &self.shapes {
                // Checked once here, as the harness checks a served forward once.
                let inputs = ForwardLimits::from_info(&engine.describe())
                    .admit(spec.name.to_owned(), bench_rows(shape.0, shape.1, spec.vocab))
                    .map_err(|e| e.to_string())?;
                let kernels = engine.kernels().map_or_else(
                    || worker_gpu::device::device_label(engine.device()),
                    |k| k.as_str().to_owned(),
                );
                let mut cell = self.new_cell(format!("candle {precision} {kernels}{int8_kernel}"), shape, round);
                // After an idle gap, one untimed warm-up forward, then timed forwards back to back.
                self.gap();
                let warm = engine.forward(&inputs).map_err(|e| e.to_string())?;
                if precision == Precision::F32 && !out.candle_f32.iter().any(|(s, _)| *s == shape) {
                    let logits = warm.iter().map(|o| o.logits.clone()).collect();
                    let act = warm.iter().map(|o| o.act_probabilities.clone()).collect();
                    out.candle_f32.push((shape, (logits, act)));
                }
                let start = Instant::now();
                while self.keep_going(cell.times_ms.len(), start) {
                    let (result, ms) = timed(|| engine.forward(&inputs));
                    result.map_err(|e| e.to_string())?;
                    cell.times_ms.push(ms);
                }
                report(&cell);
                out.cells.push(cell);
            }
        }
        Ok(())
    }

    /// Upstream torch (`--python`), then ONNX Runtime at each of `--onnx-precisions`
    /// (`--onnx-python`), each in its own process, one after another.
    fn python(&self, round: usize, out: &mut Measured) -> Result<(), String> {
        let args = self.args;
        let mut sessions: Vec<(String, Option<String>, UpstreamSession)> = Vec::new();
        if args.python != "none" {
            let session = UpstreamSession::start(&args.python, &args.torch_script, &self.dir, args.threads, &[])?;
            sessions.push(("torch f32".to_owned(), None, session));
        }
        if args.onnx_python != "none" {
            let onnx_dir = args
                .onnx_dir
                .as_ref()
                .ok_or("--onnx-python needs --onnx-dir (where `onnx_forward.py export` wrote the models)")?;
            for precision in &args.onnx_precisions {
                let extra = [
                    OsStr::new("--onnx-dir"),
                    onnx_dir.as_os_str(),
                    OsStr::new("--precision"),
                    OsStr::new(precision.as_str()),
                ];
                let session =
                    UpstreamSession::start(&args.onnx_python, &args.onnx_script, &self.dir, args.threads, &extra)?;
                sessions.push((format!("onnxruntime {precision}"), Some(precision.clone()), session));
            }
        }
        for (engine, onnx_precision, session) in &mut sessions {
            if round == 0 {
                out.upstream_meta.push(json!({
                    "model": self.spec.name, "engine": engine, "runtime": session.torch, "threads": session.threads,
                }));
            }
            for &shape in &self.shapes {
                let mut cell = self.new_cell(engine.clone(), shape, round);
                self.gap();
                let reply = session.forward(shape.0, shape.1, 1, true)?;
                let outputs = (reply.logits, reply.act_probabilities);
                match onnx_precision {
                    None if !out.torch.iter().any(|(s, _)| *s == shape) => out.torch.push((shape, outputs)),
                    Some(p) if !out.onnx.iter().any(|(q, s, _)| q == p && *s == shape) => {
                        out.onnx.push((p.clone(), shape, outputs));
                    }
                    _ => {}
                }
                let start = Instant::now();
                while self.keep_going(cell.times_ms.len(), start) {
                    cell.times_ms
                        .extend(session.forward(shape.0, shape.1, 1, false)?.times_ms);
                }
                report(&cell);
                out.cells.push(cell);
            }
        }
        // Dropping the sessions ends each serve loop and waits for its process.
        Ok(())
    }
}

fn run(args: &Args) -> Result<(), String> {
    std::fs::create_dir_all(&args.out_dir).map_err(|e| format!("{}: {e}", args.out_dir.display()))?;
    let load_before = load_average();
    if load_before.is_some_and(|l| l > 0.5) {
        eprintln!("warning: load average {load_before:?} before the run; other work will distort the timings");
    }
    let pool = CpuThreads::new(args.threads)?;
    let (peak, gemm_details) = gemm_peak(&pool)?;
    eprintln!("f32 GEMM peak on {} threads: {peak:.1} GFLOP/s", args.threads);
    let precisions: Vec<Precision> = args
        .precisions
        .iter()
        .map(|p| Precision::parse(p))
        .collect::<Result<_, _>>()?;
    let device = DeviceRequest::parse(&args.device)?;
    let kernel_choices: Vec<Option<CpuKernels>> = args
        .cpu_kernels
        .iter()
        .map(|k| CpuKernels::parse(k))
        .collect::<Result<_, _>>()?;
    let activation_choices: Vec<Option<Int8Activations>> = args
        .int8_activations
        .iter()
        .map(|a| match a.trim() {
            "auto" => Ok(None),
            other => Int8Activations::parse(other).map(Some),
        })
        .collect::<Result<_, _>>()?;
    if let Some(bad) = args
        .onnx_precisions
        .iter()
        .find(|p| !matches!(p.as_str(), "f32" | "int8"))
    {
        return Err(format!("unknown --onnx-precisions '{bad}'; expected f32 or int8"));
    }
    let engines: Vec<_> = precisions
        .iter()
        .flat_map(|&p| {
            let activations: &[Option<Int8Activations>] = if p == Precision::Int8 {
                &activation_choices
            } else {
                &[None]
            };
            kernel_choices
                .iter()
                .flat_map(move |&k| activations.iter().map(move |&a| (p, k, a)))
        })
        .collect();
    let mut measured = Measured::default();
    let mut parity = Vec::new();
    let mut onnx_parity = Vec::new();
    for model in &args.models {
        let spec = match model.as_str() {
            "modernbert-large" => ModelSpec::modernbert_large(),
            "mmbert-base" => ModelSpec::mmbert_base(args.mmbert_vocab),
            "modernbert-mini" => ModelSpec::modernbert_mini(),
            other => {
                return Err(format!(
                    "unknown model '{other}'; expected modernbert-large, mmbert-base or modernbert-mini"
                ));
            }
        };
        let dir = checkpoint::ensure_checkpoint(&spec, &args.out_dir, &args.fixture_cache)?;
        let run = ModelRun {
            args,
            spec: &spec,
            dir,
            shapes: args
                .lengths
                .iter()
                .flat_map(|&l| args.rows.iter().map(move |&r| (l, r)))
                .collect(),
            device,
            engines: engines.clone(),
        };
        let mut out = Measured::default();
        // Round r runs candle's engines, then the Python ones; every other round the other way
        // round, so two rounds are A B B A.
        for round in 0..args.rounds.max(1) {
            if round % 2 == 0 {
                run.candle(round, &mut out)?;
                run.python(round, &mut out)?;
            } else {
                run.python(round, &mut out)?;
                run.candle(round, &mut out)?;
            }
        }
        for (shape, (logits, act)) in &out.torch {
            if let Some((_, (ours, our_act))) = out.candle_f32.iter().find(|(s, _)| s == shape) {
                parity.push(json!({
                    "model": spec.name, "length": shape.0, "rows": shape.1,
                    "max_abs_logit_diff": max_abs_diff(ours, logits),
                    "max_abs_act_probability_diff": max_abs_diff(our_act, act),
                }));
            }
        }
        // ONNX Runtime against torch f32 where torch ran, else against candle f32.
        for (precision, shape, (logits, act)) in &out.onnx {
            let reference = out
                .torch
                .iter()
                .find(|(s, _)| s == shape)
                .map(|(_, o)| ("torch f32", o))
                .or_else(|| {
                    out.candle_f32
                        .iter()
                        .find(|(s, _)| s == shape)
                        .map(|(_, o)| ("candle f32", o))
                });
            if let Some((against, (ref_logits, ref_act))) = reference {
                onnx_parity.push(json!({
                    "model": spec.name, "engine": format!("onnxruntime {precision}"), "against": against,
                    "length": shape.0, "rows": shape.1,
                    "max_abs_logit_diff": max_abs_diff(logits, ref_logits),
                    "max_abs_probability_diff": max_probability_diff(logits, ref_logits),
                    "max_abs_act_probability_diff": max_abs_diff(act, ref_act),
                }));
            }
        }
        measured.cells.append(&mut out.cells);
        measured.parity_gates.append(&mut out.parity_gates);
        measured.upstream_meta.append(&mut out.upstream_meta);
    }
    let Measured {
        mut cells,
        parity_gates,
        upstream_meta,
        ..
    } = measured;
    let load_after = load_average();
    // Shape by shape for reading; the stable sort keeps engines in measuring order.
    cells.sort_by_key(|c| (args.models.iter().position(|m| m == c.model), c.length, c.rows));
    print_table(&cells, peak);
    for p in &parity {
        eprintln!("parity vs upstream f32: {p}");
    }
    for p in &onnx_parity {
        eprintln!("onnxruntime parity: {p}");
    }
    let json_cells: Vec<Value> = cells
        .iter()
        .map(|c| {
            json!({
                "model": c.model, "engine": c.engine, "length": c.length, "rows": c.rows, "round": c.round,
                "times_ms": c.times_ms, "p50_ms": c.percentile(0.5), "p90_ms": c.percentile(0.9),
                "tokens_per_s": c.tokens_per_s(), "gflops": c.gflops(), "fraction_of_gemm_peak": c.gflops() / peak,
                "upstream_p50_ms": torch_p50(&cells, c),
            })
        })
        .collect();
    let result = json!({
        "command": std::env::args().collect::<Vec<_>>().join(" "),
        "machine": {"cpu": cpu_model(), "device": args.device, "threads": args.threads, "load_average_before": load_before, "load_average_after": load_after},
        "gap_ms": args.gap_ms,
        "rounds": args.rounds.max(1),
        "gemm_peak_gflops": peak,
        "gemm": gemm_details,
        "flops_model": checkpoint::FLOPS_MODEL,
        "upstream": upstream_meta,
        "cells": json_cells,
        "parity_f32_vs_upstream": parity,
        "parity_onnxruntime": onnx_parity,
        "parity_gates": parity_gates,
    });
    let path = args
        .json
        .clone()
        .unwrap_or_else(|| args.out_dir.join("model_forward.json"));
    let text = serde_json::to_string_pretty(&result).map_err(|e| e.to_string())?;
    std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
    eprintln!("wrote {}", path.display());
    Ok(())
}

fn report(cell: &Cell) {
    eprintln!(
        "{} {} {}x{}: p50 {:.1} ms over {} runs",
        cell.model,
        cell.engine,
        cell.length,
        cell.rows,
        cell.percentile(0.5),
        cell.times_ms.len()
    );
}

/// Upstream's p50 for the same model and shape in the same round, if it ran.
fn torch_p50(cells: &[Cell], cell: &Cell) -> Option<f64> {
    cells
        .iter()
        .find(|c| {
            c.engine == "torch f32"
                && c.model == cell.model
                && (c.length, c.rows, c.round) == (cell.length, cell.rows, cell.round)
        })
        .map(|c| c.percentile(0.5))
}

fn print_table(cells: &[Cell], peak: f64) {
    println!("| model | engine | round | len × rows | p50 ms | p90 ms | n | tokens/s | GEMM peak | vs torch p50 |");
    println!("|---|---|---:|---|---:|---:|---:|---:|---:|---:|");
    for c in cells {
        let ratio = torch_p50(cells, c).map_or("–".to_owned(), |t| format!("{:.2}×", c.percentile(0.5) / t));
        println!(
            "| {} | {} | {} | {} × {} | {:.1} | {:.1} | {} | {:.0} | {:.0}% | {} |",
            c.model,
            c.engine,
            c.round + 1,
            c.length,
            c.rows,
            c.percentile(0.5),
            c.percentile(0.9),
            c.times_ms.len(),
            c.tokens_per_s(),
            100.0 * c.gflops() / peak,
            ratio
        );
    }
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown".to_owned())
}

fn main() {
    // As the worker does, so that in-process times match served ones.
    // SAFETY: first statement of `main`: no other thread exists yet.
    #[allow(unsafe_code)]
    unsafe {
        worker_gpu::device::one_candle_thread_unless_set();
    }
    let args = Args::parse();
    if let Err(e) = run(&args) {
        eprintln!("layad-bench: {e}");
        std::process::exit(1);
    }
}
