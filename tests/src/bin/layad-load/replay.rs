//! `layad-load replay`: the arrivals of `run` result files replayed on idealised servers, to separate
//! what a scheduling policy allows on given hardware from what the server adds. Each request takes
//! its class's median device time of a forward it had alone (from the same file); no batching, no
//! overhead, no cores shared with the supervisor or the load generator; a free server takes the
//! queued request it may run that comes first in the policy's order, without preemption.
//!
//! Three configurations per file: (a) one server in arrival order, (a) one server shortest-first,
//! (b) the same plus a second server for the short classes, shortest-first. Prints markdown and
//! writes JSON.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use layad_system_tests::percentile;
use serde_json::{Value, json};

use crate::workload::{Class, write_file};

#[derive(clap::Args)]
pub(crate) struct ReplayArgs {
    /// Classes the added server of (b) takes (the short pool's: single questions of up to 128 tokens).
    #[arg(long, value_delimiter = ',', default_value = "short-1q,medium-1q")]
    short_classes: Vec<String>,
    /// The class whose P99 ratio is the headline.
    #[arg(long, default_value = "short-1q")]
    class: String,
    /// Where the JSON goes.
    #[arg(long)]
    json: Option<PathBuf>,
    /// `layad-load run` result files, one per seed (the configuration does not matter: every
    /// configuration of a seed was sent the same arrivals).
    #[arg(required = true)]
    results: Vec<PathBuf>,
}

/// The order a free server takes queued requests in.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Order {
    Arrival,
    ShortestFirst,
}

/// One idealised server: the classes it takes (`None`: all).
pub(crate) struct Server {
    pub(crate) takes: Option<Vec<String>>,
}

impl Server {
    fn takes(&self, class: &str) -> bool {
        self.takes.as_ref().is_none_or(|c| c.iter().any(|t| t == class))
    }
}

/// One request to replay.
#[derive(Clone, Debug)]
pub(crate) struct Arrival {
    pub(crate) at_ms: f64,
    pub(crate) class: String,
    pub(crate) service_ms: f64,
}

/// Latency of each request (same order as `arrivals`, which must be sorted by arrival) when
/// `servers` serve them in `order`. When several servers are free, a restricted one goes first, so
/// that the server taking every class stays free for what only it can run.
pub(crate) fn replay(arrivals: &[Arrival], servers: &[Server], order: Order) -> Result<Vec<f64>, String> {
    if let Some(a) = arrivals.iter().find(|a| !servers.iter().any(|s| s.takes(&a.class))) {
        return Err(format!("no server takes class {}", a.class));
    }
    let mut free_at = vec![0.0_f64; servers.len()];
    let mut latency = vec![f64::NAN; arrivals.len()];
    let mut queued: Vec<usize> = Vec::new();
    let mut next = 0;
    let mut now = 0.0_f64;
    // Restricted servers first when several could start at the same moment.
    let mut by_preference: Vec<usize> = (0..servers.len()).collect();
    by_preference.sort_by_key(|&s| servers[s].takes.is_none());
    while next < arrivals.len() || !queued.is_empty() {
        // The soonest a server could start a queued request it takes.
        let start = by_preference
            .iter()
            .filter(|&&s| queued.iter().any(|&j| servers[s].takes(&arrivals[j].class)))
            .map(|&s| (free_at[s].max(now), s))
            .min_by(|a, b| a.0.total_cmp(&b.0));
        let arrival_at = arrivals.get(next).map_or(f64::INFINITY, |a| a.at_ms);
        match start {
            Some((at, server)) if at < arrival_at => {
                let pick = queued
                    .iter()
                    .enumerate()
                    .filter(|&(_, &j)| servers[server].takes(&arrivals[j].class))
                    .min_by(|&(_, &x), &(_, &y)| {
                        let key = |j: usize| match order {
                            Order::Arrival => (0.0, arrivals[j].at_ms),
                            Order::ShortestFirst => (arrivals[j].service_ms, arrivals[j].at_ms),
                        };
                        let (kx, ky) = (key(x), key(y));
                        kx.0.total_cmp(&ky.0).then(kx.1.total_cmp(&ky.1))
                    })
                    .map(|(i, _)| i);
                let Some(i) = pick else {
                    return Err("internal: a server with work found none".to_owned());
                };
                let job = queued.swap_remove(i);
                now = at;
                free_at[server] = at + arrivals[job].service_ms;
                latency[job] = free_at[server] - arrivals[job].at_ms;
            }
            _ => {
                now = arrival_at;
                queued.push(next);
                next += 1;
            }
        }
    }
    Ok(latency)
}

/// One result file as the replay needs it.
struct Recorded {
    seed: u64,
    /// Every request, by arrival.
    arrivals: Vec<Arrival>,
    /// Each class's median device time of a forward it ran alone, ms.
    service: BTreeMap<String, f64>,
}

/// The arrivals of one result file and each class's median device time of a forward it ran alone.
fn read(path: &Path) -> Result<Recorded, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let v: Value = serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    let records = v["records"]
        .as_array()
        .ok_or_else(|| format!("{}: not a `layad-load run` result", path.display()))?;
    let mut alone: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for r in records {
        let (Some(class), Some(device_ms), Some(rows)) = (
            r["class"].as_str().and_then(Class::parse),
            r["x_layad"]["device_ms"].as_f64(),
            r["x_layad"]["batch_rows"].as_u64(),
        ) else {
            continue;
        };
        if rows == class.questions() as u64 {
            alone.entry(class.name().to_owned()).or_default().push(device_ms);
        }
    }
    let service: BTreeMap<String, f64> = alone
        .into_iter()
        .filter_map(|(class, times)| Some((class, percentile(&times, 0.5)?)))
        .collect();
    let mut arrivals = Vec::with_capacity(records.len());
    for r in records {
        let class = r["class"].as_str().unwrap_or("?").to_owned();
        let service_ms = *service.get(&class).ok_or_else(|| {
            format!(
                "{}: no {class} request ran alone with x_layad timings (was the server started with diagnostics?)",
                path.display()
            )
        })?;
        let at_ms = r["at_ms"]
            .as_f64()
            .ok_or_else(|| format!("{}: a record without at_ms", path.display()))?;
        arrivals.push(Arrival {
            at_ms,
            class,
            service_ms,
        });
    }
    arrivals.sort_by(|a, b| a.at_ms.total_cmp(&b.at_ms));
    Ok(Recorded {
        seed: v["seed"].as_u64().unwrap_or(0),
        arrivals,
        service,
    })
}

/// P50 and P99 of `class` among `latencies`.
fn p50_p99(arrivals: &[Arrival], latencies: &[f64], class: &str) -> (f64, f64) {
    let of_class: Vec<f64> = arrivals
        .iter()
        .zip(latencies)
        .filter(|(a, _)| a.class == class)
        .map(|(_, &l)| l)
        .collect();
    (
        percentile(&of_class, 0.5).unwrap_or(f64::NAN),
        percentile(&of_class, 0.99).unwrap_or(f64::NAN),
    )
}

pub(crate) fn replay_command(args: ReplayArgs) -> Result<(), String> {
    let configurations = [
        ("(a) one server, arrival order", false, Order::Arrival),
        ("(a) one server, shortest first", false, Order::ShortestFirst),
        ("(b) plus a short server, shortest first", true, Order::ShortestFirst),
    ];
    println!(
        "Idealised replay ({} P50 / P99 ms; exact service times, no batching, no overhead):\n",
        args.class
    );
    println!(
        "| seed | device ms per class | (a) arrival | (a) shortest first | (b) | (b)/(a) P99 | (b)/(a arrival) P99 | (b) P99/P50 |"
    );
    println!("|---:|---|---:|---:|---:|---:|---:|---:|");
    let mut out = Vec::new();
    for path in &args.results {
        let Recorded {
            seed,
            arrivals,
            service,
        } = read(path)?;
        let mut results = Vec::new();
        for (name, added, order) in configurations {
            let mut servers = vec![Server { takes: None }];
            if added {
                servers.push(Server {
                    takes: Some(args.short_classes.clone()),
                });
            }
            let latencies = replay(&arrivals, &servers, order)?;
            let (p50, p99) = p50_p99(&arrivals, &latencies, &args.class);
            let classes: BTreeMap<String, Value> = service
                .keys()
                .map(|c| {
                    let (p50, p99) = p50_p99(&arrivals, &latencies, c);
                    (c.clone(), json!({"p50_ms": p50, "p99_ms": p99}))
                })
                .collect();
            results.push((name, p50, p99, classes));
        }
        let (arrival, shortest, added) = (&results[0], &results[1], &results[2]);
        let services: Vec<String> = service.iter().map(|(c, ms)| format!("{c} {ms:.1}")).collect();
        println!(
            "| {seed} | {} | {:.0} / {:.0} | {:.0} / {:.0} | {:.0} / {:.0} | {:.3} | {:.3} | {:.2} |",
            services.join(", "),
            arrival.1,
            arrival.2,
            shortest.1,
            shortest.2,
            added.1,
            added.2,
            added.2 / shortest.2,
            added.2 / arrival.2,
            added.2 / added.1
        );
        out.push(json!({
            "file": path.display().to_string(), "seed": seed, "service_ms": service,
            "configurations": results.iter().map(|(name, p50, p99, classes)| json!({
                "name": name, "p50_ms": p50, "p99_ms": p99, "classes": classes,
            })).collect::<Vec<_>>(),
            "ratio_p99": added.2 / shortest.2, "ratio_p99_vs_arrival": added.2 / arrival.2,
        }));
    }
    if let Some(path) = &args.json {
        let value = json!({"tool": "layad-load replay", "class": args.class,
                           "short_classes": args.short_classes, "seeds": out});
        write_file(path, &serde_json::to_string_pretty(&value).expect("replay JSON"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arrival(at_ms: f64, class: &str, service_ms: f64) -> Arrival {
        Arrival {
            at_ms,
            class: class.to_owned(),
            service_ms,
        }
    }

    #[test]
    fn replays_the_orders_and_the_added_server_by_hand() {
        // Two long requests, then a short one behind them.
        let arrivals = [
            arrival(0.0, "long-1q", 100.0),
            arrival(0.5, "long-1q", 100.0),
            arrival(1.0, "short-1q", 10.0),
        ];
        let one = [Server { takes: None }];
        assert_eq!(
            replay(&arrivals, &one, Order::Arrival).expect("replay"),
            [100.0, 199.5, 209.0]
        );
        // Shortest first: the short one passes the waiting long one, not the running one.
        assert_eq!(
            replay(&arrivals, &one, Order::ShortestFirst).expect("replay"),
            [100.0, 209.5, 109.0]
        );
        // A server for short requests runs it at once; the long ones still queue on the other.
        let two = [
            Server { takes: None },
            Server {
                takes: Some(vec!["short-1q".to_owned()]),
            },
        ];
        assert_eq!(
            replay(&arrivals, &two, Order::ShortestFirst).expect("replay"),
            [100.0, 199.5, 10.0]
        );
        // Two short requests at once: the restricted server takes the first, the other the second.
        let both = [arrival(0.0, "short-1q", 10.0), arrival(0.0, "short-1q", 10.0)];
        assert_eq!(replay(&both, &two, Order::ShortestFirst).expect("replay"), [10.0, 10.0]);
        let only_short = [Server {
            takes: Some(vec!["short-1q".to_owned()]),
        }];
        assert!(
            replay(&arrivals, &only_short, Order::Arrival).is_err(),
            "nobody runs long-1q"
        );
    }
}
