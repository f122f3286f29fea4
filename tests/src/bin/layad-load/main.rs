//! `layad-load`: the open-loop load generator of the scheduling benchmark (heterogeneous pools).
//! Owns the CLI, sending, statistics and the run / capacity commands; `workload`, `plot`, `compare`
//! and `replay` the rest.
//!
//! `run` sends a seeded Poisson or bursty arrival sequence of a mixed workload (short, medium and
//! long single-question requests, short four-question requests) at its scheduled times whatever the
//! server is doing, and measures latency from the scheduled arrival, so queueing shows up in the
//! numbers instead of slowing the client down (the coordinated-omission trap of closed loops).
//! `capacity` is the closed-loop throughput of the same mix, to size the offered load; `plot` turns
//! result files into docs/scheduling.svg and a markdown table; `compare` reads several seeds of
//! several configurations with bootstrap intervals; `replay` replays a run's arrivals on idealised
//! servers (what the policy allows on the hardware). tools/bench/scheduling.sh drives it.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use layad_system_tests::{addr_of_url, load_average, percentile, post_json, server_timing, wait_until_ready};
use serde_json::{Value, json};

#[derive(Parser)]
#[command(about = "Open-loop load for layad's scheduling benchmark")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Open-loop run: seeded arrivals at `--rate`, latency from the scheduled arrival.
    Run(RunArgs),
    /// Closed-loop throughput of the same mix with N clients (to set the offered load).
    Capacity(CapacityArgs),
    /// SVG and markdown table comparing `run` result files.
    Plot(PlotArgs),
    /// Several seeds of several configurations: P99 ratios with bootstrap intervals, SVG per seed.
    Compare(compare::CompareArgs),
    /// Result files' arrivals replayed on idealised servers: what the policy allows on the hardware.
    Replay(replay::ReplayArgs),
}

#[derive(clap::Args)]
struct RunArgs {
    #[command(flatten)]
    target: Target,
    /// Offered load: mean arrivals per second.
    #[arg(long)]
    rate: f64,
    /// Length of the arrival sequence in seconds.
    #[arg(long, default_value_t = 60.0)]
    seconds: f64,
    /// Arrival process.
    #[arg(long, value_enum, default_value_t = Arrivals::Poisson)]
    arrivals: Arrivals,
    /// Where the result JSON goes.
    #[arg(long)]
    out: PathBuf,
    /// Configuration name shown in tables and plots (default: the output file's stem).
    #[arg(long)]
    label: Option<String>,
    /// Send only requests of this class (short-1q, medium-1q, long-1q, short-4q) at the same
    /// arrival times, instead of the mix (the slow-device benchmark sends short questions only).
    #[arg(long)]
    only: Option<String>,
}

#[derive(clap::Args)]
struct CapacityArgs {
    #[command(flatten)]
    target: Target,
    /// Seconds of closed-loop sending.
    #[arg(long, default_value_t = 30.0)]
    seconds: f64,
    /// Concurrent clients, each sending its next request when its previous one is answered.
    #[arg(long, default_value_t = 4)]
    clients: usize,
    /// Optional JSON result.
    #[arg(long)]
    out: Option<PathBuf>,
}

mod compare;
mod plot;
mod replay;
mod workload;

use plot::{PlotArgs, counts, ms, share};
use workload::{
    Arrivals, BodySpec, Class, SplitMix64, Target, answer_values, arrivals, body_index, drift, workload, write_file,
};

// ---------------------------------------------------------------------------------------------
// Sending.

/// `x_layad`, the supervisor's per-answer diagnostics (absent on servers without it).
#[derive(Clone, Debug, Default)]
struct Diagnostics {
    pool: Option<String>,
    worker: Option<String>,
    device: Option<String>,
    route: Option<String>,
    reason: Option<String>,
    queue_ms: Option<f64>,
    device_ms: Option<f64>,
    batch_rows: Option<u64>,
}

impl Diagnostics {
    fn parse(v: &Value) -> Option<Diagnostics> {
        let d = v.get("x_layad")?.as_object()?;
        let text = |k: &str| d.get(k).and_then(Value::as_str).map(str::to_owned);
        let number = |k: &str| d.get(k).and_then(Value::as_f64);
        Some(Diagnostics {
            pool: text("pool"),
            worker: text("worker"),
            device: text("device"),
            route: text("route"),
            reason: text("reason"),
            queue_ms: number("queue_ms"),
            device_ms: number("device_ms"),
            batch_rows: d.get("batch_rows").and_then(Value::as_u64),
        })
    }
}

/// What happened to one request.
#[derive(Clone, Debug)]
struct Record {
    index: usize,
    class: Class,
    variant: usize,
    /// Scheduled arrival, ms after the start.
    at_ms: f64,
    /// How late the request actually left (the generator falling behind shows here).
    lag_ms: f64,
    /// HTTP status; 0 when no response came (connection error or the client's timeout).
    status: u16,
    error: Option<String>,
    /// Scheduled arrival to the full response.
    latency_ms: f64,
    diag: Option<Diagnostics>,
    /// `Server-Timing` queue and device phases (present on today's server too).
    timing_queue_ms: Option<f64>,
    timing_device_ms: Option<f64>,
    /// Answer values in the reference's order; `None` unless 200 with the reference's shape.
    values: Option<Vec<f64>>,
    drift: Option<f64>,
    shape_mismatch: bool,
}

impl Record {
    fn ok(&self) -> bool {
        self.status == 200
    }

    fn to_json(&self) -> Value {
        let mut v = json!({
            "i": self.index, "class": self.class.name(), "variant": self.variant,
            "at_ms": round3(self.at_ms), "lag_ms": round3(self.lag_ms), "status": self.status,
            "latency_ms": round3(self.latency_ms),
        });
        let o = v.as_object_mut().expect("object");
        if let Some(e) = &self.error {
            o.insert("error".into(), json!(e));
        }
        if let Some(d) = &self.diag {
            o.insert(
                "x_layad".into(),
                json!({"pool": d.pool, "worker": d.worker, "device": d.device, "route": d.route,
                       "reason": d.reason, "queue_ms": d.queue_ms, "device_ms": d.device_ms,
                       "batch_rows": d.batch_rows}),
            );
        }
        // Server-Timing repeats x_layad's queue and device times: kept only where x_layad is absent.
        if self.diag.is_none() {
            if let Some(q) = self.timing_queue_ms {
                o.insert("st_queue_ms".into(), json!(q));
            }
            if let Some(q) = self.timing_device_ms {
                o.insert("st_device_ms".into(), json!(q));
            }
        }
        if let Some(values) = &self.values {
            o.insert("p".into(), json!(values));
        }
        if let Some(d) = self.drift {
            o.insert("drift".into(), json!(d));
        }
        if self.shape_mismatch {
            o.insert("shape_mismatch".into(), json!(true));
        }
        v
    }
}

fn round3(x: f64) -> f64 {
    (x * 1e3).round() / 1e3
}

/// Sends `spec`'s body now and records the answer; latency counts from `scheduled`.
async fn send(addr: SocketAddr, spec: &BodySpec, scheduled: Instant, timeout: Duration, index: usize) -> Record {
    let lag_ms = scheduled.elapsed().as_secs_f64() * 1e3;
    let result = tokio::time::timeout(timeout, post_json(addr, "/v1/systemone", spec.body.as_bytes())).await;
    let latency_ms = scheduled.elapsed().as_secs_f64() * 1e3;
    let mut record = Record {
        index,
        class: spec.class,
        variant: spec.variant,
        at_ms: 0.0,
        lag_ms,
        status: 0,
        error: None,
        latency_ms,
        diag: None,
        timing_queue_ms: None,
        timing_device_ms: None,
        values: None,
        drift: None,
        shape_mismatch: false,
    };
    let response = match result {
        Err(_) => {
            record.error = Some(format!("no answer within {timeout:?}"));
            return record;
        }
        Ok(Err(e)) => {
            record.error = Some(e.to_string());
            return record;
        }
        Ok(Ok(r)) => r,
    };
    record.status = response.status;
    let timing = response.header("server-timing");
    record.timing_queue_ms = server_timing(timing, "queue");
    record.timing_device_ms = server_timing(timing, "device");
    if response.status != 200 {
        let text = response.text();
        record.error = Some(text.chars().take(200).collect());
        return record;
    }
    match serde_json::from_slice::<Value>(&response.body) {
        Ok(value) => {
            record.diag = Diagnostics::parse(&value);
            let values = answer_values(&value);
            record.drift = drift(&spec.reference, &values);
            record.shape_mismatch = record.drift.is_none();
            if !record.shape_mismatch {
                record.values = Some(values.into_iter().map(|(_, v)| v).collect());
            }
        }
        Err(e) => record.error = Some(format!("200 with a body that is not JSON: {e}")),
    }
    record
}

async fn connect(target: &Target) -> Result<(SocketAddr, Vec<BodySpec>), String> {
    if target.variants == 0 {
        return Err("--variants must be at least 1".into());
    }
    let addr = addr_of_url(&target.url)?;
    if !wait_until_ready(addr, Duration::from_secs(target.ready_timeout_s)).await {
        return Err(format!(
            "{} did not answer /readyz with 200 within {} s",
            target.url, target.ready_timeout_s
        ));
    }
    let bodies = workload(addr, target).await?;
    Ok((addr, bodies))
}

// ---------------------------------------------------------------------------------------------
// Statistics.

/// Latency and routing summary of a set of records (one class, or all).
fn summarize(name: &str, records: &[&Record], any_diagnostics: bool) -> Value {
    let ok: Vec<&&Record> = records.iter().filter(|r| r.ok()).collect();
    let latencies: Vec<f64> = ok.iter().map(|r| r.latency_ms).collect();
    let mut errors_by_status: BTreeMap<String, usize> = BTreeMap::new();
    for r in records.iter().filter(|r| !r.ok()) {
        let key = if r.status == 0 {
            "no response".to_owned()
        } else {
            r.status.to_string()
        };
        *errors_by_status.entry(key).or_default() += 1;
    }
    let mut pools: BTreeMap<String, usize> = BTreeMap::new();
    let mut routes: BTreeMap<String, usize> = BTreeMap::new();
    let mut with_diag = 0usize;
    let mut queue = Vec::new();
    let mut device = Vec::new();
    let mut batch_rows = Vec::new();
    for r in &ok {
        if let Some(d) = &r.diag {
            with_diag += 1;
            *pools.entry(d.pool.clone().unwrap_or_else(|| "?".into())).or_default() += 1;
            *routes.entry(d.route.clone().unwrap_or_else(|| "?".into())).or_default() += 1;
            batch_rows.extend(d.batch_rows.map(|b| b as f64));
        }
        // x_layad's numbers when present, else the Server-Timing phases.
        queue.extend(r.diag.as_ref().and_then(|d| d.queue_ms).or(r.timing_queue_ms));
        device.extend(r.diag.as_ref().and_then(|d| d.device_ms).or(r.timing_device_ms));
    }
    let spilled = routes.get("spilled").copied().unwrap_or(0);
    let spill_share = (any_diagnostics && with_diag > 0).then(|| spilled as f64 / with_diag as f64);
    let drifts: Vec<f64> = ok.iter().filter_map(|r| r.drift).collect();
    let mean = (!latencies.is_empty()).then(|| latencies.iter().sum::<f64>() / latencies.len() as f64);
    json!({
        "class": name,
        "count": records.len(),
        "ok": ok.len(),
        "errors": records.len() - ok.len(),
        "errors_by_status": errors_by_status,
        "p50_ms": percentile(&latencies, 0.50),
        "p95_ms": percentile(&latencies, 0.95),
        "p99_ms": percentile(&latencies, 0.99),
        "max_ms": percentile(&latencies, 1.0),
        "mean_ms": mean,
        "spill_share": spill_share,
        "routes": routes,
        "pools": pools,
        "queue_ms": {"p50": percentile(&queue, 0.5), "p99": percentile(&queue, 0.99)},
        "device_ms": {"p50": percentile(&device, 0.5), "p99": percentile(&device, 0.99)},
        "batch_rows": {"mean": (!batch_rows.is_empty()).then(|| batch_rows.iter().sum::<f64>() / batch_rows.len() as f64),
                       "max": percentile(&batch_rows, 1.0)},
        "max_drift": drifts.iter().copied().reduce(f64::max),
        "shape_mismatches": ok.iter().filter(|r| r.shape_mismatch).count(),
    })
}

fn print_summary_table(rows: &[Value]) {
    println!(
        "{:<10} {:>6} {:>9} {:>9} {:>9} {:>7} {:>7}  pools",
        "class", "count", "P50 ms", "P95 ms", "P99 ms", "errors", "spill"
    );
    for row in rows {
        println!(
            "{:<10} {:>6} {:>9} {:>9} {:>9} {:>7} {:>7}  {}",
            row["class"].as_str().unwrap_or("?"),
            row["count"].as_u64().unwrap_or(0),
            ms(&row["p50_ms"]),
            ms(&row["p95_ms"]),
            ms(&row["p99_ms"]),
            row["errors"].as_u64().unwrap_or(0),
            share(&row["spill_share"]),
            counts(&row["pools"])
        );
    }
}

fn unix_seconds() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

// ---------------------------------------------------------------------------------------------
// Commands.

async fn run(args: RunArgs) -> Result<(), String> {
    if !(args.rate > 0.0 && args.seconds > 0.0) {
        return Err("--rate and --seconds must be positive".into());
    }
    let only = match &args.only {
        Some(name) => Some(Class::parse(name).ok_or_else(|| format!("--only: no request class '{name}'"))?),
        None => None,
    };
    let (addr, bodies) = connect(&args.target).await?;
    let bodies = Arc::new(bodies);
    let mut schedule = arrivals(
        args.target.seed,
        args.rate,
        args.seconds,
        args.arrivals,
        args.target.variants,
    );
    if let Some(class) = only {
        for arrival in &mut schedule {
            arrival.class = class;
        }
    }
    let label = args.label.clone().unwrap_or_else(|| {
        args.out
            .file_stem()
            .map_or("run".to_owned(), |s| s.to_string_lossy().into_owned())
    });
    eprintln!(
        "{label}: {} {} arrivals over {} s at {} req/s (mean) to {}",
        schedule.len(),
        args.arrivals.name(),
        args.seconds,
        args.rate,
        args.target.url
    );
    let load_before = load_average();
    let timeout = Duration::from_secs(args.target.request_timeout_s);
    // A short lead so every task is spawned before the first arrival is due.
    let start = Instant::now() + Duration::from_millis(200);
    let tasks: Vec<_> = schedule
        .iter()
        .enumerate()
        .map(|(index, arrival)| {
            let bodies = Arc::clone(&bodies);
            let body = body_index(&bodies, arrival.class, arrival.variant);
            let at_ms = arrival.at * 1e3;
            let scheduled = start + Duration::from_secs_f64(arrival.at);
            // Open loop: each request waits only for its own time, never for earlier answers.
            tokio::spawn(async move {
                tokio::time::sleep_until(scheduled.into()).await;
                let mut record = send(addr, &bodies[body], scheduled, timeout, index).await;
                record.at_ms = at_ms;
                record
            })
        })
        .collect();
    let mut records = Vec::with_capacity(tasks.len());
    for task in tasks {
        records.push(task.await.map_err(|e| format!("request task: {e}"))?);
    }
    let wall_s = start.elapsed().as_secs_f64();
    let load_after = load_average();

    let any_diagnostics = records.iter().any(|r| r.diag.is_some());
    let mut classes = Vec::new();
    for class in Class::ALL {
        let of_class: Vec<&Record> = records.iter().filter(|r| r.class == class).collect();
        classes.push(summarize(class.name(), &of_class, any_diagnostics));
    }
    let all: Vec<&Record> = records.iter().collect();
    let overall = summarize("all", &all, any_diagnostics);
    let lags: Vec<f64> = records.iter().map(|r| r.lag_ms).collect();
    let drifts: Vec<f64> = records.iter().filter_map(|r| r.drift).collect();
    let max_drift = drifts.iter().copied().reduce(f64::max);
    let mismatches = records.iter().filter(|r| r.shape_mismatch).count();

    println!(
        "{label} ({} arrivals, {} req/s offered, {} s, seed {})",
        args.arrivals.name(),
        args.rate,
        args.seconds,
        args.target.seed
    );
    let mut table = classes.clone();
    table.push(overall.clone());
    print_summary_table(&table);
    println!(
        "sent {} in {wall_s:.1} s; send lag p99 {} ms, max {} ms; x_layad {}",
        records.len(),
        ms(&json!(percentile(&lags, 0.99))),
        ms(&json!(percentile(&lags, 1.0))),
        if any_diagnostics {
            "present"
        } else {
            "absent (spill share null)"
        }
    );
    println!(
        "answer drift vs reference: max |Δ| {} over {} answers{}",
        max_drift.map_or("-".to_owned(), |d| format!("{d:.2e}")),
        drifts.len(),
        if mismatches > 0 {
            format!(", {mismatches} answers shaped differently")
        } else {
            String::new()
        }
    );

    let workload: Vec<Value> = Class::ALL
        .iter()
        .map(|&class| {
            let of_class: Vec<Value> = bodies
                .iter()
                .filter(|b| b.class == class)
                .map(|b| json!({"variant": b.variant, "row_tokens": b.row_tokens, "input_tokens": b.input_tokens}))
                .collect();
            json!({"class": class.name(), "share": class.share(), "questions": class.questions(),
                   "row_tokens_wanted": class.row_tokens(), "bodies": of_class})
        })
        .collect();
    let summary = json!({
        "tool": "layad-load run",
        "command": std::env::args().collect::<Vec<_>>().join(" "),
        "label": label,
        "url": args.target.url,
        "arrivals": args.arrivals.name(),
        "rate": args.rate,
        "only": args.only,
        "seconds": args.seconds,
        "seed": args.target.seed,
        "reference": args.target.reference.as_ref().map(|p| p.display().to_string()),
        "started_unix": unix_seconds(),
        "load_average": {"before": load_before, "after": load_after},
        "sent": records.len(),
        "wall_s": wall_s,
        "send_lag_ms": {"p50": percentile(&lags, 0.5), "p99": percentile(&lags, 0.99), "max": percentile(&lags, 1.0)},
        "x_layad": any_diagnostics,
        "drift": {"max_abs": max_drift, "answers_compared": drifts.len(), "shape_mismatches": mismatches},
        "workload": workload,
        "classes": classes,
        "overall": overall,
    });
    write_file(&args.out, &with_records(&summary, &records))?;
    eprintln!("wrote {}", args.out.display());
    Ok(())
}

/// The summary pretty-printed, then the raw records one compact object per line (a file that
/// is readable at the top and still small).
fn with_records(summary: &Value, records: &[Record]) -> String {
    let mut text = serde_json::to_string_pretty(summary).expect("summary JSON");
    let close = text.rfind('}').expect("an object ends with }");
    text.truncate(close);
    let text = text.trim_end().to_owned();
    let lines: Vec<String> = records.iter().map(|r| format!("    {}", r.to_json())).collect();
    format!("{text},\n  \"records\": [\n{}\n  ]\n}}\n", lines.join(",\n"))
}

async fn capacity(args: CapacityArgs) -> Result<(), String> {
    if args.clients == 0 || args.seconds <= 0.0 {
        return Err("--clients and --seconds must be positive".into());
    }
    let (addr, bodies) = connect(&args.target).await?;
    // The mix as a long seeded sequence the clients take turns drawing from.
    let mut rng = SplitMix64::new(args.target.seed ^ 0xCA9A_C117);
    let mix: Arc<Vec<usize>> = Arc::new(
        (0..10_000)
            .map(|_| {
                let class = Class::draw(&mut rng);
                body_index(&bodies, class, rng.below(args.target.variants))
            })
            .collect(),
    );
    let bodies = Arc::new(bodies);
    let next = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let timeout = Duration::from_secs(args.target.request_timeout_s);
    let start = Instant::now();
    let clients: Vec<_> = (0..args.clients)
        .map(|_| {
            let (bodies, mix, next, stop) = (
                Arc::clone(&bodies),
                Arc::clone(&mix),
                Arc::clone(&next),
                Arc::clone(&stop),
            );
            tokio::spawn(async move {
                let mut records = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let k = next.fetch_add(1, Ordering::Relaxed);
                    let spec = &bodies[mix[k % mix.len()]];
                    records.push(send(addr, spec, Instant::now(), timeout, k).await);
                }
                records
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs_f64(args.seconds)).await;
    stop.store(true, Ordering::Relaxed);
    let mut records = Vec::new();
    for client in clients {
        records.extend(client.await.map_err(|e| format!("client task: {e}"))?);
    }
    // Answers counted up to the moment the last client finished: the in-flight tail is real work.
    let elapsed = start.elapsed().as_secs_f64();
    let ok = records.iter().filter(|r| r.ok()).count();
    let rps = ok as f64 / elapsed;
    let any_diagnostics = records.iter().any(|r| r.diag.is_some());
    let mut table: Vec<Value> = Class::ALL
        .iter()
        .map(|&class| {
            let of_class: Vec<&Record> = records.iter().filter(|r| r.class == class).collect();
            summarize(class.name(), &of_class, any_diagnostics)
        })
        .collect();
    let all: Vec<&Record> = records.iter().collect();
    table.push(summarize("all", &all, any_diagnostics));
    eprintln!(
        "closed loop, {} clients, {elapsed:.1} s: {ok} answers, {} errors (latencies from send)",
        args.clients,
        records.len() - ok
    );
    print_summary_table(&table);
    println!("capacity_rps {rps:.3}");
    if let Some(out) = &args.out {
        let value = json!({
            "tool": "layad-load capacity", "url": args.target.url, "clients": args.clients,
            "seconds": elapsed, "seed": args.target.seed, "answers": ok, "errors": records.len() - ok,
            "capacity_rps": rps, "classes": table,
        });
        write_file(out, &serde_json::to_string_pretty(&value).expect("capacity JSON"))?;
    }
    Ok(())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let result = match Cli::parse().command {
        Command::Run(args) => run(args).await,
        Command::Capacity(args) => capacity(args).await,
        Command::Plot(args) => plot::plot(args),
        Command::Compare(args) => compare::compare(args),
        Command::Replay(args) => replay::replay_command(args),
    };
    if let Err(e) = result {
        eprintln!("layad-load: {e}");
        std::process::exit(1);
    }
}
