//! Reading `model.safetensors` strictly: every tensor the model asks for must exist with exactly the
//! shape the configs imply, and every tensor in the file must be asked for (upstream's strict load).
//!
//! The file is mapped, not read into memory: its bytes are hashed (the SHA-256 Describe reports) on
//! a thread of their own while the same bytes are decoded, both reading through the page cache.
//! Tensors are decoded on the CPU in their file dtype and converted once, on the way to the device;
//! a decoded tensor is dropped as soon as it is taken. On a start-up profile (full-size checkpoint,
//! 2 vCPUs) half the CPU time was the kernel zeroing fresh pages, so every copy not made counts:
//! the file's copy in memory (0.84 GB for ModernBERT-large in f16) is one such.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use candle_core::{DType, Device, Tensor};

use crate::error::LoadError;

/// The tensors of one weights file, handed out one by one to the blocks that own them.
pub(crate) struct Weights {
    path: PathBuf,
    sha256: String,
    tensors: BTreeMap<String, Tensor>,
    device: Device,
}

impl Weights {
    /// Reads the safetensors file at `path`, hashes it and decodes every tensor; `device` is where
    /// taken tensors go.
    pub(crate) fn read(path: &Path, device: &Device) -> Result<Self, LoadError> {
        let failed = |source: candle_core::Error| LoadError::Tensor {
            path: path.to_path_buf(),
            source,
        };
        let reading = Instant::now();
        let bytes = map(path).map_err(|e| failed(e.into()))?;
        let bytes: &[u8] = &bytes;
        // Opening and mapping only: the disk is read by the hashing and decoding below.
        let read_ms = reading.elapsed().as_secs_f64() * 1e3;
        let (tensors, hashed) = std::thread::scope(|scope| {
            let hashing = std::thread::Builder::new()
                .name("weights-sha256".into())
                .spawn_scoped(scope, || {
                    let started = Instant::now();
                    let sha256 = laya::checkpoint::sha256_hex(bytes);
                    (sha256, started.elapsed().as_secs_f64() * 1e3)
                });
            let decoding = Instant::now();
            let tensors = candle_core::safetensors::load_buffer(bytes, &Device::Cpu);
            let decode_ms = decoding.elapsed().as_secs_f64() * 1e3;
            let hashed = match hashing {
                Ok(thread) => thread.join().map_err(|_| "hashing the weights panicked".to_owned()),
                Err(e) => Err(format!("cannot start the hashing thread: {e}")),
            };
            (tensors, hashed.map(|(sha256, hash_ms)| (sha256, hash_ms, decode_ms)))
        });
        let tensors = tensors.map_err(failed)?;
        let (sha256, hash_ms, decode_ms) = hashed.map_err(|e| failed(candle_core::Error::Msg(e)))?;
        tracing::info!(
            path = %path.display(),
            read_ms,
            decode_ms,
            hash_ms,
            "weights read, decoded and hashed"
        );
        Ok(Self {
            path: path.to_path_buf(),
            sha256,
            tensors: tensors.into_iter().collect(),
            device: device.clone(),
        })
    }

    /// Lower-case hex SHA-256 of the bytes that were read.
    pub(crate) fn sha256(&self) -> &str {
        &self.sha256
    }

    /// The device taken tensors are placed on.
    pub(crate) fn device(&self) -> &Device {
        &self.device
    }

    /// The shape of tensor `name` as stored, without taking it (for sizes the configs do not give).
    pub(crate) fn shape_of(&self, name: &str) -> Result<Vec<usize>, LoadError> {
        self.tensors
            .get(name)
            .map(|t| t.dims().to_vec())
            .ok_or_else(|| self.missing(name))
    }

    /// The dtype of tensor `name` as stored, without taking it.
    pub(crate) fn dtype_of(&self, name: &str) -> Result<DType, LoadError> {
        self.tensors
            .get(name)
            .map(Tensor::dtype)
            .ok_or_else(|| self.missing(name))
    }

    /// Takes tensor `name`, checking its shape, converted to `dtype` and placed on the device; the
    /// decoded copy is dropped (each tensor is taken once).
    pub(crate) fn take(&mut self, name: &str, shape: &[usize], dtype: DType) -> Result<Tensor, LoadError> {
        let tensor = self.tensors.remove(name).ok_or_else(|| self.missing(name))?;
        if !matches!(tensor.dtype(), DType::F32 | DType::F16 | DType::BF16) {
            return Err(LoadError::TensorDtype {
                path: self.path.clone(),
                tensor: name.to_owned(),
                dtype: format!("{:?}", tensor.dtype()).to_uppercase(),
            });
        }
        if tensor.dims() != shape {
            return Err(LoadError::TensorShape {
                path: self.path.clone(),
                tensor: name.to_owned(),
                expected: shape.to_vec(),
                found: tensor.dims().to_vec(),
            });
        }
        let placed = tensor
            .to_dtype(dtype)
            .and_then(|t| t.to_device(&self.device))
            .map_err(|source| LoadError::Tensor {
                path: self.path.clone(),
                source,
            })?;
        Ok(placed)
    }

    /// Fails when the file holds tensors nobody took.
    pub(crate) fn finish(self) -> Result<(), LoadError> {
        let unexpected: Vec<String> = self.tensors.into_keys().collect();
        if unexpected.is_empty() {
            Ok(())
        } else {
            Err(LoadError::UnexpectedTensors {
                path: self.path,
                tensors: unexpected,
            })
        }
    }

    fn missing(&self, name: &str) -> LoadError {
        LoadError::MissingTensor {
            path: self.path.clone(),
            tensor: name.to_owned(),
        }
    }
}

/// The file at `path`, mapped read-only.
// Mapping a file is `unsafe` in memmap2 because another process could change or truncate it while
// it is mapped: the bytes would change under the hash and the decoder, or a read past a truncated
// end would raise SIGBUS. Checkpoint files are not rewritten in place: `layad fetch` downloads each
// blob to a temporary file and renames it into place (hub/src/lib.rs), which leaves a mapping of
// the old file intact; and the mapping lives only until the tensors are decoded.
#[allow(unsafe_code)]
fn map(path: &Path) -> std::io::Result<memmap2::Mmap> {
    let file = std::fs::File::open(path)?;
    // SAFETY: see above: the file is not modified while mapped.
    unsafe { memmap2::Mmap::map(&file) }
}
