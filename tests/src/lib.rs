//! Harness for whole-system tests: finds (or builds) the real `layad` and worker binaries, starts
//! `layad serve` on the fixture checkpoints with a given config, and speaks plain HTTP/1.1 to it
//! ([`http`], the one test client, which the supervisor's in-process tests use too).
//!
//! Nothing here is mocked: every test drives real processes over real sockets on loopback.

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use layad_config::WorkerKind;

pub mod goldens;
pub mod http;
pub mod request_bodies;

pub use goldens::{deliberate_difference, fixture_json, json_differences};
pub use http::{Framing, Request, Response, exchange_raw, get, post_json, request, send};

/// The repository root.
pub fn repo_root() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

/// The fixture Hugging Face home (`HF_HOME`), holding three tiny checkpoints.
pub fn fixture_hf_home() -> PathBuf {
    repo_root().join("tests/fixtures/hf-cache")
}

/// The directory holding `layad` and the worker binaries of the profile these tests were built with,
/// building them first if `cargo test` did not (e.g. `cargo test -p layad-system-tests`).
pub fn bin_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        // Tests run from target/<profile>/deps/, the benchmark binary from target/<profile>/.
        let exe = std::env::current_exe().expect("executable path");
        let mut dir = exe.parent().expect("target/<profile>").to_path_buf();
        if dir.file_name().is_some_and(|n| n == "deps") {
            dir.pop();
        }
        let binaries: Vec<&str> = std::iter::once("layad")
            .chain(WorkerKind::ALL.iter().map(|kind| kind.binary_name()))
            .collect();
        if binaries.iter().any(|b| !dir.join(b).is_file()) {
            let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
            let mut build = Command::new(cargo);
            build.current_dir(repo_root()).arg("build");
            // Each binary is its package's name.
            for package in &binaries {
                build.args(["-p", package]);
            }
            build.arg("--bins");
            if dir.file_name().is_some_and(|n| n == "release") {
                build.arg("--release");
            }
            let status = build.status().expect("run cargo build");
            assert!(status.success(), "building layad and the worker binaries failed");
        }
        dir
    })
}

/// Everything `child` writes to its piped stderr, collected by a thread as it arrives (a worker that
/// fails to start says why there).
pub fn capture_stderr(child: &mut Child) -> Arc<Mutex<String>> {
    capture_stderr_to_end(child).0
}

/// [`capture_stderr`], with a flag set once the pipe is at its end: a process's last lines may
/// still be on their way to the text after it has exited.
pub fn capture_stderr_to_end(child: &mut Child) -> (Arc<Mutex<String>>, Arc<AtomicBool>) {
    let text = Arc::new(Mutex::new(String::new()));
    let ended = Arc::new(AtomicBool::new(false));
    if let Some(mut pipe) = child.stderr.take() {
        let (sink, done) = (Arc::clone(&text), Arc::clone(&ended));
        std::thread::spawn(move || {
            let mut buffer = [0u8; 4096];
            while let Ok(n) = std::io::Read::read(&mut pipe, &mut buffer) {
                if n == 0 {
                    break;
                }
                sink.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push_str(&String::from_utf8_lossy(&buffer[..n]));
            }
            done.store(true, Ordering::Release);
        });
    } else {
        ended.store(true, Ordering::Release);
    }
    (text, ended)
}

/// A free loopback port (bound and released; good enough for tests on one machine).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

/// Where a test server's workers get their sockets (`workers.socket_dir`).
#[derive(Clone, Copy, Debug)]
pub enum SocketDir<'a> {
    /// A directory of the server's own, removed with it (what most tests want: other layad instances
    /// on this machine never share it).
    Own,
    /// This path, as given.
    At(&'a Path),
    /// Not set: layad's default (`$XDG_RUNTIME_DIR/layad`, else `<temp>/layad-<uid>`).
    Default,
}

/// A running `layad serve`.
pub struct Server {
    child: Child,
    /// The address it listens on.
    pub addr: SocketAddr,
    /// Its working directory (config file, logs); removed on drop.
    pub dir: tempfile::TempDir,
}

impl Server {
    /// Starts `layad serve` with `config` (TOML; `{listen}` is not needed: `--listen` is passed)
    /// on the fixture checkpoints, with extra environment `env`. Does not wait for readiness.
    pub fn start(config: &str, env: &[(&str, &str)]) -> Server {
        Self::start_with_sockets(config, env, SocketDir::Own)
    }

    /// Like [`Server::start`], with the workers' socket directory chosen by `sockets`.
    pub fn start_with_sockets(config: &str, env: &[(&str, &str)], sockets: SocketDir<'_>) -> Server {
        let dir = tempfile::tempdir().expect("tempdir");
        let config_path = dir.path().join("layad.toml");
        std::fs::write(&config_path, config).expect("write config");
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().expect("addr");
        let log = std::fs::File::create(dir.path().join("layad.log")).expect("log file");
        let mut command = Command::new(bin_dir().join("layad"));
        command
            .args(["serve", "--config"])
            .arg(&config_path)
            .args(["--listen", &addr.to_string()])
            .env("HF_HOME", fixture_hf_home())
            .env("HF_HUB_OFFLINE", "1")
            .env_remove("LAYA_API_KEY")
            .env_remove("LAYAD_WORKERS__SOCKET_DIR")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log);
        // Upstream's LAYA_* variables now mean something to layad: none leaks in from the shell
        // running the tests.
        for (name, _) in std::env::vars() {
            if name.starts_with("LAYA_") {
                command.env_remove(name);
            }
        }
        match sockets {
            SocketDir::Own => {
                command.env("LAYAD_WORKERS__SOCKET_DIR", dir.path().join("sockets"));
            }
            SocketDir::At(path) => {
                command.env("LAYAD_WORKERS__SOCKET_DIR", path);
            }
            SocketDir::Default => {}
        }
        for (k, v) in env {
            command.env(k, v);
        }
        let child = command.spawn().expect("spawn layad");
        Server { child, addr, dir }
    }

    /// The supervisor's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// What the supervisor logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("layad.log")).unwrap_or_default()
    }

    /// `layad reload --config FILE` against this server: whether it exited successfully, and its
    /// output (stdout and stderr).
    pub fn reload(&self, config: &Path) -> (bool, String) {
        let output = std::process::Command::new(bin_dir().join("layad"))
            .args(["reload", "--config"])
            .arg(config)
            .env("LAYAD_SERVER__LISTEN", self.addr.to_string())
            .output()
            .expect("run layad reload");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        (output.status.success(), text)
    }

    /// Waits until `GET /readyz` answers 200.
    pub async fn wait_ready(&mut self, timeout: Duration) {
        let start = Instant::now();
        while start.elapsed() < timeout {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("layad exited with {status} before it was ready:\n{}", self.log());
            }
            if get(self.addr, "/readyz").await.is_ok_and(|r| r.status == 200) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("layad not ready within {timeout:?}:\n{}", self.log());
    }

    /// Sends SIGTERM and waits (up to `timeout`) for the supervisor to exit.
    pub fn terminate(&mut self, timeout: Duration) -> ExitStatus {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        self.wait_exit(timeout)
    }

    /// Waits (up to `timeout`) for the supervisor to exit.
    pub fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            assert!(
                start.elapsed() < timeout,
                "layad did not exit within {timeout:?}:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The socket address of a base URL such as `http://127.0.0.1:8642` or `http://localhost:8642/`
/// (plain HTTP only: the helpers here speak HTTP/1.1 without TLS).
pub fn addr_of_url(url: &str) -> Result<SocketAddr, String> {
    use std::net::ToSocketAddrs;
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| format!("'{url}': expected a plain http:// URL"))?;
    let authority = rest.split('/').next().unwrap_or(rest);
    authority
        .to_socket_addrs()
        .map_err(|e| format!("'{url}': {e}"))?
        .next()
        .ok_or_else(|| format!("'{url}': the host has no address"))
}

/// Polls `GET /readyz` on `addr` until it answers 200; false when `timeout` passes first.
pub async fn wait_until_ready(addr: SocketAddr, timeout: Duration) -> bool {
    let start = Instant::now();
    while start.elapsed() < timeout {
        if get(addr, "/readyz").await.is_ok_and(|r| r.status == 200) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    false
}

/// One CPU pool of one single-threaded worker: the smallest server the system tests start.
pub const ONE_CPU_POOL: &str = r#"
[[pool]]
name = "cpu"
device = "cpu"
workers = 1
threads = 1
"#;

/// The machine's one-minute load average (`/proc/loadavg`), recorded beside benchmark results.
pub fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Nearest-rank percentile (`p` in 0..=1) of unsorted `values`; `None` when there are none.
pub fn percentile(values: &[f64], p: f64) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    Some(sorted[rank - 1])
}

/// The `dur` of `metric` in a `Server-Timing` header (`queue;dur=0.12, device;dur=31.2`), in ms.
pub fn server_timing(header: Option<&str>, metric: &str) -> Option<f64> {
    header?.split(',').find_map(|part| {
        let rest = part.trim().strip_prefix(metric)?.strip_prefix(";dur=")?;
        rest.split(';').next()?.trim().parse().ok()
    })
}
