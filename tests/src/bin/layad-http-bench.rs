//! Supervisor overhead and HTTP throughput, side by side with upstream `laya-serve` on the same
//! checkpoint files in the same run. Prints a table and writes JSON (docs/benchmarks.md has results).
//!
//! Overhead = client-measured latency of a single-question ~64-token request at concurrency 1 minus
//! the worker's own forward time (`Server-Timing: device`). Throughput = answers per second with
//! 1, 2, 4, 8 clients sending back to back.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use layad_system_tests::{Server, get, percentile, post_json, server_timing};
use serde_json::{Value, json};

#[derive(Parser)]
struct Args {
    /// A checkpoint directory (e.g. one `layad-bench` wrote: target/bench/modernbert-large).
    #[arg(long, default_value = "target/bench/modernbert-large")]
    checkpoint: PathBuf,
    /// Sequential requests for the overhead measurement.
    #[arg(long, default_value_t = 100)]
    requests: usize,
    /// Seconds per concurrency level.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Concurrency levels.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8")]
    concurrency: Vec<usize>,
    /// Compute threads (layad's worker and upstream's torch).
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Python with `laya[serve]==0.3.20` installed (empty: skip upstream).
    #[arg(long, default_value = "/work/upstream-venv/bin/python")]
    upstream_python: String,
    /// Where the JSON goes.
    #[arg(long, default_value = "target/bench/http.json")]
    out: PathBuf,
}

/// A fake HF home whose bundle root (`english`) is `checkpoint`, so upstream loads the same files.
fn fake_hf_home(checkpoint: &Path) -> tempfile::TempDir {
    let home = tempfile::tempdir().expect("tempdir");
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
        std::fs::create_dir_all(target.parent().expect("parent")).expect("mkdir");
        let source = std::fs::canonicalize(checkpoint.join(file))
            .unwrap_or_else(|e| panic!("{}: {e}", checkpoint.join(file).display()));
        std::os::unix::fs::symlink(source, target).expect("symlink");
    }
    std::fs::create_dir_all(repo.join("refs")).expect("refs");
    std::fs::write(repo.join("refs/main"), revision).expect("refs/main");
    home
}

/// A state whose single noul row is about 64 tokens long on `addr`'s checkpoint.
async fn body_of_about_64_tokens(addr: std::net::SocketAddr) -> (String, u64) {
    let mut words = 4;
    loop {
        let state = "please refund the order ".repeat(words);
        let body = json!({"state": state.trim_end(), "questions": {"q": {"type": "noul", "instructions": "Is this a refund request?"}}}).to_string();
        let response = post_json(addr, "/v1/systemone", body.as_bytes()).await.expect("probe");
        assert_eq!(response.status, 200, "{}", response.text());
        let tokens = response.json()["usage"]["input_tokens"].as_u64().expect("input_tokens");
        if tokens >= 60 || words > 64 {
            return (body, tokens);
        }
        words += 1;
    }
}

/// Answers per second with `clients` clients for `seconds`.
async fn throughput(addr: std::net::SocketAddr, body: Arc<String>, clients: usize, seconds: u64) -> (f64, usize) {
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
    (
        done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64(),
        errors.load(Ordering::Relaxed),
    )
}

fn start_upstream(python: &str, hf_home: &Path, port: u16, threads: usize) -> Child {
    let bin = Path::new(python).with_file_name("laya-serve");
    Command::new(bin)
        .env("HF_HOME", hf_home)
        .env("HF_HUB_OFFLINE", "1")
        .env("LAYA_DEVICE", "cpu")
        .env("LAYA_HOST", "127.0.0.1")
        .env("LAYA_PORT", port.to_string())
        .env("LAYA_MODELS", "english")
        .env("LAYA_THREADS", threads.to_string())
        .env("LAYA_LOG_LEVEL", "warning")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start laya-serve")
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args = Args::parse();
    let hf_home = fake_hf_home(&args.checkpoint);
    let config = format!(
        "[checkpoints]\nmultilingual = \"off\"\ntyped-decisions = \"off\"\n\n[[pool]]\nname = \"cpu\"\ndevice = \"cpu\"\nworkers = 1\nthreads = {}\n\n[server]\nrequest_timeout = \"120s\"\n",
        args.threads
    );
    let home = hf_home.path().to_string_lossy().into_owned();
    let mut server = Server::start(&config, &[("HF_HOME", home.as_str())]);
    server.wait_ready(Duration::from_secs(600)).await;
    let (body, tokens) = body_of_about_64_tokens(server.addr).await;
    let body = Arc::new(body);

    let mut latencies = Vec::new();
    let mut overheads = Vec::new();
    for _ in 0..args.requests {
        let start = Instant::now();
        let response = post_json(server.addr, "/v1/systemone", body.as_bytes())
            .await
            .expect("request");
        let latency = start.elapsed().as_secs_f64() * 1e3;
        let device = server_timing(response.header("server-timing"), "device").expect("Server-Timing device");
        latencies.push(latency);
        overheads.push(latency - device);
    }
    let mut layad_rps = Vec::new();
    for &c in &args.concurrency {
        layad_rps.push(throughput(server.addr, Arc::clone(&body), c, args.seconds).await);
    }
    drop(server);

    let mut upstream_rps = Vec::new();
    if !args.upstream_python.is_empty() {
        let port = layad_system_tests::free_port();
        let mut child = start_upstream(&args.upstream_python, hf_home.path(), port, args.threads);
        let addr = format!("127.0.0.1:{port}").parse().expect("addr");
        let start = Instant::now();
        while !get(addr, "/health").await.is_ok_and(|r| r.status == 200) {
            assert!(start.elapsed() < Duration::from_secs(600), "laya-serve did not start");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        for &c in &args.concurrency {
            upstream_rps.push(throughput(addr, Arc::clone(&body), c, args.seconds).await);
        }
        let _ = child.kill();
        let _ = child.wait();
    }

    println!(
        "row: {tokens} tokens, 1 noul question, checkpoint {}",
        args.checkpoint.display()
    );
    let percentile = |values: &[f64], p: f64| percentile(values, p).unwrap_or(f64::NAN);
    println!(
        "supervisor overhead at concurrency 1 over {} requests: p50 {:.3} ms, p99 {:.3} ms (latency p50 {:.1} ms)",
        args.requests,
        percentile(&overheads, 0.5),
        percentile(&overheads, 0.99),
        percentile(&latencies, 0.5)
    );
    println!("| clients | layad req/s | upstream req/s | layad / upstream |");
    println!("|---|---|---|---|");
    let mut rows = Vec::new();
    for (i, &c) in args.concurrency.iter().enumerate() {
        let (ours, our_errors) = layad_rps[i];
        let theirs = upstream_rps.get(i).map(|(r, _)| *r);
        let ratio = theirs.map(|t| ours / t);
        println!(
            "| {c} | {ours:.2} | {} | {} |",
            theirs.map_or("-".to_owned(), |t| format!("{t:.2}")),
            ratio.map_or("-".to_owned(), |r| format!("{r:.2}x"))
        );
        rows.push(
            json!({"clients": c, "layad_rps": ours, "layad_errors": our_errors, "upstream_rps": theirs,
                          "upstream_errors": upstream_rps.get(i).map(|(_, e)| *e), "ratio": ratio}),
        );
    }
    let report: Value = json!({
        "checkpoint": args.checkpoint.display().to_string(), "row_tokens": tokens, "threads": args.threads,
        "overhead_ms": {"p50": percentile(&overheads, 0.5), "p99": percentile(&overheads, 0.99)},
        "latency_ms": {"p50": percentile(&latencies, 0.5), "p99": percentile(&latencies, 0.99)},
        "throughput": rows,
    });
    if let Some(dir) = args.out.parent() {
        std::fs::create_dir_all(dir).expect("out dir");
    }
    std::fs::write(&args.out, serde_json::to_string_pretty(&report).expect("json")).expect("write json");
    println!("wrote {}", args.out.display());
}
