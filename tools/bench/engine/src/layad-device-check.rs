//! `layad-device-check`: the model on one device against upstream's own numbers — every golden row of
//! `tests/fixtures/goldens/cases.json` on the three fixture checkpoints in float32 (within 1e-4 of
//! upstream's logits and act probabilities), then f16 and bf16 loaded behind their parity gate
//! (against float32 on the CPU) and judged against upstream with the same rule. Step (1) of
//! `tools/device/cuda-check.sh`; `--device cpu` runs it here.
//!
//! Prints one line per precision, writes everything as JSON, and exits 1 when f32 is off by more than
//! 1e-4 or a half precision fails its gate (a load error) or the rule against upstream.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Parser;
use laya::checkpoint::{Checkpoint, Location, find_in_hf_cache};
use laya::question::QuestionType;
use laya::routing::CheckpointName;
use layad_proto::{Engine, ParityReport, Row, check_and_forward};
use serde_json::{Value, json};
use worker_gpu::parity::{self, GateSummary};
use worker_gpu::{CandleEngine, DeviceRequest, EngineOptions, Precision};

/// Largest |Δ| of a float32 logit or act probability against upstream's float32.
const F32_TOLERANCE: f32 = 1e-4;

/// Goldens and parity gates of the candle engine on one device.
#[derive(Parser, Debug)]
struct Args {
    /// Device: cpu, cuda, cuda:N, metal.
    #[arg(long, default_value = "cpu")]
    device: String,
    /// The repository's `tests/fixtures` (goldens and the fixture checkpoints' Hugging Face cache).
    #[arg(long, default_value = "tests/fixtures")]
    fixtures: PathBuf,
    /// Half precisions to gate: f16, bf16.
    #[arg(long, value_delimiter = ',', default_value = "bf16,f16")]
    half: Vec<String>,
    /// CPU threads (the CPU device, and the gate's float32 reference).
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Where the JSON goes.
    #[arg(long)]
    out: PathBuf,
}

/// One golden row: the engine's input and upstream's outputs.
struct GoldenRow {
    row: Row,
    logits: Vec<f32>,
    act_probabilities: Vec<f32>,
}

/// One golden request that ran a forward, its rows batched as upstream batched them.
struct Case {
    checkpoint: String,
    rows: Vec<GoldenRow>,
}

fn softmax(x: &[f32]) -> Vec<f32> {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let exps: Vec<f32> = x.iter().map(|v| (v - max).exp()).collect();
    let sum: f32 = exps.iter().sum();
    exps.iter().map(|e| e / sum).collect()
}

/// Every case of `goldens/cases.json` that ran a forward.
fn read_cases(fixtures: &Path) -> Result<Vec<Case>, String> {
    let path = fixtures.join("goldens/cases.json");
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let golden: Value = serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    let bad = |what: &str| format!("{}: {what}", path.display());
    let numbers = |v: &Value| -> Result<Vec<f64>, String> {
        v.as_array()
            .ok_or_else(|| bad("expected an array of numbers"))?
            .iter()
            .map(|x| x.as_f64().ok_or_else(|| bad("expected a number")))
            .collect()
    };
    let mut cases = Vec::new();
    for case in golden["cases"].as_array().ok_or_else(|| bad("no cases"))? {
        let Some(rows) = case["rows"].as_array().filter(|rows| !rows.is_empty()) else {
            continue;
        };
        let checkpoint = case["checkpoint"]
            .as_str()
            .ok_or_else(|| bad("case without checkpoint"))?;
        let rows = rows
            .iter()
            .map(|row| {
                let act: Vec<f32> = numbers(&row["action_logits"])?.into_iter().map(|x| x as f32).collect();
                Ok(GoldenRow {
                    row: Row {
                        ids: numbers(&row["ids"])?.into_iter().map(|x| x as u32).collect(),
                        markers: numbers(&row["markers"])?.into_iter().map(|x| x as u32).collect(),
                        qtype: row["qtype"]
                            .as_u64()
                            .and_then(|q| u32::try_from(q).ok())
                            .and_then(QuestionType::from_index)
                            .ok_or_else(|| bad("row without a qtype of 0, 1 or 2"))?,
                    },
                    logits: numbers(&row["logits"])?.into_iter().map(|x| x as f32).collect(),
                    act_probabilities: softmax(&act),
                })
            })
            .collect::<Result<_, String>>()?;
        cases.push(Case {
            checkpoint: checkpoint.to_owned(),
            rows,
        });
    }
    Ok(cases)
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    if a.len() != b.len() {
        return f32::INFINITY;
    }
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

/// The three fixture checkpoints, named as the goldens name them.
fn checkpoints(fixtures: &Path) -> Result<Vec<(String, Location)>, String> {
    let cache = fixtures.join("hf-cache/hub");
    CheckpointName::ALL
        .iter()
        .map(|&name| {
            find_in_hf_cache(&cache, name)
                .map(|location| (name.as_str().to_owned(), location))
                .map_err(|e| format!("fixture checkpoint {}: {e}", name.as_str()))
        })
        .collect()
}

/// What one precision did on every golden row.
struct Run {
    rows: usize,
    worst_logit: f32,
    worst_act: f32,
    /// The parity rule against upstream's float32 over every row.
    summary: GateSummary,
}

fn run_goldens(engine: &mut CandleEngine, cases: &[Case], opened: &[(String, Checkpoint)]) -> Result<Run, String> {
    let mut run = Run {
        rows: 0,
        worst_logit: 0.0,
        worst_act: 0.0,
        summary: GateSummary::default(),
    };
    for case in cases {
        let inputs: Vec<Row> = case.rows.iter().map(|r| r.row.clone()).collect();
        let outputs = check_and_forward(engine, &case.checkpoint, &inputs)
            .map_err(|e| format!("forward on {}: {e}", case.checkpoint))?;
        let checkpoint = &opened
            .iter()
            .find(|(name, _)| *name == case.checkpoint)
            .ok_or_else(|| format!("golden case names an unknown checkpoint '{}'", case.checkpoint))?
            .1;
        for (golden, out) in case.rows.iter().zip(&outputs) {
            run.worst_logit = run.worst_logit.max(max_abs_diff(&out.logits, &golden.logits));
            run.worst_act = run
                .worst_act
                .max(max_abs_diff(&out.act_probabilities, &golden.act_probabilities));
            let t = laya::answer::temperature(&checkpoint.agent.temperatures, golden.row.qtype, golden.logits.len());
            let index = u32::try_from(run.rows).unwrap_or(u32::MAX);
            run.summary.add(
                index,
                &parity::compare(out, &golden.logits, &golden.act_probabilities, t),
            );
            run.rows += 1;
        }
    }
    Ok(run)
}

fn gate_json(report: &ParityReport) -> Value {
    json!({
        "checkpoint": report.checkpoint,
        "executor": report.executor,
        "rows": report.rows,
        "max_probability_diff": report.max_probability_diff,
        "max_act_probability_diff": report.max_act_probability_diff,
        "hard_mismatches": report.hard_mismatches,
        "near_tie_flips": report.near_tie_flips,
    })
}

fn check(args: &Args) -> Result<(Value, bool), String> {
    let device = DeviceRequest::parse(&args.device)?;
    let cases = read_cases(&args.fixtures)?;
    let locations = checkpoints(&args.fixtures)?;
    let opened: Vec<(String, Checkpoint)> = locations
        .iter()
        .map(|(name, location)| {
            Checkpoint::open(location.clone())
                .map(|c| (name.clone(), c))
                .map_err(|e| format!("{name}: {e}"))
        })
        .collect::<Result<_, _>>()?;
    let mut precisions = vec![Precision::F32];
    for half in &args.half {
        precisions.push(Precision::parse(half)?);
    }
    let mut results = Vec::new();
    let mut passed = true;
    for precision in precisions {
        let options = EngineOptions {
            device,
            precision: Some(precision),
            threads: Some(args.threads),
            ..EngineOptions::default()
        };
        let started = std::time::Instant::now();
        let mut engine = match CandleEngine::load(&locations, options) {
            Ok(engine) => engine,
            Err(e) => {
                // A half precision refused by its gate is a result, not a crash of the check.
                println!("{precision}: refused at load: {e}");
                results.push(json!({"precision": precision.as_str(), "loaded": false, "error": e.to_string()}));
                passed = false;
                continue;
            }
        };
        let load_s = started.elapsed().as_secs_f64();
        let info = engine.describe();
        if let Some(reason) = engine.fallback() {
            return Err(format!("device {device} was not used: {reason}"));
        }
        let run = run_goldens(&mut engine, &cases, &opened)?;
        let gate = &info.parity;
        let ok = match precision {
            Precision::F32 => run.worst_logit <= F32_TOLERANCE && run.worst_act <= F32_TOLERANCE,
            _ => run.summary.failure().is_none() && !gate.is_empty(),
        };
        passed &= ok;
        println!(
            "{precision} on {}: {} golden rows, worst |Δlogit| {:.2e}, worst |Δact p| {:.2e}, worst |Δp| {:.4} vs upstream; load-time gate: {}{}",
            info.device,
            run.rows,
            run.worst_logit,
            run.worst_act,
            run.summary.max_probability_diff,
            gate.iter()
                .map(|g| format!("{} |Δp| {:.4}", g.checkpoint, g.max_probability_diff))
                .collect::<Vec<_>>()
                .join(", "),
            if ok { "" } else { "  FAILED" }
        );
        results.push(json!({
            "precision": precision.as_str(),
            "loaded": true,
            "device": info.device,
            "gpu": info.facts.gpu.as_ref().map(|g| json!({"name": g.name, "total_memory_bytes": g.total_memory_bytes,
                "compute_capability": g.compute_capability.map(|(a, b)| format!("{a}.{b}")), "tf32": g.tf32})),
            "load_s": load_s,
            "rows": run.rows,
            "worst_logit_diff": run.worst_logit,
            "worst_act_diff": run.worst_act,
            "vs_upstream": {
                "max_probability_diff": run.summary.max_probability_diff,
                "max_act_probability_diff": run.summary.max_act_probability_diff,
                "hard_mismatches": run.summary.hard_mismatches.len(),
                "near_tie_flips": run.summary.near_tie_flips.len(),
                "failure": run.summary.failure(),
            },
            "load_time_gate": gate.iter().map(gate_json).collect::<Vec<_>>(),
            "passed": ok,
        }));
    }
    Ok((
        json!({"device": args.device, "f32_tolerance": F32_TOLERANCE, "gate_tolerance": parity::TOLERANCE,
               "precisions": results, "passed": passed}),
        passed,
    ))
}

fn main() -> ExitCode {
    let args = Args::parse();
    match check(&args) {
        Ok((result, passed)) => {
            let text = serde_json::to_string_pretty(&result).unwrap_or_default();
            if let Err(e) = std::fs::write(&args.out, text) {
                eprintln!("layad-device-check: {}: {e}", args.out.display());
                return ExitCode::FAILURE;
            }
            if passed { ExitCode::SUCCESS } else { ExitCode::FAILURE }
        }
        Err(e) => {
            eprintln!("layad-device-check: {e}");
            ExitCode::FAILURE
        }
    }
}
