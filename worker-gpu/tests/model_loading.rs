//! Loading broken copies of the fixture checkpoint: a removed, renamed, reshaped, surplus or
//! integer tensor, or a head depth the file does not have, fails with an error naming the tensor;
//! and edited ones that must load: other storage dtypes.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use laya::checkpoint::{Checkpoint, Location, find_in_hf_cache};
use laya::routing::CheckpointName;
use layad_proto::Row;
use worker_gpu::{CandleEngine, DeviceRequest, EngineOptions, LayaModel, LoadError, MatrixFormat};

fn fixture_dir(name: CheckpointName) -> PathBuf {
    let cache = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/hf-cache/hub"));
    find_in_hf_cache(&cache, name).expect("fixture checkpoint").dir
}

/// Copies a checkpoint directory (following the cache's symlinks, skipping nested checkpoints).
fn copy_checkpoint(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for entry in std::fs::read_dir(from).expect("read_dir") {
        let entry = entry.expect("entry");
        let target = to.join(entry.file_name());
        if entry.path().is_dir() {
            if entry.path().join("rl_agent_config.json").exists() {
                continue;
            }
            copy_checkpoint(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).expect("copy");
        }
    }
}

/// The english fixture with its weights edited by `edit` and its agent config by `config`.
fn broken_checkpoint(
    edit: impl FnOnce(&mut HashMap<String, Tensor>),
    config: impl FnOnce(&mut serde_json::Value),
) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    copy_checkpoint(&fixture_dir(CheckpointName::English), dir.path());
    let weights_path = dir.path().join("model.safetensors");
    let mut tensors = candle_core::safetensors::load(&weights_path, &Device::Cpu).expect("read weights");
    edit(&mut tensors);
    candle_core::safetensors::save(&tensors, &weights_path).expect("write weights");
    let config_path = dir.path().join("rl_agent_config.json");
    let mut value: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&config_path).expect("config")).expect("json");
    config(&mut value);
    std::fs::write(&config_path, value.to_string()).expect("write config");
    dir
}

fn load_error(dir: &Path) -> String {
    let options = EngineOptions {
        device: DeviceRequest::Cpu,
        ..EngineOptions::default()
    };
    match CandleEngine::load(&[("english".to_owned(), Location::directory(dir))], options) {
        Ok(_) => panic!("loading {} should fail", dir.display()),
        Err(e) => {
            assert!(
                !matches!(e, LoadError::Checkpoint { .. }),
                "failed before the weights were read: {e}"
            );
            e.to_string()
        }
    }
}

#[test]
fn the_unedited_copy_loads() {
    let dir = broken_checkpoint(|_| {}, |_| {});
    let options = EngineOptions {
        device: DeviceRequest::Cpu,
        ..EngineOptions::default()
    };
    CandleEngine::load(&[("english".to_owned(), Location::directory(dir.path()))], options).expect("loads");
}

#[test]
fn a_missing_tensor_is_named() {
    let dir = broken_checkpoint(
        |t| {
            t.remove("encoder.layers.2.mlp.Wi.weight").expect("present");
        },
        |_| {},
    );
    let message = load_error(dir.path());
    assert!(
        message.contains("tensor 'encoder.layers.2.mlp.Wi.weight' is missing"),
        "{message}"
    );
    assert!(message.contains("model.safetensors"), "{message}");
}

#[test]
fn a_renamed_tensor_is_named() {
    let dir = broken_checkpoint(
        |t| {
            let w = t.remove("scorer.1.weight").expect("present");
            t.insert("scorer.1.weights".to_owned(), w);
        },
        |_| {},
    );
    let message = load_error(dir.path());
    assert!(message.contains("tensor 'scorer.1.weight' is missing"), "{message}");
}

#[test]
fn a_misshaped_tensor_is_named_with_both_shapes() {
    let dir = broken_checkpoint(
        |t| {
            let w = t.get("encoder.layers.1.attn.Wqkv.weight").expect("present");
            let narrowed = w.narrow(1, 0, 64).and_then(|w| w.contiguous()).expect("narrow");
            t.insert("encoder.layers.1.attn.Wqkv.weight".to_owned(), narrowed);
        },
        |_| {},
    );
    let message = load_error(dir.path());
    assert!(
        message.contains("tensor 'encoder.layers.1.attn.Wqkv.weight' has shape [384, 64], expected [384, 128]"),
        "{message}"
    );
}

#[test]
fn a_surplus_tensor_is_named() {
    // Layer 0 has no attention norm upstream (an identity), so a file with one does not load strictly.
    let dir = broken_checkpoint(
        |t| {
            let norm = t.get("encoder.layers.1.attn_norm.weight").expect("present").clone();
            t.insert("encoder.layers.0.attn_norm.weight".to_owned(), norm);
        },
        |_| {},
    );
    let message = load_error(dir.path());
    assert!(
        message.contains("unexpected tensor(s) encoder.layers.0.attn_norm.weight"),
        "{message}"
    );
}

#[test]
fn an_integer_tensor_is_named() {
    let dir = broken_checkpoint(
        |t| {
            let ints = Tensor::new(&[1i64, 1, 1], &Device::Cpu).expect("tensor");
            t.insert("temperature".to_owned(), ints);
        },
        |_| {},
    );
    let message = load_error(dir.path());
    assert!(message.contains("tensor 'temperature' is I64"), "{message}");
}

#[test]
fn head_layers_come_from_the_config() {
    let deeper = broken_checkpoint(|_| {}, |c| c["head_layers"] = 3.into());
    let message = load_error(deeper.path());
    assert!(
        message.contains("tensor 'head.layers.2.") && message.ends_with("' is missing"),
        "{message}"
    );
    let shallower = broken_checkpoint(|_| {}, |c| c["head_layers"] = 1.into());
    let message = load_error(shallower.path());
    assert!(message.contains("unexpected tensor(s) head.layers.1."), "{message}");
}

#[test]
fn f32_and_bf16_files_load_like_f16() {
    for dtype in [DType::F32, DType::BF16] {
        let dir = broken_checkpoint(
            |t| {
                for tensor in t.values_mut() {
                    *tensor = tensor.to_dtype(dtype).expect("convert");
                }
            },
            |_| {},
        );
        let options = EngineOptions {
            device: DeviceRequest::Cpu,
            ..EngineOptions::default()
        };
        CandleEngine::load(&[("english".to_owned(), Location::directory(dir.path()))], options)
            .unwrap_or_else(|e| panic!("{dtype:?} weights: {e}"));
    }
}

/// An embedding table stored in f16 or bf16 is kept so (half the memory of converting it at load)
/// and answers exactly as the same values stored in f32: the norm after the gather converts each
/// row exactly. Checked on the gate's rows, with the matrices in float32, int8 and (where the CPU
/// has the bf16 kernels: AVX-512) bf16.
#[test]
fn a_half_precision_embedding_table_answers_like_its_f32_copy() {
    const TABLE: &str = "encoder.embeddings.tok_embeddings.weight";
    let kernels = worker_gpu::CpuKernels::detect();
    let mut formats = vec![MatrixFormat::Float32, MatrixFormat::Int8];
    if layad_cpu_kernels::bf16::Bf16Kernel::for_family(kernels).is_some() {
        formats.push(MatrixFormat::Bf16);
    }
    for stored in [DType::F16, DType::BF16] {
        // The same values (rounded to `stored` once), stored as `file`.
        let copy = |file: DType| {
            broken_checkpoint(
                |t| {
                    let table = t.get_mut(TABLE).expect("the embedding table");
                    *table = table.to_dtype(stored).and_then(|x| x.to_dtype(file)).expect("convert");
                },
                |_| {},
            )
        };
        let (half, full) = (copy(stored), copy(DType::F32));
        let open = |dir: &Path| Checkpoint::open(Location::directory(dir)).expect("open");
        let (half, full) = (open(half.path()), open(full.path()));
        let rows: Vec<Row> = worker_gpu::gate::gate_batches(&half).expect("rows").concat();
        for &format in &formats {
            let answers = |checkpoint: &Checkpoint| {
                LayaModel::load_reduced("english", checkpoint, kernels, format, None)
                    .expect("load")
                    .forward(&rows)
                    .expect("forward")
            };
            assert_eq!(answers(&half), answers(&full), "{stored:?} table, {format:?} matrices");
        }
    }
}
