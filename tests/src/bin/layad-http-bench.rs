//! The served path, side by side: layad and a peer up at once on the same checkpoint files, requests
//! interleaved A/B/B/A per shape so the machine's drift hits both alike. The peer is upstream
//! `laya-serve` (0.3.20 or 0.4.15), or edgejev (`edgejev serve`, ONNX Runtime, on a model directory
//! `edgejev build` wrote from the same checkpoint: tools/bench/edgejev-build.sh) with upstream up
//! beside it only as the reference for answers. Prints tables (per-server p50/p90 and the median
//! per-pair ratio; answers/s at 1–8 clients) and writes JSON with the CPU model and flags. Results
//! and commands are in docs/benchmarks.md.
//!
//! Shapes: 1 question of ~64 tokens, of ~256 (`medium`) and of `max_len` (512) tokens, 3 questions of
//! ~58 tokens each (~174 in the batch). Every shape's answers are compared first: layad's with upstream's
//! exactly as before (same structure, largest number difference), and every server's probabilities
//! (`noul`, `probabilities`, `act_probability`) with upstream's, as max |Δp| and hard mismatches.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use layad_system_tests::{Server, get, load_average, percentile, post_json, server_timing};
use serde_json::{Value, json};

#[derive(Parser)]
struct Args {
    /// A checkpoint directory (`layad-bench` writes the full-size ModernBERT-large one).
    #[arg(long, default_value = "target/bench/modernbert-large-v50368")]
    checkpoint: PathBuf,
    /// Request pairs per shape (each pair: one request to each server, the order alternating).
    #[arg(long, default_value_t = 20)]
    pairs: usize,
    /// Idle milliseconds before each timed request of the pairs, so the threads of the request
    /// before (the other server's: ONNX Runtime's and rayon's pools spin a while after their work)
    /// have stopped, as `layad-bench --gap-ms` does between engines.
    #[arg(long, default_value_t = 300)]
    gap_ms: u64,
    /// Shapes to time: short (1 question, ~64 tokens), medium (1 question, ~256 tokens), long
    /// (1 question, max_len tokens), three (3 questions, ~174 tokens).
    #[arg(long, value_delimiter = ',', default_value = "short,long,three")]
    shapes: Vec<String>,
    /// Seconds per server and concurrency level, run twice per server (A/B/B/A).
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Concurrency levels for the throughput table, comma-separated (`none` or empty: skip it).
    #[arg(long, default_value = "1,2,4,8", value_parser = concurrency_levels)]
    concurrency: ConcurrencyLevels,
    /// Compute threads of each server (layad's worker, upstream's torch).
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// layad's pool device (`cpu`, `cuda`, `cuda:N`, `auto`).
    #[arg(long, default_value = "cpu")]
    device: String,
    /// Directory of the worker binaries layad starts (`[workers] binary_dir`; e.g. the CUDA build's);
    /// unset: beside `layad`.
    #[arg(long)]
    worker_dir: Option<PathBuf>,
    /// layad's pool dtype (`f32`, `bf16`, `int8`, ...).
    #[arg(long, default_value = "f32")]
    dtype: String,
    /// layad's pool `batch_wait` (e.g. `2ms`); unset: the config default.
    #[arg(long)]
    batch_wait: Option<String>,
    /// Python with `laya[serve]==0.3.20` (tools/bench/upstream-venv.sh); its `laya-serve` sits beside it.
    #[arg(long, default_value = "/work/upstream-venv/bin/python")]
    upstream_python: String,
    /// `LAYA_DEVICE` for upstream (`cpu`, `cuda`).
    #[arg(long, default_value = "cpu")]
    upstream_device: String,
    /// `LAYA_CPU_AMP` for upstream (e.g. `bf16`); unset: upstream's f32.
    #[arg(long)]
    upstream_amp: Option<String>,
    /// Python of the edgejev venv (tools/bench/edgejev-venv.sh); its `edgejev` sits beside it. With
    /// --edgejev-model, edgejev is the timed peer and upstream (unless `none`) only answers the
    /// reference requests.
    #[arg(long, requires = "edgejev_model")]
    edgejev_python: Option<String>,
    /// The model directory `edgejev build` wrote from --checkpoint (tools/bench/edgejev-build.sh).
    #[arg(long, requires = "edgejev_python")]
    edgejev_model: Option<PathBuf>,
    /// Where the JSON goes.
    #[arg(long, default_value = "target/bench/served.json")]
    out: PathBuf,
    /// Where to copy layad's log (supervisor and worker) once the run is over; with
    /// `RUST_LOG=info,layad_proto=debug LAYAD_LOGGING__FILTER=debug,h2=info,hyper=info,tower=info`
    /// it holds each forward's rows and device time (`tools/bench/forward_phases.py` reads them).
    #[arg(long)]
    layad_log: Option<PathBuf>,
}

/// The throughput table's client counts; empty skips the table.
#[derive(Clone, Debug, PartialEq)]
struct ConcurrencyLevels(Vec<usize>);

/// `1,2,4,8`; `none` or nothing: no throughput table (clap's own list parser refuses an empty value).
fn concurrency_levels(text: &str) -> Result<ConcurrencyLevels, String> {
    if text.trim().is_empty() || text.trim() == "none" {
        return Ok(ConcurrencyLevels(Vec::new()));
    }
    text.split(',')
        .map(|level| match level.trim().parse::<usize>() {
            Ok(clients) if clients > 0 => Ok(clients),
            _ => Err(format!("'{level}' is not a number of clients (1 or more)")),
        })
        .collect::<Result<_, _>>()
        .map(ConcurrencyLevels)
}

/// A fake HF home whose bundle root (`english`) is `checkpoint`, so upstream loads the same files.
fn fake_hf_home(checkpoint: &Path) -> Result<tempfile::TempDir, String> {
    let home = tempfile::tempdir().map_err(|e| format!("tempdir: {e}"))?;
    let repo = home.path().join("hub/models--convaiinnovations--laya");
    let revision = "0000000000000000000000000000000000000bec";
    let snapshot = repo.join("snapshots").join(revision);
    for file in [
        "rl_agent_config.json",
        "model.safetensors",
        "encoder/config.json",
        "tokenizer/tokenizer.json",
        "tokenizer/tokenizer_config.json",
    ] {
        let target = snapshot.join(file);
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
        }
        let source = std::fs::canonicalize(checkpoint.join(file))
            .map_err(|e| format!("{}: {e}", checkpoint.join(file).display()))?;
        std::os::unix::fs::symlink(source, &target).map_err(|e| format!("{}: {e}", target.display()))?;
    }
    std::fs::create_dir_all(repo.join("refs")).map_err(|e| format!("refs: {e}"))?;
    std::fs::write(repo.join("refs/main"), revision).map_err(|e| format!("refs/main: {e}"))?;
    Ok(home)
}

/// One request shape with its body, built by growing the state until the rows have the wanted length.
struct Shape {
    name: &'static str,
    label: String,
    body: Arc<String>,
    input_tokens: u64,
}

fn body(words: usize, questions: usize) -> String {
    let state = "please refund the order ".repeat(words);
    let mut qs = serde_json::Map::new();
    for q in 0..questions {
        qs.insert(
            format!("q{q}"),
            json!({"type": "noul", "instructions": format!("Is this a refund request ({q})?")}),
        );
    }
    json!({"state": state.trim_end(), "questions": qs}).to_string()
}

/// Input tokens layad counts for `body` (the two servers are checked to agree later).
async fn input_tokens(addr: SocketAddr, body: &str) -> Result<u64, String> {
    let response = post_json(addr, "/v1/systemone", body.as_bytes())
        .await
        .map_err(|e| format!("probe: {e}"))?;
    if response.status != 200 {
        return Err(format!("probe answered {}: {}", response.status, response.text()));
    }
    response.json()["usage"]["input_tokens"]
        .as_u64()
        .ok_or_else(|| "probe: no usage.input_tokens".to_owned())
}

/// The smallest state (in repeated phrases) whose `questions` rows reach `tokens_per_row` each;
/// rows stop growing at `max_len`, where upstream truncates the state.
async fn shape(addr: SocketAddr, name: &'static str, questions: usize, tokens_per_row: u64) -> Result<Shape, String> {
    let (mut low, mut high) = (1usize, 2usize);
    while input_tokens(addr, &body(high, questions)).await? < tokens_per_row * questions as u64 {
        low = high;
        high *= 2;
        if high > 4096 {
            break;
        }
    }
    while low < high {
        let mid = (low + high) / 2;
        if input_tokens(addr, &body(mid, questions)).await? >= tokens_per_row * questions as u64 {
            high = mid;
        } else {
            low = mid + 1;
        }
    }
    let text = body(high, questions);
    let input_tokens = input_tokens(addr, &text).await?;
    Ok(Shape {
        name,
        label: format!(
            "{questions} question{}, {input_tokens} tokens",
            if questions == 1 { "" } else { "s" }
        ),
        body: Arc::new(text),
        input_tokens,
    })
}

/// Largest |difference| between numbers at the same place in two JSON answers, or an error naming
/// the first structural difference (another label, another key).
fn answer_difference(a: &Value, b: &Value, path: &str) -> Result<f64, String> {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            let (x, y) = (x.as_f64().unwrap_or(f64::NAN), y.as_f64().unwrap_or(f64::NAN));
            Ok((x - y).abs())
        }
        (Value::Object(x), Value::Object(y)) => {
            if x.keys().ne(y.keys()) {
                return Err(format!("{path}: keys differ"));
            }
            x.iter().try_fold(0f64, |worst, (k, v)| {
                Ok(worst.max(answer_difference(v, &y[k], &format!("{path}.{k}"))?))
            })
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => x
            .iter()
            .zip(y)
            .try_fold(0f64, |worst, (p, q)| Ok(worst.max(answer_difference(p, q, path)?))),
        _ if a == b => Ok(0.0),
        _ => Err(format!("{path}: {a} vs {b}")),
    }
}

/// One timed request: milliseconds, and layad's device time when the server reports one.
async fn timed(addr: SocketAddr, body: &str) -> Result<(f64, Option<f64>), String> {
    let start = Instant::now();
    let response = post_json(addr, "/v1/systemone", body.as_bytes())
        .await
        .map_err(|e| format!("request to {addr}: {e}"))?;
    let ms = start.elapsed().as_secs_f64() * 1e3;
    if response.status != 200 {
        return Err(format!("{addr} answered {}: {}", response.status, response.text()));
    }
    Ok((ms, server_timing(response.header("server-timing"), "device")))
}

/// Answers per second with `clients` clients for `seconds`, and the number of failed requests.
async fn throughput(addr: SocketAddr, body: Arc<String>, clients: usize, seconds: u64) -> (usize, f64, usize) {
    let stop = Arc::new(AtomicBool::new(false));
    let (done, errors) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let start = Instant::now();
    let tasks: Vec<_> = (0..clients)
        .map(|_| {
            let (body, stop, done, errors) = (
                Arc::clone(&body),
                Arc::clone(&stop),
                Arc::clone(&done),
                Arc::clone(&errors),
            );
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    match post_json(addr, "/v1/systemone", body.as_bytes()).await {
                        Ok(r) if r.status == 200 => done.fetch_add(1, Ordering::Relaxed),
                        _ => errors.fetch_add(1, Ordering::Relaxed),
                    };
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        let _ = task.await;
    }
    // Answers that finished after the stop count, and so does the time they took.
    (
        done.load(Ordering::Relaxed),
        start.elapsed().as_secs_f64(),
        errors.load(Ordering::Relaxed),
    )
}

/// Upstream's server on `port`, loading only the `english` root of the fake cache.
fn start_upstream(
    python: &str,
    hf_home: &Path,
    port: u16,
    threads: usize,
    device: &str,
    amp: Option<&str>,
) -> Result<Child, String> {
    let bin = Path::new(python).with_file_name("laya-serve");
    let mut command = Command::new(&bin);
    command
        .env("HF_HOME", hf_home)
        .env("HF_HUB_OFFLINE", "1")
        .env("LAYA_DEVICE", device)
        .env("LAYA_HOST", "127.0.0.1")
        .env("LAYA_PORT", port.to_string())
        .env("LAYA_MODELS", "english")
        .env("LAYA_THREADS", threads.to_string())
        .env("LAYA_LOG_LEVEL", "warning")
        .env_remove("LAYA_API_KEY")
        .env_remove("LAYA_CPU_AMP")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    if let Some(amp) = amp {
        command.env("LAYA_CPU_AMP", amp);
    }
    command
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", bin.display()))
}

/// `edgejev serve` on `port` with `threads` ONNX Runtime threads on the CPU provider.
fn start_edgejev(python: &str, model: &Path, port: u16, threads: usize) -> Result<Child, String> {
    let bin = Path::new(python).with_file_name("edgejev");
    Command::new(&bin)
        .arg("serve")
        .arg("--model")
        .arg(model)
        .args(["--host", "127.0.0.1", "--port", &port.to_string()])
        .args(["--threads", &threads.to_string(), "--provider", "cpu"])
        .env("HF_HUB_OFFLINE", "1")
        .env_remove("EDGEJEV_API_KEY")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", bin.display()))
}

/// Waits until `GET /health` on `addr` answers 200.
async fn wait_healthy(addr: SocketAddr, name: &str) -> Result<(), String> {
    let start = Instant::now();
    while !get(addr, "/health").await.is_ok_and(|r| r.status == 200) {
        if start.elapsed() > Duration::from_secs(900) {
            return Err(format!("{name} did not answer /health within 900 s"));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}

/// How far one server's answers are from a reference server's on the same questions.
#[derive(Debug, Default, PartialEq)]
struct ProbabilityDifference {
    /// Largest |Δ| of `noul`, every `probabilities` entry and `action.act_probability`, where both
    /// answers have them.
    max: f64,
    /// Answers that changed side (another `choice`, or `noul` across 0.5) where the reference's
    /// top-1/top-2 margin is at least 0.04: the int8 gate's hard mismatch (worker-gpu/src/parity.rs).
    hard_mismatches: usize,
    /// Answers that changed side inside that margin (near ties).
    near_tie_flips: usize,
}

/// Compares the probabilities in two `answers` objects. Servers of different contracts (edgejev,
/// upstream 0.4.15) add fields of their own; only the probabilities and the decision are compared.
fn probability_difference(ours: &Value, reference: &Value) -> Result<ProbabilityDifference, String> {
    let (Some(ours), Some(reference)) = (ours.as_object(), reference.as_object()) else {
        return Err("answers are not objects".into());
    };
    if ours.keys().ne(reference.keys()) {
        return Err("another set of question ids".into());
    }
    let mut max = 0f64;
    let mut compare = |a: &Value, b: &Value| {
        if let (Some(a), Some(b)) = (a.as_f64(), b.as_f64()) {
            max = max.max((a - b).abs());
        }
    };
    // The reference's top-1/top-2 margin of every answer that changed side.
    let mut flips = Vec::new();
    for (id, a) in ours {
        let b = &reference[id];
        compare(&a["noul"], &b["noul"]);
        compare(&a["action"]["act_probability"], &b["action"]["act_probability"]);
        if let (Some(pa), Some(pb)) = (a["probabilities"].as_object(), b["probabilities"].as_object()) {
            for (option, p) in pa {
                compare(p, pb.get(option).unwrap_or(&Value::Null));
            }
        }
        if a["choice"] != b["choice"] {
            let mut ps: Vec<f64> = b["probabilities"]
                .as_object()
                .map(|m| m.values().filter_map(Value::as_f64).collect())
                .unwrap_or_default();
            ps.sort_by(|x, y| y.total_cmp(x));
            flips.push(ps.first().copied().unwrap_or(1.0) - ps.get(1).copied().unwrap_or(0.0));
        }
        if let (Some(x), Some(y)) = (a["noul"].as_f64(), b["noul"].as_f64())
            && (x >= 0.5) != (y >= 0.5)
        {
            flips.push((2.0 * y - 1.0).abs());
        }
    }
    let hard_mismatches = flips.iter().filter(|&&margin| margin >= 0.04).count();
    Ok(ProbabilityDifference {
        max,
        hard_mismatches,
        near_tie_flips: flips.len() - hard_mismatches,
    })
}

/// Kills a peer server when the bench ends, however it ends.
struct Upstream(Child);

impl Drop for Upstream {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `model name` and the flags that decide which kernels run, from /proc/cpuinfo.
fn cpu() -> (String, Vec<String>) {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let field = |name: &str| {
        info.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_owned())
    };
    let wanted = [
        "avx2",
        "fma",
        "f16c",
        "avx512f",
        "avx512bw",
        "avx512vl",
        "avx512_vnni",
        "avx512_bf16",
        "avx_vnni",
        "amx_tile",
        "amx_bf16",
        "amx_int8",
    ];
    let flags = field("flags").unwrap_or_default();
    let present = flags
        .split_whitespace()
        .filter(|f| wanted.contains(f))
        .map(str::to_owned)
        .collect();
    (field("model name").unwrap_or_else(|| "unknown".into()), present)
}

/// Resident memory of `pid` and every process below it, from /proc (Linux): `VmRSS` now and the sum
/// of each process's `VmHWM` (its own peak), in MiB. Null where /proc cannot be read.
fn tree_memory(pid: u32) -> Value {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Value::Null;
    };
    // Parent of every process: the field after the command name (in parentheses, may hold spaces).
    let parents: Vec<(u32, u32)> = entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|p| {
            let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).ok()?;
            let after = stat.rsplit_once(')')?.1;
            Some((p, after.split_whitespace().nth(1)?.parse().ok()?))
        })
        .collect();
    let mut tree = vec![pid];
    let mut i = 0;
    while i < tree.len() {
        let parent = tree[i];
        tree.extend(parents.iter().filter(|(_, pp)| *pp == parent).map(|(p, _)| *p));
        i += 1;
    }
    let kib = |status: &str, key: &str| -> f64 {
        status
            .lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    let (mut rss, mut peak, mut counted) = (0.0, 0.0, 0);
    for p in &tree {
        if let Ok(status) = std::fs::read_to_string(format!("/proc/{p}/status")) {
            rss += kib(&status, "VmRSS:");
            peak += kib(&status, "VmHWM:");
            counted += 1;
        }
    }
    if counted == 0 {
        return Value::Null;
    }
    json!({"rss_mib": rss / 1024.0, "peak_rss_mib": peak / 1024.0, "processes": counted})
}

fn median(values: &[f64]) -> f64 {
    percentile(values, 0.5).unwrap_or(f64::NAN)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args = Args::parse();
    if let Err(e) = run(args).await {
        eprintln!("layad-http-bench: {e}");
        std::process::exit(1);
    }
}

async fn run(args: Args) -> Result<(), String> {
    let (cpu_model, cpu_flags) = cpu();
    let load_before = load_average();
    println!("cpu: {cpu_model}; flags: {}", cpu_flags.join(" "));
    println!("load average before: {load_before:?}");
    let hf_home = fake_hf_home(&args.checkpoint)?;
    let batch_wait = args
        .batch_wait
        .as_ref()
        .map_or(String::new(), |w| format!("batch_wait = \"{w}\"\n"));
    let binary_dir = match &args.worker_dir {
        Some(dir) => {
            let dir = std::fs::canonicalize(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            format!("binary_dir = {:?}\n", dir.to_string_lossy())
        }
        None => String::new(),
    };
    let config = format!(
        "[checkpoints]\nmultilingual = \"off\"\ntyped-decisions = \"off\"\n\n[[pool]]\nname = \"{}\"\ndevice = \"{}\"\nworkers = 1\nthreads = {}\ndtype = \"{}\"\n{batch_wait}\n[server]\nrequest_timeout = \"300s\"\n\n[workers]\nstartup_timeout = \"900s\"\n{binary_dir}",
        if args.device == "cpu" { "cpu" } else { "gpu" },
        args.device,
        args.threads,
        args.dtype
    );
    let home = hf_home.path().to_string_lossy().into_owned();
    let mut layad = Server::start(&config, &[("HF_HOME", home.as_str())]);
    let upstream = match args.upstream_python.as_str() {
        "" | "none" => None,
        python => {
            let port = layad_system_tests::free_port();
            let child = start_upstream(
                python,
                hf_home.path(),
                port,
                args.threads,
                &args.upstream_device,
                args.upstream_amp.as_deref(),
            )?;
            let addr: SocketAddr = format!("127.0.0.1:{port}").parse().map_err(|e| format!("{e}"))?;
            Some((Upstream(child), addr))
        }
    };
    let edgejev = match (&args.edgejev_python, &args.edgejev_model) {
        (Some(python), Some(model)) => {
            let port = layad_system_tests::free_port();
            let child = start_edgejev(python, model, port, args.threads)?;
            let addr: SocketAddr = format!("127.0.0.1:{port}").parse().map_err(|e| format!("{e}"))?;
            Some((Upstream(child), addr))
        }
        _ => None,
    };
    layad.wait_ready(Duration::from_secs(900)).await;
    if let Some((_, addr)) = &upstream {
        wait_healthy(*addr, "laya-serve").await?;
    }
    // The timed peer: edgejev when it is given, else upstream.
    let mut edgejev_health = Value::Null;
    let peer = if let Some((_, addr)) = &edgejev {
        wait_healthy(*addr, "edgejev").await?;
        edgejev_health = get(*addr, "/health").await.map_err(|e| e.to_string())?.json();
        println!("edgejev: {edgejev_health}");
        let precision = edgejev_health["precision"].as_str().unwrap_or("?");
        Some((format!("edgejev {precision}"), *addr))
    } else {
        upstream.as_ref().map(|(_, addr)| ("upstream".to_owned(), *addr))
    };
    let peer_name = peer.as_ref().map_or("–".to_owned(), |(name, _)| name.clone());
    let health = get(layad.addr, "/health").await.map_err(|e| e.to_string())?.json();
    let engine = &health["pools"][0]["workers"][0];
    println!(
        "layad worker: {}",
        json!({"device": engine["device"], "dtype": engine["dtype"], "cpu_kernels": engine["cpu_kernels"],
               "gpu": engine["gpu"], "device_fallback": engine["device_fallback"], "parity_gate": engine["parity_gate"]})
    );

    let mut shapes = Vec::new();
    for name in &args.shapes {
        let shape = match name.as_str() {
            "short" => self::shape(layad.addr, "short", 1, 64).await?,
            "medium" => self::shape(layad.addr, "medium", 1, 256).await?,
            "long" => self::shape(layad.addr, "long", 1, 512).await?,
            "three" => self::shape(layad.addr, "three", 3, 58).await?,
            other => {
                return Err(format!(
                    "unknown shape '{other}'; expected short, medium, long or three"
                ));
            }
        };
        shapes.push(shape);
    }

    // Answers compared before anything is timed: layad's with upstream's exactly (same structure),
    // then every server's probabilities with upstream's (or, without upstream, edgejev's with layad's).
    let mut parity = Vec::new();
    for shape in &shapes {
        let ask = |addr: SocketAddr| {
            let body = Arc::clone(&shape.body);
            async move {
                post_json(addr, "/v1/systemone", body.as_bytes())
                    .await
                    .map(|r| r.json())
                    .map_err(|e| e.to_string())
            }
        };
        let ours = ask(layad.addr).await?;
        let reference = match &upstream {
            Some((_, addr)) => Some(ask(*addr).await?),
            None => None,
        };
        let theirs = match &edgejev {
            Some((_, addr)) => Some(ask(*addr).await?),
            None => None,
        };
        let mut row = json!({"shape": shape.name, "input_tokens": ours["usage"]["input_tokens"]});
        if let Some(reference) = &reference {
            if ours["usage"]["input_tokens"] != reference["usage"]["input_tokens"] {
                return Err(format!(
                    "{}: usage differs: layad {} vs upstream {}",
                    shape.name, ours["usage"], reference["usage"]
                ));
            }
            let diff = answer_difference(&ours["answers"], &reference["answers"], "answers")
                .map_err(|e| format!("{}: answers differ: {e}", shape.name))?;
            println!(
                "{}: layad's answers agree with upstream's, max |Δ| {diff:.4}",
                shape.label
            );
            row["max_abs_answer_diff"] = json!(diff);
        }
        let against = if reference.is_some() { "upstream" } else { "layad" };
        let mut servers = vec![("layad", &ours)];
        servers.extend(theirs.as_ref().map(|t| ("edgejev", t)));
        let mut probabilities = Vec::new();
        for (server, answer) in servers {
            let base = match &reference {
                Some(r) => r,
                None if server == "layad" => continue,
                None => &ours,
            };
            let d = probability_difference(&answer["answers"], &base["answers"])
                .map_err(|e| format!("{}: {server} vs {against}: {e}", shape.name))?;
            let tokens = &answer["usage"]["input_tokens"];
            println!(
                "{}: {server} vs {against}: max |Δp| {:.4}, hard mismatches {}, near-tie flips {}, input tokens {tokens}",
                shape.label, d.max, d.hard_mismatches, d.near_tie_flips
            );
            probabilities.push(
                json!({"server": server, "against": against, "max_abs_probability_diff": d.max,
                "hard_mismatches": d.hard_mismatches, "near_tie_flips": d.near_tie_flips, "input_tokens": tokens}),
            );
        }
        row["probabilities"] = json!(probabilities);
        parity.push(row);
    }

    println!();
    println!(
        "| request | layad p50 / p90 ms | layad device p50 ms | {peer_name} p50 / p90 ms | layad / {peer_name} (median of pairs) |"
    );
    println!("|---|---|---|---|---|");
    let mut latency_rows = Vec::new();
    for shape in &shapes {
        // Two untimed requests each: first-use costs (allocations, caches) stay out of the pairs.
        for _ in 0..2 {
            timed(layad.addr, &shape.body).await?;
            if let Some((_, addr)) = &peer {
                timed(*addr, &shape.body).await?;
            }
        }
        let (mut ours, mut device, mut theirs, mut ratios) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for pair in 0..args.pairs {
            let layad_first = pair % 2 == 0;
            let mut layad_ms = 0.0;
            let mut peer_ms = None;
            for turn in 0..2 {
                tokio::time::sleep(Duration::from_millis(args.gap_ms)).await;
                if (turn == 0) == layad_first {
                    let (ms, dev) = timed(layad.addr, &shape.body).await?;
                    layad_ms = ms;
                    device.extend(dev);
                } else if let Some((_, addr)) = &peer {
                    peer_ms = Some(timed(*addr, &shape.body).await?.0);
                }
            }
            ours.push(layad_ms);
            if let Some(u) = peer_ms {
                theirs.push(u);
                ratios.push(layad_ms / u);
            }
        }
        let p = |v: &[f64], q: f64| percentile(v, q).unwrap_or(f64::NAN);
        let ratio = (!ratios.is_empty()).then(|| median(&ratios));
        println!(
            "| {} | {:.1} / {:.1} | {:.1} | {} | {} |",
            shape.label,
            p(&ours, 0.5),
            p(&ours, 0.9),
            p(&device, 0.5),
            if theirs.is_empty() {
                "–".to_owned()
            } else {
                format!("{:.1} / {:.1}", p(&theirs, 0.5), p(&theirs, 0.9))
            },
            ratio.map_or("–".to_owned(), |r| format!("**{r:.2}**"))
        );
        latency_rows.push(json!({
            "shape": shape.name, "label": shape.label, "input_tokens": shape.input_tokens,
            "layad_ms": ours, "layad_device_ms": device, "peer_ms": theirs, "ratios": ratios,
            "layad_p50_ms": p(&ours, 0.5), "layad_p90_ms": p(&ours, 0.9),
            "peer_p50_ms": percentile(&theirs, 0.5), "peer_p90_ms": percentile(&theirs, 0.9),
            "median_ratio": ratio,
        }));
    }

    let mut throughput_rows = Vec::new();
    if !args.concurrency.0.is_empty() {
        let short = shapes
            .iter()
            .find(|s| s.name == "short")
            .map(|s| Arc::clone(&s.body))
            .unwrap_or_else(|| Arc::new(body(30, 1)));
        println!();
        println!(
            "| clients | layad answers/s | {peer_name} answers/s | layad / {peer_name} | errors (layad, {peer_name}) |"
        );
        println!("|---|---|---|---|---|");
        for &clients in &args.concurrency.0 {
            // A/B/B/A: each server runs twice, the halves mirrored around the middle.
            let (mut ours, mut theirs) = ((0usize, 0f64, 0usize), (0usize, 0f64, 0usize));
            // Each run kept as (answers, seconds, errors), so a reader sees the spread of the halves.
            let (mut our_runs, mut their_runs) = (Vec::new(), Vec::new());
            let add = |total: &mut (usize, f64, usize), runs: &mut Vec<Value>, run: (usize, f64, usize)| {
                total.0 += run.0;
                total.1 += run.1;
                total.2 += run.2;
                runs.push(json!({"answers": run.0, "seconds": run.1, "errors": run.2}));
            };
            add(
                &mut ours,
                &mut our_runs,
                throughput(layad.addr, Arc::clone(&short), clients, args.seconds).await,
            );
            if let Some((_, addr)) = &peer {
                for _ in 0..2 {
                    add(
                        &mut theirs,
                        &mut their_runs,
                        throughput(*addr, Arc::clone(&short), clients, args.seconds).await,
                    );
                }
            }
            add(
                &mut ours,
                &mut our_runs,
                throughput(layad.addr, Arc::clone(&short), clients, args.seconds).await,
            );
            let our_rate = ours.0 as f64 / ours.1;
            let their_rate = (theirs.1 > 0.0).then(|| theirs.0 as f64 / theirs.1);
            let ratio = their_rate.map(|t| our_rate / t);
            println!(
                "| {clients} | {our_rate:.2} | {} | {} | {}, {} |",
                their_rate.map_or("–".to_owned(), |t| format!("{t:.2}")),
                ratio.map_or("–".to_owned(), |r| format!("**{r:.2}×**")),
                ours.2,
                theirs.2
            );
            throughput_rows.push(json!({
                "clients": clients, "layad_answers_per_s": our_rate, "peer_answers_per_s": their_rate,
                "ratio": ratio, "layad_errors": ours.2, "peer_errors": theirs.2,
                "layad_runs": our_runs, "peer_runs": their_runs,
            }));
        }
    }
    // Resident memory of each server's process tree after the timed load (the peak over the run,
    // and now), the supervisor and its worker together for layad.
    let memory = json!({
        "layad": tree_memory(layad.pid()),
        "upstream": upstream.as_ref().map(|(child, _)| tree_memory(child.0.id())),
        "edgejev": edgejev.as_ref().map(|(child, _)| tree_memory(child.0.id())),
    });
    println!("resident memory: {memory}");
    let load_after = load_average();
    println!("load average after: {load_after:?}");
    let report = json!({
        "command": std::env::args().collect::<Vec<_>>().join(" "),
        "machine": {"cpu": cpu_model, "flags": cpu_flags, "load_average_before": load_before, "load_average_after": load_after},
        "checkpoint": args.checkpoint.display().to_string(),
        "threads": args.threads,
        "layad": {"device": args.device, "dtype": args.dtype, "batch_wait": args.batch_wait, "worker": engine},
        "upstream": {"python": args.upstream_python, "device": args.upstream_device, "amp": args.upstream_amp},
        "peer": peer_name,
        "edgejev": {"python": args.edgejev_python, "model": args.edgejev_model, "health": edgejev_health},
        "answer_parity": parity,
        "latency": latency_rows,
        "throughput": throughput_rows,
        "resident_memory": memory,
    });
    if let Some(dir) = args.out.parent() {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    let text = serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?;
    std::fs::write(&args.out, text).map_err(|e| format!("{}: {e}", args.out.display()))?;
    println!("wrote {}", args.out.display());
    if let Some(path) = &args.layad_log {
        std::fs::write(path, layad.log()).map_err(|e| format!("{}: {e}", path.display()))?;
        println!("wrote {}", path.display());
    }
    drop(edgejev);
    drop(upstream);
    drop(hf_home);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn concurrency_levels_parse_a_list_or_none() {
        assert_eq!(concurrency_levels("1,2, 8"), Ok(ConcurrencyLevels(vec![1, 2, 8])));
        assert_eq!(concurrency_levels(""), Ok(ConcurrencyLevels(Vec::new())));
        assert_eq!(concurrency_levels("none"), Ok(ConcurrencyLevels(Vec::new())));
        assert!(concurrency_levels("1,,2").is_err_and(|e| e.contains("''")));
        assert!(concurrency_levels("0").is_err());
    }

    #[test]
    fn probabilities_are_compared_across_contracts_and_flips_split_by_the_gate_margin() {
        // upstream 0.4.15 adds answer_confidence; edgejev does not: only probabilities count.
        let reference = json!({
            "a": {"type": "noul", "noul": 0.51, "answer_confidence": 0.51, "action": {"act_probability": 0.9}},
            "b": {"type": "noul", "noul": 0.80, "action": {"act_probability": 0.2}},
            "c": {"type": "choice", "choice": "x", "probabilities": {"x": 0.6, "y": 0.4}},
        });
        let ours = json!({
            "a": {"type": "noul", "noul": 0.49, "action": {"act_probability": 0.93}},
            "b": {"type": "noul", "noul": 0.45, "action": {"act_probability": 0.2}},
            "c": {"type": "choice", "choice": "y", "probabilities": {"x": 0.45, "y": 0.55}},
        });
        let d = probability_difference(&ours, &reference).expect("same questions");
        assert!((d.max - 0.35).abs() < 1e-9, "{d:?}");
        // a: margin 0.02 (near tie); b: margin 0.6 (hard); c: margin 0.2 (hard).
        assert_eq!((d.hard_mismatches, d.near_tie_flips), (2, 1), "{d:?}");
        let same = probability_difference(&reference, &reference).expect("same questions");
        assert_eq!(same, ProbabilityDifference::default());
        let other = json!({"a": reference["a"].clone()});
        assert!(probability_difference(&other, &reference).is_err());
    }
}
