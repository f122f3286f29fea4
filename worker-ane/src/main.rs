//! `layad-worker-ane`: one worker process serving Laya checkpoints as bucketed Core ML graphs on the
//! Neural Engine (or the same graphs with candle on the CPU); the harness in `layad_proto` does the rest.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::error::ErrorKind;
use clap::{CommandFactory, Parser};
use laya::checkpoint::Location;
use layad_proto::harness::{self, HarnessError, HarnessOptions, LoadError};
use layad_proto::logging::init_logging;
use layad_proto::{EXIT_CONFIG_REFUSED, EXIT_DEVICE_UNAVAILABLE, WorkerArgs, user_cache_dir};
use worker_ane::{AneEngine, AneError, AneOptions, ExecutorKind};
use worker_gpu::Precision;
use worker_gpu::macos::MacosVersion;

/// Serves Laya checkpoints over the layad worker protocol (gRPC on a Unix socket) from converted
/// `bc1s-masked` artifacts, one row per prediction, padded to fixed length buckets. Binds the socket
/// only after every checkpoint's artifacts are verified, warm and through the parity gate.
///
/// `--device` takes auto, ane (Core ML) or cpu (candle): the executor decides what runs; a device it
/// does not satisfy is reported as a mismatch in Describe, and `cpu` with Core ML is refused (exit
/// status 78). `--dtype` takes auto (f16), f16, or f32 (candle only; Core ML graphs are FP16, and f32
/// with Core ML is refused with exit status 78). `--length-buckets`
/// keeps only those buckets (default: every bucket present in the artifacts). The graphs are batch 1,
/// so this worker reports one row per forward whatever `--max-rows` says, and caps
/// `--max-batch-tokens` at its longest bucket.
#[derive(Debug, Parser)]
#[command(name = "layad-worker-ane", version)]
struct Args {
    #[command(flatten)]
    common: WorkerArgs,

    /// Converted artifacts: DIR/<checkpoint>/L<bucket>/{manifest.json, model.mlpackage} and
    /// DIR/<checkpoint>/parity.json, as the converter in worker-ane/convert writes them.
    #[arg(long, value_name = "DIR")]
    artifacts: PathBuf,

    /// What runs the graphs: coreml (the Neural Engine, macOS only) or candle (the same contract on
    /// the CPU, with the checkpoint's weights).
    #[arg(long, default_value = "coreml", value_parser = ExecutorKind::parse)]
    executor: ExecutorKind,

    /// Where Core ML's compiled models are kept, keyed on each package's tree hash (default: the
    /// user cache directory, `layad/ane`).
    #[arg(long, value_name = "DIR")]
    cache_dir: Option<PathBuf>,
}

/// `--device` and `--dtype` must be values this worker knows; otherwise clap's usage error.
fn check_device_and_dtype(common: &WorkerArgs) {
    for (flag, value, known) in [
        ("--device", &common.device, &["auto", "ane", "cpu"][..]),
        ("--dtype", &common.dtype, &["auto", "f16", "f32"][..]),
    ] {
        if !known.contains(&value.as_str()) {
            Args::command()
                .error(
                    ErrorKind::InvalidValue,
                    format!(
                        "invalid value '{value}' for {flag}; expected one of {}",
                        known.join(", ")
                    ),
                )
                .exit();
        }
    }
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
    check_device_and_dtype(&args.common);
    let common = &args.common;
    if let Err(error) = init_logging(common.log_format) {
        eprintln!("layad-worker-ane: {error}");
        return ExitCode::FAILURE;
    }
    tracing::info!(?args, "layad-worker-ane starting");
    if common.max_rows != 1 {
        tracing::info!(
            max_rows = common.max_rows,
            "the graphs are batch 1: this worker takes one row per forward"
        );
    }
    let precision = match common.dtype.as_str() {
        "f32" => Precision::F32,
        _ => Precision::F16,
    };
    let options = AneOptions {
        artifacts: args.artifacts.clone(),
        executor: args.executor,
        precision,
        // None: every bucket the artifacts have.
        buckets: (!common.length_buckets.is_empty()).then(|| common.length_buckets.clone()),
        threads: common.threads,
        max_batch_tokens: common.max_batch_tokens,
        cache_dir: args.cache_dir.clone().unwrap_or_else(|| user_cache_dir("ane")),
    };
    // Refused before the harness starts, with the exit status that tells the supervisor whether a
    // restart could help.
    let refused = if args.executor == ExecutorKind::CoreMl && common.device == "cpu" {
        Err(AneError::CoreMlOnCpu)
    } else {
        options.check(std::env::consts::OS, MacosVersion::running())
    };
    if let Err(error) = refused {
        tracing::error!(%error, "layad-worker-ane failed");
        return ExitCode::from(exit_status(&error));
    }
    let checkpoints: Vec<(String, Location)> = common
        .checkpoints
        .iter()
        .map(|(name, dir)| (name.clone(), Location::from_path(dir)))
        .collect();
    let load = move || -> Result<AneEngine, LoadError> { Ok(AneEngine::load(&checkpoints, &options)?) };
    let harness_options = HarnessOptions::from_args(common, format!("layad-worker-ane {}", env!("CARGO_PKG_VERSION")));
    let result = harness::run(load, harness_options);
    harness::exit_code("layad-worker-ane", result, |error| match error {
        HarnessError::Load(error) => error.downcast_ref::<AneError>().map_or(1, exit_status),
        _ => 1,
    })
}
