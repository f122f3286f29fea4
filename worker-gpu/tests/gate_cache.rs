//! The parity gate's float32 reference kept between starts (`EngineOptions::gate_cache`): a second
//! start on the same files reads it back and judges the same; an entry that does not fit is
//! computed again; an entry that reads back is what the gate judges against; a start that reads it
//! back serves exactly what a start that computed it serves.

use std::path::{Path, PathBuf};

use laya::checkpoint::{Location, find_in_hf_cache};
use laya::question::QuestionType;
use laya::routing::CheckpointName;
use layad_proto::{Engine, ForwardLimits, ParityReport, Row, RowOutput};
use worker_gpu::{CandleEngine, DeviceRequest, EngineOptions, LoadError, Precision};

fn location(name: CheckpointName) -> Location {
    let cache = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/hf-cache/hub"));
    find_in_hf_cache(&cache, name).expect("fixture checkpoint")
}

/// An engine of two checkpoints of different random weights, in `precision` on `threads`, behind
/// the gate kept in `cache`.
fn start(precision: Precision, threads: usize, cache: &Path) -> Result<CandleEngine, LoadError> {
    let checkpoints = [
        ("english".to_owned(), location(CheckpointName::English)),
        ("multilingual".to_owned(), location(CheckpointName::Multilingual)),
    ];
    let options = EngineOptions {
        device: DeviceRequest::Cpu,
        precision: Some(precision),
        threads: Some(threads),
        gate_cache: Some(cache.to_path_buf()),
        ..EngineOptions::default()
    };
    CandleEngine::load(&checkpoints, options)
}

/// [`start`] on one thread: the gate's reports.
fn load(precision: Precision, cache: &Path) -> Result<Vec<ParityReport>, LoadError> {
    start(precision, 1, cache).map(|engine| engine.describe().parity)
}

fn entries(dir: &Path) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("cache dir")
        .map(|e| e.expect("entry").path())
        .collect();
    found.sort();
    found
}

/// Rewrites every logit of an entry (`LAYADGR1`, rows, then per row a count and its logits, a count
/// and its act probabilities; little-endian) with `edit(option index, logit)`, keeping its layout.
fn edit_logits(path: &Path, edit: impl Fn(usize, f32) -> f32) {
    let mut bytes = std::fs::read(path).expect("entry");
    let word = |bytes: &[u8], at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes")) as usize;
    let rows = word(&bytes, 8);
    let mut at = 12;
    for _ in 0..rows {
        let logits = word(&bytes, at);
        at += 4;
        for option in 0..logits {
            let value = f32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"));
            bytes[at..at + 4].copy_from_slice(&edit(option, value).to_le_bytes());
            at += 4;
        }
        at += 4 + 4 * word(&bytes, at);
    }
    assert_eq!(at, bytes.len(), "the whole entry walked");
    std::fs::write(path, bytes).expect("write entry");
}

#[test]
fn a_second_start_reads_the_reference_back_and_judges_the_same() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cache = dir.path().join("gate");
    let first = load(Precision::Int8, &cache).expect("int8 passes");
    // One entry per checkpoint: their weights differ.
    let kept = entries(&cache);
    assert_eq!(kept.len(), 2, "{kept:?}");
    let bytes: Vec<Vec<u8>> = kept.iter().map(|p| std::fs::read(p).expect("entry")).collect();
    let again = load(Precision::Int8, &cache).expect("int8 passes again");
    assert_eq!(again, first);
    // f16 runs against the same float32 forward of the same rows: the same entries serve it.
    load(Precision::F16, &cache).expect("f16 passes");
    assert_eq!(entries(&cache), kept);

    // A truncated entry is computed again, to the same bytes: the float32 forward is deterministic.
    let truncated = &kept[0];
    std::fs::write(truncated, &bytes[0][..bytes[0].len() - 3]).expect("truncate");
    assert_eq!(load(Precision::Int8, &cache).expect("int8 passes"), first);
    assert_eq!(std::fs::read(truncated).expect("entry"), bytes[0]);

    // An entry that reads back is what the gate judges against: logits that make every row's last
    // option certain refuse the checkpoint, in int8 and in f16.
    edit_logits(truncated, |option, _| 20.0 * option as f32);
    for precision in [Precision::Int8, Precision::F16] {
        let refused = load(precision, &cache).expect_err("judged against the edited reference");
        assert!(matches!(refused, LoadError::ParityGate { .. }), "{refused}");
    }
    // Without the cache the gate computes its own reference and passes.
    let fresh = tempfile::tempdir().expect("tempdir");
    assert_eq!(load(Precision::Int8, fresh.path()).expect("int8 passes"), first);
}

/// Every row of a forward of a few short rows, on `engine`'s checkpoint `name`.
fn answers(engine: &mut CandleEngine, name: &str) -> Vec<RowOutput> {
    let rows = (0..3u32)
        .map(|r| Row {
            ids: (0..24 + 9 * r).map(|t| 5 + (t * 37 + r * 11) % 200).collect(),
            markers: vec![4, 9, 15],
            qtype: [QuestionType::Choice, QuestionType::Score, QuestionType::Noul][r as usize],
        })
        .collect();
    let forward = ForwardLimits::from_info(&engine.describe())
        .admit(name.to_owned(), rows)
        .expect("rows within the limits");
    engine.forward(&forward).expect("forward")
}

/// A start that reads the reference back reduces each matrix as it reads it (the float32 model is
/// never built whole): it must serve exactly what a start that built it serves, and judge the same.
#[test]
fn a_start_that_reads_the_reference_back_serves_the_same_answers() {
    let mut precisions = vec![Precision::Int8];
    if layad_cpu_kernels::bf16::Bf16Kernel::for_family(worker_gpu::CpuKernels::detect()).is_some() {
        precisions.push(Precision::Bf16);
    }
    for precision in precisions {
        let dir = tempfile::tempdir().expect("tempdir");
        let cache = dir.path().join("gate");
        let mut built = start(precision, 2, &cache).expect("passes the gate");
        assert_eq!(entries(&cache).len(), 2, "{precision}: the references kept");
        let mut read_back = start(precision, 2, &cache).expect("passes the gate");
        assert_eq!(read_back.describe().parity, built.describe().parity, "{precision}");
        for name in ["english", "multilingual"] {
            assert_eq!(
                answers(&mut read_back, name),
                answers(&mut built, name),
                "{precision} {name}"
            );
        }
    }
}
