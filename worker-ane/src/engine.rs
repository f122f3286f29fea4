//! `AneEngine`: the worker's [`Engine`] — named checkpoints, each admitted from its converted
//! artifacts (manifests, warm-up, placement probe, parity gate), then run one row at a time.
//!
//! A checkpoint is served only after its graph matched upstream on the reference rows; the summary
//! of that gate is what Describe shows (`WorkerInfo.parity_gate`).

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Instant;

use laya::checkpoint::{Checkpoint, CheckpointError, Location};
use laya::question::QuestionType;
use layad_proto::rows::usable_buckets;
use layad_proto::{
    CheckedForward, Engine, EngineError, EngineFacts, EngineInfo, InvalidForward, LoadedCheckpoint, ParityReport, Row,
    RowOutput, bucket_for,
};
use worker_gpu::Precision;
use worker_gpu::device::CpuThreads;
use worker_gpu::macos::MacosVersion;

use crate::artifact::{self, Artifact, ArtifactError, Expected};
use crate::executor::candle::CandleExecutor;
use crate::executor::{Executor, ExecutorError};
use crate::host::{self, HostError, HostWeights};
use worker_gpu::parity::{self, GateSummary};

/// Which executor runs the graphs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExecutorKind {
    /// Core ML, compute units pinned to CPU and Neural Engine (macOS only).
    CoreMl,
    /// candle on the CPU: the same contract with the checkpoint's weights, anywhere.
    Candle,
}

impl ExecutorKind {
    /// Parses `coreml` or `candle`.
    pub fn parse(text: &str) -> Result<Self, String> {
        match text {
            "coreml" => Ok(Self::CoreMl),
            "candle" => Ok(Self::Candle),
            _ => Err(format!("unknown executor '{text}'; expected coreml or candle")),
        }
    }
}

/// How the engine is set up.
#[derive(Clone, Debug)]
pub struct AneOptions {
    /// `<artifacts>/<checkpoint>/L<bucket>/` and `<artifacts>/<checkpoint>/parity.json`.
    pub artifacts: PathBuf,
    /// Which executor runs the graphs.
    pub executor: ExecutorKind,
    /// Graph precision: Core ML runs f16 only; candle f16 (default) or f32.
    pub precision: Precision,
    /// Only these length buckets; `None`: every bucket present in the artifacts.
    pub buckets: Option<Vec<u32>>,
    /// CPU threads of the candle executor (`None`: rayon's default).
    pub threads: Option<usize>,
    /// Most tokens in one forward (capped at the longest bucket).
    pub max_batch_tokens: u32,
    /// Where Core ML's compiled models are kept between starts.
    pub cache_dir: PathBuf,
}

/// Why the engine could not start.
#[derive(Debug, thiserror::Error)]
pub enum AneError {
    /// Core ML does not exist on this platform.
    #[error(
        "--executor coreml: Core ML is not available on {0} (this build has no Core ML executor); run on macOS or use --executor candle"
    )]
    CoreMlUnavailable(&'static str),
    /// This macOS is older than the Core ML graphs need.
    #[error("--executor coreml: {0}")]
    MacosTooOld(String),
    /// `--device cpu` with Core ML, which is pinned to the CPU and Neural Engine.
    #[error(
        "--device cpu with --executor coreml: Core ML is pinned to the CPU and Neural Engine; use --executor candle for the CPU"
    )]
    CoreMlOnCpu,
    /// Nothing to serve.
    #[error("no checkpoint to load")]
    NoCheckpoints,
    /// A name given twice.
    #[error("checkpoint name '{0}' is given twice")]
    DuplicateName(String),
    /// The executor cannot run this precision.
    #[error("--dtype {precision}: {executor} runs {supported}")]
    Precision {
        /// What was asked for.
        precision: Precision,
        /// The executor.
        executor: &'static str,
        /// What it runs.
        supported: &'static str,
    },
    /// The CPU thread pool could not be built.
    #[error("--threads: {0}")]
    Threads(String),
    /// The checkpoint could not be opened.
    #[error("checkpoint '{name}': {source}")]
    Checkpoint {
        /// Checkpoint name.
        name: String,
        /// Why.
        source: CheckpointError,
    },
    /// An artifact is missing or does not match the checkpoint.
    #[error("artifacts of checkpoint '{name}': {source}")]
    Artifact {
        /// Checkpoint name.
        name: String,
        /// Why.
        source: ArtifactError,
    },
    /// A bucket the checkpoint needs has no artifact.
    #[error(
        "checkpoint '{name}': no artifact for length bucket {bucket} ({path} missing); convert it or narrow --length-buckets"
    )]
    MissingBucket {
        /// Checkpoint name.
        name: String,
        /// The bucket.
        bucket: u32,
        /// The manifest that should exist.
        path: PathBuf,
    },
    /// `--length-buckets` left nothing to serve.
    #[error("--length-buckets {0:?}: no bucket left to serve")]
    NoBuckets(Vec<u32>),
    /// The host tensors could not be read.
    #[error("checkpoint '{name}': {source}")]
    Host {
        /// Checkpoint name.
        name: String,
        /// Why.
        source: HostError,
    },
    /// The candle model could not be built.
    #[error("checkpoint '{name}': {source}")]
    Model {
        /// Checkpoint name.
        name: String,
        /// Why (boxed: it is large and rare).
        source: Box<worker_gpu::LoadError>,
    },
    /// A graph failed to load or run during admission.
    #[error("checkpoint '{name}': {source}")]
    Executor {
        /// Checkpoint name.
        name: String,
        /// Why.
        source: ExecutorError,
    },
    /// A warm-up or probe row failed.
    #[error("checkpoint '{name}' bucket {bucket}: {reason}")]
    Warmup {
        /// Checkpoint name.
        name: String,
        /// The bucket.
        bucket: u32,
        /// Why.
        reason: String,
    },
    /// The graph disagrees with upstream.
    #[error("checkpoint '{name}': parity gate failed ({executor}, {file}): {reason}", file = file.display())]
    Parity {
        /// Checkpoint name.
        name: String,
        /// What ran.
        executor: String,
        /// The reference file.
        file: PathBuf,
        /// What failed.
        reason: String,
    },
    /// Core ML does not run the graph on the Neural Engine.
    #[error(
        "checkpoint '{name}' bucket {bucket}: placement probe failed: fastest {fastest_ms:.2} ms vs {cpu_only_ms:.2} ms CPU-only (ratio {ratio:.2} > {max_ratio}); Core ML is not running this graph on the Neural Engine"
    )]
    Placement {
        /// Checkpoint name.
        name: String,
        /// The bucket.
        bucket: u32,
        /// Fastest as configured.
        fastest_ms: f64,
        /// Fastest CPU-only.
        cpu_only_ms: f64,
        /// Their ratio.
        ratio: f64,
        /// The limit.
        max_ratio: f64,
    },
}

impl AneError {
    /// True when the device or its artifacts do not exist here (Core ML absent, macOS too old,
    /// artifacts missing, graph not placed on the Neural Engine, graph outside the parity gate on
    /// this device): the binary exits with `EXIT_DEVICE_UNAVAILABLE`.
    pub fn is_unavailable(&self) -> bool {
        matches!(
            self,
            AneError::CoreMlUnavailable(_)
                | AneError::MacosTooOld(_)
                | AneError::MissingBucket { .. }
                | AneError::Placement { .. }
                | AneError::Parity { .. }
                | AneError::Artifact {
                    source: ArtifactError::Missing { .. },
                    ..
                }
        )
    }
}

impl AneError {
    /// True when the command line asks for something this worker never runs (a precision its
    /// executor lacks, Core ML on the CPU, no checkpoint or bucket, a name twice, artifacts that
    /// are malformed or made for another checkpoint or graph): the same arguments fail the same
    /// way every time, so the binary exits with `EXIT_CONFIG_REFUSED` and the supervisor does not
    /// restart it.
    pub fn is_configuration(&self) -> bool {
        matches!(
            self,
            AneError::Precision { .. }
                | AneError::CoreMlOnCpu
                | AneError::NoCheckpoints
                | AneError::DuplicateName(_)
                | AneError::NoBuckets(_)
                | AneError::Artifact {
                    source: ArtifactError::Malformed { .. } | ArtifactError::Mismatch { .. },
                    ..
                }
        )
    }
}

impl AneOptions {
    /// What can be refused before any checkpoint is opened, configuration first (it is wrong
    /// everywhere), then the platform: the executor's precision, then Core ML's presence and the
    /// macOS version (`os` and `macos` describe the machine; `None`: not known).
    pub fn check(&self, os: &'static str, macos: Option<MacosVersion>) -> Result<(), AneError> {
        let (executor, supported) = match self.executor {
            ExecutorKind::CoreMl => ("coreml", [Precision::F16].as_slice()),
            ExecutorKind::Candle => ("candle", [Precision::F16, Precision::F32].as_slice()),
        };
        if !supported.contains(&self.precision) {
            return Err(AneError::Precision {
                precision: self.precision,
                executor,
                supported: if executor == "coreml" { "f16 only" } else { "f16 or f32" },
            });
        }
        if self.executor != ExecutorKind::CoreMl {
            return Ok(());
        }
        if os != "macos" {
            return Err(AneError::CoreMlUnavailable(os));
        }
        match macos {
            Some(version) => version
                .supports("the Core ML executor (artifacts converted for macOS 15)")
                .map_err(AneError::MacosTooOld),
            None => Ok(()),
        }
    }
}

/// Largest ratio of the placement probe (configured vs CPU-only) that counts as running on the ANE.
pub const MAX_PLACEMENT_RATIO: f64 = 0.8;

/// One served checkpoint.
struct Served {
    info: LoadedCheckpoint,
    host: HostWeights,
    executor: Box<dyn Executor>,
    /// Buckets rows of this checkpoint can land in, ascending.
    buckets: Vec<u32>,
    parity: ParityReport,
}

impl Served {
    /// One row through host inputs, the graph and the host's act head.
    fn run_row(&mut self, row: &Row) -> Result<RowOutput, EngineError> {
        let invalid = |e: host::RowError| EngineError::InvalidArgument(e.to_string());
        let bucket = bucket_for(row.ids.len(), &self.buckets).ok_or_else(|| {
            invalid(host::RowError::Contract(InvalidForward::RowLongerThanBuckets {
                row: 0,
                len: row.ids.len(),
                bucket: self.buckets.last().copied().unwrap_or(0),
            }))
        })?;
        let inputs = self.host.inputs(row, bucket).map_err(invalid)?;
        let outputs = self
            .executor
            .predict(bucket, &inputs)
            .map_err(|e| EngineError::Internal(format!("bucket {bucket}: {e}")))?;
        if !outputs.is_finite() {
            return Err(EngineError::Internal(format!(
                "bucket {bucket}: the graph returned non-finite values"
            )));
        }
        self.host
            .finish(&outputs, row.markers.len())
            .map_err(|e| EngineError::Internal(format!("bucket {bucket}: {e}")))
    }
}

/// Laya checkpoints as bucketed `bc1s-masked` graphs behind the worker's engine trait.
pub struct AneEngine {
    served: Vec<Served>,
    threads: Option<CpuThreads>,
    device: &'static str,
    precision: Precision,
    max_batch_tokens: u32,
}

/// A valid row of `len` tokens for warming and probing a bucket.
fn probe_row(len: usize, vocab: usize) -> Row {
    let ids = (0..len)
        .map(|i| 1 + (i % vocab.saturating_sub(1).max(1)) as u32)
        .collect();
    let markers = if len >= 3 { vec![1, 2] } else { vec![0] };
    Row {
        ids,
        markers,
        qtype: QuestionType::Choice,
    }
}

impl AneEngine {
    /// Admits and loads every `(name, location)` checkpoint from `options.artifacts`.
    pub fn load(checkpoints: &[(String, Location)], options: &AneOptions) -> Result<Self, AneError> {
        options.check(std::env::consts::OS, MacosVersion::running())?;
        if checkpoints.is_empty() {
            return Err(AneError::NoCheckpoints);
        }
        let device = match options.executor {
            ExecutorKind::CoreMl => "ane",
            ExecutorKind::Candle => "cpu",
        };
        let mut discovered = Vec::with_capacity(checkpoints.len());
        for (name, _) in checkpoints {
            if discovered.iter().any(|(n, _)| n == name) {
                return Err(AneError::DuplicateName(name.clone()));
            }
            let found = artifact::discover(&options.artifacts, name).map_err(|source| AneError::Artifact {
                name: name.clone(),
                source,
            })?;
            discovered.push((name.clone(), found));
        }
        let selected: Vec<u32> = match &options.buckets {
            Some(asked) => asked.iter().copied().collect::<BTreeSet<u32>>().into_iter().collect(),
            None => discovered
                .iter()
                .flat_map(|(_, b)| b.keys().copied())
                .collect::<BTreeSet<u32>>()
                .into_iter()
                .collect(),
        };
        if selected.iter().all(|&b| b == 0) {
            return Err(AneError::NoBuckets(selected));
        }
        let threads = options
            .threads
            .filter(|_| options.executor == ExecutorKind::Candle)
            .map(CpuThreads::new)
            .transpose()
            .map_err(AneError::Threads)?;
        let mut served = Vec::with_capacity(checkpoints.len());
        for ((name, location), (_, found)) in checkpoints.iter().zip(&discovered) {
            let loading = Instant::now();
            let admit = || admit(name, location, found, &selected, options);
            let one = match &threads {
                Some(pool) => pool.run(admit)?,
                None => admit()?,
            };
            tracing::info!(
                checkpoint = %name,
                executor = %one.parity.executor,
                buckets = ?one.buckets,
                rows = one.parity.rows,
                skipped_rows = one.parity.skipped_rows,
                max_probability_diff = one.parity.max_probability_diff,
                max_act_probability_diff = one.parity.max_act_probability_diff,
                hard_mismatches = one.parity.hard_mismatches,
                near_tie_flips = ?one.parity.near_tie_flips,
                placement = ?one.parity.placement,
                load_ms = loading.elapsed().as_secs_f64() * 1e3,
                "checkpoint admitted: parity gate passed"
            );
            served.push(one);
        }
        let longest = served
            .iter()
            .filter_map(|s| s.buckets.last().copied())
            .max()
            .unwrap_or(0);
        Ok(Self {
            served,
            threads,
            device,
            precision: options.precision,
            max_batch_tokens: options.max_batch_tokens.min(longest),
        })
    }

    fn find(&mut self, checkpoint: &str) -> Result<&mut Served, EngineError> {
        let loaded: Vec<String> = self.served.iter().map(|s| s.info.name.clone()).collect();
        self.served
            .iter_mut()
            .find(|s| s.info.name == checkpoint)
            .ok_or_else(|| {
                EngineError::InvalidArgument(format!(
                    "unknown checkpoint '{checkpoint}'; loaded: {}",
                    loaded.join(", ")
                ))
            })
    }
}

/// Opens one checkpoint, verifies its manifests and reference file, loads its host tensors and
/// executor; warms and probes every bucket.
fn admit(
    name: &str,
    location: &Location,
    found: &std::collections::BTreeMap<u32, PathBuf>,
    selected: &[u32],
    options: &AneOptions,
) -> Result<Served, AneError> {
    let checkpoint = Checkpoint::open(location.clone()).map_err(|source| AneError::Checkpoint {
        name: name.to_owned(),
        source,
    })?;
    let max_len = checkpoint.agent.max_len;
    let buckets = usable_buckets(selected, max_len);
    if buckets.is_empty() {
        return Err(AneError::NoBuckets(selected.to_vec()));
    }
    let revision = location.revision();
    let expected = Expected {
        checkpoint: name,
        weights_sha256: &checkpoint.weights.sha256,
        revision,
        hidden_size: checkpoint.encoder.hidden_size,
    };
    let artifact_error = |source| AneError::Artifact {
        name: name.to_owned(),
        source,
    };
    let mut artifacts: Vec<Artifact> = Vec::with_capacity(buckets.len());
    for &bucket in &buckets {
        let dir = found.get(&bucket).ok_or_else(|| AneError::MissingBucket {
            name: name.to_owned(),
            bucket,
            path: options.artifacts.join(name).join(format!("L{bucket}/manifest.json")),
        })?;
        artifacts.push(artifact::admit(dir, bucket, &expected).map_err(artifact_error)?);
    }
    let reference =
        artifact::read_parity(&options.artifacts.join(name).join("parity.json"), &expected).map_err(artifact_error)?;
    let host = HostWeights::load(name, &checkpoint).map_err(|source| AneError::Host {
        name: name.to_owned(),
        source,
    })?;
    let longest = buckets.last().copied().unwrap_or(0);
    let executor: Box<dyn Executor> = match options.executor {
        ExecutorKind::Candle => Box::new(
            CandleExecutor::load(name, &checkpoint, options.precision, longest).map_err(|source| AneError::Model {
                name: name.to_owned(),
                source: Box::new(source),
            })?,
        ),
        ExecutorKind::CoreMl => core_ml_executor(name, &artifacts, options)?,
    };
    let info = LoadedCheckpoint {
        name: name.to_owned(),
        revision: revision.map(str::to_owned),
        weights_sha256: checkpoint.weights.sha256.clone(),
        vocab_size: u32::try_from(host.vocab()).unwrap_or(u32::MAX),
        max_len: u32::try_from(max_len).unwrap_or(u32::MAX),
        // Fixed buckets bound the rows: the longest is all a request may use here.
        warmup_len: u32::try_from(max_len).unwrap_or(u32::MAX),
    };
    let parity = ParityReport {
        checkpoint: name.to_owned(),
        executor: executor.info().label(),
        rows: 0,
        skipped_rows: 0,
        tolerance: parity::TOLERANCE,
        max_probability_diff: 0.0,
        max_act_probability_diff: 0.0,
        hard_mismatches: 0,
        near_tie_flips: Vec::new(),
        placement: Vec::new(),
    };
    let mut served = Served {
        info,
        host,
        executor,
        buckets,
        parity,
    };
    warm_and_probe(name, &mut served, max_len)?;
    gate(name, &mut served, &reference, &checkpoint)?;
    Ok(served)
}

#[cfg(target_os = "macos")]
fn core_ml_executor(name: &str, artifacts: &[Artifact], options: &AneOptions) -> Result<Box<dyn Executor>, AneError> {
    crate::executor::coreml::CoreMlExecutor::load(artifacts, &options.cache_dir)
        .map(|e| Box::new(e) as Box<dyn Executor>)
        .map_err(|source| AneError::Executor {
            name: name.to_owned(),
            source,
        })
}

#[cfg(not(target_os = "macos"))]
fn core_ml_executor(_: &str, _: &[Artifact], _: &AneOptions) -> Result<Box<dyn Executor>, AneError> {
    Err(AneError::CoreMlUnavailable(std::env::consts::OS))
}

/// One prediction per bucket (Core ML's first one on a bucket pays its device compile), then the
/// placement probe where the executor has one; a failed probe refuses the checkpoint.
fn warm_and_probe(name: &str, served: &mut Served, max_len: usize) -> Result<(), AneError> {
    for bucket in served.buckets.clone() {
        let row = probe_row((bucket as usize).min(max_len), served.host.vocab());
        let failed = |reason: String| AneError::Warmup {
            name: name.to_owned(),
            bucket,
            reason,
        };
        let started = Instant::now();
        served.run_row(&row).map_err(|e| failed(e.to_string()))?;
        tracing::info!(checkpoint = %name, bucket, first_ms = started.elapsed().as_secs_f64() * 1e3, "bucket warm");
        let inputs = served.host.inputs(&row, bucket).map_err(|e| failed(e.to_string()))?;
        let probe = served
            .executor
            .placement_probe(bucket, &inputs)
            .map_err(|source| AneError::Executor {
                name: name.to_owned(),
                source,
            })?;
        if let Some(probe) = probe {
            let ratio = probe.ratio();
            // NaN (a zero CPU time) fails too: a probe that measured nothing proves nothing.
            if ratio.is_nan() || ratio > MAX_PLACEMENT_RATIO {
                return Err(AneError::Placement {
                    name: name.to_owned(),
                    bucket,
                    fastest_ms: probe.fastest_ms,
                    cpu_only_ms: probe.cpu_only_fastest_ms,
                    ratio,
                    max_ratio: MAX_PLACEMENT_RATIO,
                });
            }
            served.parity.placement.push(probe);
        }
    }
    Ok(())
}

/// The parity gate over every reference row that fits the checkpoint's buckets.
fn gate(
    name: &str,
    served: &mut Served,
    reference: &artifact::ParityFile,
    checkpoint: &Checkpoint,
) -> Result<(), AneError> {
    let mut summary = GateSummary::default();
    let longest = served.buckets.last().copied().unwrap_or(0);
    for (index, row) in reference.rows.iter().enumerate() {
        let engine_row = Row {
            ids: row.ids.clone(),
            markers: row.markers.clone(),
            qtype: row.qtype,
        };
        let fits = host::check_row(&engine_row, &served.host.limits(longest)).is_ok();
        if !fits {
            summary.skipped_rows += 1;
            continue;
        }
        let index = u32::try_from(index).unwrap_or(u32::MAX);
        let ours = served.run_row(&engine_row).unwrap_or_else(|e| {
            tracing::warn!(checkpoint = %name, row = index, error = %e, "reference row failed");
            RowOutput {
                logits: vec![f32::NAN; row.logits.len()],
                act_probabilities: vec![f32::NAN; row.act_probabilities.len()],
            }
        });
        let temperature = laya::answer::temperature(&checkpoint.agent.temperatures, row.qtype, row.markers.len());
        summary.add(
            index,
            &parity::compare(&ours, &row.logits, &row.act_probabilities, temperature),
        );
    }
    let report = &mut served.parity;
    report.rows = summary.rows;
    report.skipped_rows = summary.skipped_rows;
    report.max_probability_diff = summary.max_probability_diff;
    report.max_act_probability_diff = summary.max_act_probability_diff;
    report.hard_mismatches = u32::try_from(summary.hard_mismatches.len()).unwrap_or(u32::MAX);
    report.near_tie_flips = summary.near_tie_flips.clone();
    match summary.failure() {
        None => Ok(()),
        Some(reason) => Err(AneError::Parity {
            name: name.to_owned(),
            executor: report.executor.clone(),
            file: reference.path.clone(),
            reason,
        }),
    }
}

impl Engine for AneEngine {
    fn describe(&self) -> EngineInfo {
        let buckets: BTreeSet<u32> = self.served.iter().flat_map(|s| s.buckets.iter().copied()).collect();
        EngineInfo {
            device: self.device.to_owned(),
            dtype: self.precision.as_str().to_owned(),
            checkpoints: self.served.iter().map(|s| s.info.clone()).collect(),
            max_rows: 1,
            max_batch_tokens: self.max_batch_tokens,
            length_buckets: buckets.into_iter().collect(),
            parity: self.served.iter().map(|s| s.parity.clone()).collect(),
            // No operator facts of its own: each checkpoint's parity gate names what ran it where.
            facts: EngineFacts::default(),
        }
    }

    fn forward(&mut self, forward: &CheckedForward) -> Result<Vec<RowOutput>, EngineError> {
        let (checkpoint, rows) = (forward.checkpoint(), forward.rows());
        let threads = self.threads.take();
        let served = match self.find(checkpoint) {
            Ok(served) => served,
            Err(e) => {
                self.threads = threads;
                return Err(e);
            }
        };
        // One prediction at a time: the graphs are batch 1, so a batch is its rows in order.
        let mut run = move || rows.iter().map(|row| served.run_row(row)).collect();
        let outputs = match &threads {
            Some(pool) => pool.run(run),
            None => run(),
        };
        self.threads = threads;
        outputs
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(executor: ExecutorKind, precision: Precision) -> AneOptions {
        AneOptions {
            artifacts: PathBuf::from("artifacts"),
            executor,
            precision,
            buckets: None,
            threads: None,
            max_batch_tokens: 128,
            cache_dir: PathBuf::from("cache"),
        }
    }

    #[test]
    fn configuration_is_refused_before_the_platform_and_never_restarted() {
        let sequoia = Some(MacosVersion::new(15, 2));
        let coreml_f32 = options(ExecutorKind::CoreMl, Precision::F32);
        // Wrong on every machine, so refused as configuration even where Core ML is missing.
        for (os, macos) in [("macos", sequoia), ("linux", None)] {
            let error = coreml_f32.check(os, macos).expect_err("f32 with Core ML");
            assert!(error.is_configuration() && !error.is_unavailable(), "{error}");
            assert_eq!(error.to_string(), "--dtype f32: coreml runs f16 only");
        }
        let coreml = options(ExecutorKind::CoreMl, Precision::F16);
        assert!(coreml.check("macos", sequoia).is_ok());
        assert!(
            coreml.check("macos", None).is_ok(),
            "an unreadable version is not a refusal"
        );
        let error = coreml.check("linux", None).expect_err("no Core ML");
        assert!(error.is_unavailable() && !error.is_configuration(), "{error}");
        let error = coreml
            .check("macos", Some(MacosVersion::new(14, 7)))
            .expect_err("too old");
        assert!(error.is_unavailable(), "{error}");
        assert!(
            error
                .to_string()
                .contains("needs macOS 15.0 or later; this is macOS 14.7"),
            "{error}"
        );
        // candle runs anywhere, in either precision.
        for precision in [Precision::F16, Precision::F32] {
            assert!(options(ExecutorKind::Candle, precision).check("linux", None).is_ok());
        }
        assert!(AneError::CoreMlOnCpu.is_configuration());
    }

    #[test]
    fn wrong_artifacts_and_a_failed_parity_gate_are_not_restarted() {
        let artifact = |source| AneError::Artifact {
            name: "english".into(),
            source,
        };
        let path = PathBuf::from("artifacts/english/L64/manifest.json");
        let mismatch = artifact(ArtifactError::Mismatch {
            path: path.clone(),
            field: "graph".into(),
            expected: artifact::GRAPH.into(),
            found: "other".into(),
        });
        let malformed = artifact(ArtifactError::Malformed {
            path: path.clone(),
            problem: "expected value at line 1 column 1".into(),
        });
        for error in [&mismatch, &malformed] {
            assert!(error.is_configuration() && !error.is_unavailable(), "{error}");
        }
        let parity = AneError::Parity {
            name: "english".into(),
            executor: "coreml".into(),
            file: PathBuf::from("parity.json"),
            reason: "max |Δp| 0.05 > 0.02".into(),
        };
        assert!(parity.is_unavailable() && !parity.is_configuration());
        // A file that cannot be read may be a passing fault (a disk, a mount): restarted.
        let io = artifact(ArtifactError::Io {
            path,
            source: std::io::Error::other("EIO"),
        });
        assert!(!io.is_unavailable() && !io.is_configuration());
    }

    #[test]
    fn probe_rows_are_valid_for_their_bucket() {
        for len in [1, 2, 3, 64] {
            let row = probe_row(len, 701);
            let limits = layad_proto::RowLimits {
                checkpoint: "english".into(),
                vocab_size: 701,
                max_len: 96,
                longest_bucket: Some(64),
            };
            assert_eq!(host::check_row(&row, &limits), Ok(()), "{len}");
            assert_eq!(row.ids.len(), len);
        }
    }
}
