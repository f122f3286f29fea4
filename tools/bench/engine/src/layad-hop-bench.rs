//! `layad-hop-bench`: what the gRPC hop to a worker process costs. The same one-row forward runs
//! in-process on a `CandleEngine` and through the `layad-worker-gpu` binary; prints a table, writes JSON.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use clap::Parser;
use laya::checkpoint::Location;
use laya::question::QuestionType;
use layad_proto::logging::LogFormat;
use layad_proto::{DEFAULT_MAX_BATCH_TOKENS, DEFAULT_MAX_ROWS, Engine, ForwardLimits, Row, WorkerArgs, WorkerClient};
use serde_json::json;
use worker_gpu::{CandleEngine, DeviceRequest, EngineOptions};

/// Measures the round-trip cost of the worker gRPC hop: one row of `--tokens` tokens, `--calls`
/// times in-process and `--calls` times through the worker binary, in alternating blocks.
#[derive(Debug, Parser)]
#[command(name = "layad-hop-bench")]
struct Args {
    /// Checkpoint directory (default: the english fixture checkpoint of this repository).
    #[arg(long, value_name = "DIR")]
    checkpoint: Option<PathBuf>,
    /// Forwards per side (in-process and over gRPC), after the warm-up calls.
    #[arg(long, default_value_t = 1000)]
    calls: usize,
    /// Untimed forwards per side before measuring.
    #[arg(long, default_value_t = 50)]
    warmup: usize,
    /// Tokens in the row.
    #[arg(long, default_value_t = 64)]
    tokens: u32,
    /// Device for both sides.
    #[arg(long, default_value = "cpu", value_parser = DeviceRequest::parse)]
    device: DeviceRequest,
    /// CPU threads for both sides (default: one per physical core).
    #[arg(long)]
    threads: Option<usize>,
    /// The worker binary (default: `layad-worker-gpu` next to this binary).
    #[arg(long, value_name = "PATH")]
    worker: Option<PathBuf>,
    /// Where to write the JSON results.
    #[arg(long, value_name = "PATH", default_value = "hop-bench.json")]
    json: PathBuf,
    /// Idle time before each in-process forward, in microseconds. Through the worker, the engine's
    /// CPU threads idle during the hop between two forwards; this gives the in-process engine the
    /// same gap, separating the cost of the transport from the cost of waking idle threads.
    #[arg(long, default_value_t = 0)]
    in_process_gap_us: u64,
}

/// Calls per block; the two sides alternate block by block so that drift hits both alike.
const BLOCK: usize = 100;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let checkpoint_dir = args.checkpoint.clone().unwrap_or_else(|| {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../../tests/fixtures/hf-cache/hub/models--convaiinnovations--laya/snapshots")
            .join("7a1e5eed0f1c7ee5c0de5eed0f1c7ee5c0de0320")
    });
    let worker_bin = match &args.worker {
        Some(path) => path.clone(),
        None => std::env::current_exe()?.with_file_name("layad-worker-gpu"),
    };
    let options = EngineOptions {
        device: args.device,
        threads: args.threads,
        ..EngineOptions::default()
    };
    let mut engine = CandleEngine::load(
        &[("bench".to_owned(), Location::from_path(&checkpoint_dir))],
        options.clone(),
    )?;
    let info = engine.describe();
    let vocab = info.checkpoints[0].vocab_size;
    let row = bench_row(args.tokens, vocab);
    let rows = std::slice::from_ref(&row);
    // Checked once, as the harness checks a served forward once.
    let checked = ForwardLimits::from_info(&info).admit("bench".to_owned(), rows.to_vec())?;

    let socket_dir = std::env::temp_dir().join(format!("layad-hop-bench-{}", std::process::id()));
    let socket = socket_dir.join("worker.sock");
    let mut worker = spawn_worker(&worker_bin, &checkpoint_dir, &socket, &args)?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let client = runtime.block_on(connect(&socket, &mut worker))?;

    for _ in 0..args.warmup {
        engine.forward(&checked)?;
        runtime.block_on(client.forward("bench", rows))?;
    }
    let mut in_process = Vec::with_capacity(args.calls);
    let mut round_trip = Vec::with_capacity(args.calls);
    let mut worker_device = Vec::with_capacity(args.calls);
    let mut worker_queue = Vec::with_capacity(args.calls);
    while in_process.len() < args.calls {
        let block = BLOCK.min(args.calls - in_process.len());
        for _ in 0..block {
            if args.in_process_gap_us > 0 {
                std::thread::sleep(Duration::from_micros(args.in_process_gap_us));
            }
            let start = Instant::now();
            engine.forward(&checked)?;
            in_process.push(start.elapsed());
        }
        for _ in 0..block {
            let start = Instant::now();
            let result = runtime.block_on(client.forward("bench", rows))?;
            round_trip.push(start.elapsed());
            worker_device.push(Duration::from_micros(result.device_us));
            worker_queue.push(Duration::from_micros(result.queue_us));
        }
    }
    let hop_only: Vec<Duration> = round_trip
        .iter()
        .zip(&worker_device)
        .map(|(trip, device)| trip.saturating_sub(*device))
        .collect();
    let _ = worker.kill();
    let _ = worker.wait();
    let _ = std::fs::remove_dir_all(&socket_dir);

    let series = [
        ("in-process forward", Stats::of(&in_process)),
        ("gRPC round trip", Stats::of(&round_trip)),
        ("worker engine time (device_us)", Stats::of(&worker_device)),
        ("worker wait for the engine thread (queue_us)", Stats::of(&worker_queue)),
        ("round trip - engine time", Stats::of(&hop_only)),
    ];
    let added_p50 = series[1].1.p50_ms - series[0].1.p50_ms;
    let added_p99 = series[1].1.p99_ms - series[0].1.p99_ms;
    println!(
        "one {}-token row, checkpoint {}, device {}, dtype {}, {} calls per side",
        args.tokens,
        checkpoint_dir.display(),
        info.device,
        info.dtype,
        args.calls
    );
    println!("| series | min ms | p50 ms | p99 ms | mean ms |");
    println!("|---|---:|---:|---:|---:|");
    for (name, s) in &series {
        println!(
            "| {name} | {:.3} | {:.3} | {:.3} | {:.3} |",
            s.min_ms, s.p50_ms, s.p99_ms, s.mean_ms
        );
    }
    println!("| added by the hop (gRPC p50 - in-process p50, p99 - p99) | | {added_p50:.3} | {added_p99:.3} | |");

    let report = json!({
        "bench": "layad-hop-bench",
        "checkpoint": checkpoint_dir.display().to_string(),
        "device": info.device,
        "dtype": info.dtype,
        "tokens": args.tokens,
        "calls": args.calls,
        "warmup_calls": args.warmup,
        "in_process_gap_us": args.in_process_gap_us,
        "threads": args.threads,
        "available_parallelism": std::thread::available_parallelism().map(|n| n.get()).ok(),
        "debug_build": cfg!(debug_assertions),
        "series": series.iter().map(|(name, s)| json!({
            "name": name, "min_ms": s.min_ms, "p50_ms": s.p50_ms, "p99_ms": s.p99_ms, "mean_ms": s.mean_ms,
        })).collect::<Vec<_>>(),
        "added_p50_ms": added_p50,
        "added_p99_ms": added_p99,
    });
    std::fs::write(&args.json, serde_json::to_string_pretty(&report)? + "\n")?;
    println!("wrote {}", args.json.display());
    Ok(())
}

/// A row shaped like a real prompt: three option markers, ids spread over the vocabulary.
fn bench_row(tokens: u32, vocab: u32) -> Row {
    let ids = (0..tokens)
        .map(|i| 4 + (i * 37) % vocab.saturating_sub(4).max(1))
        .collect();
    let markers = [tokens / 4, tokens / 2, 3 * tokens / 4]
        .into_iter()
        .filter(|&m| m > 0)
        .collect();
    Row {
        ids,
        markers,
        qtype: QuestionType::Choice,
    }
}

fn spawn_worker(bin: &Path, checkpoint: &Path, socket: &Path, args: &Args) -> std::io::Result<Child> {
    let worker = WorkerArgs {
        socket: socket.to_path_buf(),
        checkpoints: vec![("bench".to_owned(), checkpoint.to_path_buf())],
        device: args.device.to_string(),
        dtype: "auto".to_owned(),
        threads: args.threads,
        max_rows: DEFAULT_MAX_ROWS,
        max_batch_tokens: DEFAULT_MAX_BATCH_TOKENS,
        length_buckets: Vec::new(),
        // The worker's stdin is a pipe whose write end only this process holds: if the bench dies,
        // the worker sees end-of-file and exits.
        liveness_fd: Some(0),
        log_format: LogFormat::Json,
        spawn_nonce: None,
    };
    Command::new(bin)
        .args(worker.to_args())
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
}

async fn connect(socket: &Path, worker: &mut Child) -> Result<WorkerClient, Box<dyn std::error::Error>> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        match WorkerClient::connect_uds(socket).await {
            Ok(client) => return Ok(client),
            Err(error) if error.is_retryable() && Instant::now() < deadline => {
                if let Some(status) = worker.try_wait()? {
                    return Err(format!("the worker exited before it was ready ({status})").into());
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(error) => return Err(error.into()),
        }
    }
}

struct Stats {
    min_ms: f64,
    p50_ms: f64,
    p99_ms: f64,
    mean_ms: f64,
}

impl Stats {
    fn of(samples: &[Duration]) -> Stats {
        let mut ms: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1e3).collect();
        ms.sort_by(f64::total_cmp);
        let at = |q: f64| {
            ms.get(((ms.len() as f64 - 1.0) * q).round() as usize)
                .copied()
                .unwrap_or(f64::NAN)
        };
        Stats {
            min_ms: at(0.0),
            p50_ms: at(0.50),
            p99_ms: at(0.99),
            mean_ms: ms.iter().sum::<f64>() / ms.len().max(1) as f64,
        }
    }
}
