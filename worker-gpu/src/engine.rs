//! `CandleEngine`: the worker's [`Engine`] — several named checkpoints loaded on one device in one
//! precision, each request checked against the row contract before it reaches the model.

use std::path::PathBuf;

use candle_core::{DType, Device};
use laya::checkpoint::{Checkpoint, Location};
use layad_cpu_kernels::CpuKernels;
use layad_cpu_kernels::bf16::Bf16Kernel;
use layad_cpu_kernels::int8::Int8Activations;
use layad_proto::{
    CheckedForward, DEFAULT_MAX_BATCH_TOKENS, DEFAULT_MAX_ROWS, Engine, EngineError, EngineFacts, EngineInfo, GpuInfo,
    LoadedCheckpoint, ParityReport, Row, RowOutput, bucket_for,
};
use rayon::prelude::*;

use crate::cuda;
use crate::device::{CpuThreads, DeviceRequest, Precision, SelectedDevice};
use crate::error::LoadError;
use crate::gate;
use crate::model::{LayaModel, MatrixFormat};
use crate::reference_cache::ReferenceCache;

/// How the engine is set up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EngineOptions {
    /// The device to run on (falls back to the CPU when unavailable; see [`CandleEngine::fallback`]).
    pub device: DeviceRequest,
    /// Weights and matmul precision; `None`: f32 on the CPU, the checkpoints' `amp_dtype` on a GPU.
    pub precision: Option<Precision>,
    /// CPU threads for matrix products, norms, GeGLU, RoPE and softmax (CPU only); `None`: one per
    /// CPU this process may use (`std::thread::available_parallelism`). Either way the pool is
    /// pinned one thread per CPU when it spans them all ([`CpuThreads`]). A batch of several rows
    /// runs as up to this many forwards side by side, one per group of rows. candle's own elementwise
    /// ops (adds, casts) run on a pool sized by `CANDLE_NUM_THREADS`, which only the process
    /// environment sets (`layad-worker-gpu` and `layad-bench` set it to 1 unless it is set:
    /// `device::one_candle_thread_unless_set`).
    pub threads: Option<usize>,
    /// CPU only: the SIMD kernels of the matrix products; `None`: the best this CPU has. Naming one
    /// the CPU lacks fails the load.
    pub cpu_kernels: Option<CpuKernels>,
    /// int8 with the AVX512-VNNI kernel: how activation rows are quantized; `None`: the first of
    /// `gate::DEFAULT_ACTIVATIONS` the load-time gate passes (8 bits where the gate's rows keep
    /// a third of its bound, else 16 bits as two u8 planes; `gate::load_reduced_behind_gate`).
    pub int8_activations: Option<Int8Activations>,
    /// Most rows in one forward.
    pub max_rows: u32,
    /// Most tokens (sum of row lengths) in one forward.
    pub max_batch_tokens: u32,
    /// Fixed row lengths, increasing: every batch is padded to the smallest that holds its longest
    /// row (as a fixed-shape engine would be); longer rows are refused. Empty: pad to the longest.
    pub length_buckets: Vec<u32>,
    /// Where the parity gate keeps its float32 reference between starts ([`ReferenceCache`]);
    /// `None`: computed at every start.
    pub gate_cache: Option<PathBuf>,
}

impl Default for EngineOptions {
    fn default() -> Self {
        Self {
            device: DeviceRequest::Auto,
            precision: None,
            threads: None,
            cpu_kernels: None,
            int8_activations: None,
            max_rows: DEFAULT_MAX_ROWS,
            max_batch_tokens: DEFAULT_MAX_BATCH_TOKENS,
            length_buckets: Vec::new(),
            gate_cache: None,
        }
    }
}

struct NamedModel {
    info: LoadedCheckpoint,
    model: LayaModel,
}

/// Laya checkpoints in candle behind the worker's engine trait.
pub struct CandleEngine {
    device: SelectedDevice,
    precision: Precision,
    threads: Option<CpuThreads>,
    /// The kernel family of CPU forwards (`None` on other devices).
    cpu_kernels: Option<CpuKernels>,
    models: Vec<NamedModel>,
    /// The parity gate each checkpoint passed at load (int8, f16, bf16; empty in f32).
    parity: Vec<ParityReport>,
    /// The GPU forwards run on, as its driver describes it (`None` on the CPU).
    gpu: Option<GpuInfo>,
    max_rows: u32,
    max_batch_tokens: u32,
    length_buckets: Vec<u32>,
}

impl CandleEngine {
    /// Opens and loads every `(name, location)` checkpoint on the requested device.
    pub fn load(checkpoints: &[(String, Location)], options: EngineOptions) -> Result<Self, LoadError> {
        if checkpoints.is_empty() {
            return Err(LoadError::NoCheckpoints);
        }
        // The weights are hashed as the model reads them (`Weights::read`), not here: one read of
        // the file instead of two, and the hash runs beside the decoding.
        let mut opened: Vec<(&str, Checkpoint)> = Vec::with_capacity(checkpoints.len());
        for (name, location) in checkpoints {
            if opened.iter().any(|(n, _)| n == name) {
                return Err(LoadError::DuplicateName(name.clone()));
            }
            let checkpoint = Checkpoint::open_unhashed(location.clone()).map_err(|source| LoadError::Checkpoint {
                name: name.clone(),
                source,
            })?;
            opened.push((name, checkpoint));
        }
        // int8 exists on the CPU only: there `auto` means the CPU, and a named GPU is refused.
        let requested = match (options.precision, options.device) {
            (Some(Precision::Int8), DeviceRequest::Auto) => DeviceRequest::Cpu,
            (Some(Precision::Int8), gpu @ (DeviceRequest::Metal | DeviceRequest::Cuda(_))) => {
                return Err(LoadError::Device(format!(
                    "dtype int8 runs on the CPU only, not on device {gpu}; use device cpu (or auto), or f16/bf16 on the GPU"
                )));
            }
            (_, requested) => requested,
        };
        let device = SelectedDevice::open(requested);
        if let Some(reason) = &device.fallback {
            tracing::warn!(requested = %options.device, %reason, "device fallback");
        }
        // A driver that cannot describe its device still runs it: the facts are for operators.
        let gpu = cuda::describe(&device.device)
            .inspect_err(|reason| tracing::warn!(%reason, "GPU not described"))
            .ok()
            .flatten();
        if let Some(gpu) = &gpu {
            tracing::info!(name = %gpu.name, memory_bytes = gpu.total_memory_bytes, compute_capability = ?gpu.compute_capability, tf32 = gpu.tf32, "GPU");
        }
        let precision = options
            .precision
            .unwrap_or_else(|| Precision::default_for(&device.device, opened.iter().map(|(_, c)| c.agent.amp_dtype)));
        let threads = if device.device.is_cpu() {
            let count = options
                .threads
                .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, usize::from));
            Some(CpuThreads::new(count).map_err(LoadError::Device)?)
        } else {
            None
        };
        let cpu_kernels = if device.device.is_cpu() {
            let kernels = options.cpu_kernels.unwrap_or_else(CpuKernels::detect);
            if !kernels.available() {
                return Err(LoadError::Device(format!(
                    "cpu_kernels = {kernels}: this CPU lacks them (it has {})",
                    CpuKernels::detect()
                )));
            }
            if let Err(refused @ layad_cpu_kernels::amx::AmxUnavailable::Refused(_)) =
                layad_cpu_kernels::amx::Amx::detect()
            {
                tracing::warn!(cpu_kernels = %kernels, reason = %refused, "the CPU has AMX, not used");
            }
            Some(kernels)
        } else {
            None
        };
        // bf16 on an AVX-512 CPU loads float32 and runs the encoder's products with the bf16
        // kernels (candle's bf16 CPU path is slower than f32 there).
        let bf16_kernels = precision == Precision::Bf16 && cpu_kernels.and_then(Bf16Kernel::for_family).is_some();
        let load_dtype = if bf16_kernels { DType::F32 } else { precision.dtype() };
        let gate_cache = options.gate_cache.clone().map(ReferenceCache::new);
        let mut models = Vec::with_capacity(opened.len());
        let mut parity = Vec::new();
        for (name, mut checkpoint) in opened {
            let kernels = cpu_kernels.unwrap_or(CpuKernels::Gemm);
            // int8 and bf16 on the CPU reduce each matrix as it is read, the gate's float32
            // reference read back where it is kept, else computed through each float32 layer just
            // before it is reduced (`gate::load_reduced_behind_gate`). f16, and bf16 without its
            // kernels, load in that precision and run the gate's rows against the float32 forward on
            // the CPU, run one layer at a time (`gate::half_precision_behind_gate`).
            let reduced = match precision {
                Precision::Int8 if device.device.is_cpu() => Some(MatrixFormat::Int8),
                Precision::Bf16 if bf16_kernels => Some(MatrixFormat::Bf16),
                _ => None,
            };
            let load = || -> Result<(LayaModel, Option<ParityReport>), LoadError> {
                if let Some(format) = reduced {
                    let (model, report) = gate::load_reduced_behind_gate(
                        name,
                        &checkpoint,
                        kernels,
                        format,
                        options.int8_activations,
                        gate_cache.as_ref(),
                    )?;
                    return Ok((model, Some(report)));
                }
                let model = LayaModel::load_with_kernels(name, &checkpoint, &device.device, load_dtype, kernels)?;
                let report = match precision {
                    // Never here: int8 is refused off the CPU above, and on the CPU it is reduced.
                    Precision::Int8 => {
                        return Err(LoadError::Device("dtype int8 runs on the CPU only".to_owned()));
                    }
                    Precision::F16 | Precision::Bf16 => Some(gate::half_precision_behind_gate(
                        name,
                        &checkpoint,
                        &model,
                        precision,
                        &device.label(),
                        gate_cache.as_ref(),
                    )?),
                    Precision::F32 => None,
                };
                Ok((model, report))
            };
            // Packing (and the gate) run on the engine's pool, like the forwards.
            let (model, report) = match &threads {
                Some(pool) => pool.run(load)?,
                None => load()?,
            };
            checkpoint.weights.sha256.clone_from(&model.weights_sha256);
            if let Some(report) = report {
                tracing::info!(
                    checkpoint = name,
                    rows = report.rows,
                    max_probability_diff = report.max_probability_diff,
                    max_act_probability_diff = report.max_act_probability_diff,
                    near_tie_flips = ?report.near_tie_flips,
                    "{precision} parity gate passed (against float32)"
                );
                parity.push(report);
            }
            tracing::info!(
                checkpoint = name,
                device = %device.label(),
                dtype = precision.as_str(),
                cpu_kernels = cpu_kernels.map_or("-", CpuKernels::as_str),
                sha256 = %checkpoint.weights.sha256,
                "checkpoint loaded"
            );
            models.push(NamedModel {
                info: LoadedCheckpoint {
                    name: name.to_owned(),
                    revision: checkpoint.location.revision().map(str::to_owned),
                    weights_sha256: checkpoint.weights.sha256.clone(),
                    vocab_size: saturating_u32(model.vocab_size),
                    max_len: saturating_u32(model.max_len),
                    warmup_len: saturating_u32(checkpoint.agent.max_len),
                },
                model,
            });
        }
        // What the load freed on the pool's threads (the float32 weights int8 and bf16 replaced,
        // packing's copies) is handed back now rather than held for the worker's life.
        let released = crate::memory::release_freed_memory();
        tracing::debug!(released, "memory freed by the load handed back");
        Ok(Self {
            device,
            precision,
            threads,
            cpu_kernels,
            models,
            parity,
            gpu,
            max_rows: options.max_rows,
            max_batch_tokens: options.max_batch_tokens,
            length_buckets: options.length_buckets,
        })
    }

    /// The candle device forwards run on.
    pub fn device(&self) -> &Device {
        &self.device.device
    }

    /// Why the requested GPU is not in use, when the engine fell back to the CPU.
    pub fn fallback(&self) -> Option<&str> {
        self.device.fallback.as_deref()
    }

    /// The precision in use.
    pub fn precision(&self) -> Precision {
        self.precision
    }

    /// The SIMD kernels of CPU forwards (`None` on other devices).
    pub fn kernels(&self) -> Option<CpuKernels> {
        self.cpu_kernels
    }

    /// Size of the engine's own CPU thread pool (CPU engines only).
    pub fn cpu_threads(&self) -> Option<usize> {
        self.threads.as_ref().map(CpuThreads::threads)
    }

    fn find(&self, checkpoint: &str) -> Result<&NamedModel, EngineError> {
        self.models.iter().find(|m| m.info.name == checkpoint).ok_or_else(|| {
            let loaded: Vec<&str> = self.models.iter().map(|m| m.info.name.as_str()).collect();
            EngineError::InvalidArgument(format!(
                "unknown checkpoint '{checkpoint}'; loaded: {}",
                loaded.join(", ")
            ))
        })
    }
}

impl Engine for CandleEngine {
    fn describe(&self) -> EngineInfo {
        EngineInfo {
            device: self.device.label(),
            dtype: self.precision.as_str().to_owned(),
            checkpoints: self.models.iter().map(|m| m.info.clone()).collect(),
            max_rows: self.max_rows,
            max_batch_tokens: self.max_batch_tokens,
            length_buckets: self.length_buckets.clone(),
            parity: self.parity.clone(),
            facts: EngineFacts {
                cpu_kernels: self.cpu_kernels.map(CpuKernels::report),
                gpu: self.gpu.clone(),
                device_fallback: self.device.fallback.clone(),
            },
        }
    }

    fn forward(&mut self, forward: &CheckedForward) -> Result<Vec<RowOutput>, EngineError> {
        let (checkpoint, rows) = (forward.checkpoint(), forward.rows());
        let named = self.find(checkpoint)?;
        let buckets = &self.length_buckets;
        let run = |rows: &[&Row]| {
            let longest = rows.iter().map(|r| r.ids.len()).max().unwrap_or(0);
            // The row contract already refused rows longer than the longest bucket.
            let pad_to = bucket_for(longest, buckets).map_or(longest, |b| b as usize);
            named.model.forward_padded(rows, pad_to)
        };
        let outputs = match &self.threads {
            Some(pool) if pool.threads() > 1 && rows.len() > 1 => pool.run(|| side_by_side(rows, pool.threads(), run)),
            Some(pool) => pool.run(|| run(&rows.iter().collect::<Vec<_>>())),
            None => run(&rows.iter().collect::<Vec<_>>()),
        };
        outputs.map_err(|e| EngineError::Internal(format!("forward on '{checkpoint}' failed: {e}")))
    }
}

/// Runs a CPU batch as one forward per group of its rows ([`row_groups`], at most `threads`), side
/// by side on the current pool, and returns the outputs in the rows' order.
///
/// One forward spread over every thread waits at the end of each of its parallel steps and runs its
/// serial steps (embeddings, the head's small ops) on one thread while the others idle: a 64-token
/// int8 row took 37 ms on two threads of a 2-vCPU Zen 5 but 61–64 ms each when two ran at once on
/// one thread apiece, 19% more rows per second. Side by side, each group's forward keeps one thread
/// busy and the pool's work stealing lends idle threads to the group still running, so uneven
/// groups cost little. Rows answer as alone either way (each is computed independently of the
/// others; `mixed_batches_match_single_rows`). Every group reads all the weights once: g groups
/// read them g times, which this CPU's memory bandwidth absorbed at two (docs/benchmarks.md, "Rows
/// side by side"); pools of more threads have not been measured.
fn side_by_side<F>(rows: &[Row], threads: usize, run: F) -> candle_core::Result<Vec<RowOutput>>
where
    F: Fn(&[&Row]) -> candle_core::Result<Vec<RowOutput>> + Sync,
{
    let groups = row_groups(rows, threads);
    let answers: Vec<candle_core::Result<Vec<RowOutput>>> = groups
        .par_iter()
        .map(|group| {
            // Borrowed: the padded batch is where a row's ids are copied.
            let own: Vec<&Row> = group.iter().map(|&i| &rows[i]).collect();
            run(&own)
        })
        .collect();
    let mut outputs: Vec<Option<RowOutput>> = vec![None; rows.len()];
    for (group, answer) in groups.iter().zip(answers) {
        let answer = answer?;
        if answer.len() != group.len() {
            candle_core::bail!("a group of {} rows got {} outputs", group.len(), answer.len());
        }
        for (&i, output) in group.iter().zip(answer) {
            outputs[i] = Some(output);
        }
    }
    // Every row is in exactly one group, so every slot was filled.
    Ok(outputs.into_iter().flatten().collect())
}

/// The row indices of a batch in `min(groups, rows)` groups of nearly equal size: longest rows
/// first, so each group's rows are of similar length and pad little, and the groups of the
/// shortest rows take the extra rows.
fn row_groups(rows: &[Row], groups: usize) -> Vec<Vec<usize>> {
    let mut order: Vec<usize> = (0..rows.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(rows[i].ids.len()));
    let groups = groups.clamp(1, rows.len().max(1));
    let (size, extra) = (rows.len() / groups, rows.len() % groups);
    let mut rest = order.as_slice();
    (0..groups)
        .map(|g| {
            let (group, after) = rest.split_at(size + usize::from(g >= groups - extra));
            rest = after;
            group.to_vec()
        })
        .collect()
}

fn saturating_u32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows_of(lengths: &[usize]) -> Vec<Row> {
        lengths
            .iter()
            .map(|&n| Row {
                ids: vec![1; n],
                markers: vec![0],
                qtype: laya::question::QuestionType::Choice,
            })
            .collect()
    }

    #[test]
    fn row_groups_split_longest_first_with_the_extra_rows_among_the_shortest() {
        let rows = rows_of(&[10, 50, 30, 20, 40]);
        // By length: 1 (50), 4 (40), 2 (30), 3 (20), 0 (10).
        assert_eq!(row_groups(&rows, 2), [vec![1, 4], vec![2, 3, 0]]);
        assert_eq!(row_groups(&rows, 3), [vec![1], vec![4, 2], vec![3, 0]]);
        assert_eq!(row_groups(&rows, 5), [vec![1], vec![4], vec![2], vec![3], vec![0]]);
        // Never more groups than rows, never none.
        assert_eq!(row_groups(&rows, 8).len(), 5);
        assert_eq!(row_groups(&rows, 0), [vec![1, 4, 2, 3, 0]]);
        assert_eq!(row_groups(&rows_of(&[7, 7]), 2), [vec![0], vec![1]]);
    }

    #[test]
    fn side_by_side_answers_in_the_rows_order_and_passes_errors_on() {
        let rows = rows_of(&[3, 9, 5, 7, 1]);
        // A stand-in forward that answers each row with its length.
        let by_length = |rows: &[&Row]| {
            Ok(rows
                .iter()
                .map(|r| RowOutput {
                    logits: vec![r.ids.len() as f32],
                    act_probabilities: vec![1.0],
                })
                .collect())
        };
        let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().expect("pool");
        for threads in [2, 3, 5] {
            let outputs = pool
                .install(|| side_by_side(&rows, threads, by_length))
                .expect("outputs");
            let lengths: Vec<f32> = outputs.iter().map(|o| o.logits[0]).collect();
            assert_eq!(lengths, [3.0, 9.0, 5.0, 7.0, 1.0], "{threads} groups");
        }
        let failing = |rows: &[&Row]| {
            if rows.iter().any(|r| r.ids.len() == 1) {
                candle_core::bail!("row of one token")
            }
            by_length(rows)
        };
        let error = pool
            .install(|| side_by_side(&rows, 2, failing))
            .expect_err("a group failed");
        assert!(error.to_string().contains("row of one token"), "{error}");
        let short = |rows: &[&Row]| by_length(&rows[1..]);
        let error = pool
            .install(|| side_by_side(&rows, 2, short))
            .expect_err("a group came back short");
        assert!(error.to_string().contains("got 1 outputs"), "{error}");
    }
}
