//! Instances and their workers kept apart, for real: a symlinked or foreign-owned socket directory
//! stops `layad serve` at start-up and is left as it was; two instances started together with the
//! default socket directory each serve through their own workers only, with no restart; a process
//! that answers at a worker's socket without being the worker the supervisor spawned is never
//! counted ready; workers do not inherit `LAYA_API_KEY`; a request no pool can ever hold is a 4xx
//! that names the limit and says nothing about retrying.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use layad_system_tests::goldens::golden_body;
use layad_system_tests::{ONE_CPU_POOL, Server, SocketDir, bin_dir, get, request};

/// What a directory looks like from outside: mode, owner and the names in it.
fn snapshot(dir: &Path) -> (u32, u32, Vec<String>) {
    let metadata = std::fs::symlink_metadata(dir).expect("stat");
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("read_dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    (metadata.mode() & 0o7777, metadata.uid(), names)
}

/// A directory that stands for someone else's: mode 0755, one file in it.
fn bystander_dir(path: &Path) {
    std::fs::create_dir(path).expect("mkdir");
    std::fs::write(path.join("keep.txt"), "not layad's").expect("write");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
}

/// Starts layad with `sockets` and `env`, expects it to exit with an error at start-up whose log
/// contains `expected`.
fn refused_at_start_up(sockets: SocketDir<'_>, env: &[(&str, &str)], expected: &str) {
    let mut server = Server::start_with_sockets(ONE_CPU_POOL, env, sockets);
    let status = server.wait_exit(Duration::from_secs(60));
    let log = server.log();
    assert!(!status.success(), "layad started on an unsafe socket directory:\n{log}");
    assert!(log.contains(expected), "the error does not say '{expected}':\n{log}");
    assert!(
        !log.contains("worker ready"),
        "a worker started before the refusal:\n{log}"
    );
}

#[test]
fn a_symlinked_socket_dir_is_refused_at_start_up_and_its_target_is_untouched() {
    let root = tempfile::tempdir().expect("tempdir");
    let target = root.path().join("someone-elses");
    bystander_dir(&target);
    let before = snapshot(&target);

    // Configured explicitly.
    let link = root.path().join("sockets");
    std::os::unix::fs::symlink(&target, &link).expect("symlink");
    refused_at_start_up(SocketDir::At(&link), &[], "is a symbolic link");
    assert_eq!(snapshot(&target), before, "the symlink's target was changed");

    // The default place, planted in advance as the issue describes (`$XDG_RUNTIME_DIR/layad`).
    let runtime = root.path().join("xdg");
    std::fs::create_dir(&runtime).expect("mkdir");
    std::os::unix::fs::symlink(&target, runtime.join("layad")).expect("symlink");
    let runtime_text = runtime.display().to_string();
    refused_at_start_up(
        SocketDir::Default,
        &[("XDG_RUNTIME_DIR", &runtime_text)],
        "is a symbolic link",
    );
    assert_eq!(snapshot(&target), before, "the symlink's target was changed");
}

#[test]
fn a_socket_dir_owned_by_another_user_is_refused_at_start_up_and_left_as_it_was() {
    let root = tempfile::tempdir().expect("tempdir");
    let foreign = root.path().join("foreign");
    bystander_dir(&foreign);
    let me = nix::unistd::geteuid();
    if me.is_root() {
        // 65534: nobody.
        std::os::unix::fs::chown(&foreign, Some(65534), Some(65534)).expect("chown to nobody");
    } else {
        // Without root, the only directories of another user's at hand are the system's.
        let system = PathBuf::from("/usr");
        let before = snapshot(&system);
        refused_at_start_up(SocketDir::At(&system), &[], "is owned by uid 0");
        assert_eq!(snapshot(&system), before);
        return;
    }
    let before = snapshot(&foreign);
    refused_at_start_up(SocketDir::At(&foreign), &[], "is owned by uid 65534");
    assert_eq!(snapshot(&foreign), before, "the foreign directory was changed");
}

/// One worker as `/health` reports it.
#[derive(Debug)]
struct WorkerView {
    pid: u32,
    state: String,
    restarts: u64,
}

async fn workers(server: &Server) -> Vec<WorkerView> {
    // The bearer, for the instance that requires it (without it /health says only "ok"); one
    // without a key ignores the header.
    let bearer = format!("Bearer {API_KEY}");
    let health = request(server.addr, "GET", "/health", &[("authorization", &bearer)], b"")
        .await
        .expect("health")
        .json();
    let mut found = Vec::new();
    for pool in health["pools"].as_array().into_iter().flatten() {
        for worker in pool["workers"].as_array().into_iter().flatten() {
            found.push(WorkerView {
                pid: worker["pid"].as_u64().unwrap_or(0) as u32,
                state: worker["state"].as_str().unwrap_or("").to_owned(),
                restarts: worker["restarts"].as_u64().unwrap_or(u64::MAX),
            });
        }
    }
    found
}

/// The parent pid of `pid`, from `/proc/<pid>/stat`.
#[cfg(target_os = "linux")]
fn parent_of(pid: u32) -> u32 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat of a worker");
    // The command name, in parentheses, may hold spaces; the fields after it are plain.
    let after_name = &stat[stat.rfind(')').expect("stat format") + 2..];
    after_name.split(' ').nth(1).and_then(|p| p.parse().ok()).expect("ppid")
}

/// The parent pid of `pid`, from `ps` (macOS has no `/proc`).
#[cfg(not(target_os = "linux"))]
fn parent_of(pid: u32) -> u32 {
    ps(pid, "ppid=").trim().parse().expect("ppid")
}

/// The value after `--socket` on `pid`'s command line.
#[cfg(target_os = "linux")]
fn socket_of(pid: u32) -> PathBuf {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).expect("cmdline of a worker");
    let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
    let at = args
        .iter()
        .position(|a| *a == b"--socket")
        .expect("--socket on the worker's command line");
    PathBuf::from(String::from_utf8_lossy(args[at + 1]).into_owned())
}

/// The value after `--socket` on `pid`'s command line, from `ps` (its arguments joined by spaces;
/// the test's socket paths have none).
#[cfg(not(target_os = "linux"))]
fn socket_of(pid: u32) -> PathBuf {
    let command = ps(pid, "args=");
    let mut words = command.split_whitespace();
    words
        .find(|w| *w == "--socket")
        .expect("--socket on the worker's command line");
    PathBuf::from(words.next().expect("a path after --socket"))
}

/// One field of `ps -o FIELD -p PID`, a portable way to see another process.
#[cfg(not(target_os = "linux"))]
fn ps(pid: u32, field: &str) -> String {
    let out = std::process::Command::new("ps")
        .args(["-o", field, "-p", &pid.to_string()])
        .output()
        .expect("ps");
    assert!(out.status.success(), "ps -o {field} -p {pid}: process gone?");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The names in `pid`'s environment. Linux only: macOS shows another process's environment to
/// `ps -E` only in part and not for every process, so the check is not made there.
#[cfg(target_os = "linux")]
fn environment_names(pid: u32) -> Vec<String> {
    let environ = std::fs::read(format!("/proc/{pid}/environ")).expect("environ of a worker");
    environ
        .split(|&b| b == 0)
        .filter(|v| !v.is_empty())
        .map(|v| String::from_utf8_lossy(v.split(|&b| b == b'=').next().unwrap_or(v)).into_owned())
        .collect()
}

/// 40 questions on a 48,000-character state: 40 rows of the checkpoint's longest length, more
/// padded tokens than a pool of `max_batch_tokens = 1024` takes in one forward (all rows of one
/// request go in one forward).
fn over_budget_request() -> String {
    let state = "The customer wrote again about the refund for the invoice. ".repeat(800);
    let questions: serde_json::Map<String, serde_json::Value> = (0..40)
        .map(|i| {
            (
                format!("q{i}"),
                serde_json::json!({"type": "noul", "instructions": format!("Is statement {i} true?")}),
            )
        })
        .collect();
    serde_json::json!({"state": state, "questions": questions}).to_string()
}

const API_KEY: &str = "secret-key-for-the-isolation-test";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_instances_started_together_with_default_settings_each_use_only_their_own_workers() {
    // Both take the default socket directory, `$XDG_RUNTIME_DIR/layad`: the same base for both, as
    // for two services of one user. The runtime directory is the test's so nothing else shares it.
    let runtime = tempfile::tempdir().expect("tempdir");
    let runtime_text = runtime.path().display().to_string();
    let base = runtime.path().join("layad");
    // Default settings: an empty configuration file; each gets its own port (`--listen`).
    let mut first = Server::start_with_sockets(
        "",
        &[("XDG_RUNTIME_DIR", &runtime_text), ("LAYA_API_KEY", API_KEY)],
        SocketDir::Default,
    );
    let mut second = Server::start_with_sockets("", &[("XDG_RUNTIME_DIR", &runtime_text)], SocketDir::Default);
    first.wait_ready(Duration::from_secs(240)).await;
    second.wait_ready(Duration::from_secs(240)).await;

    let body = golden_body("multi_five_questions_mixed");
    let bearer = format!("Bearer {API_KEY}");
    for _ in 0..3 {
        for (server, auth) in [(&first, Some(bearer.as_str())), (&second, None)] {
            let mut headers = vec![("content-type", "application/json")];
            if let Some(auth) = auth {
                headers.push(("authorization", auth));
            }
            let answer = request(server.addr, "POST", "/v1/systemone", &headers, body.as_bytes())
                .await
                .expect("answer");
            assert_eq!(answer.status, 200, "{}", answer.text());
        }
    }

    let mut sockets = Vec::new();
    for server in [&first, &second] {
        let seen = workers(server).await;
        assert!(!seen.is_empty(), "no workers in /health");
        for worker in &seen {
            assert_eq!(worker.state, "ready", "{worker:?}\n{}", server.log());
            assert_eq!(worker.restarts, 0, "a worker was restarted:\n{}", server.log());
            assert_eq!(
                parent_of(worker.pid),
                server.pid(),
                "worker {} is not this supervisor's child",
                worker.pid
            );
            let socket = socket_of(worker.pid);
            let instance = socket.parent().expect("instance directory");
            assert_eq!(instance.parent(), Some(base.as_path()), "{}", socket.display());
            let name = instance.file_name().expect("name").to_string_lossy().into_owned();
            assert!(
                name.starts_with(&format!("{}-", server.pid())),
                "worker socket {} is not in the directory of supervisor {}",
                socket.display(),
                server.pid()
            );
            assert_eq!(std::fs::metadata(instance).expect("stat").mode() & 0o777, 0o700);
            #[cfg(target_os = "linux")]
            {
                let names = environment_names(worker.pid);
                assert!(
                    !names.iter().any(|n| n == "LAYA_API_KEY"),
                    "worker {} has LAYA_API_KEY in its environment: {names:?}",
                    worker.pid
                );
            }
            sockets.push(socket);
        }
        assert!(!server.log().contains("restarting it"), "{}", server.log());
    }
    sockets.sort();
    sockets.dedup();
    assert_eq!(sockets.len(), 2, "the instances share a worker socket: {sockets:?}");

    assert!(first.terminate(Duration::from_secs(30)).success());
    assert!(second.terminate(Duration::from_secs(30)).success());
    let left: Vec<_> = std::fs::read_dir(&base)
        .expect("base")
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(left.is_empty(), "instance directories left behind: {left:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_no_pool_can_ever_hold_is_a_4xx_naming_the_limit_without_retry_after() {
    let config = format!("{ONE_CPU_POOL}max_batch_tokens = 1024\n");
    let mut server = Server::start(&config, &[]);
    server.wait_ready(Duration::from_secs(120)).await;
    let refused = request(
        server.addr,
        "POST",
        "/v1/systemone",
        &[("content-type", "application/json")],
        over_budget_request().as_bytes(),
    )
    .await
    .expect("answer");
    assert_eq!(refused.status, 413, "{}", refused.text());
    assert!(refused.detail().contains("1024 padded tokens"), "{}", refused.detail());
    assert_eq!(refused.header("retry-after"), None);
    // Still serving: the refusal cost nothing.
    let body = golden_body("multi_five_questions_mixed");
    let answer = request(
        server.addr,
        "POST",
        "/v1/systemone",
        &[("content-type", "application/json")],
        body.as_bytes(),
    )
    .await
    .expect("answer");
    assert_eq!(answer.status, 200, "{}", answer.text());
}

/// A stand-in for `layad-worker-gpu` that starts the real worker as another process (its own
/// child, so not the pid the supervisor spawned) with the same flags, nonce included, and then
/// waits without ever listening itself, until the supervisor's liveness pipe (its stdin) closes:
/// the socket is answered, correctly, by a foreign process.
fn impostor_binaries(dir: &Path, pids: &Path) {
    std::fs::create_dir_all(dir).expect("mkdir");
    let real = bin_dir().join("layad-worker-gpu");
    // Workers start with a cleaned environment, so everything the script needs is spelled out.
    let script = format!(
        // A background command's stdin becomes /dev/null (even `<&0` then reads that), and stdin is
        // the liveness pipe: keep it on fd 3 first.
        "#!/bin/sh\nexec 3<&0\n\"{real}\" \"$@\" <&3 3<&- &\necho $! >> \"{pids}\"\nexec /bin/cat >/dev/null 3<&-\n",
        real = real.display(),
        pids = pids.display()
    );
    let path = dir.join("layad-worker-gpu");
    std::fs::write(&path, script).expect("write script");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_socket_answered_by_another_process_is_never_marked_ready() {
    let root = tempfile::tempdir().expect("tempdir");
    let binaries = root.path().join("bin");
    let pids = root.path().join("impostors");
    impostor_binaries(&binaries, &pids);
    let config = format!(
        r#"
[checkpoints]
english = "hf"
multilingual = "off"
typed-decisions = "off"

[[pool]]
name = "cpu"
device = "cpu"
workers = 1
threads = 1

[workers]
binary_dir = "{}"
restart_backoff_initial = "100ms"
startup_timeout = "60s"
"#,
        binaries.display()
    );
    let mut server = Server::start(&config, &[]);
    let refusal = "is not answered by the worker this supervisor started";
    let started = Instant::now();
    let mut refusals_seen = 0;
    while started.elapsed() < Duration::from_secs(120) {
        if let Ok(ready) = get(server.addr, "/readyz").await {
            assert_ne!(
                ready.status,
                200,
                "a foreign process was counted ready:\n{}",
                server.log()
            );
        }
        refusals_seen = server.log().matches(refusal).count();
        if refusals_seen >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let log = server.log();
    assert!(
        refusals_seen >= 2,
        "the impostor was not recognised twice within 120 s:\n{log}"
    );
    for worker in workers(&server).await {
        assert_ne!(worker.state, "ready", "{worker:?}");
    }
    server.terminate(Duration::from_secs(30));
    // The impostors read the supervisor's liveness pipe and end with it; make sure.
    for pid in std::fs::read_to_string(&pids).unwrap_or_default().lines() {
        if let Ok(pid) = pid.trim().parse::<i32>() {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
        }
    }
}
