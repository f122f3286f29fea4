//! The request id across the hop: a forward sent with its jobs' request ids is logged by the worker
//! under those ids, on the gRPC side and on the engine thread alike, in the JSON lines the
//! supervisor re-emits. Its own test binary: it installs the process's global log subscriber.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use laya::question::QuestionType;
use layad_proto::harness::{LoadError, serve};
use layad_proto::{
    CheckedForward, Engine, EngineError, EngineFacts, EngineInfo, HarnessOptions, LoadedCheckpoint, Row, RowOutput,
    StopReason, WarmupPolicy, WorkerClient,
};
use tokio::sync::mpsc;

/// Answers every row with one logit per marker, logging one line per forward.
struct LoggingEngine;

impl Engine for LoggingEngine {
    fn describe(&self) -> EngineInfo {
        EngineInfo {
            device: "cpu".into(),
            dtype: "f32".into(),
            checkpoints: vec![LoadedCheckpoint {
                name: "toy".into(),
                revision: None,
                weights_sha256: "sha".into(),
                vocab_size: 50,
                max_len: 16,
                warmup_len: 16,
            }],
            max_rows: 2,
            max_batch_tokens: 32,
            length_buckets: vec![],
            parity: Vec::new(),
            facts: EngineFacts::default(),
        }
    }

    fn forward(&mut self, forward: &CheckedForward) -> Result<Vec<RowOutput>, EngineError> {
        let rows = forward.rows();
        tracing::info!(rows = rows.len(), "toy engine ran a batch");
        Ok(rows
            .iter()
            .map(|row| RowOutput {
                logits: row.markers.iter().map(|&m| m as f32).collect(),
                act_probabilities: vec![0.5, 0.5],
            })
            .collect())
    }
}

/// Everything logged, as the worker binary writes it (`logging::init_logging`'s JSON settings).
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("log buffer").extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn lines(&self) -> Vec<serde_like::Line> {
        let text = String::from_utf8_lossy(&self.0.lock().expect("log buffer")).into_owned();
        text.lines().map(serde_like::Line::new).collect()
    }
}

/// Just enough reading of a JSON log line for the assertions (this crate has no JSON parser).
mod serde_like {
    pub struct Line(pub String);

    impl Line {
        pub fn new(text: &str) -> Self {
            Line(text.to_owned())
        }

        pub fn says(&self, message: &str) -> bool {
            self.0.contains(&format!("\"message\":\"{message}\""))
        }

        pub fn has_request_id(&self, id: &str) -> bool {
            self.0.contains(&format!("\"request_id\":\"{id}\""))
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workers_log_lines_for_a_forward_carry_its_request_ids() {
    let captured = Captured::default();
    let writer = captured.clone();
    tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_max_level(tracing::Level::DEBUG)
        .with_ansi(false)
        .json()
        .flatten_event(true)
        .with_current_span(false)
        .try_init()
        .expect("the only subscriber of this test binary");

    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("private").join("worker.sock");
    let options = HarnessOptions {
        socket: socket.clone(),
        liveness_fd: None,
        requested_device: "cpu".into(),
        worker: "toy-worker 1.0".into(),
        warmup: WarmupPolicy {
            short_len: 4,
            multi_rows: 2,
            runs: 1,
        },
        spawn_nonce: "nonce".into(),
    };
    let (stop, stop_rx) = mpsc::channel(1);
    let load = || -> Result<LoggingEngine, LoadError> { Ok(LoggingEngine) };
    let task = tokio::spawn(serve(load, options, stop_rx));
    let deadline = Instant::now() + Duration::from_secs(20);
    let client = loop {
        match WorkerClient::connect_uds(&socket).await {
            Ok(client) => break client,
            Err(error) if error.is_retryable() && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(error) => panic!("cannot connect: {error}"),
        }
    };
    let rows = [Row {
        ids: vec![1, 2, 3],
        markers: vec![1],
        qtype: QuestionType::Choice,
    }];
    let answer = client
        .forward_for("toy", rows.to_vec(), &["4f2a9c/0", "4f2a9d"])
        .await
        .expect("forward");
    assert_eq!(answer.outputs.len(), 1);
    // A forward without ids (the warm-up's kind) logs an empty id, not another request's.
    client.forward("toy", &rows).await.expect("forward");
    stop.send(StopReason::Terminate).await.expect("stop");
    task.await.expect("join").expect("serve");

    let lines = captured.lines();
    let engine_lines: Vec<&serde_like::Line> = lines.iter().filter(|l| l.says("toy engine ran a batch")).collect();
    // Warm-up forwards, then the two forwards above, in order.
    assert!(
        engine_lines.len() >= 2,
        "{:?}",
        lines.iter().map(|l| &l.0).collect::<Vec<_>>()
    );
    let with_ids = engine_lines[engine_lines.len() - 2];
    assert!(with_ids.has_request_id("4f2a9c/0,4f2a9d"), "{}", with_ids.0);
    let without = engine_lines[engine_lines.len() - 1];
    assert!(without.has_request_id(""), "{}", without.0);
    // The gRPC side's lines of the forward carry it too.
    assert!(
        lines
            .iter()
            .any(|l| l.says("forward answered") && l.has_request_id("4f2a9c/0,4f2a9d")),
        "{:?}",
        lines.iter().map(|l| &l.0).collect::<Vec<_>>()
    );
}
