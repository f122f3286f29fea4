//! `layad-load plot`: result files to an SVG of P99 and P50 per class and configuration (hand-written
//! SVG, no dependency) and the same numbers as a markdown table.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::workload::{Class, write_file};

#[derive(clap::Args)]
pub(crate) struct PlotArgs {
    /// Where the SVG goes.
    #[arg(long, default_value = "docs/scheduling.svg")]
    pub(crate) out: PathBuf,
    /// Title of the figure.
    #[arg(long, default_value = "layad scheduling benchmark: latency by request class")]
    pub(crate) title: String,
    /// `layad-load run` result files.
    #[arg(required = true)]
    pub(crate) results: Vec<PathBuf>,
}

pub(crate) fn ms(v: &Value) -> String {
    v.as_f64().map_or("-".to_owned(), |x| {
        if x >= 100.0 {
            format!("{x:.0}")
        } else {
            format!("{x:.1}")
        }
    })
}

pub(crate) fn share(v: &Value) -> String {
    v.as_f64().map_or("null".to_owned(), |x| format!("{:.1}%", 100.0 * x))
}

pub(crate) fn counts(v: &Value) -> String {
    match v.as_object() {
        Some(map) if !map.is_empty() => map
            .iter()
            .map(|(k, n)| format!("{k}:{n}"))
            .collect::<Vec<_>>()
            .join(" "),
        _ => "-".to_owned(),
    }
}

/// One run's numbers as the plot needs them.
pub(crate) struct RunResult {
    label: String,
    arrivals: String,
    rate: f64,
    /// By class name ("short-1q", ..., "all").
    classes: BTreeMap<String, Value>,
}

pub(crate) fn read_result(path: &Path) -> Result<RunResult, String> {
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
pub(crate) const COLOURS: &[&str] = &[
    "#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000",
];

pub(crate) fn xml(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// The gridline values of a log axis from `lo` up to `hi`: 1, 2 and 5 per decade, each with whether
/// it starts a decade (drawn darker).
pub(crate) fn log_ticks(lo: f64, hi: f64) -> Vec<(f64, bool)> {
    let mut ticks = Vec::new();
    let mut decade = lo;
    while decade <= hi * 1.0001 {
        for m in [1.0, 2.0, 5.0] {
            let v = decade * m;
            if v > hi * 1.0001 {
                break;
            }
            ticks.push((v, m == 1.0));
        }
        decade *= 10.0;
    }
    ticks
}

pub(crate) fn tick_label(v: f64) -> String {
    if v >= 1000.0 {
        format!("{}k", v / 1000.0)
    } else if v >= 1.0 {
        format!("{v:.0}")
    } else {
        format!("{v}")
    }
}

pub(crate) fn first_appearances<'a>(items: impl Iterator<Item = &'a str>) -> Vec<String> {
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
pub(crate) fn svg(runs: &[RunResult], title: &str) -> String {
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
        for (v, starts_decade) in log_ticks(lo, hi) {
            let y = y_of(v);
            let stroke = if starts_decade { "#bbbbbb" } else { "#e5e5e5" };
            s.push_str(&format!(
                "<line x1=\"{left}\" y1=\"{y:.1}\" x2=\"{}\" y2=\"{y:.1}\" stroke=\"{stroke}\"/><text x=\"{}\" y=\"{:.1}\" font-size=\"11\" text-anchor=\"end\" fill=\"#444444\">{}</text>\n",
                left + plot_w,
                left - 6.0,
                y + 4.0,
                tick_label(v)
            ));
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

pub(crate) fn tick_label_ms(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

pub(crate) fn markdown(runs: &[RunResult]) -> String {
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

pub(crate) fn plot(args: PlotArgs) -> Result<(), String> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_ticks_are_one_two_five_per_decade_up_to_the_top() {
        assert_eq!(
            log_ticks(1.0, 300.0),
            [
                (1.0, true),
                (2.0, false),
                (5.0, false),
                (10.0, true),
                (20.0, false),
                (50.0, false),
                (100.0, true),
                (200.0, false),
            ]
        );
    }
}
