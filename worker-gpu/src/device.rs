//! Which device and precision the engine runs on: parsing what was asked for, finding out what is
//! really available (with the reason when it fell back), and the per-process CPU thread pool.

use std::fmt;

use candle_core::{DType, Device};
use laya::config::AmpDtype;

use crate::macos::MacosVersion;

/// The device an operator asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceRequest {
    /// The best available: CUDA device 0, else Metal, else CPU.
    Auto,
    /// The CPU.
    Cpu,
    /// The default Metal device (macOS only).
    Metal,
    /// The CUDA device with this ordinal (needs the `cuda` feature).
    Cuda(usize),
}

impl DeviceRequest {
    /// Parses `auto`, `cpu`, `metal`, `cuda` (device 0) or `cuda:N`.
    pub fn parse(text: &str) -> Result<Self, String> {
        let bad = || format!("unknown device '{text}'; expected auto, cpu, metal, cuda or cuda:N");
        match text.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(Self::Auto),
            "cpu" => Ok(Self::Cpu),
            "metal" => Ok(Self::Metal),
            "cuda" => Ok(Self::Cuda(0)),
            other => {
                let ordinal = other.strip_prefix("cuda:").ok_or_else(bad)?;
                ordinal.parse().map(Self::Cuda).map_err(|_| bad())
            }
        }
    }
}

impl fmt::Display for DeviceRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Auto => f.write_str("auto"),
            Self::Cpu => f.write_str("cpu"),
            Self::Metal => f.write_str("metal"),
            Self::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

/// Precision of weights and matrix products; norms, softmax and RoPE always run in f32.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Precision {
    /// Everything in float32 (upstream's CPU behaviour; the reference).
    F32,
    /// float16 weights and matmuls (upstream's CUDA autocast below compute capability 8, and MPS).
    F16,
    /// bfloat16 weights and matmuls (upstream's CUDA autocast with the published `amp_dtype`).
    Bf16,
    /// CPU only: the matrix products of the encoder and of the decision head's layers with int8
    /// weights and integer dot products (`layad_cpu_kernels::int8`); everything else float32. Served only behind a parity gate
    /// against the float32 forward ([`crate::gate`]).
    Int8,
}

impl Precision {
    /// Parses `f32`, `f16`, `bf16` or `int8` (also `float32`, `fp16`, `float16`, `bfloat16`).
    pub fn parse(text: &str) -> Result<Self, String> {
        match text.trim().to_ascii_lowercase().as_str() {
            "f32" | "fp32" | "float32" => Ok(Self::F32),
            "f16" | "fp16" | "float16" | "half" => Ok(Self::F16),
            "bf16" | "bfloat16" => Ok(Self::Bf16),
            "int8" => Ok(Self::Int8),
            _ => Err(format!("unknown precision '{text}'; expected f32, f16, bf16 or int8")),
        }
    }

    /// The precision upstream would use on `device` for checkpoints asking for `amp_dtypes`: f32 on
    /// CPU; on a GPU bf16 when every checkpoint asks for bf16, else f16 (upstream's fallback).
    pub fn default_for(device: &Device, amp_dtypes: impl IntoIterator<Item = AmpDtype>) -> Self {
        if device.is_cpu() {
            Self::F32
        } else if amp_dtypes.into_iter().all(|d| d == AmpDtype::Bf16) {
            Self::Bf16
        } else {
            Self::F16
        }
    }

    /// The candle dtype of weights as loaded and of matmul outputs (int8 loads float32 weights and
    /// quantizes the encoder's afterwards).
    pub fn dtype(self) -> DType {
        match self {
            Self::F32 | Self::Int8 => DType::F32,
            Self::F16 => DType::F16,
            Self::Bf16 => DType::BF16,
        }
    }

    /// `f32`, `f16`, `bf16` or `int8`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::F16 => "f16",
            Self::Bf16 => "bf16",
            Self::Int8 => "int8",
        }
    }
}

impl fmt::Display for Precision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The device the engine really runs on.
#[derive(Clone, Debug)]
pub struct SelectedDevice {
    /// What was asked for.
    pub requested: DeviceRequest,
    /// The candle device in use.
    pub device: Device,
    /// Why an explicitly requested GPU was not used (the engine then runs on the CPU).
    pub fallback: Option<String>,
}

impl SelectedDevice {
    /// Opens the requested device, falling back to the CPU (with the reason) when it is unavailable.
    /// `Auto` tries CUDA device 0, then Metal, and settles on the CPU without calling it a fallback.
    pub fn open(requested: DeviceRequest) -> Self {
        Self::open_with(requested, &SystemMetal)
    }

    /// [`SelectedDevice::open`] with Metal discovered through `metal`.
    pub fn open_with(requested: DeviceRequest, metal: &dyn MetalHost) -> Self {
        let (device, fallback) = match requested {
            DeviceRequest::Cpu => (Device::Cpu, None),
            DeviceRequest::Auto => {
                let cuda = candle_core::utils::cuda_is_available()
                    .then(|| {
                        crate::cuda::open(0)
                            .inspect_err(|reason| tracing::warn!(%reason, "device auto: cuda:0 unusable"))
                            .ok()
                    })
                    .flatten();
                let gpu = cuda.or_else(|| {
                    if !metal.compiled() {
                        return None;
                    }
                    open_metal(metal)
                        .inspect_err(|reason| tracing::warn!(%reason, "device auto: Metal unusable; running on cpu"))
                        .ok()
                });
                (gpu.unwrap_or(Device::Cpu), None)
            }
            DeviceRequest::Metal => match open_metal(metal) {
                Ok(device) => (device, None),
                Err(e) => (Device::Cpu, Some(format!("metal unavailable ({e}); running on cpu"))),
            },
            DeviceRequest::Cuda(n) => match crate::cuda::open(n) {
                Ok(device) => (device, None),
                Err(e) => (Device::Cpu, Some(format!("cuda:{n} unavailable ({e}); running on cpu"))),
            },
        };
        Self {
            requested,
            device,
            fallback,
        }
    }

    /// Name of the device in use: `cpu`, `metal` or `cuda:N`.
    pub fn label(&self) -> String {
        device_label(&self.device)
    }
}

/// `cpu`, `metal` or `cuda:N` for a candle device.
pub fn device_label(device: &Device) -> String {
    match device.location() {
        candle_core::DeviceLocation::Cpu => "cpu".to_owned(),
        candle_core::DeviceLocation::Metal { .. } => "metal".to_owned(),
        candle_core::DeviceLocation::Cuda { gpu_id } => format!("cuda:{gpu_id}"),
    }
}

/// What opening Metal needs to know about the machine: [`SystemMetal`] asks macOS and candle; tests
/// describe machines this one is not (too old a macOS, no GPU).
pub trait MetalHost {
    /// Whether this build has candle's Metal backend (macOS builds only).
    fn compiled(&self) -> bool;
    /// The running macOS version, when known.
    fn macos_version(&self) -> Option<MacosVersion>;
    /// How many Metal devices the system has.
    fn device_count(&self) -> usize;
    /// Opens Metal device `ordinal`; called only for one that exists, on a new enough macOS.
    fn open(&self, ordinal: usize) -> candle_core::Result<Device>;
}

/// The machine this process runs on.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemMetal;

impl MetalHost for SystemMetal {
    fn compiled(&self) -> bool {
        candle_core::utils::metal_is_available()
    }

    fn macos_version(&self) -> Option<MacosVersion> {
        MacosVersion::running()
    }

    fn device_count(&self) -> usize {
        // The list candle's `Device::new_metal` indexes into without a bounds check.
        #[cfg(target_os = "macos")]
        return candle_metal_kernels::metal::Device::all().len();
        #[cfg(not(target_os = "macos"))]
        0
    }

    fn open(&self, ordinal: usize) -> candle_core::Result<Device> {
        Device::new_metal(ordinal)
    }
}

/// Opens Metal device 0, or says why it cannot: no Metal in this build, a macOS older than
/// [`MIN_MACOS`](crate::macos::MIN_MACOS), or no Metal device at all (a virtual machine, a CI
/// runner). candle 0.11.1 panics in each of the last two cases (a missing Objective-C class,
/// `Device::all().swap_remove(0)`), so they are ruled out before it is called.
pub fn open_metal(host: &dyn MetalHost) -> Result<Device, String> {
    if !host.compiled() {
        return Err("this build has no Metal backend (macOS builds only)".to_owned());
    }
    if let Some(version) = host.macos_version() {
        version.supports("Metal in this build (candle 0.11.1)")?;
    }
    if host.device_count() == 0 {
        return Err("the system reports no Metal device (a virtual machine or CI runner without a GPU?)".to_owned());
    }
    host.open(0).map_err(|e| e.to_string())
}

/// Sizes candle's own CPU thread pool (its elementwise ops: adds, casts, copies) to one thread
/// unless `CANDLE_NUM_THREADS` is set. The matrix products, attention, GeGLU and norms run on the
/// engine's rayon pool; candle's pool of one thread per physical core spin-waits at a barrier after
/// each op, and on a machine with few, busy cores those spinning threads took the cores from the
/// forward: 18% of an int8 forward's profile, and one row of 64 tokens ran in 575 ms with one
/// candle thread against 912–2333 ms with the default, paired on a 2-vCPU Zen 4 under load
/// (docs/benchmarks.md).
///
/// # Safety
/// Changes the process environment: call it first thing in `main`, before any other thread
/// exists (no other thread may read or write the environment meanwhile).
#[allow(unsafe_code)]
pub unsafe fn one_candle_thread_unless_set() {
    if std::env::var_os("CANDLE_NUM_THREADS").is_none() {
        // SAFETY: the caller guarantees no other thread exists yet.
        unsafe { std::env::set_var("CANDLE_NUM_THREADS", "1") };
    }
}

/// A rayon pool of a fixed size that CPU forwards run in, so each worker process uses exactly the
/// cores it was given instead of one thread per physical core.
///
/// When the pool has at least as many threads as the CPUs this process may run on (Linux), thread
/// `i` is pinned to the `i`-th of them (modulo their count). Measured on a 2-vCPU Zen 5 VM, int8,
/// one 66-token request after each 300 ms idle gap: 63–65 ms pinned against 77–81 ms unpinned (A B
/// B A, docs/benchmarks.md): after an idle spell of 100 ms or more the scheduler woke both compute
/// threads onto one CPU for part of the next forward. A pool smaller than the CPU set is left to
/// the scheduler: pinning it would put every such worker on the same first CPUs.
pub struct CpuThreads {
    pool: rayon::ThreadPool,
    pinned: bool,
}

impl CpuThreads {
    /// A pool of `threads` threads (at least one), pinned one per CPU when it spans them all.
    pub fn new(threads: usize) -> Result<Self, String> {
        let threads = threads.max(1);
        let cpus = affinity::allowed_cpus();
        let pinned = cpus.len() > 1 && threads >= cpus.len();
        let mut builder = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("candle-cpu-{i}"));
        if pinned {
            let cpus = cpus.clone();
            builder = builder.start_handler(move |i| {
                let cpu = cpus[i % cpus.len()];
                if let Err(e) = affinity::pin_current_thread(cpu) {
                    tracing::warn!(thread = i, cpu, error = %e, "cannot pin a CPU thread; the scheduler places it");
                }
            });
        }
        let pool = builder
            .build()
            .map_err(|e| format!("cannot start {threads} CPU threads: {e}"))?;
        if pinned {
            tracing::info!(threads, cpus = ?cpus, "CPU threads pinned one per CPU");
        }
        Ok(Self { pool, pinned })
    }

    /// Whether the pool's threads were pinned one per CPU.
    pub fn pinned(&self) -> bool {
        self.pinned
    }

    /// Number of threads in the pool.
    pub fn threads(&self) -> usize {
        self.pool.current_num_threads()
    }

    /// Runs `work` with every parallel section inside it on this pool.
    pub fn run<R: Send>(&self, work: impl FnOnce() -> R + Send) -> R {
        self.pool.install(work)
    }
}

impl fmt::Debug for CpuThreads {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CpuThreads")
            .field("threads", &self.threads())
            .field("pinned", &self.pinned)
            .finish()
    }
}

/// The CPUs this process may run on and pinning a thread to one: Linux's affinity calls; other
/// systems report no CPU set, so nothing is pinned there.
mod affinity {
    /// The CPUs in this thread's affinity mask (inherited from the process), ascending.
    #[cfg(target_os = "linux")]
    pub(super) fn allowed_cpus() -> Vec<usize> {
        use nix::sched::{CpuSet, sched_getaffinity};
        use nix::unistd::Pid;
        match sched_getaffinity(Pid::from_raw(0)) {
            Ok(set) => (0..CpuSet::count())
                .filter(|&cpu| set.is_set(cpu).unwrap_or(false))
                .collect(),
            Err(_) => Vec::new(),
        }
    }

    #[cfg(not(target_os = "linux"))]
    pub(super) fn allowed_cpus() -> Vec<usize> {
        Vec::new()
    }

    /// Pins the calling thread to `cpu`.
    #[cfg(target_os = "linux")]
    pub(super) fn pin_current_thread(cpu: usize) -> Result<(), String> {
        use nix::sched::{CpuSet, sched_setaffinity};
        use nix::unistd::Pid;
        let mut set = CpuSet::new();
        set.set(cpu).map_err(|e| e.to_string())?;
        // Pid 0: the calling thread.
        sched_setaffinity(Pid::from_raw(0), &set).map_err(|e| e.to_string())
    }

    #[cfg(not(target_os = "linux"))]
    pub(super) fn pin_current_thread(_cpu: usize) -> Result<(), String> {
        Err("pinning threads is implemented on Linux only".to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_devices_and_precisions() {
        assert_eq!(DeviceRequest::parse("auto"), Ok(DeviceRequest::Auto));
        assert_eq!(DeviceRequest::parse(" CPU "), Ok(DeviceRequest::Cpu));
        assert_eq!(DeviceRequest::parse("metal"), Ok(DeviceRequest::Metal));
        assert_eq!(DeviceRequest::parse("cuda"), Ok(DeviceRequest::Cuda(0)));
        assert_eq!(DeviceRequest::parse("cuda:3"), Ok(DeviceRequest::Cuda(3)));
        for bad in ["gpu", "cuda:", "cuda:x", "cuda:-1", ""] {
            let err = DeviceRequest::parse(bad).expect_err(bad);
            assert!(err.contains(&format!("'{bad}'")), "{err}");
        }
        assert_eq!(DeviceRequest::Cuda(2).to_string(), "cuda:2");
        assert_eq!(Precision::parse("bf16"), Ok(Precision::Bf16));
        assert_eq!(Precision::parse("FP16"), Ok(Precision::F16));
        assert_eq!(Precision::parse("float32"), Ok(Precision::F32));
        assert_eq!(Precision::parse(" INT8 "), Ok(Precision::Int8));
        assert_eq!(
            (Precision::Int8.dtype(), Precision::Int8.as_str()),
            (DType::F32, "int8")
        );
        assert!(Precision::parse("int4").expect_err("int4").contains("'int4'"));
    }

    #[test]
    fn cpu_is_never_a_fallback_and_missing_gpus_are() {
        let cpu = SelectedDevice::open(DeviceRequest::Cpu);
        assert_eq!((cpu.label().as_str(), cpu.fallback.is_none()), ("cpu", true));
        let auto = SelectedDevice::open(DeviceRequest::Auto);
        assert!(auto.fallback.is_none());
        if !candle_core::utils::cuda_is_available() {
            let cuda = SelectedDevice::open(DeviceRequest::Cuda(0));
            assert_eq!(cuda.label(), "cpu");
            assert!(
                cuda.fallback
                    .as_deref()
                    .is_some_and(|r| r.starts_with("cuda:0 unavailable"))
            );
        }
        // Without the feature the reason names the build, not a driver error.
        #[cfg(not(feature = "cuda"))]
        assert_eq!(
            SelectedDevice::open(DeviceRequest::Cuda(1)).fallback.as_deref(),
            Some(format!("cuda:1 unavailable ({}); running on cpu", crate::cuda::NOT_BUILT).as_str())
        );
        if !candle_core::utils::metal_is_available() {
            let metal = SelectedDevice::open(DeviceRequest::Metal);
            assert!(
                metal
                    .fallback
                    .as_deref()
                    .is_some_and(|r| r.starts_with("metal unavailable"))
            );
        }
    }

    /// A machine described by its Metal facts; `open` succeeds with the CPU device as a stand-in and
    /// records that it was called.
    struct Machine {
        compiled: bool,
        version: Option<MacosVersion>,
        devices: usize,
        opened: std::cell::Cell<bool>,
    }

    impl Machine {
        fn new(version: Option<(u32, u32)>, devices: usize) -> Self {
            Self {
                compiled: true,
                version: version.map(|(major, minor)| MacosVersion::new(major, minor)),
                devices,
                opened: std::cell::Cell::new(false),
            }
        }
    }

    impl MetalHost for Machine {
        fn compiled(&self) -> bool {
            self.compiled
        }
        fn macos_version(&self) -> Option<MacosVersion> {
            self.version
        }
        fn device_count(&self) -> usize {
            self.devices
        }
        fn open(&self, ordinal: usize) -> candle_core::Result<Device> {
            assert!(ordinal < self.devices, "opened a device that does not exist");
            self.opened.set(true);
            Ok(Device::Cpu)
        }
    }

    #[test]
    fn metal_is_opened_only_on_a_new_enough_macos_with_a_device() {
        let vm = Machine::new(Some((15, 1)), 0);
        let error = open_metal(&vm).expect_err("no device");
        assert!(error.contains("no Metal device"), "{error}");
        let sonoma = Machine::new(Some((14, 6)), 1);
        let error = open_metal(&sonoma).expect_err("too old");
        assert!(
            error.contains("needs macOS 15.0 or later; this is macOS 14.6"),
            "{error}"
        );
        let linux = Machine {
            compiled: false,
            ..Machine::new(None, 0)
        };
        assert!(open_metal(&linux).expect_err("no metal").contains("no Metal backend"));
        assert!(!vm.opened.get() && !sonoma.opened.get() && !linux.opened.get());

        // A version that cannot be read does not stop a machine that has a device.
        for machine in [Machine::new(Some((15, 0)), 1), Machine::new(None, 2)] {
            assert!(open_metal(&machine).is_ok());
            assert!(machine.opened.get());
        }
    }

    #[test]
    fn without_usable_metal_the_worker_runs_on_the_cpu_and_says_why() {
        let vm = Machine::new(Some((15, 1)), 0);
        let metal = SelectedDevice::open_with(DeviceRequest::Metal, &vm);
        assert_eq!(metal.label(), "cpu");
        let reason = metal.fallback.expect("a fallback");
        assert!(
            reason.starts_with("metal unavailable (the system reports no Metal device"),
            "{reason}"
        );
        // auto settles on the CPU without calling it a fallback (it asked for nothing in particular).
        if !candle_core::utils::cuda_is_available() {
            let auto = SelectedDevice::open_with(DeviceRequest::Auto, &Machine::new(Some((14, 6)), 1));
            assert_eq!((auto.label().as_str(), auto.fallback), ("cpu", None));
        }
    }

    #[test]
    fn default_precision_follows_upstream() {
        assert_eq!(Precision::default_for(&Device::Cpu, [AmpDtype::Bf16]), Precision::F32);
        assert_eq!(Precision::F16.dtype(), DType::F16);
        let pool = CpuThreads::new(3).expect("pool");
        assert_eq!(pool.threads(), 3);
        assert_eq!(pool.run(rayon::current_num_threads), 3);
    }

    /// A pool spanning every allowed CPU pins thread `i` to the `i`-th of them; a smaller pool
    /// keeps the process's whole set on each thread.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_pool_spanning_the_cpus_is_pinned_one_per_cpu() {
        let cpus = affinity::allowed_cpus();
        assert!(!cpus.is_empty(), "the affinity mask names at least this CPU");
        let each_thread = |pool: &CpuThreads| {
            let mut seen: Vec<(usize, Vec<usize>)> = pool
                .pool
                .broadcast(|context| (context.index(), affinity::allowed_cpus()));
            seen.sort();
            seen
        };
        let spanning = CpuThreads::new(cpus.len()).expect("pool");
        if cpus.len() == 1 {
            assert!(!spanning.pinned(), "one CPU: nothing to spread");
            eprintln!("this machine gives the process one CPU: pinning not exercised");
            return;
        }
        assert!(spanning.pinned());
        let seen = each_thread(&spanning);
        assert_eq!(seen.len(), cpus.len());
        for (i, mask) in &seen {
            assert_eq!(mask, &vec![cpus[*i]], "thread {i}");
        }
        let smaller = CpuThreads::new(cpus.len() - 1).expect("pool");
        assert!(!smaller.pinned());
        assert!(each_thread(&smaller).iter().all(|(_, mask)| mask == &cpus));
    }
}
