//! How to run one worker: [`HarnessOptions`], from the worker's command line or set by hand (tests,
//! benchmarks).

use std::os::fd::RawFd;
use std::path::PathBuf;

use crate::args::WorkerArgs;
use crate::warmup::WarmupPolicy;

/// How to run one worker.
#[derive(Clone, Debug)]
pub struct HarnessOptions {
    /// Unix socket to serve on. Its directory must be private (mode 0700, owned by this user) and is
    /// created with mode 0700 if missing; the socket itself gets mode 0600.
    pub socket: PathBuf,
    /// Read end of the supervisor's liveness pipe: end-of-file on it means the supervisor is gone.
    pub liveness_fd: Option<RawFd>,
    /// Device as asked for on the command line (`auto`, `cpu`, `metal`, `cuda`, `cuda:1`, …), reported
    /// next to the device in use so that a fallback is never silent.
    pub requested_device: String,
    /// Binary name and version reported by Describe, e.g. `layad-worker-gpu 0.1.0`.
    pub worker: String,
    /// Shapes and repetitions of the warm-up.
    pub warmup: WarmupPolicy,
    /// The nonce given on the command line, echoed in Describe (empty: none given).
    pub spawn_nonce: String,
}

impl HarnessOptions {
    /// The options of a worker binary started with `args`; `worker` is its name and version.
    pub fn from_args(args: &WorkerArgs, worker: String) -> Self {
        Self {
            socket: args.socket.clone(),
            liveness_fd: args.liveness_fd,
            requested_device: args.device.clone(),
            worker,
            warmup: WarmupPolicy::default(),
            spawn_nonce: args.spawn_nonce.clone().unwrap_or_default(),
        }
    }
}
