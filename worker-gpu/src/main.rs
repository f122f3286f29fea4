//! `layad-worker-gpu`: one worker process serving Laya checkpoints with the candle engine on one device
//! (CPU, Metal or CUDA) behind the worker protocol; the harness in `layad_proto` does the rest.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::error::ErrorKind;
use clap::{CommandFactory, Parser};
use laya::checkpoint::Location;
use layad_proto::harness::{self, HarnessError, HarnessOptions, LoadError};
use layad_proto::logging::init_logging;
use layad_proto::{EXIT_DEVICE_UNAVAILABLE, WorkerArgs, user_cache_dir};
use worker_gpu::{CandleEngine, CpuKernels, DeviceRequest, EngineOptions, Int8Activations, Precision};

/// Serves Laya checkpoints over the layad worker protocol (gRPC on a Unix socket). Binds the socket
/// only after every checkpoint is loaded and warmed; exits on SIGTERM after answering the forwards it
/// accepted, and on its own when the supervisor dies.
#[derive(Debug, Parser)]
#[command(name = "layad-worker-gpu", version)]
struct Args {
    #[command(flatten)]
    common: WorkerArgs,

    /// CPU kernels of matrix products and attention: auto (the best this CPU has: amx, else
    /// avx512, else avx2), amx (avx512 with the int8 and bf16 products on AMX tiles), avx512, avx2,
    /// or gemm (candle's own matmul and composed ops). Naming kernels the CPU lacks fails the
    /// start. The supervisor leaves it at auto.
    #[arg(long, default_value = "auto", value_parser = parse_kernels)]
    cpu_kernels: Kernels,

    /// `--dtype int8` with a VNNI kernel (AVX512-VNNI or AVX-VNNI): how activation rows are
    /// quantized, each choice behind the load-time parity gate: auto (8 bits where the gate's rows
    /// stay within a third of its bound, else 16 bits), u16, u8, u8o (8 bits with outliers held
    /// apart), u8o:N (N outliers per row). The AVX2 i16 kernel ignores it. The supervisor leaves it
    /// at auto.
    #[arg(long, default_value = "auto", value_parser = parse_activations)]
    int8_activations: Activations,

    /// Exit at start-up (non-zero) when the requested device is not available, instead of running on
    /// the CPU and reporting the mismatch in Describe.
    #[arg(long)]
    require_device: bool,

    /// Where the parity gate keeps its float32 reference outputs between starts (int8, bf16, f16),
    /// named by a hash of this executable, the weights, the kernels and the gate's rows, so that a
    /// start on the same files runs only the reduced precision's rows; `off`: computed at every
    /// start. Default: the service's or the user's cache directory, `layad/gate`.
    #[arg(long, value_name = "DIR|off", value_parser = parse_gate_cache)]
    gate_cache: Option<GateCache>,
}

/// `--gate-cache`: a directory, or `off`.
#[derive(Clone, Debug)]
struct GateCache(Option<PathBuf>);

fn parse_gate_cache(text: &str) -> Result<GateCache, String> {
    match text.trim() {
        "" => Err("expected a directory or 'off'".to_owned()),
        "off" => Ok(GateCache(None)),
        dir => Ok(GateCache(Some(PathBuf::from(dir)))),
    }
}

/// `--cpu-kernels`: `auto` leaves the choice to the engine.
#[derive(Clone, Copy, Debug)]
struct Kernels(Option<CpuKernels>);

fn parse_kernels(text: &str) -> Result<Kernels, String> {
    CpuKernels::parse(text).map(Kernels)
}

/// `--int8-activations`: `auto` leaves the choice to the gate (`gate::DEFAULT_ACTIVATIONS`).
#[derive(Clone, Copy, Debug)]
struct Activations(Option<Int8Activations>);

fn parse_activations(text: &str) -> Result<Activations, String> {
    match text.trim() {
        "auto" => Ok(Activations(None)),
        other => Int8Activations::parse(other).map(|a| Activations(Some(a))),
    }
}

/// `--device` (auto: CUDA, then Metal, then CPU; cpu, metal, cuda or cuda:N) and `--dtype` (auto:
/// f32 on the CPU, the checkpoints' amp_dtype on a GPU; f32, f16, bf16, or int8 on the CPU), or
/// clap's usage error.
fn device_and_precision(common: &WorkerArgs) -> (DeviceRequest, Option<Precision>) {
    let invalid = |flag: &str, message: String| -> ! {
        Args::command()
            .error(ErrorKind::InvalidValue, format!("invalid value for {flag}: {message}"))
            .exit()
    };
    let device = DeviceRequest::parse(&common.device).unwrap_or_else(|e| invalid("--device", e));
    let precision = match common.dtype.as_str() {
        "auto" => None,
        other => Some(Precision::parse(other).unwrap_or_else(|e| invalid("--dtype", e))),
    };
    (device, precision)
}

fn main() -> ExitCode {
    // SAFETY: first statement of `main`: no other thread exists yet.
    #[allow(unsafe_code)]
    unsafe {
        worker_gpu::device::one_candle_thread_unless_set();
    }
    let args = Args::parse();
    let (device, precision) = device_and_precision(&args.common);
    let common = args.common.clone();
    if let Err(error) = init_logging(common.log_format) {
        eprintln!("layad-worker-gpu: {error}");
        return ExitCode::FAILURE;
    }
    tracing::info!(?args, "layad-worker-gpu starting");

    let checkpoints: Vec<(String, Location)> = common
        .checkpoints
        .iter()
        .map(|(name, dir)| (name.clone(), Location::from_path(dir)))
        .collect();
    let engine_options = EngineOptions {
        device,
        precision,
        threads: common.threads,
        cpu_kernels: args.cpu_kernels.0,
        int8_activations: args.int8_activations.0,
        max_rows: common.max_rows,
        max_batch_tokens: common.max_batch_tokens,
        length_buckets: common.length_buckets.clone(),
        gate_cache: match &args.gate_cache {
            Some(GateCache(dir)) => dir.clone(),
            None => Some(user_cache_dir("gate")),
        },
    };
    let require_device = args.require_device;
    let load = move || -> Result<CandleEngine, LoadError> {
        let engine = CandleEngine::load(&checkpoints, engine_options)?;
        match engine.fallback() {
            Some(reason) if require_device => Err(Box::new(DeviceRequired(reason.to_owned()))),
            _ => Ok(engine),
        }
    };
    let mut options = HarnessOptions::from_args(&common, format!("layad-worker-gpu {}", env!("CARGO_PKG_VERSION")));
    // As parsed: `CUDA:0` asks for what `cuda:0` does.
    options.requested_device = device.to_string();
    harness::exit_code("layad-worker-gpu", harness::run(load, options), |error| match error {
        // Not a crash: the same start fails the same way; the supervisor reports the pool
        // unavailable with this reason instead of restarting it.
        HarnessError::Load(error) if error.is::<DeviceRequired>() => u8::try_from(EXIT_DEVICE_UNAVAILABLE).unwrap_or(1),
        _ => 1,
    })
}

/// `--require-device` refused the CPU fallback: the requested device's reason for being missing.
#[derive(Debug, thiserror::Error)]
#[error("--require-device: {0}")]
struct DeviceRequired(String);
