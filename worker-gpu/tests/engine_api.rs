//! `CandleEngine` through the worker's `Engine` trait: what `describe()` reports, which requests are
//! refused with `InvalidArgument` (and what the message says: the row contract's, from
//! `layad_proto::rows`), and the load-time refusals.

use std::path::PathBuf;

use laya::checkpoint::{Checkpoint, Location, find_in_hf_cache};
use laya::question::QuestionType;
use laya::routing::CheckpointName;
use layad_proto::{Engine, EngineError, Row, check_and_forward};
use worker_gpu::{CandleEngine, DeviceRequest, EngineOptions, LoadError, Precision};

fn location(name: CheckpointName) -> Location {
    let cache = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/hf-cache/hub"));
    find_in_hf_cache(&cache, name).expect("fixture checkpoint")
}

fn options() -> EngineOptions {
    EngineOptions {
        device: DeviceRequest::Cpu,
        precision: None,
        threads: Some(1),
        cpu_kernels: None,
        int8_activations: None,
        max_rows: 4,
        max_batch_tokens: 100,
        length_buckets: Vec::new(),
        gate_cache: None,
    }
}

fn engine() -> CandleEngine {
    let checkpoints = [
        ("english".to_owned(), location(CheckpointName::English)),
        ("multilingual".to_owned(), location(CheckpointName::Multilingual)),
    ];
    CandleEngine::load(&checkpoints, options()).expect("load")
}

/// Without a thread count a CPU engine gets its own pool of one thread per CPU it may use.
#[test]
fn the_default_pool_has_a_thread_per_cpu() {
    let checkpoints = [("english".to_owned(), location(CheckpointName::English))];
    let engine = CandleEngine::load(
        &checkpoints,
        EngineOptions {
            threads: None,
            ..options()
        },
    )
    .expect("load");
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    assert_eq!(engine.cpu_threads(), Some(cpus));
}

fn row(ids: Vec<u32>, markers: Vec<u32>, qtype: QuestionType) -> Row {
    Row { ids, markers, qtype }
}

#[test]
fn info_reports_what_runs() {
    let engine = engine();
    let info = engine.describe();
    assert_eq!((info.device.as_str(), info.dtype.as_str()), ("cpu", "f32"));
    assert_eq!((info.max_rows, info.max_batch_tokens), (4, 100));
    assert!(info.length_buckets.is_empty());
    assert_eq!(engine.cpu_threads(), Some(1));
    assert_eq!(engine.precision(), Precision::F32);
    assert!(engine.fallback().is_none());
    let names: Vec<&str> = info.checkpoints.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["english", "multilingual"]);
    for (loaded, name) in info
        .checkpoints
        .iter()
        .zip([CheckpointName::English, CheckpointName::Multilingual])
    {
        let checkpoint = Checkpoint::open(location(name)).expect("open");
        assert_eq!(
            loaded.revision.as_deref(),
            Some("7a1e5eed0f1c7ee5c0de5eed0f1c7ee5c0de0320")
        );
        assert_eq!(loaded.weights_sha256, checkpoint.weights.sha256);
        assert_eq!(loaded.vocab_size as usize, checkpoint.encoder.vocab_size);
        // A request may raise its own `max_len` to upstream 0.4.x's budget; warm-up stays at the
        // checkpoint's own.
        assert_eq!(loaded.max_len as usize, laya::request::DEFAULT_MAX_TOKEN_BUDGET);
        assert_eq!(loaded.warmup_len as usize, checkpoint.agent.max_len);
    }
    assert_eq!(
        (info.checkpoints[0].vocab_size, info.checkpoints[0].warmup_len),
        (701, 96)
    );
    assert_eq!(
        (info.checkpoints[1].vocab_size, info.checkpoints[1].warmup_len),
        (776, 128)
    );
}

#[test]
fn outputs_have_one_logit_per_marker_and_n_act_probabilities() {
    let mut engine = engine();
    let rows = [
        row(vec![1, 5, 700, 9, 700, 2], vec![2, 4], QuestionType::Choice),
        row(vec![1, 700, 2], vec![1], QuestionType::Noul),
    ];
    let english = check_and_forward(&mut engine, "english", &rows).expect("forward");
    assert_eq!(english.iter().map(|o| o.logits.len()).collect::<Vec<_>>(), [2, 1]);
    let multilingual = check_and_forward(&mut engine, "multilingual", &rows).expect("forward");
    for (outputs, n_act) in [(&english, 2), (&multilingual, 3)] {
        for out in outputs {
            assert_eq!(out.act_probabilities.len(), n_act);
            let sum: f32 = out.act_probabilities.iter().sum();
            assert!((sum - 1.0).abs() < 1e-5 && out.logits.iter().all(|l| l.is_finite()));
        }
    }
    assert_eq!(refusal(&mut engine, "english", &[]), "the forward has no rows");
}

fn refusal(engine: &mut CandleEngine, checkpoint: &str, rows: &[Row]) -> String {
    match check_and_forward(engine, checkpoint, rows) {
        Err(EngineError::InvalidArgument(message)) => message,
        Err(other) => panic!("expected InvalidArgument, got {other}"),
        Ok(_) => panic!("expected a refusal"),
    }
}

#[test]
fn invalid_requests_are_refused_with_a_reason() {
    let mut engine = engine();
    let ok = row(vec![1, 700, 2], vec![1], QuestionType::Choice);
    let cases: Vec<(&str, Vec<Row>, &str)> = vec![
        (
            "german",
            vec![ok.clone()],
            "unknown checkpoint \"german\"; this worker serves english, multilingual",
        ),
        (
            "english",
            vec![ok.clone(); 5],
            "the forward has 5 rows; this worker takes at most 4 rows per forward",
        ),
        (
            "english",
            vec![
                row(vec![1; 60], vec![1], QuestionType::Choice),
                row(vec![1; 41], vec![1], QuestionType::Choice),
            ],
            "the forward has 101 tokens in all; this worker takes at most 100 tokens per forward",
        ),
        (
            "english",
            vec![ok.clone(), row(vec![], vec![], QuestionType::Choice)],
            "row 1 has no tokens",
        ),
        (
            "english",
            vec![row(vec![1, 701, 2], vec![1], QuestionType::Choice)],
            "row 0 position 1 has token id 701; checkpoint english has 701 ids (0..701)",
        ),
        (
            "english",
            vec![row(vec![1, 700, 2], vec![], QuestionType::Choice)],
            "row 0 has no markers",
        ),
        (
            "english",
            vec![row(vec![1, 700, 2], vec![1, 3], QuestionType::Choice)],
            "row 0 marker 1 is at position 3, outside the row (3 tokens)",
        ),
    ];
    for (checkpoint, rows, want) in cases {
        assert_eq!(refusal(&mut engine, checkpoint, &rows), want);
    }
    // Rows longer than the checkpoint's own max_len run (a 0.4.x request may ask for them).
    // (Rows past the 8192-token budget are refused by `rows::ForwardLimits`, tested there.)
    let long = row(vec![5; 97], vec![1], QuestionType::Score);
    assert!(check_and_forward(&mut engine, "english", &[long]).is_ok());
}

#[test]
fn load_refuses_duplicates_and_empty_lists() {
    let english = location(CheckpointName::English);
    let twice = [("a".to_owned(), english.clone()), ("a".to_owned(), english)];
    assert!(matches!(CandleEngine::load(&twice, options()), Err(LoadError::DuplicateName(n)) if n == "a"));
    assert!(matches!(
        CandleEngine::load(&[], options()),
        Err(LoadError::NoCheckpoints)
    ));
    let missing = [("nowhere".to_owned(), Location::directory("/nonexistent/laya"))];
    let err = CandleEngine::load(&missing, options()).err().expect("fails");
    assert!(
        err.to_string().starts_with("checkpoint 'nowhere': /nonexistent/laya"),
        "{err}"
    );
}

#[test]
fn an_unavailable_gpu_falls_back_to_the_cpu_and_says_so() {
    if candle_core::utils::cuda_is_available() {
        return;
    }
    let checkpoints = [("english".to_owned(), location(CheckpointName::English))];
    let requested = EngineOptions {
        device: DeviceRequest::Cuda(0),
        ..options()
    };
    let engine = CandleEngine::load(&checkpoints, requested).expect("falls back");
    assert_eq!(engine.describe().device, "cpu");
    assert_eq!(engine.describe().dtype, "f32");
    assert!(engine.fallback().is_some_and(|r| r.starts_with("cuda:0 unavailable")));
}
