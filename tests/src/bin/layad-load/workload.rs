//! The benchmark's workload: seeded randomness, the request classes and their bodies (calibrated to
//! token lengths against the live server), reference answers and drift, and the arrival sequences.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::ValueEnum;
use layad_system_tests::post_json;
use serde_json::{Map, Value, json};

/// What every measuring command needs to build the same requests.
#[derive(clap::Args)]
pub(crate) struct Target {
    /// Base URL of the server (plain http).
    #[arg(long, default_value = "http://127.0.0.1:8642")]
    pub(crate) url: String,
    /// Seed of the arrivals, the class draws and the request bodies.
    #[arg(long, default_value_t = 1)]
    pub(crate) seed: u64,
    /// Distinct bodies per class (each is calibrated and answered once before timing).
    #[arg(long, default_value_t = 6)]
    pub(crate) variants: usize,
    /// Bodies and reference answers: loaded if the file exists, else made here and saved, so
    /// several configurations are sent identical requests and judged against the same answers.
    #[arg(long)]
    pub(crate) reference: Option<PathBuf>,
    /// Seconds to wait for /readyz before giving up.
    #[arg(long, default_value_t = 120)]
    pub(crate) ready_timeout_s: u64,
    /// Per-request timeout in seconds (a request past it is recorded as an error).
    #[arg(long, default_value_t = 120)]
    pub(crate) request_timeout_s: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum Arrivals {
    /// Poisson arrivals with mean rate R.
    Poisson,
    /// Cycles of 1 s of Poisson arrivals at 3R then 2 s idle (mean R).
    Bursty,
}

impl Arrivals {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Arrivals::Poisson => "poisson",
            Arrivals::Bursty => "bursty",
        }
    }
}

// Deterministic randomness: splitmix64, so a seed means the same sequence on every machine and
// build without a dependency.

pub(crate) struct SplitMix64(u64);

impl SplitMix64 {
    pub(crate) fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1) with 53 random bits.
    pub(crate) fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in 0..n (n > 0); the modulo bias is far below anything this tool can measure.
    pub(crate) fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    /// Exponential gap of a Poisson process with `rate` per second.
    pub(crate) fn exp_gap(&mut self, rate: f64) -> f64 {
        -(1.0 - self.unit()).ln() / rate
    }
}

// ---------------------------------------------------------------------------------------------
// The workload.

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Class {
    Short,
    Medium,
    Long,
    Short4,
}

impl Class {
    pub(crate) const ALL: [Class; 4] = [Class::Short, Class::Medium, Class::Long, Class::Short4];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Class::Short => "short-1q",
            Class::Medium => "medium-1q",
            Class::Long => "long-1q",
            Class::Short4 => "short-4q",
        }
    }

    pub(crate) fn parse(name: &str) -> Option<Class> {
        Class::ALL.into_iter().find(|c| c.name() == name)
    }

    /// Share of arrivals.
    pub(crate) fn share(self) -> f64 {
        match self {
            Class::Short => 0.6,
            Class::Medium => 0.2,
            Class::Long => 0.1,
            Class::Short4 => 0.1,
        }
    }

    /// Wanted tokens per row, inclusive. Long rows are sized not to fit a 128-token short pool.
    pub(crate) fn row_tokens(self) -> (u64, u64) {
        match self {
            Class::Short | Class::Short4 => (48, 64),
            Class::Medium => (100, 120),
            Class::Long => (300, 400),
        }
    }

    pub(crate) fn questions(self) -> usize {
        match self {
            Class::Short4 => 4,
            _ => 1,
        }
    }

    pub(crate) fn draw(rng: &mut SplitMix64) -> Class {
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
pub(crate) const PHRASES: &[&str] = &[
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
pub(crate) fn question_templates() -> Vec<(&'static str, Value)> {
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
pub(crate) struct BodySpec {
    pub(crate) class: Class,
    pub(crate) variant: usize,
    /// Mean tokens per row as the server counted them (`usage.input_tokens` / questions).
    pub(crate) row_tokens: f64,
    pub(crate) input_tokens: u64,
    pub(crate) body: String,
    /// Answer probabilities by path (`qid.probabilities.label`, `qid.act_probability`), in order.
    pub(crate) reference: Vec<(String, f64)>,
}

impl BodySpec {
    pub(crate) fn to_json(&self) -> Value {
        let values: Map<String, Value> = self.reference.iter().map(|(k, v)| (k.clone(), json!(v))).collect();
        json!({"class": self.class.name(), "variant": self.variant, "row_tokens": self.row_tokens,
               "input_tokens": self.input_tokens, "body": self.body, "reference": values})
    }

    pub(crate) fn from_json(v: &Value) -> Result<BodySpec, String> {
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
pub(crate) fn answer_values(response: &Value) -> Vec<(String, f64)> {
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
pub(crate) fn drift(reference: &[(String, f64)], values: &[(String, f64)]) -> Option<f64> {
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
pub(crate) async fn probe(addr: SocketAddr, body: &str) -> Result<(u64, Vec<(String, f64)>), String> {
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

pub(crate) fn body_text(words: &[&str], questions: &[(&'static str, Value)]) -> String {
    let questions: Map<String, Value> = questions.iter().map(|(id, q)| ((*id).to_owned(), q.clone())).collect();
    json!({"state": words.join(" "), "questions": questions}).to_string()
}

/// Phrases drawn per body; far more than 400 tokens on any tokenizer we serve.
pub(crate) const MAX_PHRASES: usize = 256;

/// Builds variant `variant` of `class`: the questions and the state's text come from the seed, its
/// length in words is the smallest whose rows reach a seeded target length on this server's
/// tokenizer (or the server's row cap, when it truncates rows shorter than the target). Words, not
/// phrases, so a short row can land within its 16-token window after the question's overhead.
pub(crate) async fn calibrate(addr: SocketAddr, seed: u64, class: Class, variant: usize) -> Result<BodySpec, String> {
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
pub(crate) async fn workload(addr: SocketAddr, target: &Target) -> Result<Vec<BodySpec>, String> {
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

pub(crate) fn write_file(path: &Path, text: &str) -> Result<(), String> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))
}

/// Index of `class`'s `variant` in the workload (bodies are stored class by class).
pub(crate) fn body_index(bodies: &[BodySpec], class: Class, variant: usize) -> usize {
    bodies
        .iter()
        .position(|b| b.class == class && b.variant == variant)
        .expect("every class has every variant")
}

// ---------------------------------------------------------------------------------------------
// Arrivals.

/// One scheduled request: seconds after the start, and which body.
pub(crate) struct Arrival {
    pub(crate) at: f64,
    pub(crate) class: Class,
    pub(crate) variant: usize,
}

/// The seeded arrival sequence over `seconds`.
pub(crate) fn arrivals(seed: u64, rate: f64, seconds: f64, pattern: Arrivals, variants: usize) -> Vec<Arrival> {
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
