//! The command line every worker binary takes: where to serve, what to load, on which device, within
//! which limits. The supervisor writes it with [`WorkerArgs::to_args`]; each worker parses it with
//! clap (`#[command(flatten)]` into its own `Args`, next to the flags only it has), so writer and
//! parser cannot drift apart.

use std::ffi::OsString;
use std::os::fd::RawFd;
use std::path::PathBuf;

use crate::logging::LogFormat;
use crate::rows::{DEFAULT_MAX_BATCH_TOKENS, DEFAULT_MAX_ROWS};

/// The flags every worker binary takes.
#[derive(Clone, Debug, PartialEq, Eq, clap::Args)]
pub struct WorkerArgs {
    /// Unix socket to serve on. Its directory must be private (mode 0700, ours); a missing one is
    /// created with mode 0700. The socket gets mode 0600; a stale socket there is removed.
    #[arg(long, value_name = "PATH")]
    pub socket: PathBuf,

    /// A checkpoint to serve, as NAME=DIR (repeatable). Inside a Hugging Face cache snapshot
    /// (`models--owner--name/snapshots/<rev>[/sub]`) the revision is read from the path.
    #[arg(long = "checkpoint", value_name = "NAME=DIR", required = true, value_parser = parse_checkpoint)]
    pub checkpoints: Vec<(String, PathBuf)>,

    /// Device to run on: `auto`, or one the worker knows (layad-worker-gpu: cpu, metal, cuda,
    /// cuda:N; layad-worker-ane: ane, cpu).
    #[arg(long, default_value = "auto", value_name = "DEVICE")]
    pub device: String,

    /// Precision: `auto`, or one the worker runs (f32, f16; layad-worker-gpu also bf16, and int8 on
    /// the CPU behind a parity gate).
    #[arg(long, default_value = "auto", value_name = "DTYPE")]
    pub dtype: String,

    /// CPU threads for forwards (default: one per core).
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,

    /// Most rows in one forward.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_ROWS)]
    pub max_rows: u32,

    /// Most tokens (sum of row lengths) in one forward.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_BATCH_TOKENS)]
    pub max_batch_tokens: u32,

    /// Fixed row lengths, comma-separated and increasing (e.g. 64,96,128): each batch is padded to
    /// the smallest that holds its longest row; longer rows are refused.
    #[arg(long, value_name = "N,N,...", value_delimiter = ',')]
    pub length_buckets: Vec<u32>,

    /// Read end of the supervisor's liveness pipe; end-of-file on it makes the worker exit.
    #[arg(long, value_name = "FD")]
    pub liveness_fd: Option<RawFd>,

    /// Log lines on stderr: json (for the supervisor) or pretty.
    #[arg(long, default_value = "json", value_name = "FORMAT")]
    pub log_format: LogFormat,

    /// A value fresh for every start, echoed in Describe (`spawn_nonce`): with the socket peer's
    /// pid, how the supervisor tells the worker it started from any other process at the socket.
    /// It is not a secret (command lines are visible to other local users); the pid check is what
    /// another process cannot fake.
    #[arg(long, value_name = "HEX")]
    pub spawn_nonce: Option<String>,
}

/// `NAME=DIR`.
pub fn parse_checkpoint(text: &str) -> Result<(String, PathBuf), String> {
    match text.split_once('=') {
        Some((name, dir)) if !name.is_empty() && !dir.is_empty() => Ok((name.to_owned(), PathBuf::from(dir))),
        _ => Err(format!("expected NAME=DIR, got '{text}'")),
    }
}

/// Where a worker keeps files it can remake (`name`: `gate`, `ane`): `$CACHE_DIRECTORY/name` under a
/// systemd unit with `CacheDirectory=` (the service's own, writable where its home is not), else
/// `~/Library/Caches/layad/name` on macOS, `$XDG_CACHE_HOME/layad/name` or `~/.cache/layad/name`
/// elsewhere, else the temporary directory's `layad/name`.
pub fn user_cache_dir(name: &str) -> PathBuf {
    user_cache_dir_from(name, |var| std::env::var_os(var))
}

fn user_cache_dir_from(name: &str, var: impl Fn(&str) -> Option<OsString>) -> PathBuf {
    let var = |key: &str| var(key).filter(|v| !v.is_empty()).map(PathBuf::from);
    // systemd may list several directories, colon-separated: the first is the unit's first.
    if let Some(service) = var("CACHE_DIRECTORY").and_then(|dirs| {
        let dirs = dirs.to_string_lossy().into_owned();
        dirs.split(':').next().filter(|d| !d.is_empty()).map(PathBuf::from)
    }) {
        return service.join(name);
    }
    let base = if cfg!(target_os = "macos") {
        var("HOME").map(|home| home.join("Library/Caches"))
    } else {
        var("XDG_CACHE_HOME").or_else(|| var("HOME").map(|home| home.join(".cache")))
    };
    base.unwrap_or_else(std::env::temp_dir).join("layad").join(name)
}

impl WorkerArgs {
    /// These flags as a command line (defaults left out only where absent means something).
    pub fn to_args(&self) -> Vec<OsString> {
        let mut args: Vec<OsString> = vec!["--socket".into(), self.socket.clone().into()];
        if let Some(fd) = self.liveness_fd {
            args.extend(["--liveness-fd".into(), fd.to_string().into()]);
        }
        args.extend(["--log-format".into(), self.log_format.as_str().into()]);
        if let Some(nonce) = &self.spawn_nonce {
            args.extend(["--spawn-nonce".into(), nonce.into()]);
        }
        for (name, dir) in &self.checkpoints {
            let mut arg = OsString::from(format!("{name}="));
            arg.push(dir);
            args.extend(["--checkpoint".into(), arg]);
        }
        args.extend([
            "--device".into(),
            self.device.clone().into(),
            "--dtype".into(),
            self.dtype.clone().into(),
        ]);
        if let Some(threads) = self.threads {
            args.extend(["--threads".into(), threads.to_string().into()]);
        }
        args.extend(["--max-rows".into(), self.max_rows.to_string().into()]);
        args.extend(["--max-batch-tokens".into(), self.max_batch_tokens.to_string().into()]);
        if !self.length_buckets.is_empty() {
            let buckets: Vec<String> = self.length_buckets.iter().map(u32::to_string).collect();
            args.extend(["--length-buckets".into(), buckets.join(",").into()]);
        }
        args
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[test]
    fn the_cache_directory_is_the_services_then_the_users() {
        let from = |vars: &[(&str, &str)]| {
            let vars: Vec<(String, OsString)> =
                vars.iter().map(|(k, v)| ((*k).to_owned(), OsString::from(v))).collect();
            user_cache_dir_from("gate", move |key| {
                vars.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone())
            })
        };
        let service = [
            ("CACHE_DIRECTORY", "/var/cache/layad:/var/cache/other"),
            ("HOME", "/home/u"),
        ];
        assert_eq!(from(&service), PathBuf::from("/var/cache/layad/gate"));
        if !cfg!(target_os = "macos") {
            let xdg = [("XDG_CACHE_HOME", "/x"), ("HOME", "/home/u")];
            assert_eq!(from(&xdg), PathBuf::from("/x/layad/gate"));
            assert_eq!(
                from(&[("XDG_CACHE_HOME", ""), ("HOME", "/home/u")]),
                PathBuf::from("/home/u/.cache/layad/gate")
            );
        }
        assert_eq!(from(&[]), std::env::temp_dir().join("layad/gate"));
    }

    #[derive(Debug, Parser)]
    struct Worker {
        #[command(flatten)]
        common: WorkerArgs,
    }

    fn parse(args: &[OsString]) -> Result<WorkerArgs, clap::Error> {
        let all = std::iter::once(OsString::from("worker")).chain(args.iter().cloned());
        Worker::try_parse_from(all).map(|w| w.common)
    }

    #[test]
    fn what_the_supervisor_writes_a_worker_reads_back() {
        let written = WorkerArgs {
            socket: "/run/layad/gpu-0-1.sock".into(),
            checkpoints: vec![
                ("english".into(), "/hf/snap shot".into()),
                ("typed-decisions".into(), "/hf/snap/typed-decisions".into()),
            ],
            device: "cuda:1".into(),
            dtype: "bf16".into(),
            threads: Some(3),
            max_rows: 8,
            max_batch_tokens: 4096,
            length_buckets: vec![64, 128],
            liveness_fd: Some(0),
            log_format: LogFormat::Json,
            spawn_nonce: Some("0123456789abcdef0123456789abcdef".into()),
        };
        assert_eq!(parse(&written.to_args()).expect("parses"), written);
    }

    #[test]
    fn defaults_are_the_row_contracts_and_a_checkpoint_is_required() {
        let read = parse(&[
            "--socket".into(),
            "/s".into(),
            "--checkpoint".into(),
            "english=/e".into(),
        ])
        .expect("parses");
        assert_eq!(
            (
                read.max_rows,
                read.max_batch_tokens,
                read.device.as_str(),
                read.log_format
            ),
            (DEFAULT_MAX_ROWS, DEFAULT_MAX_BATCH_TOKENS, "auto", LogFormat::Json)
        );
        assert!(read.length_buckets.is_empty() && read.threads.is_none() && read.liveness_fd.is_none());
        assert!(read.spawn_nonce.is_none());
        assert!(parse(&["--socket".into(), "/s".into()]).is_err());
        let bad =
            parse(&["--socket".into(), "/s".into(), "--checkpoint".into(), "english".into()]).expect_err("refused");
        assert!(bad.to_string().contains("expected NAME=DIR, got 'english'"), "{bad}");
    }
}
