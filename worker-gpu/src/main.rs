//! `layad-worker-gpu`: one worker process serving Laya checkpoints with the candle engine on one device
//! (CPU, Metal or CUDA) behind the worker protocol; the harness in `layad_proto` does the rest.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use laya::checkpoint::Location;
use layad_proto::harness::{self, HarnessOptions, LoadError};
use layad_proto::logging::{LogFormat, init_logging};
use layad_proto::{ServeOutcome, WarmupPolicy};
use worker_gpu::{CandleEngine, CpuKernels, DeviceRequest, EngineOptions, Precision};

/// Serves Laya checkpoints over the layad worker protocol (gRPC on a Unix socket). Binds the socket
/// only after every checkpoint is loaded and warmed; exits on SIGTERM after answering the forwards it
/// accepted, and on its own when the supervisor dies.
#[derive(Debug, Parser)]
#[command(name = "layad-worker-gpu", version)]
struct Args {
    /// Unix socket to serve on. Its directory must be private (mode 0700, ours); a missing one is
    /// created with mode 0700. The socket gets mode 0600; a stale socket there is removed.
    #[arg(long, value_name = "PATH")]
    socket: PathBuf,

    /// A checkpoint to serve, as NAME=DIR (repeatable). Inside a Hugging Face cache snapshot
    /// (`models--owner--name/snapshots/<rev>[/sub]`) the revision is read from the path.
    #[arg(long = "checkpoint", value_name = "NAME=DIR", required = true, value_parser = parse_checkpoint)]
    checkpoints: Vec<(String, PathBuf)>,

    /// Device: auto (CUDA, then Metal, then CPU), cpu, metal, cuda or cuda:N.
    #[arg(long, default_value = "auto", value_parser = DeviceRequest::parse)]
    device: DeviceRequest,

    /// Precision: auto (f32 on the CPU, the checkpoints' amp_dtype on a GPU), f32, f16 or bf16.
    #[arg(long, default_value = "auto", value_parser = parse_dtype)]
    dtype: Dtype,

    /// CPU threads for forwards (default: one per physical core).
    #[arg(long, value_name = "N")]
    threads: Option<usize>,

    /// CPU kernels of matrix products and attention: auto (the best this CPU has: avx512, else
    /// avx2), avx512, avx2, or gemm (candle's own matmul and composed ops). Naming kernels the CPU
    /// lacks fails the start. The supervisor leaves it at auto.
    #[arg(long, default_value = "auto", value_parser = parse_kernels)]
    cpu_kernels: Kernels,

    /// Most rows in one forward.
    #[arg(long, value_name = "N", default_value_t = EngineOptions::default().max_rows)]
    max_rows: u32,

    /// Most tokens (sum of row lengths) in one forward.
    #[arg(long, value_name = "N", default_value_t = EngineOptions::default().max_batch_tokens)]
    max_batch_tokens: u32,

    /// Fixed row lengths, comma-separated and increasing (e.g. 64,96,128): each batch is padded to
    /// the smallest that holds its longest row; longer rows are refused.
    #[arg(long, value_name = "N,N,...", value_delimiter = ',')]
    length_buckets: Vec<u32>,

    /// Read end of the supervisor's liveness pipe; end-of-file on it makes the worker exit.
    #[arg(long, value_name = "FD")]
    liveness_fd: Option<std::os::fd::RawFd>,

    /// Exit at start-up (non-zero) when the requested device is not available, instead of running on
    /// the CPU and reporting the mismatch in Describe.
    #[arg(long)]
    require_device: bool,

    /// Log lines on stderr: json (for the supervisor) or pretty.
    #[arg(long, default_value = "json", value_name = "FORMAT")]
    log_format: LogFormat,
}

/// `--dtype`: `auto` leaves the choice to the engine.
#[derive(Clone, Copy, Debug)]
struct Dtype(Option<Precision>);

fn parse_dtype(text: &str) -> Result<Dtype, String> {
    if text == "auto" {
        Ok(Dtype(None))
    } else {
        Precision::parse(text).map(|p| Dtype(Some(p)))
    }
}

/// `--cpu-kernels`: `auto` leaves the choice to the engine.
#[derive(Clone, Copy, Debug)]
struct Kernels(Option<CpuKernels>);

fn parse_kernels(text: &str) -> Result<Kernels, String> {
    CpuKernels::parse(text).map(Kernels)
}

fn parse_checkpoint(text: &str) -> Result<(String, PathBuf), String> {
    match text.split_once('=') {
        Some((name, dir)) if !name.is_empty() && !dir.is_empty() => Ok((name.to_owned(), PathBuf::from(dir))),
        _ => Err(format!("expected NAME=DIR, got '{text}'")),
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    if let Err(error) = init_logging(args.log_format) {
        eprintln!("layad-worker-gpu: {error}");
        return ExitCode::FAILURE;
    }
    tracing::info!(?args, "layad-worker-gpu starting");

    let checkpoints: Vec<(String, Location)> = args
        .checkpoints
        .iter()
        .map(|(name, dir)| (name.clone(), Location::from_path(dir)))
        .collect();
    let engine_options = EngineOptions {
        device: args.device,
        precision: args.dtype.0,
        threads: args.threads,
        cpu_kernels: args.cpu_kernels.0,
        max_rows: args.max_rows,
        max_batch_tokens: args.max_batch_tokens,
        length_buckets: args.length_buckets.clone(),
    };
    let require_device = args.require_device;
    let load = move || -> Result<CandleEngine, LoadError> {
        let engine = CandleEngine::load(&checkpoints, engine_options)?;
        match engine.fallback() {
            Some(reason) if require_device => Err(format!("--require-device: {reason}").into()),
            _ => Ok(engine),
        }
    };
    let options = HarnessOptions {
        socket: args.socket,
        liveness_fd: args.liveness_fd,
        requested_device: args.device.to_string(),
        worker: format!("layad-worker-gpu {}", env!("CARGO_PKG_VERSION")),
        warmup: WarmupPolicy::default(),
    };
    match harness::run(load, options) {
        Ok(outcome) => {
            if outcome == ServeOutcome::SupervisorGone {
                tracing::warn!("exiting: the supervisor is gone");
            }
            ExitCode::SUCCESS
        }
        Err(error) => {
            tracing::error!(%error, "layad-worker-gpu failed");
            ExitCode::FAILURE
        }
    }
}
