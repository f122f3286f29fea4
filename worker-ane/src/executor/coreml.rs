//! The Core ML executor: one compiled `bc1s-masked` model per bucket with compute units pinned to
//! CPU and Neural Engine, compiled once per package tree hash into a cache, FP16 arrays in and out.
//!
//! macOS only: type-checked for `aarch64-apple-darwin` in CI (`.ci/check-macos`), never linked or
//! run on the Linux machines this crate is developed on. It is kept to the Core ML calls themselves;
//! shapes, layouts, strides and everything around them live (tested) in the rest of the crate.
//!
//! Every entry point runs inside an autorelease pool: the engine thread is not the main thread and
//! has no run loop draining one, so the objects Core ML autoreleases during a load or a prediction
//! would otherwise live until the thread exits, growing the process with every request.

// Core ML is an Objective-C framework: every call through objc2-core-ml is `unsafe`, and the models
// must be marked `Send` by hand. This module is the only place in the crate that needs it.
#![allow(unsafe_code)]

use std::cell::Cell;
use std::collections::BTreeMap;
use std::ffi::c_void;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::time::Instant;

use block2::RcBlock;
use half::f16;
use layad_proto::PlacementReport;
use objc2::AnyThread;
use objc2::rc::{Retained, autoreleasepool};
use objc2::runtime::{AnyObject, ProtocolObject};
use objc2_core_ml::{
    MLComputeUnits, MLDictionaryFeatureProvider, MLFeatureProvider, MLFeatureValue, MLModel, MLModelConfiguration,
    MLMultiArray, MLMultiArrayDataType,
};
use objc2_foundation::{NSArray, NSDictionary, NSError, NSInteger, NSNumber, NSString, NSURL};
use worker_gpu::Precision;

use super::{Executor, ExecutorError, ExecutorInfo, strided_offsets};
use crate::artifact::Artifact;
use crate::host::{GraphInputs, GraphOutputs};

/// Predictions per side of the placement probe.
const PROBE_RUNS: usize = 5;

/// One model per bucket, as Core ML loaded it with CPU and Neural Engine.
pub struct CoreMlExecutor {
    models: BTreeMap<u32, Bucket>,
}

struct Bucket {
    model: Retained<MLModel>,
    /// The compiled model, for the probe's CPU-only twin.
    compiled: PathBuf,
    hidden: usize,
}

// SAFETY: Core ML documents MLModel predictions as thread-safe; beyond that, the harness owns the
// engine on one thread and calls it one prediction at a time, so these objects are moved to that
// thread once (at load) and never used from two threads at once.
unsafe impl Send for CoreMlExecutor {}

fn runtime(what: &str, error: &NSError) -> ExecutorError {
    ExecutorError::Runtime(format!("Core ML: {what}: {}", error.localizedDescription()))
}

impl CoreMlExecutor {
    /// Compiles (or finds in `cache_dir`) and loads every bucket's artifact.
    pub fn load(artifacts: &[Artifact], cache_dir: &Path) -> Result<Self, ExecutorError> {
        let mut models = BTreeMap::new();
        for artifact in artifacts {
            let (compiled, model) = autoreleasepool(|_| {
                let compiled = compiled_model(&artifact.package(), &artifact.manifest.tree_sha256, cache_dir)?;
                let model = load_model(&compiled, MLComputeUnits::CPUAndNeuralEngine)?;
                Ok::<_, ExecutorError>((compiled, model))
            })?;
            models.insert(
                artifact.manifest.bucket,
                Bucket {
                    model,
                    compiled,
                    hidden: artifact.manifest.hidden_size as usize,
                },
            );
        }
        Ok(Self { models })
    }
}

/// `<cache>/<tree_sha256>.mlmodelc`, compiling the package into it on first use. Loading a package
/// directly would recompile it in every process (tens of seconds); the tree hash names exactly the
/// package that was verified, so a cached model is reused only for identical bytes.
fn compiled_model(package: &Path, tree: &str, cache_dir: &Path) -> Result<PathBuf, ExecutorError> {
    let target = cache_dir.join(format!("{tree}.mlmodelc"));
    if target.is_dir() {
        return Ok(target);
    }
    let io = |what: &str, e: std::io::Error| ExecutorError::Runtime(format!("{what}: {e}"));
    std::fs::create_dir_all(cache_dir).map_err(|e| io(&cache_dir.display().to_string(), e))?;
    let url = NSURL::from_directory_path(package)
        .ok_or_else(|| ExecutorError::Runtime(format!("{}: not a usable path", package.display())))?;
    let started = Instant::now();
    // The synchronous call is deprecated for apps on a main thread; here it runs once per package on
    // the engine thread, before the worker is ready, which is exactly when it should block.
    #[allow(deprecated)]
    let compiled = unsafe { MLModel::compileModelAtURL_error(&url) }
        .map_err(|e| runtime(&format!("compiling {}", package.display()), &e))?;
    let compiled = compiled
        .to_file_path()
        .ok_or_else(|| ExecutorError::Runtime("Core ML returned a compiled model that is not a file".into()))?;
    tracing::info!(package = %package.display(), ms = started.elapsed().as_secs_f64() * 1e3, "compiled Core ML package");
    // Core ML compiles into a temporary directory; stage beside the target, then rename into place so
    // a crash never leaves a half-copied model under the final name.
    let staging = cache_dir.join(format!(".{tree}.{}.tmp", std::process::id()));
    let _ = std::fs::remove_dir_all(&staging);
    if std::fs::rename(&compiled, &staging).is_err() {
        copy_dir(&compiled, &staging).map_err(|e| io(&staging.display().to_string(), e))?;
        let _ = std::fs::remove_dir_all(&compiled);
    }
    if let Err(e) = std::fs::rename(&staging, &target) {
        let _ = std::fs::remove_dir_all(&staging);
        // Another worker may have finished the same compile first.
        if !target.is_dir() {
            return Err(io(&target.display().to_string(), e));
        }
    }
    Ok(target)
}

fn copy_dir(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let destination = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_dir(&entry.path(), &destination)?;
        } else {
            std::fs::copy(entry.path(), destination)?;
        }
    }
    Ok(())
}

fn load_model(compiled: &Path, units: MLComputeUnits) -> Result<Retained<MLModel>, ExecutorError> {
    let url = NSURL::from_directory_path(compiled)
        .ok_or_else(|| ExecutorError::Runtime(format!("{}: not a usable path", compiled.display())))?;
    unsafe {
        let configuration = MLModelConfiguration::new();
        configuration.setComputeUnits(units);
        MLModel::modelWithContentsOfURL_configuration_error(&url, &configuration)
    }
    .map_err(|e| runtime(&format!("loading {}", compiled.display()), &e))
}

fn numbers(values: &[usize]) -> Retained<NSArray<NSNumber>> {
    let numbers: Vec<Retained<NSNumber>> = values.iter().map(|&v| NSNumber::new_isize(v as isize)).collect();
    NSArray::from_retained_slice(&numbers)
}

fn isizes(array: &NSArray<NSNumber>) -> Vec<isize> {
    array.iter().map(|n| n.as_isize()).collect()
}

/// An FP16 array of `shape` holding `values` (row-major), written through the array's own strides.
fn fp16_array(name: &str, shape: &[usize], values: &[f32]) -> Result<Retained<MLMultiArray>, ExecutorError> {
    let array = unsafe {
        MLMultiArray::initWithShape_dataType_error(
            MLMultiArray::alloc(),
            &numbers(shape),
            MLMultiArrayDataType::Float16,
        )
    }
    .map_err(|e| runtime(&format!("allocating input {name}"), &e))?;
    let written = Cell::new(false);
    let block = RcBlock::new(
        |bytes: NonNull<c_void>, size: NSInteger, strides: NonNull<NSArray<NSNumber>>| {
            // SAFETY: Core ML passes the array's strides, valid for the duration of the block.
            let strides = isizes(unsafe { strides.as_ref() });
            let capacity = usize::try_from(size).unwrap_or(0) / 2;
            if let Some(offsets) = strided_offsets(shape, &strides, capacity) {
                let data = bytes.cast::<u16>().as_ptr();
                for (&offset, &value) in offsets.iter().zip(values) {
                    // SAFETY: every offset is below the buffer's size in FP16 elements (checked above).
                    unsafe { data.add(offset).write(f16::from_f32(value).to_bits()) };
                }
                written.set(true);
            }
        },
    );
    unsafe { array.getMutableBytesWithHandler(&block) };
    if written.get() {
        Ok(array)
    } else {
        Err(ExecutorError::Runtime(format!(
            "Core ML: input {name}: the array's layout does not fit shape {shape:?}"
        )))
    }
}

/// The values of output `name` (FP16 or FP32), row-major, read through its strides.
fn read_output(
    outputs: &ProtocolObject<dyn MLFeatureProvider>,
    name: &str,
    shape: &[usize],
) -> Result<Vec<f32>, ExecutorError> {
    let missing = || ExecutorError::Runtime(format!("Core ML: the prediction has no array output {name}"));
    let array = unsafe { outputs.featureValueForName(&NSString::from_str(name)) }
        .and_then(|value| unsafe { value.multiArrayValue() })
        .ok_or_else(missing)?;
    let (shape_found, strides) = unsafe { (array.shape(), array.strides()) };
    let found: Vec<usize> = isizes(&shape_found).iter().map(|&d| d.unsigned_abs()).collect();
    let count: usize = shape.iter().product();
    if found.iter().product::<usize>() != count {
        return Err(ExecutorError::Runtime(format!(
            "Core ML: output {name} has shape {found:?}, expected {shape:?}"
        )));
    }
    let strides = isizes(&strides);
    let data_type = unsafe { array.dataType() };
    let width = match data_type {
        t if t == MLMultiArrayDataType::Float16 => 2,
        t if t == MLMultiArrayDataType::Float32 => 4,
        other => {
            return Err(ExecutorError::Runtime(format!(
                "Core ML: output {name} has data type {other:?}; expected FP16 or FP32"
            )));
        }
    };
    let values = std::cell::RefCell::new(Vec::new());
    let block = RcBlock::new(|bytes: NonNull<c_void>, size: NSInteger| {
        let capacity = usize::try_from(size).unwrap_or(0) / width;
        let Some(offsets) = strided_offsets(&found, &strides, capacity) else {
            return;
        };
        let read = offsets.iter().map(|&offset| {
            // SAFETY: every offset is below the buffer's size in elements (checked above).
            unsafe {
                if width == 2 {
                    f16::from_bits(bytes.cast::<u16>().as_ptr().add(offset).read()).to_f32()
                } else {
                    bytes.cast::<f32>().as_ptr().add(offset).read()
                }
            }
        });
        *values.borrow_mut() = read.collect();
    });
    unsafe { array.getBytesWithHandler(&block) };
    // The block borrows `values` until it is dropped (block2 drops its closure with it).
    drop(block);
    let values = values.into_inner();
    if values.len() == count {
        Ok(values)
    } else {
        Err(ExecutorError::Runtime(format!(
            "Core ML: output {name}: strides {strides:?} do not fit shape {found:?}"
        )))
    }
}

fn as_object(value: &MLFeatureValue) -> &AnyObject {
    value
}

fn predict_with(model: &MLModel, hidden: usize, inputs: &GraphInputs) -> Result<GraphOutputs, ExecutorError> {
    let mut names = Vec::with_capacity(5);
    let mut values = Vec::with_capacity(5);
    for ((name, shape), (_, data)) in GraphInputs::shapes(hidden, inputs.bucket).iter().zip(inputs.named()) {
        names.push(NSString::from_str(name));
        let array = fp16_array(name, shape, data)?;
        values.push(unsafe { MLFeatureValue::featureValueWithMultiArray(&array) });
    }
    let keys: Vec<&NSString> = names.iter().map(|n| &**n).collect();
    let objects: Vec<&AnyObject> = values.iter().map(|v| as_object(v)).collect();
    let dictionary: Retained<NSDictionary<NSString, AnyObject>> = NSDictionary::from_slices(&keys, &objects);
    let provider = unsafe {
        MLDictionaryFeatureProvider::initWithDictionary_error(MLDictionaryFeatureProvider::alloc(), &dictionary)
    }
    .map_err(|e| runtime("building the inputs", &e))?;
    let outputs = unsafe { model.predictionFromFeatures_error(ProtocolObject::from_ref(&*provider)) }
        .map_err(|e| runtime("prediction", &e))?;
    let [(logits_name, logits_shape), (cls_name, cls_shape)] = GraphOutputs::shapes(hidden);
    Ok(GraphOutputs {
        logits: read_output(&outputs, logits_name, &logits_shape)?,
        cls: read_output(&outputs, cls_name, &cls_shape)?,
    })
}

/// Fastest of [`PROBE_RUNS`] predictions, in milliseconds.
fn fastest_ms(model: &MLModel, hidden: usize, inputs: &GraphInputs) -> Result<f64, ExecutorError> {
    let mut fastest = f64::INFINITY;
    for _ in 0..PROBE_RUNS {
        let started = Instant::now();
        autoreleasepool(|_| predict_with(model, hidden, inputs))?;
        fastest = fastest.min(started.elapsed().as_secs_f64() * 1e3);
    }
    Ok(fastest)
}

impl Executor for CoreMlExecutor {
    fn info(&self) -> ExecutorInfo {
        ExecutorInfo {
            name: "coreml",
            device: "ane",
            precision: Precision::F16,
        }
    }

    fn predict(&mut self, bucket: u32, inputs: &GraphInputs) -> Result<GraphOutputs, ExecutorError> {
        let loaded = self.models.get(&bucket).ok_or(ExecutorError::UnknownBucket(bucket))?;
        if inputs.bucket != bucket || inputs.hidden != loaded.hidden {
            return Err(ExecutorError::Shape {
                bucket,
                hidden: inputs.hidden,
                problem: format!("the graph takes hidden size {}", loaded.hidden),
            });
        }
        autoreleasepool(|_| predict_with(&loaded.model, loaded.hidden, inputs))
    }

    fn placement_probe(&mut self, bucket: u32, inputs: &GraphInputs) -> Result<Option<PlacementReport>, ExecutorError> {
        let loaded = self.models.get(&bucket).ok_or(ExecutorError::UnknownBucket(bucket))?;
        let fastest = fastest_ms(&loaded.model, loaded.hidden, inputs)?;
        let cpu_only_fastest = autoreleasepool(|_| {
            let cpu_only = load_model(&loaded.compiled, MLComputeUnits::CPUOnly)?;
            fastest_ms(&cpu_only, loaded.hidden, inputs)
        })?;
        Ok(Some(PlacementReport {
            bucket,
            fastest_ms: fastest,
            cpu_only_fastest_ms: cpu_only_fastest,
        }))
    }
}
