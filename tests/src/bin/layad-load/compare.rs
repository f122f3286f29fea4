//! `layad-load compare`: `run` result files of several configurations over several seeds, read
//! together. Per configuration and class: P50 and P99 over the seeds. Per pair (a candidate against
//! a baseline): each seed's P99 ratio of one class with a bootstrap interval, the median ratio over
//! seeds with an interval that resamples the seeds and each seed's requests, the candidate's P99/P50,
//! the other class's P99 ratio, and the longest latency against the baseline's P99 of its class.
//! Prints markdown, writes JSON and an SVG of P99 and P50 per seed.

use std::path::{Path, PathBuf};

use layad_system_tests::percentile;
use serde_json::{Value, json};

use crate::plot::{COLOURS, first_appearances, log_ticks, tick_label, xml};
use crate::workload::{Class, SplitMix64, write_file};

#[derive(clap::Args)]
pub(crate) struct CompareArgs {
    /// `CANDIDATE vs BASELINE`, by the runs' labels; repeat for several readings.
    #[arg(long = "pair", required = true)]
    pairs: Vec<String>,
    /// The class whose P99 ratio is the headline.
    #[arg(long, default_value = "short-1q")]
    class: String,
    /// The class that must not get worse.
    #[arg(long, default_value = "long-1q")]
    guard_class: String,
    /// Bootstrap resamples.
    #[arg(long, default_value_t = 2000)]
    resamples: usize,
    /// Where the JSON goes.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Where the SVG goes.
    #[arg(long)]
    plot: Option<PathBuf>,
    /// Title of the figure.
    #[arg(long, default_value = "layad scheduling: P99 (filled) and P50 (open) per seed")]
    title: String,
    /// `layad-load run` result files.
    #[arg(required = true)]
    results: Vec<PathBuf>,
}

/// One request as `compare` needs it.
struct Record {
    class: String,
    ok: bool,
    latency_ms: f64,
    queue_ms: Option<f64>,
    drift: Option<f64>,
}

/// One `run` result.
struct Run {
    label: String,
    seed: u64,
    records: Vec<Record>,
}

impl Run {
    fn read(path: &Path) -> Result<Run, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let v: Value = serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        let records = v["records"]
            .as_array()
            .ok_or_else(|| format!("{}: not a `layad-load run` result", path.display()))?
            .iter()
            .map(|r| Record {
                class: r["class"].as_str().unwrap_or("?").to_owned(),
                ok: r["status"] == 200,
                latency_ms: r["latency_ms"].as_f64().unwrap_or(f64::NAN),
                queue_ms: r["x_layad"]["queue_ms"].as_f64(),
                drift: r["drift"].as_f64(),
            })
            .collect();
        Ok(Run {
            label: v["label"].as_str().unwrap_or("?").to_owned(),
            seed: v["seed"].as_u64().unwrap_or(0),
            records,
        })
    }

    /// Latencies of the answered requests of `class`.
    fn latencies(&self, class: &str) -> Vec<f64> {
        self.records
            .iter()
            .filter(|r| r.ok && r.class == class)
            .map(|r| r.latency_ms)
            .collect()
    }

    fn errors(&self) -> usize {
        self.records.iter().filter(|r| !r.ok).count()
    }

    fn max_drift(&self) -> Option<f64> {
        self.records.iter().filter_map(|r| r.drift).reduce(f64::max)
    }
}

/// P99 of `values` resampled with replacement.
fn resampled_p99(rng: &mut SplitMix64, values: &[f64], scratch: &mut Vec<f64>) -> f64 {
    scratch.clear();
    scratch.extend((0..values.len()).map(|_| values[rng.below(values.len())]));
    percentile(scratch, 0.99).unwrap_or(f64::NAN)
}

/// The 2.5th and 97.5th percentiles.
fn interval(mut samples: Vec<f64>) -> (f64, f64) {
    samples.retain(|x| x.is_finite());
    (
        percentile(&samples, 0.025).unwrap_or(f64::NAN),
        percentile(&samples, 0.975).unwrap_or(f64::NAN),
    )
}

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    match sorted.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

fn f(x: f64) -> String {
    if !x.is_finite() {
        "-".to_owned()
    } else if x >= 100.0 {
        format!("{x:.0}")
    } else if x >= 1.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.3}")
    }
}

/// One seed of a pair.
struct SeedPair<'a> {
    seed: u64,
    candidate: &'a Run,
    baseline: &'a Run,
}

pub(crate) fn compare(args: CompareArgs) -> Result<(), String> {
    let runs = args
        .results
        .iter()
        .map(|p| Run::read(p))
        .collect::<Result<Vec<_>, _>>()?;
    let labels = first_appearances(runs.iter().map(|r| r.label.as_str()));
    let classes: Vec<&str> = Class::ALL.iter().map(|c| c.name()).collect();
    let mut out = String::new();
    let mut json_configs = Vec::new();

    out.push_str("| configuration | class | seeds | requests | P50 ms median (min–max) | P99 ms median (min–max) | max ms | errors | max drift |\n|---|---|---:|---:|---|---|---:|---:|---:|\n");
    for label in &labels {
        let of_label: Vec<&Run> = runs.iter().filter(|r| &r.label == label).collect();
        for class in &classes {
            let p50: Vec<f64> = of_label
                .iter()
                .filter_map(|r| percentile(&r.latencies(class), 0.5))
                .collect();
            let p99: Vec<f64> = of_label
                .iter()
                .filter_map(|r| percentile(&r.latencies(class), 0.99))
                .collect();
            let max = of_label
                .iter()
                .filter_map(|r| percentile(&r.latencies(class), 1.0))
                .fold(f64::NAN, f64::max);
            let n: usize = of_label.iter().map(|r| r.latencies(class).len()).sum();
            let range = |v: &[f64]| {
                let (lo, hi) = (
                    v.iter().copied().fold(f64::INFINITY, f64::min),
                    v.iter().copied().fold(0.0, f64::max),
                );
                format!("{} ({}–{})", f(median(v)), f(lo), f(hi))
            };
            out.push_str(&format!(
                "| {label} | {class} | {} | {n} | {} | {} | {} | {} | {} |\n",
                of_label.len(),
                range(&p50),
                range(&p99),
                f(max),
                of_label.iter().map(|r| r.errors()).sum::<usize>(),
                of_label
                    .iter()
                    .filter_map(|r| r.max_drift())
                    .reduce(f64::max)
                    .map_or("-".to_owned(), |d| format!("{d:.1e}"))
            ));
            json_configs.push(
                json!({"label": label, "class": class, "seeds": of_label.len(), "requests": n,
                "p50_ms": p50, "p99_ms": p99, "max_ms": max}),
            );
        }
    }

    let mut rng = SplitMix64::new(0x5EED_B007);
    let mut json_pairs = Vec::new();
    for pair in &args.pairs {
        let (candidate, baseline) = pair
            .split_once(" vs ")
            .ok_or_else(|| format!("--pair {pair:?}: write it as `CANDIDATE vs BASELINE`"))?;
        let mut seeds: Vec<SeedPair> = Vec::new();
        for c in runs.iter().filter(|r| r.label == candidate) {
            if let Some(b) = runs.iter().find(|r| r.label == baseline && r.seed == c.seed) {
                seeds.push(SeedPair {
                    seed: c.seed,
                    candidate: c,
                    baseline: b,
                });
            }
        }
        if seeds.is_empty() {
            // A configuration left out of this batch of runs: say so and read the other pairs.
            out.push_str(&format!(
                "\n**{candidate}** against **{baseline}**: no seed has runs labelled both ways\n"
            ));
            eprintln!("--pair {pair:?}: no seed has runs labelled both ways; skipped");
            continue;
        }
        json_pairs.push(pair_report(&mut out, &mut rng, &args, candidate, baseline, &seeds));
    }
    print!("{out}");
    if let Some(path) = &args.json {
        let value = json!({"tool": "layad-load compare", "class": args.class, "guard_class": args.guard_class,
            "resamples": args.resamples, "configurations": json_configs, "pairs": json_pairs});
        write_file(path, &serde_json::to_string_pretty(&value).expect("compare JSON"))?;
    }
    if let Some(path) = &args.plot {
        write_file(path, &svg(&runs, &labels, &classes, &args.title))?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}

/// The markdown and JSON of one candidate-against-baseline reading.
fn pair_report(
    out: &mut String,
    rng: &mut SplitMix64,
    args: &CompareArgs,
    candidate: &str,
    baseline: &str,
    seeds: &[SeedPair],
) -> Value {
    let (class, guard) = (args.class.as_str(), args.guard_class.as_str());
    let lat = |run: &Run, class: &str| run.latencies(class);
    let mut scratch = Vec::new();
    out.push_str(&format!(
        "\n**{candidate}** against **{baseline}**, {class}:\n\n| seed | n | P99 baseline ms | P99 candidate ms | P99 ratio [95% bootstrap] | P50 candidate ms | P99/P50 candidate | {guard} P99 baseline → candidate ms | {guard} ratio | errors |\n|---:|---:|---:|---:|---|---:|---:|---|---:|---:|\n"
    ));
    let mut ratios = Vec::new();
    let mut rows = Vec::new();
    for s in seeds {
        let (b, c) = (lat(s.baseline, class), lat(s.candidate, class));
        let (b99, c99, c50) = (
            percentile(&b, 0.99).unwrap_or(f64::NAN),
            percentile(&c, 0.99).unwrap_or(f64::NAN),
            percentile(&c, 0.5).unwrap_or(f64::NAN),
        );
        let samples: Vec<f64> = (0..args.resamples)
            .map(|_| resampled_p99(rng, &c, &mut scratch) / resampled_p99(rng, &b, &mut scratch))
            .collect();
        let (lo, hi) = interval(samples);
        let (gb, gc) = (
            percentile(&lat(s.baseline, guard), 0.99).unwrap_or(f64::NAN),
            percentile(&lat(s.candidate, guard), 0.99).unwrap_or(f64::NAN),
        );
        let errors = s.candidate.errors() + s.baseline.errors();
        out.push_str(&format!(
            "| {} | {} | {} | {} | {:.3} [{:.3}, {:.3}] | {} | {:.2} | {} → {} | {:.2} | {errors} |\n",
            s.seed,
            c.len(),
            f(b99),
            f(c99),
            c99 / b99,
            lo,
            hi,
            f(c50),
            c99 / c50,
            f(gb),
            f(gc),
            gc / gb
        ));
        ratios.push(c99 / b99);
        rows.push(
            json!({"seed": s.seed, "n": c.len(), "baseline_p99_ms": b99, "candidate_p99_ms": c99,
            "ratio": c99 / b99, "ratio_interval": [lo, hi], "candidate_p50_ms": c50, "p99_over_p50": c99 / c50,
            "guard_baseline_p99_ms": gb, "guard_candidate_p99_ms": gc, "guard_ratio": gc / gb, "errors": errors}),
        );
    }
    // The median over seeds, resampled two ways: each seed's requests only (the seeds as run), and
    // the seeds as well as their requests (how much another set of seeds could differ).
    let mut requests_only = Vec::with_capacity(args.resamples);
    let mut seeds_too = Vec::with_capacity(args.resamples);
    for _ in 0..args.resamples {
        for (resample_seeds, into) in [(false, &mut requests_only), (true, &mut seeds_too)] {
            let chosen: Vec<&SeedPair> = (0..seeds.len())
                .map(|i| &seeds[if resample_seeds { rng.below(seeds.len()) } else { i }])
                .collect();
            let ratios: Vec<f64> = chosen
                .iter()
                .map(|s| {
                    resampled_p99(rng, &lat(s.candidate, class), &mut scratch)
                        / resampled_p99(rng, &lat(s.baseline, class), &mut scratch)
                })
                .collect();
            into.push(median(&ratios));
        }
    }
    let (lo1, hi1) = interval(requests_only);
    let (lo2, hi2) = interval(seeds_too);
    let med = median(&ratios);
    out.push_str(&format!(
        "\nMedian {class} P99 ratio over {} seeds: **{med:.3}**; 95% bootstrap interval [{lo1:.3}, {hi1:.3}] resampling each seed's requests, [{lo2:.3}, {hi2:.3}] resampling the seeds too.\n",
        seeds.len()
    ));
    // The longest latency and queue wait of each class, against the baseline's P99 of that class
    // in the same seed.
    out.push_str(&format!(
        "\nLongest latency and queue wait per class against the baseline's P99 of the class (worst seed):\n\n| class | {candidate}: max latency / P99 | max queue wait / P99 | {baseline}: max latency / P99 |\n|---|---:|---:|---:|\n"
    ));
    let mut bounds = Vec::new();
    for class in Class::ALL.iter().map(|c| c.name()) {
        let worst = |of_candidate: bool, queue: bool| {
            seeds
                .iter()
                .filter_map(|s| {
                    let p99 = percentile(&s.baseline.latencies(class), 0.99)?;
                    let run = if of_candidate { s.candidate } else { s.baseline };
                    let of_class = run.records.iter().filter(|r| r.ok && r.class == class);
                    let max = if queue {
                        of_class.filter_map(|r| r.queue_ms).reduce(f64::max)?
                    } else {
                        of_class.map(|r| r.latency_ms).reduce(f64::max)?
                    };
                    Some(max / p99)
                })
                .fold(f64::NAN, f64::max)
        };
        let (c_lat, c_queue, b_lat) = (worst(true, false), worst(true, true), worst(false, false));
        out.push_str(&format!("| {class} | {c_lat:.2} | {c_queue:.2} | {b_lat:.2} |\n"));
        bounds.push(json!({"class": class, "candidate_max_latency_over_baseline_p99": c_lat,
            "candidate_max_queue_over_baseline_p99": c_queue, "baseline_max_latency_over_baseline_p99": b_lat}));
    }
    json!({"candidate": candidate, "baseline": baseline, "class": class, "seeds": rows,
        "median_ratio": med, "interval_requests": [lo1, hi1], "interval_seeds_and_requests": [lo2, hi2],
        "wait_bounds": bounds})
}

/// Per class a panel: per configuration, each seed's P99 (filled) and P50 (open) on a log axis,
/// with the median P99 as a bar.
fn svg(runs: &[Run], labels: &[String], classes: &[&str], title: &str) -> String {
    let stats: Vec<(usize, usize, f64, f64)> = runs
        .iter()
        .flat_map(|r| {
            let l = labels.iter().position(|x| x == &r.label).unwrap_or(0);
            classes.iter().enumerate().filter_map(move |(c, class)| {
                let lat = r.latencies(class);
                Some((l, c, percentile(&lat, 0.5)?, percentile(&lat, 0.99)?))
            })
        })
        .collect();
    let values = stats.iter().flat_map(|s| [s.2, s.3]).filter(|v| *v > 0.0);
    let lo = 10f64.powf(values.clone().fold(f64::INFINITY, f64::min).log10().floor());
    let hi = 10f64.powf(values.fold(0.0, f64::max).log10().ceil());
    let (lo, hi) = if lo.is_finite() && hi > lo {
        (lo, hi)
    } else {
        (1.0, 1000.0)
    };
    let (width, left, top, plot_h) = (980.0, 70.0, 60.0 + 20.0 * labels.len() as f64, 300.0);
    let height = top + plot_h + 60.0;
    let panel_w = (width - left - 20.0) / classes.len() as f64;
    let y_of = |v: f64| top + plot_h - (v.max(lo).log10() - lo.log10()) / (hi.log10() - lo.log10()) * plot_h;
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" viewBox=\"0 0 {width} {height}\" font-family=\"Helvetica, Arial, sans-serif\">\n<rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n<text x=\"{}\" y=\"26\" font-size=\"17\" font-weight=\"bold\" text-anchor=\"middle\">{}</text>\n",
        width / 2.0,
        xml(title)
    );
    for (i, label) in labels.iter().enumerate() {
        let y = 44.0 + 20.0 * i as f64;
        s.push_str(&format!(
            "<circle cx=\"{}\" cy=\"{}\" r=\"5\" fill=\"{}\"/><text x=\"{}\" y=\"{}\" font-size=\"13\">{}</text>\n",
            left + 6.0,
            y - 4.0,
            COLOURS[i % COLOURS.len()],
            left + 16.0,
            y,
            xml(label)
        ));
    }
    for (v, starts_decade) in log_ticks(lo, hi) {
        let y = y_of(v);
        s.push_str(&format!(
            "<line x1=\"{left}\" y1=\"{y:.1}\" x2=\"{}\" y2=\"{y:.1}\" stroke=\"{}\"/><text x=\"{}\" y=\"{:.1}\" font-size=\"11\" text-anchor=\"end\">{}</text>\n",
            width - 20.0,
            if starts_decade { "#bbbbbb" } else { "#eeeeee" },
            left - 6.0,
            y + 4.0,
            tick_label(v)
        ));
    }
    s.push_str(&format!(
        "<text transform=\"translate(18 {:.1}) rotate(-90)\" font-size=\"12\" text-anchor=\"middle\">latency from arrival, ms (log)</text>\n",
        top + plot_h / 2.0
    ));
    for (c, class) in classes.iter().enumerate() {
        let x0 = left + panel_w * c as f64;
        s.push_str(&format!(
            "<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"13\" text-anchor=\"middle\">{class}</text><line x1=\"{x0:.1}\" y1=\"{top}\" x2=\"{x0:.1}\" y2=\"{:.1}\" stroke=\"#999999\"/>\n",
            x0 + panel_w / 2.0,
            top + plot_h + 20.0,
            top + plot_h
        ));
        let slot = panel_w / (labels.len() + 1) as f64;
        for (l, _) in labels.iter().enumerate() {
            let x = x0 + slot * (l + 1) as f64;
            let colour = COLOURS[l % COLOURS.len()];
            let mine: Vec<&(usize, usize, f64, f64)> = stats.iter().filter(|t| t.0 == l && t.1 == c).collect();
            let p99s: Vec<f64> = mine.iter().map(|t| t.3).collect();
            if !p99s.is_empty() {
                let y = y_of(median(&p99s));
                s.push_str(&format!(
                    "<line x1=\"{:.1}\" y1=\"{y:.1}\" x2=\"{:.1}\" y2=\"{y:.1}\" stroke=\"{colour}\" stroke-width=\"3\"/>\n",
                    x - slot * 0.35,
                    x + slot * 0.35
                ));
            }
            for (k, t) in mine.iter().enumerate() {
                let dx = (k as f64 - (mine.len() as f64 - 1.0) / 2.0) * 4.0;
                s.push_str(&format!(
                    "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3.5\" fill=\"{colour}\"/><circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3\" fill=\"none\" stroke=\"{colour}\"/>\n",
                    x + dx,
                    y_of(t.3),
                    x + dx,
                    y_of(t.2)
                ));
            }
        }
    }
    s.push_str(&format!(
        "<text x=\"{left}\" y=\"{:.1}\" font-size=\"11\" fill=\"#555555\">One dot per seed: filled P99, open P50; bar: median P99 over seeds. Open loop, latency from each request's scheduled arrival.</text>\n</svg>\n",
        height - 12.0
    ));
    s
}
