//! The candle executor through the whole host path against upstream: f32 within 1e-4 of upstream's
//! logits and act probabilities on every golden row, f16 through the parity gate, and the graph entry
//! point (`LayaModel::forward_graph`) against worker-gpu's ordinary forward.

mod common;

use candle_core::{DType, Device};
use laya::checkpoint::{Checkpoint, Location};
use layad_proto::bucket_for;
use layad_proto::{Engine, Row, RowOutput, check_and_forward};
use layad_system_tests::goldens::golden_forwards;
use worker_ane::executor::Executor;
use worker_ane::executor::candle::CandleExecutor;
use worker_ane::host::HostWeights;
use worker_ane::{AneEngine, AneOptions, ExecutorKind};
use worker_gpu::{LayaModel, Precision};

fn checkpoints() -> Vec<(String, Location)> {
    common::CHECKPOINTS
        .iter()
        .map(|(name, sub, ..)| ((*name).to_owned(), Location::from_path(common::checkpoint_dir(sub))))
        .collect()
}

fn options(artifacts: &std::path::Path, precision: Precision) -> AneOptions {
    AneOptions {
        artifacts: artifacts.to_path_buf(),
        executor: ExecutorKind::Candle,
        precision,
        buckets: None,
        threads: None,
        max_batch_tokens: 16_384,
        cache_dir: std::env::temp_dir(),
    }
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "{a:?} vs {b:?}");
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

#[test]
fn f32_matches_upstream_goldens_within_1e4() {
    let scratch = tempfile::tempdir().expect("tempdir");
    let artifacts = common::artifacts(scratch.path());
    let mut engine = AneEngine::load(&checkpoints(), &options(&artifacts, Precision::F32)).expect("load");
    let info = engine.describe();
    assert_eq!(
        (info.device.as_str(), info.dtype.as_str(), info.max_rows),
        ("cpu", "f32", 1)
    );
    assert_eq!(info.length_buckets, [64, 96, 128]);
    let (mut rows, mut logit_diff, mut act_diff) = (0, 0f32, 0f32);
    for forward in golden_forwards() {
        for golden in forward.rows.iter().filter(|r| r.ids.len() <= 128) {
            let row = Row {
                ids: golden.ids.clone(),
                markers: golden.markers.clone(),
                qtype: golden.qtype,
            };
            let out = check_and_forward(&mut engine, &forward.checkpoint, &[row]).expect("forward");
            logit_diff = logit_diff.max(max_abs_diff(&out[0].logits, &golden.logits));
            act_diff = act_diff.max(max_abs_diff(&out[0].act_probabilities, &golden.act_probabilities));
            rows += 1;
        }
    }
    eprintln!("candle f32 vs upstream: {rows} rows, max |Δlogit| {logit_diff:.3e}, max |Δact| {act_diff:.3e}");
    assert!(rows >= 160, "{rows}");
    assert!(logit_diff <= 1e-4 && act_diff <= 1e-4, "{logit_diff} {act_diff}");
    for report in engine.describe().parity {
        eprintln!("gate f32 {report:?}");
        assert_eq!(report.hard_mismatches, 0);
        assert!(report.max_probability_diff <= 1e-4, "{report:?}");
    }
}

#[test]
fn f16_passes_the_parity_gate() {
    let scratch = tempfile::tempdir().expect("tempdir");
    let artifacts = common::artifacts(scratch.path());
    let engine = AneEngine::load(&checkpoints(), &options(&artifacts, Precision::F16)).expect("load passes the gate");
    let described = engine.describe();
    assert_eq!(described.dtype, "f16");
    let reports = described.parity;
    assert_eq!(reports.len(), 3);
    for report in &reports {
        eprintln!("gate f16 {report:?}");
        assert_eq!(report.executor, "candle cpu f16");
        assert!(report.rows > 0 && report.hard_mismatches == 0, "{report:?}");
        assert!(report.max_probability_diff <= 0.02 && report.max_act_probability_diff <= 0.02);
        // FP16 I/O and f16 matmuls do move the outputs: a gate that saw no difference would be suspect.
        assert!(report.max_probability_diff > 0.0, "{report:?}");
        assert!(report.placement.is_empty());
    }
    let total: u32 = reports.iter().map(|r| r.rows + r.skipped_rows).sum();
    assert_eq!(total, 137 + 18 + 14);
}

/// The graph entry point against the ordinary padded forward of worker-gpu, on the same weights: the
/// two paths share every layer, so in f32 they agree to rounding.
#[test]
fn the_graph_path_agrees_with_the_existing_forward() {
    for (name, sub, ..) in common::CHECKPOINTS {
        let checkpoint = Checkpoint::open(Location::from_path(common::checkpoint_dir(sub))).expect("open");
        let host = HostWeights::load(name, &checkpoint).expect("host");
        let mut executor = CandleExecutor::load(name, &checkpoint, Precision::F32, 128).expect("executor");
        let model = LayaModel::load(name, &checkpoint, &Device::Cpu, DType::F32).expect("model");
        let mut worst = 0f32;
        for forward in golden_forwards().into_iter().filter(|f| f.checkpoint == name) {
            for golden in &forward.rows {
                let row = Row {
                    ids: golden.ids.clone(),
                    markers: golden.markers.clone(),
                    qtype: golden.qtype,
                };
                let bucket = bucket_for(row.ids.len(), &common::BUCKETS).expect("fits");
                let inputs = host.inputs(&row, bucket).expect("inputs");
                let graph = executor.predict(bucket, &inputs).expect("predict");
                assert!(graph.is_finite());
                let ours: RowOutput = host.finish(&graph, row.markers.len()).expect("finish");
                let theirs = model.forward(std::slice::from_ref(&row)).expect("forward").remove(0);
                worst = worst
                    .max(max_abs_diff(&ours.logits, &theirs.logits))
                    .max(max_abs_diff(&ours.act_probabilities, &theirs.act_probabilities));
            }
        }
        eprintln!("{name}: graph path vs LayaModel::forward, max |Δ| {worst:.3e}");
        assert!(worst <= 1e-5, "{name}: {worst}");
    }
}
