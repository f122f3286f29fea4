//! The real `layad-worker-gpu` binary as the supervisor sees it: started as a process on the fixture
//! checkpoints and driven over its Unix socket with `layad_proto`'s client — readiness, upstream
//! parity over gRPC, refused input, SIGTERM mid-forward, parent death, device fallback.

mod common;

use common::{Case, GoldenRow, golden_cases};
use laya::question::QuestionType;

use layad_system_tests::capture_stderr_to_end;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use layad_proto::pb::WorkerState;
use layad_proto::{ClientError, Row, WorkerClient};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::Value;
use sha2::{Digest, Sha256};

const REVISION: &str = "7a1e5eed0f1c7ee5c0de5eed0f1c7ee5c0de0320";
const CHECKPOINTS: [(&str, &str); 3] = [
    ("english", ""),
    ("multilingual", "multilingual"),
    ("typed-decisions", "typed-decisions"),
];

fn snapshot() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/hf-cache/hub/models--convaiinnovations--laya/snapshots")
        .join(REVISION)
}

fn checkpoint_dir(sub: &str) -> PathBuf {
    if sub.is_empty() {
        snapshot()
    } else {
        snapshot().join(sub)
    }
}

/// The worker's arguments for the three fixture checkpoints on the CPU (unless `extra` names a
/// device), plus `extra`.
fn worker_args(socket: &Path, extra: &[&str]) -> Vec<String> {
    let mut args = vec!["--socket".to_owned(), socket.display().to_string()];
    for (name, sub) in CHECKPOINTS {
        args.push("--checkpoint".into());
        args.push(format!("{name}={}", checkpoint_dir(sub).display()));
    }
    if !extra.contains(&"--device") {
        args.extend(["--device", "cpu"].map(String::from));
    }
    args.extend(["--threads", "2"].map(String::from));
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

/// A worker process (or a parent process holding one) that is killed when the test ends.
struct Worker {
    child: Child,
    socket: PathBuf,
    stderr: Arc<Mutex<String>>,
    /// Set once everything the worker wrote to stderr is in `stderr`.
    stderr_ended: Arc<AtomicBool>,
    _dir: tempfile::TempDir,
}

impl Worker {
    /// Starts `layad-worker-gpu` with its socket in a private directory it must create itself.
    fn start(extra: &[&str]) -> Worker {
        Worker::start_with(extra, |command| command)
    }

    fn start_with(extra: &[&str], adjust: impl FnOnce(&mut Command) -> &mut Command) -> Worker {
        let dir = tempfile::tempdir().expect("tempdir");
        let socket = dir.path().join("run").join("worker.sock");
        let mut command = Command::new(env!("CARGO_BIN_EXE_layad-worker-gpu"));
        command
            .args(worker_args(&socket, extra))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        adjust(&mut command);
        Worker::spawned(command, socket, dir)
    }

    fn spawned(mut command: Command, socket: PathBuf, dir: tempfile::TempDir) -> Worker {
        let mut child = command.spawn().expect("spawn the worker");
        let (stderr, stderr_ended) = capture_stderr_to_end(&mut child);
        Worker {
            child,
            socket,
            stderr,
            stderr_ended,
            _dir: dir,
        }
    }

    fn pid(&self) -> Pid {
        Pid::from_raw(self.child.id() as i32)
    }

    fn log(&self) -> String {
        self.stderr.lock().expect("stderr").clone()
    }

    /// Polls until Describe says `ready`; returns what every earlier attempt saw.
    async fn ready(&mut self) -> (WorkerClient, Vec<String>) {
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut seen = Vec::new();
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                panic!("worker exited before it was ready ({status}):\n{}", self.log());
            }
            match WorkerClient::connect_uds(&self.socket).await {
                Ok(client) => {
                    let info = client.describe().await.expect("describe");
                    if info.state() == WorkerState::Ready {
                        return (client, seen);
                    }
                    seen.push(info.state().label().to_owned());
                }
                Err(error) if error.is_retryable() => seen.push("unreachable".into()),
                Err(error) => panic!("connect: {error}"),
            }
            assert!(
                Instant::now() < deadline,
                "worker not ready after 60 s:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    fn signal(&self, signal: Signal) {
        kill(self.pid(), signal).expect("signal the worker");
    }

    async fn exit_within(&mut self, limit: Duration) -> ExitStatus {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                // Its last lines may still be on their way into the log, which a test reads next.
                let read_by = Instant::now() + Duration::from_secs(5);
                while !self.stderr_ended.load(Ordering::Acquire) && Instant::now() < read_by {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "worker still running after {limit:?}:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn assert_close(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: {got:?} vs {want:?}");
    for (g, w) in got.iter().zip(want) {
        assert!((g - w).abs() <= 1e-4, "{what}: {got:?} vs golden {want:?}");
    }
}

fn rows_of(case: &Case) -> Vec<Row> {
    case.rows.iter().map(|r| r.row.clone()).collect()
}

async fn forward_matches_golden(client: &WorkerClient, case: &Case) {
    let result = client.forward(&case.checkpoint, &rows_of(case)).await;
    let result = result.unwrap_or_else(|e| panic!("{}: {e}", case.name));
    for (i, (output, golden)) in result.outputs.iter().zip(&case.rows).enumerate() {
        assert_close(&format!("{} row {i} logits", case.name), &output.logits, &golden.logits);
        assert_close(
            &format!("{} row {i} act", case.name),
            &output.act_probabilities,
            &golden.act_probabilities,
        );
    }
}

fn sha256_hex(path: &Path) -> String {
    let bytes = std::fs::read(path).expect("weights");
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn describe_is_unreachable_until_ready_then_reports_what_really_runs() {
    let mut worker = Worker::start(&[]);
    let (client, before) = worker.ready().await;
    // The socket exists only once every checkpoint is loaded and warm: until then nothing answers.
    assert!(!before.is_empty(), "the first attempt already found a ready worker");
    assert!(
        before
            .iter()
            .all(|s| ["unreachable", "loading", "warming"].contains(&s.as_str())),
        "{before:?}"
    );

    let info = client.describe().await.expect("describe");
    assert_eq!(info.state(), WorkerState::Ready);
    assert_eq!(info.protocol_version, layad_proto::PROTOCOL_VERSION);
    assert_eq!(info.pid, worker.child.id());
    assert_eq!(info.worker, format!("layad-worker-gpu {}", env!("CARGO_PKG_VERSION")));
    assert_eq!(
        (
            info.device.as_str(),
            info.requested_device.as_str(),
            info.device_mismatch
        ),
        ("cpu", "cpu", false)
    );
    assert_eq!(info.dtype, "f32");
    let expected = [
        ("english", "", 701, 8192),
        ("multilingual", "multilingual", 776, 8192),
        ("typed-decisions", "typed-decisions", 701, 8192),
    ];
    assert_eq!(info.checkpoints.len(), expected.len());
    for (checkpoint, (name, sub, vocab, max_len)) in info.checkpoints.iter().zip(expected) {
        assert_eq!(checkpoint.name, name);
        assert_eq!(checkpoint.revision.as_deref(), Some(REVISION), "{name}");
        assert_eq!(
            checkpoint.weights_sha256,
            sha256_hex(&checkpoint_dir(sub).join("model.safetensors")),
            "{name}"
        );
        assert_eq!((checkpoint.vocab_size, checkpoint.max_len), (vocab, max_len), "{name}");
    }
    let capabilities = info.capabilities.expect("capabilities");
    assert_eq!(
        (
            capabilities.max_rows,
            capabilities.max_batch_tokens,
            capabilities.max_len
        ),
        (
            layad_proto::DEFAULT_MAX_ROWS,
            layad_proto::DEFAULT_MAX_BATCH_TOKENS,
            8192
        )
    );
    assert!(capabilities.length_buckets.is_empty());
    let shapes: Vec<String> = info
        .warmup
        .iter()
        .map(|w| format!("{} {} {}x{}", w.checkpoint, w.shape, w.rows, w.tokens_per_row))
        .collect();
    let expected_shapes = [
        "english short 1x16",
        "english multi-row 8x16",
        "multilingual short 1x16",
        "multilingual multi-row 8x16",
        "typed-decisions short 1x16",
        "typed-decisions multi-row 8x16",
    ];
    assert_eq!(shapes, expected_shapes);
    assert!(
        info.warmup.iter().all(|w| w.first_ms > 0.0 && w.steady_ms > 0.0),
        "{:?}",
        info.warmup
    );
    let memory = info.memory.expect("memory");
    assert!(memory.rss_bytes.is_some_and(|rss| rss > 1 << 20), "{memory:?}");

    // Private socket: the directory was created 0700, the socket is 0600.
    let mode = |path: &Path| std::fs::metadata(path).expect("stat").permissions().mode() & 0o777;
    assert_eq!(mode(worker.socket.parent().expect("dir")), 0o700);
    assert_eq!(mode(&worker.socket), 0o600);

    let mut watch = client.watch().await.expect("watch");
    assert_eq!(
        watch.next().await.expect("status").expect("status").state(),
        WorkerState::Ready
    );
    worker.signal(Signal::SIGTERM);
    assert!(
        watch
            .next()
            .await
            .is_none_or(|s| s.is_ok_and(|s| s.state() == WorkerState::Draining))
    );
    let status = worker.exit_within(Duration::from_secs(10)).await;
    assert_eq!(status.code(), Some(0), "{}", worker.log());
    assert!(!worker.socket.exists(), "socket removed at exit");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwards_over_grpc_reproduce_the_upstream_goldens() {
    let mut worker = Worker::start(&[]);
    let (client, _) = worker.ready().await;
    let cases = golden_cases();
    assert_eq!(cases.len(), 104, "cases.json changed");
    for checkpoint in ["english", "multilingual", "typed-decisions"] {
        assert!(
            cases.iter().any(|c| c.checkpoint == checkpoint),
            "no golden for {checkpoint}"
        );
    }
    for case in &cases {
        forward_matches_golden(&client, case).await;
    }
    assert_eq!(client.describe().await.expect("describe").forwards_served, 104);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_invalid_argument_and_the_next_request_still_succeeds() {
    let mut worker = Worker::start(&["--max-rows", "4", "--max-batch-tokens", "200"]);
    let (client, _) = worker.ready().await;
    let cases = golden_cases();
    let good = cases
        .iter()
        .find(|c| c.checkpoint == "english" && c.rows.len() == 1)
        .expect("a one-row case");
    let base = good.rows[0].row.clone();
    let len = base.ids.len() as u32;
    let with = |change: &dyn Fn(&mut Row)| {
        let mut row = base.clone();
        change(&mut row);
        row
    };
    let long_row = Row {
        ids: vec![5; 90],
        markers: vec![3],
        qtype: QuestionType::Choice,
    };
    let bad: Vec<(&str, Vec<Row>, String)> = vec![
        (
            "martian",
            vec![base.clone()],
            "unknown checkpoint \"martian\"; this worker serves english, multilingual, typed-decisions".into(),
        ),
        (
            "english",
            vec![with(&|r| r.ids[3] = 701)],
            "row 0 position 3 has token id 701; checkpoint english has 701 ids".into(),
        ),
        (
            "english",
            vec![with(&|r| r.markers.push(len))],
            format!("is at position {len}, outside the row ({len} tokens)"),
        ),
        (
            "english",
            vec![base.clone(); 5],
            "the forward has 5 rows; this worker takes at most 4 rows per forward".into(),
        ),
        (
            "english",
            vec![long_row.clone(), long_row.clone(), long_row],
            "the forward has 270 tokens in all; this worker takes at most 200".into(),
        ),
        ("english", vec![], "the forward has no rows".into()),
        (
            "english",
            vec![
                base.clone(),
                Row {
                    ids: vec![],
                    markers: vec![],
                    qtype: QuestionType::Choice,
                },
            ],
            "row 1 has no tokens".into(),
        ),
        (
            "english",
            vec![with(&|r| r.markers.clear())],
            "row 0 has no markers".into(),
        ),
        (
            "english",
            vec![with(&|r| r.markers.reverse())],
            "not after the previous marker".into(),
        ),
    ];
    for (checkpoint, rows, expected) in bad {
        match client.forward(checkpoint, &rows).await {
            Err(ClientError::InvalidArgument(message)) => assert!(message.contains(&expected), "{message}"),
            other => panic!("expected INVALID_ARGUMENT ({expected}), got {other:?}"),
        }
        forward_matches_golden(&client, good).await;
    }
    assert_eq!(
        worker.child.try_wait().expect("try_wait"),
        None,
        "the worker keeps serving"
    );
}

/// `n` rows filled from the longest golden english rows: a forward that takes a while, whose every
/// row has a known answer.
fn long_batch(n: usize) -> Vec<GoldenRow> {
    let mut rows: Vec<GoldenRow> = golden_cases()
        .into_iter()
        .filter(|c| c.checkpoint == "english")
        .flat_map(|c| c.rows)
        .collect();
    rows.sort_by_key(|r| std::cmp::Reverse(r.row.ids.len()));
    rows.truncate(16);
    (0..n)
        .map(|i| {
            let golden = &rows[i % rows.len()];
            GoldenRow {
                row: golden.row.clone(),
                logits: golden.logits.clone(),
                act_probabilities: golden.act_probabilities.clone(),
            }
        })
        .collect()
}

async fn wait_for_in_flight(client: &WorkerClient, n: u32) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while client.describe().await.expect("describe").forwards_in_flight < n {
        assert!(Instant::now() < deadline, "forwards never arrived");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_during_a_forward_still_answers_it_and_exits_zero() {
    let mut worker = Worker::start(&[]);
    let (client, _) = worker.ready().await;
    let batch = Arc::new(long_batch(64));
    let forwards: Vec<_> = (0..3)
        .map(|_| {
            let client = client.clone();
            let batch = batch.clone();
            tokio::spawn(async move {
                let rows: Vec<Row> = batch.iter().map(|g| g.row.clone()).collect();
                client.forward("english", &rows).await
            })
        })
        .collect();
    // All three accepted: one on the engine, two queued behind it.
    wait_for_in_flight(&client, 3).await;
    worker.signal(Signal::SIGTERM);
    for forward in forwards {
        let result = forward.await.expect("join").expect("answered despite SIGTERM");
        for (i, (output, golden)) in result.outputs.iter().zip(batch.iter()).enumerate() {
            assert_close(&format!("row {i}"), &output.logits, &golden.logits);
            assert_close(
                &format!("row {i} act"),
                &output.act_probabilities,
                &golden.act_probabilities,
            );
        }
    }
    let status = worker.exit_within(Duration::from_secs(30)).await;
    assert_eq!(status.code(), Some(0), "{}", worker.log());
    // Structured log lines: the drain was logged as JSON with the three forwards in flight.
    let drain_line = worker
        .log()
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .find(|line| line["state"] == "draining")
        .expect("a JSON log line for the drain");
    assert_eq!(drain_line["in_flight"], 3, "{drain_line}");
    assert!(
        WorkerClient::connect_uds(&worker.socket)
            .await
            .expect_err("gone")
            .is_retryable()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_mid_forward_gives_a_retryable_error() {
    let mut worker = Worker::start(&[]);
    let (client, _) = worker.ready().await;
    let rows: Vec<Row> = long_batch(64).into_iter().map(|g| g.row).collect();
    let forwards: Vec<_> = (0..3)
        .map(|_| {
            let client = client.clone();
            let rows = rows.clone();
            tokio::spawn(async move { client.forward("english", &rows).await })
        })
        .collect();
    wait_for_in_flight(&client, 3).await;
    worker.signal(Signal::SIGKILL);
    let mut failed = 0;
    for forward in forwards {
        if let Err(error) = forward.await.expect("join") {
            assert!(error.is_retryable(), "{error:?}");
            failed += 1;
        }
    }
    assert!(failed > 0, "SIGKILL came after every forward finished");
}

#[cfg(target_os = "linux")]
fn has_exited(pid: Pid) -> bool {
    // Re-parented to an init that may not reap: a zombie has exited too.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z')),
    }
}

#[cfg(not(target_os = "linux"))]
fn has_exited(pid: Pid) -> bool {
    kill(pid, None).is_err()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_parent_makes_the_worker_exit_within_two_seconds() {
    // The parent is a shell that holds the write end of the liveness pipe (its stdout) and waits; the
    // worker gets the read end as fd 3 and nothing else of the pipe.
    let (reader, writer) = std::io::pipe().expect("pipe");
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("run").join("worker.sock");
    let mut command = Command::new("sh");
    command
        .arg("-c")
        .arg(r#"exec 3<&0 0</dev/null; "$@" --liveness-fd 3 >&2 & wait"#)
        .arg("sh")
        .arg(env!("CARGO_BIN_EXE_layad-worker-gpu"))
        .args(worker_args(&socket, &[]))
        .stdin(reader)
        .stdout(writer)
        .stderr(Stdio::piped());
    let mut parent = Worker::spawned(command, socket, dir);
    let (client, _) = parent.ready().await;
    let worker_pid = Pid::from_raw(client.describe().await.expect("describe").pid as i32);
    assert_ne!(worker_pid, parent.pid());
    drop(client);

    parent.signal(Signal::SIGKILL);
    let killed = Instant::now();
    while !has_exited(worker_pid) {
        assert!(
            killed.elapsed() < Duration::from_secs(2),
            "worker alive 2 s after its parent died:\n{}",
            parent.log()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(!parent.socket.exists(), "the worker removed its socket on the way out");
}

/// Without a liveness pipe, Linux's parent-death signal alone stops the worker; the same signal while
/// the parent process lives (its forking thread exited) is ignored.
#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_parent_death_signal_alone_stops_the_worker_and_a_spurious_one_does_not() {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("run").join("worker.sock");
    let mut command = Command::new("sh");
    command
        .arg("-c")
        .arg(r#""$@" & wait"#)
        .arg("sh")
        .arg(env!("CARGO_BIN_EXE_layad-worker-gpu"))
        .args(worker_args(&socket, &[]))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut parent = Worker::spawned(command, socket, dir);
    let (client, _) = parent.ready().await;
    let worker_pid = Pid::from_raw(client.describe().await.expect("describe").pid as i32);
    kill(worker_pid, Signal::SIGUSR1).expect("spurious parent-death signal");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let info = client.describe().await.expect("still serving after a spurious signal");
    assert_eq!(info.state(), WorkerState::Ready);
    drop(client);

    parent.signal(Signal::SIGKILL);
    let killed = Instant::now();
    while !has_exited(worker_pid) {
        assert!(
            killed.elapsed() < Duration::from_secs(2),
            "worker alive 2 s after its parent died:\n{}",
            parent.log()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(parent.log().contains("parent process died"), "{}", parent.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_the_liveness_pipe_stops_the_worker_while_its_parent_lives() {
    let (reader, writer) = std::io::pipe().expect("pipe");
    let mut worker = Worker::start_with(&["--liveness-fd", "0"], |command| command.stdin(reader));
    worker.ready().await;
    drop(writer);
    let status = worker.exit_within(Duration::from_secs(2)).await;
    assert_eq!(status.code(), Some(0), "{}", worker.log());
    assert!(worker.log().contains("liveness pipe closed"), "{}", worker.log());
}

/// A GPU this machine never has: Metal off macOS, CUDA on macOS.
const MISSING_GPU: &str = if cfg!(target_os = "macos") { "cuda" } else { "metal" };

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_device_is_refused_with_require_device_and_reported_without() {
    let mut refused = Worker::start(&["--device", MISSING_GPU, "--require-device"]);
    let status = refused.exit_within(Duration::from_secs(30)).await;
    // Not a crash: the supervisor does not restart a worker that exits with this code.
    assert_eq!(
        status.code(),
        Some(layad_proto::EXIT_DEVICE_UNAVAILABLE),
        "{}",
        refused.log()
    );
    let expected = format!("--require-device: {MISSING_GPU}");
    assert!(refused.log().contains(&expected), "{}", refused.log());
    assert!(!refused.socket.exists());

    // Without the flag the worker runs on the CPU and says so: requested vs in use, mismatch set.
    let mut fallback = Worker::start(&["--device", MISSING_GPU]);
    let (client, _) = fallback.ready().await;
    let info = client.describe().await.expect("describe");
    let requested = if MISSING_GPU == "cuda" { "cuda:0" } else { "metal" };
    assert_eq!(
        (
            info.device.as_str(),
            info.requested_device.as_str(),
            info.device_mismatch
        ),
        ("cpu", requested, true)
    );
    // The engine's own reason reaches Describe (and from there the supervisor's /health); a CPU
    // has no GPU facts.
    let facts = info.decode_engine_facts().expect("engine facts");
    let reason = facts.device_fallback.as_deref().unwrap_or_default();
    assert!(
        reason.starts_with(&format!("{requested} unavailable (")) && reason.ends_with("); running on cpu"),
        "{reason}"
    );
    assert_eq!(facts.gpu, None);

    // CUDA off a CUDA build: the reason names the build, not a driver.
    if !cfg!(feature = "cuda") {
        let mut cuda = Worker::start(&["--device", "cuda:1"]);
        let (client, _) = cuda.ready().await;
        let info = client.describe().await.expect("describe");
        assert_eq!(
            info.decode_engine_facts()
                .expect("engine facts")
                .device_fallback
                .as_deref(),
            Some(format!("cuda:1 unavailable ({}); running on cpu", worker_gpu::cuda::NOT_BUILT).as_str())
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn int8_serves_only_after_its_parity_gate_and_describe_reports_the_gate() {
    let mut worker = Worker::start(&["--dtype", "int8"]);
    let (client, _) = worker.ready().await;
    let info = client.describe().await.expect("describe");
    assert_eq!((info.device.as_str(), info.dtype.as_str()), ("cpu", "int8"));
    // What the supervisor shows in /health as pools[].workers[].parity_gate.
    let gate = info.parity_gate.expect("an int8 worker reports its gate");
    let names: Vec<&str> = gate.checkpoints.iter().map(|c| c.checkpoint.as_str()).collect();
    assert_eq!(names, ["english", "multilingual", "typed-decisions"]);
    for checkpoint in &gate.checkpoints {
        assert!(checkpoint.executor.contains("int8"), "{checkpoint:?}");
        assert!(checkpoint.rows >= 8, "{checkpoint:?}");
        assert_eq!((checkpoint.tolerance, checkpoint.hard_mismatches), (0.02, 0));
        assert!(
            checkpoint.max_probability_diff <= 0.02 && checkpoint.max_act_probability_diff <= 0.02,
            "{checkpoint:?}"
        );
    }
    assert!(worker.log().contains("int8 parity gate passed"), "{}", worker.log());
    // An int8 forward over gRPC answers every golden row close to upstream.
    let case = &golden_cases()[0];
    let answers = client.forward(&case.checkpoint, &rows_of(case)).await.expect("forward");
    assert_eq!(answers.outputs.len(), case.rows.len());
    assert!(answers.outputs.iter().all(|o| o.logits.iter().all(|v| v.is_finite())));

    // int8 exists on the CPU only: a named GPU is refused at load, naming the problem.
    let mut refused = Worker::start(&["--device", "metal", "--dtype", "int8"]);
    let status = refused.exit_within(Duration::from_secs(30)).await;
    assert!(!status.success(), "{}", refused.log());
    assert!(
        refused.log().contains("dtype int8 runs on the CPU only"),
        "{}",
        refused.log()
    );
    assert!(!refused.socket.exists());
}

/// `--int8-activations` reaches the gate: with the VNNI kernel, u8o:2 is refused on the
/// `typed-decisions` fixture and the worker exits naming it; an unknown choice is a usage error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn int8_activations_are_chosen_on_the_command_line_and_gated() {
    #[cfg(target_arch = "x86_64")]
    let vnni = worker_gpu::CpuKernels::Avx512.available()
        && std::arch::is_x86_feature_detected!("avx512vnni")
        && std::arch::is_x86_feature_detected!("avx512bw");
    #[cfg(not(target_arch = "x86_64"))]
    let vnni = false;
    if vnni {
        let mut refused = Worker::start(&["--dtype", "int8", "--int8-activations", "u8o:2"]);
        let status = refused.exit_within(Duration::from_secs(60)).await;
        assert!(!status.success(), "{}", refused.log());
        assert!(
            refused.log().contains("'typed-decisions': refused in int8"),
            "{}",
            refused.log()
        );
    } else {
        eprintln!("this CPU has no AVX512-VNNI: the refusal is not tested here");
    }
    let mut unknown = Worker::start(&["--dtype", "int8", "--int8-activations", "u4"]);
    let status = unknown.exit_within(Duration::from_secs(30)).await;
    assert_eq!(status.code(), Some(2), "{}", unknown.log());
    assert!(
        unknown.log().contains("unknown int8 activations 'u4'"),
        "{}",
        unknown.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_socket_directory_others_can_enter_is_refused_before_loading() {
    let dir = tempfile::tempdir().expect("tempdir");
    let shared = dir.path().join("shared");
    std::fs::create_dir(&shared).expect("mkdir");
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let socket = shared.join("worker.sock");
    let output = Command::new(env!("CARGO_BIN_EXE_layad-worker-gpu"))
        .args(worker_args(&socket, &[]))
        .output()
        .expect("run the worker");
    assert_eq!(output.status.code(), Some(1));
    let log = String::from_utf8_lossy(&output.stderr);
    assert!(log.contains("has mode 0755; it must be 0700 (owner only)"), "{log}");
    assert!(!log.contains("checkpoint loaded"), "{log}");
}
