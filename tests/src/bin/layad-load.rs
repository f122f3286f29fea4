//! `layad-load`: the open-loop load generator of the scheduling benchmark (heterogeneous pools).
//! Owns the seeded workload mix, the `run` / `capacity` measurements, answer drift and the SVG plot.
//!
//! `run` sends a seeded Poisson or bursty arrival sequence of a mixed workload (short, medium and
//! long single-question requests, short four-question requests) at its scheduled times whatever the
//! server is doing, and measures latency from the scheduled arrival, so queueing shows up in the
//! numbers instead of slowing the client down (the coordinated-omission trap of closed loops).
//! `capacity` is the closed-loop throughput of the same mix, to size the offered load; `plot` turns
//! result files into docs/scheduling.svg and a markdown table. tools/bench/scheduling.sh drives it.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand, ValueEnum};
use layad_system_tests::{addr_of_url, percentile, post_json, server_timing, wait_until_ready};
use serde_json::{Map, Value, json};

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
}

/// What every measuring command needs to build the same requests.
#[derive(clap::Args)]
struct Target {
    /// Base URL of the server (plain http).
    #[arg(long, default_value = "http://127.0.0.1:8642")]
    url: String,
    /// Seed of the arrivals, the class draws and the request bodies.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Distinct bodies per class (each is calibrated and answered once before timing).
    #[arg(long, default_value_t = 6)]
    variants: usize,
    /// Bodies and reference answers: loaded if the file exists, else made here and saved, so
    /// several configurations are sent identical requests and judged against the same answers.
    #[arg(long)]
    reference: Option<PathBuf>,
    /// Seconds to wait for /readyz before giving up.
    #[arg(long, default_value_t = 120)]
    ready_timeout_s: u64,
    /// Per-request timeout in seconds (a request past it is recorded as an error).
    #[arg(long, default_value_t = 120)]
    request_timeout_s: u64,
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

#[derive(clap::Args)]
struct PlotArgs {
    /// Where the SVG goes.
    #[arg(long, default_value = "docs/scheduling.svg")]
    out: PathBuf,
    /// Title of the figure.
    #[arg(long, default_value = "layad scheduling benchmark: latency by request class")]
    title: String,
    /// `layad-load run` result files.
    #[arg(required = true)]
    results: Vec<PathBuf>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Arrivals {
    /// Poisson arrivals with mean rate R.
    Poisson,
    /// Cycles of 1 s of Poisson arrivals at 3R then 2 s idle (mean R).
    Bursty,
}

impl Arrivals {
    fn name(self) -> &'static str {
        match self {
            Arrivals::Poisson => "poisson",
            Arrivals::Bursty => "bursty",
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Deterministic randomness: splitmix64, so a seed means the same sequence on every machine and
// build without a dependency.

struct SplitMix64(u64);

impl SplitMix64 {
    fn new(seed: u64) -> Self {
        Self(seed)
    }

    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1) with 53 random bits.
    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in 0..n (n > 0); the modulo bias is far below anything this tool can measure.
    fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    /// Exponential gap of a Poisson process with `rate` per second.
    fn exp_gap(&mut self, rate: f64) -> f64 {
        -(1.0 - self.unit()).ln() / rate
    }
}

// ---------------------------------------------------------------------------------------------
// The workload.

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Class {
    Short,
    Medium,
    Long,
    Short4,
}

impl Class {
    const ALL: [Class; 4] = [Class::Short, Class::Medium, Class::Long, Class::Short4];

    fn name(self) -> &'static str {
        match self {
            Class::Short => "short-1q",
            Class::Medium => "medium-1q",
            Class::Long => "long-1q",
            Class::Short4 => "short-4q",
        }
    }

    fn parse(name: &str) -> Option<Class> {
        Class::ALL.into_iter().find(|c| c.name() == name)
    }

    /// Share of arrivals.
    fn share(self) -> f64 {
        match self {
            Class::Short => 0.6,
            Class::Medium => 0.2,
            Class::Long => 0.1,
            Class::Short4 => 0.1,
        }
    }

    /// Wanted tokens per row, inclusive. Long rows are sized not to fit a 128-token short pool.
    fn row_tokens(self) -> (u64, u64) {
        match self {
            Class::Short | Class::Short4 => (48, 64),
            Class::Medium => (100, 120),
            Class::Long => (300, 400),
        }
    }

    fn questions(self) -> usize {
        match self {
            Class::Short4 => 4,
            _ => 1,
        }
    }

    fn draw(rng: &mut SplitMix64) -> Class {
        let u = rng.unit();
        let mut acc = 0.0;
        for class in Class::ALL {
            acc += class.share();
            if u < acc {
                return class;
            }
        }
        Class::Short
    }
}

/// Support-ticket sentences: plain English so language routing sends every body to `english`.
const PHRASES: &[&str] = &[
    "I was charged twice for invoice 4411.",
    "Please refund the second payment today.",
    "The app crashes when I open the settings page.",
    "My order has not arrived after two weeks.",
    "Can you change the delivery address to my office?",
    "The password reset email never reaches my inbox.",
    "I would like to cancel my subscription at the end of the month.",
    "The tracking number you sent does not work.",
    "We need an invoice with our company tax number on it.",
    "The discount code was not applied at checkout.",
    "Your support line kept me on hold for an hour.",
    "The screen stays black after the latest update.",
    "I cannot log in from my new phone.",
    "Please send a replacement for the broken item.",
    "The package arrived damaged and the box was wet.",
    "Why was my card declined when the balance is fine?",
    "I want to upgrade our plan to the team edition.",
    "The export to spreadsheet feature times out.",
    "Thank you for the quick help last week.",
    "This is the third time I am writing about this problem.",
    "Our account was locked after a failed payment.",
    "The size chart on the website is wrong.",
    "I ordered blue shoes but received red ones.",
    "Could someone call me back this afternoon?",
    "The monthly report shows the wrong totals.",
    "Notifications stopped working on all our devices.",
    "I moved to a new city and need to update my billing details.",
    "The warranty should cover this repair.",
    "Please remove my data from your mailing list.",
    "The checkout page shows an error after I enter my card.",
];

/// Question templates: (id, question JSON). Short instructions keep the row overhead small, so a
/// short row is mostly state.
fn question_templates() -> Vec<(&'static str, Value)> {
    vec![
        (
            "queue",
            json!({"type": "choice", "instructions": "Which queue?",
                   "criteria": {"billing": "payments", "tech": "technical", "other": "anything else"}}),
        ),
        (
            "refund",
            json!({"type": "noul", "instructions": "Is this a refund request?"}),
        ),
        (
            "urgency",
            json!({"type": "choice", "instructions": "How urgent?", "criteria": {"high": "today", "low": "can wait"}}),
        ),
        (
            "mood",
            json!({"type": "choice", "instructions": "Customer mood?", "criteria": {"upset": "angry", "calm": "neutral"}}),
        ),
    ]
}

/// One distinct request body with the server's answer to it alone (the drift reference).
#[derive(Clone, Debug)]
struct BodySpec {
    class: Class,
    variant: usize,
    /// Mean tokens per row as the server counted them (`usage.input_tokens` / questions).
    row_tokens: f64,
    input_tokens: u64,
    body: String,
    /// Answer probabilities by path (`qid.probabilities.label`, `qid.act_probability`), in order.
    reference: Vec<(String, f64)>,
}

impl BodySpec {
    fn to_json(&self) -> Value {
        let values: Map<String, Value> = self.reference.iter().map(|(k, v)| (k.clone(), json!(v))).collect();
        json!({"class": self.class.name(), "variant": self.variant, "row_tokens": self.row_tokens,
               "input_tokens": self.input_tokens, "body": self.body, "reference": values})
    }

    fn from_json(v: &Value) -> Result<BodySpec, String> {
        let class = v["class"]
            .as_str()
            .and_then(Class::parse)
            .ok_or("reference body without a known class")?;
        let reference = v["reference"]
            .as_object()
            .ok_or("reference body without answers")?
            .iter()
            .map(|(k, x)| x.as_f64().map(|x| (k.clone(), x)).ok_or(format!("{k}: not a number")))
            .collect::<Result<_, _>>()?;
        Ok(BodySpec {
            class,
            variant: v["variant"].as_u64().ok_or("reference body without variant")? as usize,
            row_tokens: v["row_tokens"].as_f64().unwrap_or(f64::NAN),
            input_tokens: v["input_tokens"].as_u64().unwrap_or(0),
            body: v["body"].as_str().ok_or("reference body without body")?.to_owned(),
            reference,
        })
    }
}

/// Every answer probability of a 200 body: each `answers.<qid>.probabilities` value, a noul
/// answer's `noul`, and each `answers.<qid>.action.act_probability`, keyed by path, in the
/// server's order.
fn answer_values(response: &Value) -> Vec<(String, f64)> {
    let mut out = Vec::new();
    let Some(answers) = response["answers"].as_object() else {
        return out;
    };
    for (qid, answer) in answers {
        match &answer["probabilities"] {
            Value::Object(map) => {
                for (label, p) in map {
                    if let Some(p) = p.as_f64() {
                        out.push((format!("{qid}.probabilities.{label}"), p));
                    }
                }
            }
            Value::Array(items) => {
                for (i, p) in items.iter().enumerate() {
                    if let Some(p) = p.as_f64() {
                        out.push((format!("{qid}.probabilities.{i}"), p));
                    }
                }
            }
            _ => {}
        }
        // A noul answer's probability is a scalar, not a `probabilities` map.
        if let Some(p) = answer["noul"].as_f64() {
            out.push((format!("{qid}.noul"), p));
        }
        if let Some(p) = answer["action"]["act_probability"].as_f64() {
            out.push((format!("{qid}.act_probability"), p));
        }
    }
    out
}

/// Max |Δ| between `values` and the reference, or `None` when the answer's shape differs.
fn drift(reference: &[(String, f64)], values: &[(String, f64)]) -> Option<f64> {
    if reference.len() != values.len() {
        return None;
    }
    let mut max = 0f64;
    for ((rk, rv), (k, v)) in reference.iter().zip(values) {
        if rk != k {
            return None;
        }
        max = max.max((rv - v).abs());
    }
    Some(max)
}

/// POSTs `body` alone and returns (input_tokens, answer values), retrying 503s (a busy or
/// restarting server) for up to a minute.
async fn probe(addr: SocketAddr, body: &str) -> Result<(u64, Vec<(String, f64)>), String> {
    let start = Instant::now();
    loop {
        let response = post_json(addr, "/v1/systemone", body.as_bytes())
            .await
            .map_err(|e| format!("probe request: {e}"))?;
        if response.status == 503 && start.elapsed() < Duration::from_secs(60) {
            tokio::time::sleep(Duration::from_millis(250)).await;
            continue;
        }
        if response.status != 200 {
            return Err(format!("probe answered {}: {}", response.status, response.text()));
        }
        let value: Value = serde_json::from_slice(&response.body).map_err(|e| format!("probe body: {e}"))?;
        let tokens = value["usage"]["input_tokens"]
            .as_u64()
            .ok_or_else(|| format!("probe answer without usage.input_tokens: {}", response.text()))?;
        return Ok((tokens, answer_values(&value)));
    }
}

fn body_text(words: &[&str], questions: &[(&'static str, Value)]) -> String {
    let questions: Map<String, Value> = questions.iter().map(|(id, q)| ((*id).to_owned(), q.clone())).collect();
    json!({"state": words.join(" "), "questions": questions}).to_string()
}

/// Phrases drawn per body; far more than 400 tokens on any tokenizer we serve.
const MAX_PHRASES: usize = 256;

/// Builds variant `variant` of `class`: the questions and the state's text come from the seed, its
/// length in words is the smallest whose rows reach a seeded target length on this server's
/// tokenizer (or the server's row cap, when it truncates rows shorter than the target). Words, not
/// phrases, so a short row can land within its 16-token window after the question's overhead.
async fn calibrate(addr: SocketAddr, seed: u64, class: Class, variant: usize) -> Result<BodySpec, String> {
    // Bodies depend on the seed, class and variant only (not on rate or arrivals), so every run
    // with one seed sends the same requests.
    let mut rng = SplitMix64::new(seed ^ 0xB0D1_E500_0000_0000 ^ ((class as u64) << 32) ^ variant as u64);
    let (lo, hi) = class.row_tokens();
    let target = lo + rng.below((hi - lo + 1) as usize) as u64;
    let templates = question_templates();
    let questions: Vec<_> = if class.questions() == templates.len() {
        templates
    } else {
        let pick = rng.below(templates.len());
        vec![templates[pick].clone()]
    };
    // A random start inside the first phrase: short rows hold only a few words of state, and
    // whole-phrase starts would make many short variants identical.
    let skip = rng.below(5);
    let words: Vec<&str> = (0..MAX_PHRASES)
        .flat_map(|_| PHRASES[rng.below(PHRASES.len())].split(' '))
        .skip(skip)
        .collect();
    let rows = questions.len() as u64;
    let mut seen: HashMap<usize, (u64, Vec<(String, f64)>)> = HashMap::new();
    let mut row_tokens = async |n: usize| -> Result<u64, String> {
        if let Some((tokens, _)) = seen.get(&n) {
            return Ok(tokens / rows);
        }
        let result = probe(addr, &body_text(&words[..n], &questions)).await?;
        let tokens = result.0;
        seen.insert(n, result);
        Ok(tokens / rows)
    };
    // Growing 4x until the target is reached or rows stop growing (the server truncates them);
    // then the bracket (below, above] holds the answer, with rows(below) < goal <= rows(above).
    let (mut below, mut above) = (0usize, 1usize);
    let (mut below_tokens, mut above_tokens) = (None, row_tokens(1).await?);
    let mut goal = target;
    while above_tokens < goal {
        if above == words.len() {
            goal = above_tokens;
            break;
        }
        let next = (above * 4).min(words.len());
        let tokens = row_tokens(next).await?;
        if tokens == above_tokens {
            goal = tokens;
            break;
        }
        (below, below_tokens) = (above, Some(above_tokens));
        (above, above_tokens) = (next, tokens);
    }
    // Smallest word count in the bracket whose rows reach the goal: interpolation (tokens grow
    // almost linearly with words), falling back to bisection without a lower point.
    while above - below > 1 {
        let mid = match below_tokens {
            Some(t) if above_tokens > t => {
                let step = ((goal - t) as f64 * (above - below) as f64 / (above_tokens - t) as f64).ceil() as usize;
                (below + step).clamp(below + 1, above - 1)
            }
            _ => (below + above) / 2,
        };
        let tokens = row_tokens(mid).await?;
        if tokens >= goal {
            (above, above_tokens) = (mid, tokens);
        } else {
            (below, below_tokens) = (mid, Some(tokens));
        }
    }
    // One word can add several tokens: when reaching the target overshoots the window, one word
    // fewer may still be inside it.
    if above_tokens > hi && below_tokens.is_some_and(|t| t >= lo) {
        above = below;
    }
    let (input_tokens, reference) = seen.remove(&above).expect("the chosen word count was probed");
    let row = input_tokens as f64 / rows as f64;
    if row < lo as f64 || row > hi as f64 {
        eprintln!(
            "note: {} variant {variant}: rows of {row:.0} tokens (wanted {lo}-{hi}){}",
            class.name(),
            if goal < target {
                "; the server truncates rows at this length"
            } else {
                ""
            }
        );
    }
    Ok(BodySpec {
        class,
        variant,
        row_tokens: row,
        input_tokens,
        body: body_text(&words[..above], &questions),
        reference,
    })
}

/// The bodies of every class and variant with their reference answers: from `--reference` if it
/// exists, else calibrated against the server now (and saved there when given).
async fn workload(addr: SocketAddr, target: &Target) -> Result<Vec<BodySpec>, String> {
    if let Some(path) = target.reference.as_ref().filter(|p| p.exists()) {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let value: Value = serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        let (seed, variants) = (value["seed"].as_u64(), value["variants"].as_u64());
        if seed != Some(target.seed) || variants != Some(target.variants as u64) {
            return Err(format!(
                "{} was made with --seed {seed:?} --variants {variants:?}; pass the same or another file",
                path.display()
            ));
        }
        let bodies = value["bodies"]
            .as_array()
            .ok_or_else(|| format!("{}: no bodies", path.display()))?
            .iter()
            .map(BodySpec::from_json)
            .collect::<Result<Vec<_>, _>>()?;
        eprintln!(
            "loaded {} bodies and reference answers from {}",
            bodies.len(),
            path.display()
        );
        return Ok(bodies);
    }
    // The calibration probes are sequential, each alone on the server: the probe of the body
    // finally chosen is its closed-loop reference answer.
    let started = Instant::now();
    let mut bodies = Vec::new();
    for class in Class::ALL {
        for variant in 0..target.variants {
            bodies.push(calibrate(addr, target.seed, class, variant).await?);
        }
    }
    eprintln!(
        "calibrated {} bodies against {} in {:.1} s",
        bodies.len(),
        target.url,
        started.elapsed().as_secs_f64()
    );
    if let Some(path) = &target.reference {
        let value = json!({
            "tool": "layad-load", "format": 1, "seed": target.seed, "variants": target.variants,
            "url": target.url, "bodies": bodies.iter().map(BodySpec::to_json).collect::<Vec<_>>(),
        });
        write_file(path, &serde_json::to_string_pretty(&value).expect("reference JSON"))?;
        eprintln!("saved bodies and reference answers to {}", path.display());
    }
    Ok(bodies)
}

fn write_file(path: &Path, text: &str) -> Result<(), String> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))
}

/// Index of `class`'s `variant` in the workload (bodies are stored class by class).
fn body_index(bodies: &[BodySpec], class: Class, variant: usize) -> usize {
    bodies
        .iter()
        .position(|b| b.class == class && b.variant == variant)
        .expect("every class has every variant")
}

// ---------------------------------------------------------------------------------------------
// Arrivals.

/// One scheduled request: seconds after the start, and which body.
struct Arrival {
    at: f64,
    class: Class,
    variant: usize,
}

/// The seeded arrival sequence over `seconds`.
fn arrivals(seed: u64, rate: f64, seconds: f64, pattern: Arrivals, variants: usize) -> Vec<Arrival> {
    let mut rng = SplitMix64::new(seed);
    let mut out = Vec::new();
    // Bursty: a Poisson process at 3R in "active time", mapped onto 1-second active windows that
    // start every 3 seconds, so the long-run mean is R.
    let (process_rate, to_wall): (f64, fn(f64) -> f64) = match pattern {
        Arrivals::Poisson => (rate, |t| t),
        Arrivals::Bursty => (3.0 * rate, |t| t.floor() * 3.0 + t.fract()),
    };
    let mut active = 0.0;
    loop {
        active += rng.exp_gap(process_rate);
        let at = to_wall(active);
        if at >= seconds {
            return out;
        }
        let class = Class::draw(&mut rng);
        let variant = rng.below(variants);
        out.push(Arrival { at, class, variant });
    }
}

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

fn ms(v: &Value) -> String {
    v.as_f64().map_or("-".to_owned(), |x| {
        if x >= 100.0 {
            format!("{x:.0}")
        } else {
            format!("{x:.1}")
        }
    })
}

fn share(v: &Value) -> String {
    v.as_f64().map_or("null".to_owned(), |x| format!("{:.1}%", 100.0 * x))
}

fn counts(v: &Value) -> String {
    match v.as_object() {
        Some(map) if !map.is_empty() => map
            .iter()
            .map(|(k, n)| format!("{k}:{n}"))
            .collect::<Vec<_>>()
            .join(" "),
        _ => "-".to_owned(),
    }
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

fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
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
    let (addr, bodies) = connect(&args.target).await?;
    let bodies = Arc::new(bodies);
    let schedule = arrivals(
        args.target.seed,
        args.rate,
        args.seconds,
        args.arrivals,
        args.target.variants,
    );
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

// ---------------------------------------------------------------------------------------------
// Plot.

/// One run's numbers as the plot needs them.
struct RunResult {
    label: String,
    arrivals: String,
    rate: f64,
    /// By class name ("short-1q", ..., "all").
    classes: BTreeMap<String, Value>,
}

fn read_result(path: &Path) -> Result<RunResult, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let v: Value = serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut classes = BTreeMap::new();
    for c in v["classes"].as_array().into_iter().flatten().chain([&v["overall"]]) {
        if let Some(name) = c["class"].as_str() {
            classes.insert(name.to_owned(), c.clone());
        }
    }
    if classes.is_empty() {
        return Err(format!("{}: not a `layad-load run` result", path.display()));
    }
    Ok(RunResult {
        label: v["label"].as_str().unwrap_or("?").to_owned(),
        arrivals: v["arrivals"].as_str().unwrap_or("?").to_owned(),
        rate: v["rate"].as_f64().unwrap_or(f64::NAN),
        classes,
    })
}

/// Colour-blind-safe (Okabe-Ito) colours, one per configuration.
const COLOURS: &[&str] = &[
    "#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000",
];

fn xml(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn tick_label(v: f64) -> String {
    if v >= 1000.0 {
        format!("{}k", v / 1000.0)
    } else if v >= 1.0 {
        format!("{v:.0}")
    } else {
        format!("{v}")
    }
}

fn first_appearances<'a>(items: impl Iterator<Item = &'a str>) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for item in items {
        if !out.iter().any(|o| o == item) {
            out.push(item.to_owned());
        }
    }
    out
}

/// Grouped bars per arrival pattern: classes on x, one bar per configuration, P99 solid with the
/// P50 part lighter, on a log latency axis (short and long requests differ by orders of magnitude).
fn svg(runs: &[RunResult], title: &str) -> String {
    let patterns = first_appearances(runs.iter().map(|r| r.arrivals.as_str()));
    let labels = first_appearances(runs.iter().map(|r| r.label.as_str()));
    let groups: Vec<&str> = Class::ALL.iter().map(|c| c.name()).chain(["all"]).collect();
    let value = |run: &RunResult, group: &str, key: &str| {
        run.classes
            .get(group)
            .and_then(|c| c[key].as_f64())
            .filter(|v| *v > 0.0)
    };
    let all_values: Vec<f64> = runs
        .iter()
        .flat_map(|r| {
            groups
                .iter()
                .flat_map(move |g| [value(r, g, "p50_ms"), value(r, g, "p99_ms")])
        })
        .flatten()
        .collect();
    let lo = 10f64.powf(all_values.iter().copied().fold(f64::INFINITY, f64::min).log10().floor());
    let hi = 10f64.powf(all_values.iter().copied().fold(0.0, f64::max).log10().ceil());
    let (lo, hi) = if lo.is_finite() && hi > lo {
        (lo, hi)
    } else {
        (1.0, 1000.0)
    };

    let (width, left, right) = (980.0, 70.0, 20.0);
    // Legend layout first: entries flow left to right and wrap; the panels start below them.
    let mut legend = Vec::new();
    let (mut x, mut y) = (left, 46.0);
    for (i, label) in labels.iter().enumerate() {
        let w = 19.0 + 7.5 * label.chars().count() as f64 + 24.0;
        if x > left && x + w > width - right {
            (x, y) = (left, y + 22.0);
        }
        legend.push((x, y, COLOURS[i % COLOURS.len()], label));
        x += w;
    }
    let hint_y = y + 22.0;
    let (panel_h, plot_h, top) = (330.0, 230.0, hint_y + 36.0);
    let height = top + panel_h * patterns.len() as f64 + 24.0;
    let plot_w = width - left - right;
    let mut s = String::new();
    s.push_str(&format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" viewBox=\"0 0 {width} {height}\" font-family=\"Helvetica, Arial, sans-serif\">\n"
    ));
    // An opaque background keeps the figure readable in GitHub's dark mode.
    s.push_str("<rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n");
    s.push_str(&format!(
        "<text x=\"{}\" y=\"28\" font-size=\"18\" font-weight=\"bold\" text-anchor=\"middle\">{}</text>\n",
        width / 2.0,
        xml(title)
    ));
    // Legend: one swatch per configuration, then how to read a bar.
    for (x, y, colour, label) in legend {
        s.push_str(&format!(
            "<rect x=\"{x}\" y=\"{y}\" width=\"14\" height=\"14\" fill=\"{colour}\"/><text x=\"{}\" y=\"{}\" font-size=\"13\">{}</text>\n",
            x + 19.0,
            y + 12.0,
            xml(label)
        ));
    }
    s.push_str(&format!(
        "<rect x=\"{left}\" y=\"{hint_y}\" width=\"14\" height=\"14\" fill=\"#777777\"/><rect x=\"{left}\" y=\"{}\" width=\"14\" height=\"7\" fill=\"#ffffff\" fill-opacity=\"0.55\"/><text x=\"{}\" y=\"{}\" font-size=\"13\" fill=\"#333333\">whole bar: P99, light lower part: P50 (ms, log scale)</text>\n",
        hint_y + 7.0,
        left + 19.0,
        hint_y + 12.0
    ));

    for (p, pattern) in patterns.iter().enumerate() {
        let panel_top = top + panel_h * p as f64;
        let bottom = panel_top + 30.0 + plot_h;
        let y_of = |v: f64| bottom - (v.log10() - lo.log10()) / (hi.log10() - lo.log10()) * plot_h;
        let rates: Vec<String> = runs
            .iter()
            .filter(|r| &r.arrivals == pattern)
            .map(|r| format!("{}", (r.rate * 100.0).round() / 100.0))
            .collect();
        let rates = first_appearances(rates.iter().map(String::as_str));
        s.push_str(&format!(
            "<text x=\"{left}\" y=\"{}\" font-size=\"15\" font-weight=\"bold\">{} arrivals, offered {} req/s</text>\n",
            panel_top + 18.0,
            xml(pattern),
            xml(&rates.join(" / "))
        ));
        // Gridlines and y labels at 1, 2, 5 per decade.
        let mut decade = lo;
        while decade <= hi * 1.0001 {
            for m in [1.0, 2.0, 5.0] {
                let v = decade * m;
                if v > hi * 1.0001 {
                    break;
                }
                let y = y_of(v);
                let stroke = if m == 1.0 { "#bbbbbb" } else { "#e5e5e5" };
                s.push_str(&format!(
                    "<line x1=\"{left}\" y1=\"{y:.1}\" x2=\"{}\" y2=\"{y:.1}\" stroke=\"{stroke}\"/><text x=\"{}\" y=\"{:.1}\" font-size=\"11\" text-anchor=\"end\" fill=\"#444444\">{}</text>\n",
                    left + plot_w,
                    left - 6.0,
                    y + 4.0,
                    tick_label(v)
                ));
            }
            decade *= 10.0;
        }
        s.push_str(&format!(
            "<text transform=\"translate(18 {:.1}) rotate(-90)\" font-size=\"12\" text-anchor=\"middle\" fill=\"#333333\">latency, ms (log)</text>\n",
            bottom - plot_h / 2.0
        ));
        s.push_str(&format!(
            "<line x1=\"{left}\" y1=\"{bottom}\" x2=\"{}\" y2=\"{bottom}\" stroke=\"#333333\"/><line x1=\"{left}\" y1=\"{}\" x2=\"{left}\" y2=\"{bottom}\" stroke=\"#333333\"/>\n",
            left + plot_w,
            bottom - plot_h
        ));
        let group_w = plot_w / groups.len() as f64;
        let bar_w = (group_w * 0.8 / labels.len().max(1) as f64).min(60.0);
        for (g, group) in groups.iter().enumerate() {
            let group_left = left + group_w * g as f64 + (group_w - bar_w * labels.len() as f64) / 2.0;
            s.push_str(&format!(
                "<text x=\"{:.1}\" y=\"{}\" font-size=\"13\" text-anchor=\"middle\">{}</text>\n",
                left + group_w * (g as f64 + 0.5),
                bottom + 18.0,
                if *group == "all" { "all requests" } else { group }
            ));
            for (l, label) in labels.iter().enumerate() {
                let Some(run) = runs.iter().find(|r| &r.arrivals == pattern && &r.label == label) else {
                    continue;
                };
                let (Some(p99), p50) = (value(run, group, "p99_ms"), value(run, group, "p50_ms")) else {
                    continue;
                };
                let bx = group_left + bar_w * l as f64;
                let colour = COLOURS[l % COLOURS.len()];
                let y99 = y_of(p99.max(lo));
                let errors = run.classes.get(*group).and_then(|c| c["errors"].as_u64()).unwrap_or(0);
                s.push_str(&format!(
                    "<rect x=\"{bx:.1}\" y=\"{y99:.1}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"{colour}\"><title>{}: {} P99 {:.1} ms</title></rect>\n",
                    bar_w - 2.0,
                    bottom - y99,
                    xml(label),
                    group,
                    p99
                ));
                if let Some(p50) = p50 {
                    let y50 = y_of(p50.max(lo));
                    s.push_str(&format!(
                        "<rect x=\"{bx:.1}\" y=\"{y50:.1}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"#ffffff\" fill-opacity=\"0.55\"><title>{}: {} P50 {:.1} ms</title></rect>\n",
                        bar_w - 2.0,
                        bottom - y50,
                        xml(label),
                        group,
                        p50
                    ));
                }
                let note = if errors > 0 {
                    format!("{} ({errors} err)", tick_label_ms(p99))
                } else {
                    tick_label_ms(p99)
                };
                s.push_str(&format!(
                    "<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"10\" text-anchor=\"middle\" fill=\"{}\">{}</text>\n",
                    bx + (bar_w - 2.0) / 2.0,
                    y99 - 3.0,
                    if errors > 0 { "#B00000" } else { "#222222" },
                    note
                ));
            }
        }
    }
    s.push_str(&format!(
        "<text x=\"{left}\" y=\"{:.1}\" font-size=\"11\" fill=\"#555555\">Open loop: latency from each request's scheduled arrival to its full answer. Bar labels: P99 ms (and errors, if any).</text>\n",
        height - 12.0
    ));
    s.push_str("</svg>\n");
    s
}

fn tick_label_ms(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

fn markdown(runs: &[RunResult]) -> String {
    let mut out = String::from(
        "| arrivals | offered req/s | configuration | class | n | P50 ms | P95 ms | P99 ms | errors | spill share | pools |\n|---|---:|---|---|---:|---:|---:|---:|---:|---:|---|\n",
    );
    let patterns = first_appearances(runs.iter().map(|r| r.arrivals.as_str()));
    for pattern in &patterns {
        for run in runs.iter().filter(|r| &r.arrivals == pattern) {
            for group in Class::ALL.iter().map(|c| c.name()).chain(["all"]) {
                let Some(c) = run.classes.get(group) else {
                    continue;
                };
                out.push_str(&format!(
                    "| {pattern} | {} | {} | {group} | {} | {} | {} | {} | {} | {} | {} |\n",
                    run.rate,
                    run.label,
                    c["count"],
                    ms(&c["p50_ms"]),
                    ms(&c["p95_ms"]),
                    ms(&c["p99_ms"]),
                    c["errors"],
                    share(&c["spill_share"]),
                    counts(&c["pools"])
                ));
            }
        }
    }
    out
}

fn plot(args: PlotArgs) -> Result<(), String> {
    let runs = args
        .results
        .iter()
        .map(|p| read_result(p))
        .collect::<Result<Vec<_>, _>>()?;
    write_file(&args.out, &svg(&runs, &args.title))?;
    print!("{}", markdown(&runs));
    eprintln!("wrote {}", args.out.display());
    Ok(())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let result = match Cli::parse().command {
        Command::Run(args) => run(args).await,
        Command::Capacity(args) => capacity(args).await,
        Command::Plot(args) => plot(args),
    };
    if let Err(e) = result {
        eprintln!("layad-load: {e}");
        std::process::exit(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arrivals_are_seeded_and_have_the_mean_rate() {
        let a = arrivals(7, 20.0, 300.0, Arrivals::Poisson, 6);
        let b = arrivals(7, 20.0, 300.0, Arrivals::Poisson, 6);
        assert_eq!(a.len(), b.len());
        assert!(
            a.iter()
                .zip(&b)
                .all(|(x, y)| x.at == y.at && x.class == y.class && x.variant == y.variant)
        );
        let rate = a.len() as f64 / 300.0;
        assert!((rate - 20.0).abs() < 1.0, "poisson rate {rate}");
        let short = a.iter().filter(|x| x.class == Class::Short).count() as f64 / a.len() as f64;
        assert!((short - 0.6).abs() < 0.03, "short share {short}");
    }

    #[test]
    fn bursty_arrivals_come_in_the_first_second_of_every_three() {
        let a = arrivals(7, 20.0, 300.0, Arrivals::Bursty, 6);
        assert!(a.iter().all(|x| x.at % 3.0 < 1.0));
        let rate = a.len() as f64 / 300.0;
        assert!((rate - 20.0).abs() < 1.0, "bursty mean rate {rate}");
    }

    #[test]
    fn drift_compares_the_same_paths_only() {
        let reference = vec![
            ("q.probabilities.a".to_owned(), 0.25),
            ("q.act_probability".to_owned(), 0.5),
        ];
        let close = vec![
            ("q.probabilities.a".to_owned(), 0.2501),
            ("q.act_probability".to_owned(), 0.5),
        ];
        assert!(drift(&reference, &close).is_some_and(|d| (d - 1e-4).abs() < 1e-9));
        let other = vec![
            ("q.probabilities.b".to_owned(), 0.25),
            ("q.act_probability".to_owned(), 0.5),
        ];
        assert_eq!(drift(&reference, &other), None);
    }
}
