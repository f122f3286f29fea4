//! `layad-worker-ane`: one worker process serving Laya checkpoints as bucketed Core ML graphs on the
//! Neural Engine (or the same graphs with candle on the CPU); the harness in `layad_proto` does the rest.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use laya::checkpoint::Location;
use layad_proto::harness::{self, HarnessError, HarnessOptions, LoadError};
use layad_proto::logging::{LogFormat, init_logging};
use layad_proto::{EXIT_CONFIG_REFUSED, EXIT_DEVICE_UNAVAILABLE, ServeOutcome, WarmupPolicy};
use worker_ane::{AneEngine, AneError, AneOptions, ExecutorKind};
use worker_gpu::Precision;
use worker_gpu::macos::MacosVersion;

/// Serves Laya checkpoints over the layad worker protocol (gRPC on a Unix socket) from converted
/// `bc1s-masked` artifacts, one row per prediction, padded to fixed length buckets. Binds the socket
/// only after every checkpoint's artifacts are verified, warm and through the parity gate.
#[derive(Debug, Parser)]
#[command(name = "layad-worker-ane", version)]
struct Args {
    /// Unix socket to serve on. Its directory must be private (mode 0700, ours); a missing one is
    /// created with mode 0700. The socket gets mode 0600; a stale socket there is removed.
    #[arg(long, value_name = "PATH")]
    socket: PathBuf,

    /// A checkpoint to serve, as NAME=DIR (repeatable). Inside a Hugging Face cache snapshot
    /// (`models--owner--name/snapshots/<rev>[/sub]`) the revision is read from the path.
    #[arg(long = "checkpoint", value_name = "NAME=DIR", required = true, value_parser = parse_checkpoint)]
    checkpoints: Vec<(String, PathBuf)>,

    /// Converted artifacts: DIR/<checkpoint>/L<bucket>/{manifest.json, model.mlpackage} and
    /// DIR/<checkpoint>/parity.json, as the converter in worker-ane/convert writes them.
    #[arg(long, value_name = "DIR")]
    artifacts: PathBuf,

    /// What runs the graphs: coreml (the Neural Engine, macOS only) or candle (the same contract on
    /// the CPU, with the checkpoint's weights).
    #[arg(long, default_value = "coreml", value_parser = ExecutorKind::parse)]
    executor: ExecutorKind,

    /// Only these length buckets, comma separated (default: every bucket present in the artifacts).
    #[arg(long, value_name = "L,L,…", value_delimiter = ',')]
    length_buckets: Option<Vec<u32>>,

    /// Device: auto, ane (Core ML) or cpu (candle). The executor decides what runs; a device it does
    /// not satisfy is reported as a mismatch in Describe, and `cpu` with Core ML is refused (exit 78).
    #[arg(long, default_value = "auto", value_parser = ["auto", "ane", "cpu"])]
    device: String,

    /// Graph precision: auto (f16), f16, or f32 (candle only; Core ML graphs are FP16, and f32 with
    /// Core ML is refused with exit status 78).
    #[arg(long, default_value = "auto", value_parser = ["auto", "f16", "f32"])]
    dtype: String,

    /// CPU threads of the candle executor (default: one per core).
    #[arg(long, value_name = "N")]
    threads: Option<usize>,

    /// Accepted like every worker's; the graphs are batch 1, so this worker reports one row per forward.
    #[arg(long, value_name = "N", default_value_t = 1)]
    max_rows: u32,

    /// Most tokens in one forward (capped at the longest bucket).
    #[arg(long, value_name = "N", default_value_t = 16_384)]
    max_batch_tokens: u32,

    /// Where Core ML's compiled models are kept, keyed on each package's tree hash (default: the
    /// user cache directory, `layad/ane`).
    #[arg(long, value_name = "DIR")]
    cache_dir: Option<PathBuf>,

    /// Read end of the supervisor's liveness pipe; end-of-file on it makes the worker exit.
    #[arg(long, value_name = "FD")]
    liveness_fd: Option<std::os::fd::RawFd>,

    /// Log lines on stderr: json (for the supervisor) or pretty.
    #[arg(long, default_value = "json", value_name = "FORMAT")]
    log_format: LogFormat,
}

fn parse_checkpoint(text: &str) -> Result<(String, PathBuf), String> {
    match text.split_once('=') {
        Some((name, dir)) if !name.is_empty() && !dir.is_empty() => Ok((name.to_owned(), PathBuf::from(dir))),
        _ => Err(format!("expected NAME=DIR, got '{text}'")),
    }
}

/// `~/Library/Caches/layad/ane` on macOS, `$XDG_CACHE_HOME/layad/ane` or `~/.cache/layad/ane` elsewhere.
fn default_cache_dir() -> PathBuf {
    let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from);
    let base = if cfg!(target_os = "macos") {
        var("HOME").map(|home| home.join("Library/Caches"))
    } else {
        var("XDG_CACHE_HOME").or_else(|| var("HOME").map(|home| home.join(".cache")))
    };
    base.unwrap_or_else(std::env::temp_dir).join("layad").join("ane")
}

/// `EXIT_DEVICE_UNAVAILABLE` or `EXIT_CONFIG_REFUSED` (the supervisor does not restart either),
/// else 1.
fn exit_status(error: &AneError) -> u8 {
    let code = if error.is_unavailable() {
        EXIT_DEVICE_UNAVAILABLE
    } else if error.is_configuration() {
        EXIT_CONFIG_REFUSED
    } else {
        1
    };
    u8::try_from(code).unwrap_or(1)
}

fn main() -> ExitCode {
    let args = Args::parse();
    if let Err(error) = init_logging(args.log_format) {
        eprintln!("layad-worker-ane: {error}");
        return ExitCode::FAILURE;
    }
    tracing::info!(?args, "layad-worker-ane starting");
    let fail = |error: &dyn std::fmt::Display, code: u8| {
        tracing::error!(%error, "layad-worker-ane failed");
        ExitCode::from(code)
    };
    if args.max_rows != 1 {
        tracing::info!(
            max_rows = args.max_rows,
            "the graphs are batch 1: this worker takes one row per forward"
        );
    }
    let precision = match args.dtype.as_str() {
        "f32" => Precision::F32,
        _ => Precision::F16,
    };
    let options = AneOptions {
        artifacts: args.artifacts.clone(),
        executor: args.executor,
        precision,
        buckets: args.length_buckets.clone(),
        threads: args.threads,
        max_batch_tokens: args.max_batch_tokens,
        cache_dir: args.cache_dir.clone().unwrap_or_else(default_cache_dir),
    };
    // Refused before the harness starts, with the exit status that tells the supervisor whether a
    // restart could help.
    let refused = if args.executor == ExecutorKind::CoreMl && args.device == "cpu" {
        Err(AneError::CoreMlOnCpu)
    } else {
        options.check(std::env::consts::OS, MacosVersion::running())
    };
    if let Err(error) = refused {
        return fail(&error, exit_status(&error));
    }
    let checkpoints: Vec<(String, Location)> = args
        .checkpoints
        .iter()
        .map(|(name, dir)| (name.clone(), Location::from_path(dir)))
        .collect();
    let load = move || -> Result<AneEngine, LoadError> { Ok(AneEngine::load(&checkpoints, &options)?) };
    let harness_options = HarnessOptions {
        socket: args.socket,
        liveness_fd: args.liveness_fd,
        requested_device: args.device,
        worker: format!("layad-worker-ane {}", env!("CARGO_PKG_VERSION")),
        warmup: WarmupPolicy::default(),
    };
    match harness::run(load, harness_options) {
        Ok(outcome) => {
            if outcome == ServeOutcome::SupervisorGone {
                tracing::warn!("exiting: the supervisor is gone");
            }
            ExitCode::SUCCESS
        }
        Err(HarnessError::Load(error)) => {
            let code = error.downcast_ref::<AneError>().map_or(1, exit_status);
            fail(&HarnessError::Load(error), code)
        }
        Err(error) => fail(&error, 1),
    }
}
