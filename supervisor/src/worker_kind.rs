//! What differs between worker kinds (`pool.worker`), in one place: the limits a kind imposes
//! whatever the configuration says, the arguments only it takes, and what keeps it off a machine.
//! Everything else about a worker (its protocol, its common arguments) is shared.
//!
//! A new kind needs its variant in `layad_config::WorkerKind` (name and binary), an entry here,
//! and its crate in the workspace; docs/architecture.md lists the steps.

use std::ffi::OsString;

use layad_config::{AneExecutor, PoolConfig, WorkerKind};

/// What one worker kind needs from the supervisor.
#[derive(Clone, Copy, Debug)]
pub struct KindSpec {
    /// Most rows one forward can hold, whatever the pool's `max_rows` says (`None`: no own limit).
    pub max_rows: Option<u32>,
    /// The arguments only this kind takes, from its pool's configuration.
    pub extra_args: fn(&PoolConfig) -> Vec<OsString>,
    /// Why a pool of this kind cannot run on this machine, when that is known before starting it
    /// (`layad check` says so; the worker itself exits with `EXIT_DEVICE_UNAVAILABLE`).
    pub unavailable_here: fn(&PoolConfig) -> Option<&'static str>,
}

/// The spec of `kind`.
pub fn spec(kind: WorkerKind) -> KindSpec {
    match kind {
        WorkerKind::Gpu => KindSpec {
            max_rows: None,
            extra_args: gpu_args,
            unavailable_here: |_| None,
        },
        WorkerKind::Ane => KindSpec {
            // The converted graphs take one row per prediction.
            max_rows: Some(1),
            extra_args: ane_args,
            unavailable_here: ane_unavailable_here,
        },
    }
}

/// `require_device`: the worker refuses to fall back to the CPU (and exits with
/// `EXIT_DEVICE_UNAVAILABLE`, which the supervisor does not restart).
fn gpu_args(pool: &PoolConfig) -> Vec<OsString> {
    if pool.require_device {
        vec!["--require-device".into()]
    } else {
        Vec::new()
    }
}

fn ane_args(pool: &PoolConfig) -> Vec<OsString> {
    let mut args = Vec::new();
    if let Some(dir) = &pool.artifacts {
        args.extend(["--artifacts".into(), dir.clone().into_os_string()]);
    }
    args.extend(["--executor".into(), pool.executor.as_str().into()]);
    args
}

fn ane_unavailable_here(pool: &PoolConfig) -> Option<&'static str> {
    (pool.executor == AneExecutor::Coreml && !cfg!(target_os = "macos"))
        .then_some("Core ML exists only on macOS: this pool will be reported unavailable and its requests served by the other pools")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_neural_engine_pool_takes_one_row_and_names_its_artifacts() {
        let mut pool = PoolConfig::named("ane");
        pool.worker = WorkerKind::Ane;
        pool.artifacts = Some("/art".into());
        pool.executor = AneExecutor::Candle;
        let spec = spec(WorkerKind::Ane);
        assert_eq!(spec.max_rows, Some(1));
        assert_eq!(
            (spec.extra_args)(&pool),
            ["--artifacts", "/art", "--executor", "candle"]
        );
        assert_eq!((spec.unavailable_here)(&pool), None, "candle runs anywhere");
        let gpu = super::spec(WorkerKind::Gpu);
        assert_eq!((gpu.max_rows, (gpu.extra_args)(&pool).len()), (None, 0));
        let mut strict = PoolConfig::named("cuda");
        strict.require_device = true;
        assert_eq!((gpu.extra_args)(&strict), ["--require-device"]);
    }
}
