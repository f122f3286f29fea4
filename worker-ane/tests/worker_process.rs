//! The real `layad-worker-ane` binary as the supervisor starts it: ready with the candle executor
//! (Describe shows the buckets, one row per forward and the parity gate), golden forwards over gRPC,
//! rows no bucket holds refused, exit status 69 where Core ML or the artifacts are missing, and 78
//! for arguments it never runs.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use laya::answer::calibrated_probabilities;
use laya::question::QuestionType;
use layad_proto::pb::WorkerState;
use layad_proto::{ClientError, EXIT_CONFIG_REFUSED, EXIT_DEVICE_UNAVAILABLE, Row, WorkerClient};
use layad_system_tests::capture_stderr;
use layad_system_tests::goldens::golden_forwards;

/// A worker process, killed when the test ends.
struct Worker {
    child: Child,
    socket: PathBuf,
    stderr: Arc<Mutex<String>>,
    _dir: tempfile::TempDir,
}

fn args(socket: &Path, artifacts: &Path, extra: &[&str]) -> Vec<String> {
    let mut args = vec![
        "--socket".to_owned(),
        socket.display().to_string(),
        "--artifacts".to_owned(),
        artifacts.display().to_string(),
        "--log-format".to_owned(),
        "json".to_owned(),
    ];
    for (name, sub, ..) in common::CHECKPOINTS {
        args.push("--checkpoint".into());
        args.push(format!("{name}={}", common::checkpoint_dir(sub).display()));
    }
    // What the supervisor passes to every worker.
    args.extend(["--max-rows", "64", "--max-batch-tokens", "16384"].map(String::from));
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

impl Worker {
    fn start(artifacts: &Path, extra: &[&str]) -> Worker {
        let dir = tempfile::tempdir().expect("tempdir");
        let socket = dir.path().join("run").join("ane.sock");
        let mut child = Command::new(env!("CARGO_BIN_EXE_layad-worker-ane"))
            .args(args(&socket, artifacts, extra))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn the worker");
        let stderr = capture_stderr(&mut child);
        Worker {
            child,
            socket,
            stderr,
            _dir: dir,
        }
    }

    fn log(&self) -> String {
        self.stderr.lock().expect("stderr").clone()
    }

    async fn ready(&mut self) -> WorkerClient {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                panic!("worker exited before it was ready ({status}):\n{}", self.log());
            }
            if let Ok(client) = WorkerClient::connect_uds(&self.socket).await
                && client
                    .describe()
                    .await
                    .is_ok_and(|info| info.state() == WorkerState::Ready)
            {
                return client;
            }
            assert!(Instant::now() < deadline, "not ready after 120 s:\n{}", self.log());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits for the exit status and returns it with the last stderr line.
    fn exit(mut self) -> (Option<i32>, String) {
        let deadline = Instant::now() + Duration::from_secs(60);
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                break status;
            }
            assert!(Instant::now() < deadline, "still running:\n{}", self.log());
            std::thread::sleep(Duration::from_millis(20));
        };
        // The reader thread may still be draining the pipe.
        std::thread::sleep(Duration::from_millis(100));
        let log = self.log();
        (status.code(), log.lines().last().unwrap_or_default().to_owned())
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn row(ids: Vec<u32>, markers: Vec<u32>, qtype: QuestionType) -> Row {
    Row { ids, markers, qtype }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn candle_worker_becomes_ready_and_serves_goldens_within_the_gate() {
    let scratch = tempfile::tempdir().expect("tempdir");
    let artifacts = common::artifacts(scratch.path());
    let mut worker = Worker::start(&artifacts, &["--executor", "candle", "--threads", "2"]);
    let client = worker.ready().await;
    let info = client.describe().await.expect("describe");
    assert_eq!(info.worker, format!("layad-worker-ane {}", env!("CARGO_PKG_VERSION")));
    assert_eq!(
        (
            info.device.as_str(),
            info.requested_device.as_str(),
            info.dtype.as_str()
        ),
        ("cpu", "auto", "f16")
    );
    let capabilities = info.capabilities.clone().expect("capabilities");
    assert_eq!(capabilities.max_rows, 1);
    assert_eq!(capabilities.max_batch_tokens, 128);
    assert_eq!(capabilities.length_buckets, [64, 96, 128]);
    // Every bucket a checkpoint's rows can land in was warmed, one row at a time.
    let shapes: Vec<String> = info
        .warmup
        .iter()
        .map(|w| format!("{} {} {}x{}", w.checkpoint, w.shape, w.rows, w.tokens_per_row))
        .collect();
    assert_eq!(
        shapes,
        [
            "english bucket 1x64",
            "english bucket 1x96",
            "multilingual bucket 1x64",
            "multilingual bucket 1x96",
            "multilingual bucket 1x128",
            "typed-decisions bucket 1x64",
            "typed-decisions bucket 1x96",
        ]
    );
    let gate = info.parity_gate.clone().expect("parity gate in Describe");
    let names: Vec<&str> = gate.checkpoints.iter().map(|c| c.checkpoint.as_str()).collect();
    assert_eq!(names, ["english", "multilingual", "typed-decisions"]);
    for checkpoint in &gate.checkpoints {
        eprintln!("Describe parity_gate: {checkpoint:?}");
        assert_eq!(checkpoint.executor, "candle cpu f16");
        assert!(checkpoint.rows > 0 && checkpoint.hard_mismatches == 0);
        assert!(checkpoint.max_probability_diff <= 0.02 && checkpoint.tolerance == 0.02);
    }

    // Golden forwards: calibrated probabilities and act probabilities within the gate's tolerance.
    let english = laya::checkpoint::Checkpoint::open(laya::checkpoint::Location::from_path(common::checkpoint_dir("")))
        .expect("english");
    let mut worst = 0f32;
    for forward in golden_forwards()
        .into_iter()
        .filter(|f| f.checkpoint == "english")
        .take(20)
    {
        for golden in &forward.rows {
            let request = row(golden.ids.clone(), golden.markers.clone(), golden.qtype);
            let result = client.forward("english", &[request]).await.expect("forward");
            let output = &result.outputs[0];
            let t = laya::answer::temperature(&english.agent.temperatures, golden.qtype, golden.markers.len());
            let ours = calibrated_probabilities(&output.logits, t);
            let theirs = calibrated_probabilities(&golden.logits, t);
            for (a, b) in ours
                .iter()
                .zip(&theirs)
                .chain(output.act_probabilities.iter().zip(&golden.act_probabilities))
            {
                worst = worst.max((a - b).abs());
            }
        }
    }
    eprintln!("gRPC f16 forwards vs upstream: max |Δp| {worst:.3e}");
    assert!(worst <= 0.02, "{worst}");

    // Two rows in one forward: refused by the worker's limits (the graphs are batch 1).
    let two = [
        row(vec![1, 2, 3], vec![1, 2], QuestionType::Choice),
        row(vec![1, 2, 3], vec![1, 2], QuestionType::Choice),
    ];
    assert!(matches!(
        client.forward("english", &two).await,
        Err(ClientError::InvalidArgument(_))
    ));
    // 33 options: more than the graph's slots.
    let many = row((1..=40).collect(), (1..=33).collect(), QuestionType::Choice);
    match client.forward("english", &[many]).await {
        Err(ClientError::InvalidArgument(message)) => assert!(message.contains("at most 32"), "{message}"),
        other => panic!("expected INVALID_ARGUMENT, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f32_worker_matches_goldens_and_refuses_rows_longer_than_its_buckets() {
    let scratch = tempfile::tempdir().expect("tempdir");
    let artifacts = common::artifacts(scratch.path());
    let mut worker = Worker::start(
        &artifacts,
        &[
            "--executor",
            "candle",
            "--dtype",
            "f32",
            "--length-buckets",
            "64,96",
            "--device",
            "cpu",
        ],
    );
    let client = worker.ready().await;
    let info = client.describe().await.expect("describe");
    assert_eq!((info.dtype.as_str(), info.device_mismatch), ("f32", false));
    assert_eq!(info.capabilities.expect("capabilities").length_buckets, [64, 96]);
    let gate = info.parity_gate.expect("gate");
    let multilingual = gate
        .checkpoints
        .iter()
        .find(|c| c.checkpoint == "multilingual")
        .expect("multilingual");
    // Reference rows over 96 tokens fit no bucket now: skipped, not failed.
    assert!(multilingual.skipped_rows > 0, "{multilingual:?}");

    let mut worst = 0f32;
    let mut served = 0;
    for forward in golden_forwards() {
        for golden in forward.rows.iter().filter(|r| r.ids.len() <= 96) {
            let request = row(golden.ids.clone(), golden.markers.clone(), golden.qtype);
            let result = client.forward(&forward.checkpoint, &[request]).await.expect("forward");
            let output = &result.outputs[0];
            for (a, b) in output
                .logits
                .iter()
                .zip(&golden.logits)
                .chain(output.act_probabilities.iter().zip(&golden.act_probabilities))
            {
                worst = worst.max((a - b).abs());
            }
            served += 1;
        }
    }
    eprintln!("gRPC f32 forwards vs upstream: {served} rows, max |Δ| {worst:.3e}");
    assert!(served > 100 && worst <= 1e-4, "{served} {worst}");

    let long = row((1..=100).collect(), vec![1, 2], QuestionType::Choice);
    match client.forward("multilingual", &[long]).await {
        Err(ClientError::InvalidArgument(message)) => assert!(message.contains("96"), "{message}"),
        other => panic!("expected INVALID_ARGUMENT, got {other:?}"),
    }
}

#[test]
fn coreml_on_linux_exits_69_with_the_reason_last() {
    if cfg!(target_os = "macos") {
        return;
    }
    let scratch = tempfile::tempdir().expect("tempdir");
    let artifacts = common::artifacts(scratch.path());
    let (code, last) = Worker::start(&artifacts, &[]).exit();
    assert_eq!(code, Some(EXIT_DEVICE_UNAVAILABLE), "{last}");
    assert!(
        last.contains("ERROR") && last.contains("Core ML is not available"),
        "{last}"
    );
}

#[test]
fn arguments_it_never_runs_exit_78_with_the_reason_last_on_every_os() {
    let scratch = tempfile::tempdir().expect("tempdir");
    let artifacts = common::artifacts(scratch.path());
    // What an ane pool without dtype was started with before it defaulted to f16: Core ML graphs
    // are FP16, so the supervisor must not restart this worker in a loop.
    let (code, last) = Worker::start(&artifacts, &["--executor", "coreml", "--dtype", "f32"]).exit();
    assert_eq!(code, Some(EXIT_CONFIG_REFUSED), "{last}");
    assert!(
        last.contains("ERROR") && last.contains("--dtype f32: coreml runs f16 only"),
        "{last}"
    );
    let (code, last) = Worker::start(&artifacts, &["--executor", "coreml", "--device", "cpu"]).exit();
    assert_eq!(code, Some(EXIT_CONFIG_REFUSED), "{last}");
    assert!(last.contains("--device cpu with --executor coreml"), "{last}");
}

#[test]
fn missing_artifacts_exit_69_naming_the_directory() {
    let scratch = tempfile::tempdir().expect("tempdir");
    let artifacts = common::artifacts(scratch.path());
    let partial = tempfile::tempdir().expect("tempdir");
    for (name, ..) in &common::CHECKPOINTS[..2] {
        copy_dir(&artifacts.join(name), &partial.path().join(name));
    }
    let (code, last) = Worker::start(partial.path(), &["--executor", "candle"]).exit();
    assert_eq!(code, Some(EXIT_DEVICE_UNAVAILABLE), "{last}");
    assert!(last.contains("typed-decisions") && last.contains("missing"), "{last}");
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for entry in std::fs::read_dir(from).expect("read_dir") {
        let entry = entry.expect("entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("type").is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).expect("copy");
        }
    }
}
