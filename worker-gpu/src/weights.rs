//! Reading `model.safetensors` strictly: every tensor the model asks for must exist with exactly the
//! shape the configs imply, and every tensor in the file must be asked for (upstream's strict load).
//!
//! The file is mapped, not read into memory, and hashed (the SHA-256 Describe reports) on a thread
//! of its own while the model is built, both reading through the page cache. Each tensor is decoded
//! from the mapping when it is taken — straight into float32 by the pool's threads where the CPU
//! takes float32 (every CPU load but an f16 one), else in its file dtype and converted once on the
//! way to the device — and its mapped pages released: neither the decoded copies of the tensors not
//! yet taken nor the file are ever all in the worker's memory, so a load that finishes each matrix
//! as it is read ([`crate::model::MatrixFormat`]) holds about one layer's float32 weights at a
//! time. On a start-up profile (full-size checkpoint, 2 vCPUs) half the CPU time was the kernel
//! zeroing fresh pages, so every copy not made counts: the file's copy in memory (0.84 GB for
//! ModernBERT-large in f16) is one such.

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;
use std::time::Instant;

use candle_core::safetensors::Load;
use candle_core::{DType, Device, Tensor};
use safetensors::SafeTensors;
use safetensors::tensor::TensorView;

use crate::error::LoadError;

/// The tensors of one weights file, handed out one by one to the blocks that own them.
pub(crate) struct Weights {
    path: PathBuf,
    bytes: memmap2::Mmap,
    /// The file's SHA-256, once known.
    sha256: String,
    /// The thread computing it, until [`Weights::sha256`] joins it.
    hashing: Option<JoinHandle<(Result<String, LoadError>, f64)>>,
    /// Where each tensor not yet taken lies in `bytes`.
    tensors: BTreeMap<String, Stored>,
    device: Device,
}

/// One tensor's place in the file.
struct Stored {
    dtype: safetensors::Dtype,
    shape: Vec<usize>,
    bytes: Range<usize>,
}

impl Weights {
    /// Maps the safetensors file at `path` and reads its header; hashes the file on a thread of its
    /// own unless `sha256` gives the hash already. `device` is where taken tensors go.
    pub(crate) fn read(path: &Path, device: &Device, sha256: Option<String>) -> Result<Self, LoadError> {
        let failed = |source: candle_core::Error| LoadError::Tensor {
            path: path.to_path_buf(),
            source,
        };
        let reading = Instant::now();
        let bytes = map(path).map_err(|e| failed(e.into()))?;
        let header = SafeTensors::deserialize(&bytes)
            .map_err(|e| failed(candle_core::Error::Msg(format!("not a complete safetensors file: {e}"))))?;
        let base = bytes.as_ptr() as usize;
        let tensors = header
            .tensors()
            .into_iter()
            .map(|(name, view)| {
                // The view's data is a slice of `bytes`: its place is its offset from the start.
                let start = view.data().as_ptr() as usize - base;
                let stored = Stored {
                    dtype: view.dtype(),
                    shape: view.shape().to_vec(),
                    bytes: start..start + view.data().len(),
                };
                (name, stored)
            })
            .collect();
        let hashing = match sha256 {
            Some(_) => None,
            None => {
                let file = path.to_path_buf();
                let thread = std::thread::Builder::new()
                    .name("weights-sha256".into())
                    .spawn(move || {
                        let started = Instant::now();
                        let sha256 = file_sha256(&file);
                        (sha256, started.elapsed().as_secs_f64() * 1e3)
                    })
                    .map_err(|e| failed(candle_core::Error::Msg(format!("cannot start the hashing thread: {e}"))))?;
                Some(thread)
            }
        };
        tracing::info!(
            path = %path.display(),
            read_ms = reading.elapsed().as_secs_f64() * 1e3,
            "weights mapped, header read"
        );
        Ok(Self {
            path: path.to_path_buf(),
            bytes,
            sha256: sha256.unwrap_or_default(),
            hashing,
            tensors,
            device: device.clone(),
        })
    }

    /// Lower-case hex SHA-256 of the file, waiting for its hashing to end.
    pub(crate) fn sha256(&mut self) -> Result<String, LoadError> {
        if let Some(thread) = self.hashing.take() {
            let (sha256, hash_ms) = thread.join().map_err(|_| LoadError::Tensor {
                path: self.path.clone(),
                source: candle_core::Error::Msg("hashing the weights panicked".to_owned()),
            })?;
            tracing::info!(path = %self.path.display(), hash_ms, "weights hashed");
            self.sha256 = sha256?;
        }
        Ok(self.sha256.clone())
    }

    /// The device taken tensors are placed on.
    pub(crate) fn device(&self) -> &Device {
        &self.device
    }

    /// The shape of tensor `name` as stored, without taking it (for sizes the configs do not give).
    pub(crate) fn shape_of(&self, name: &str) -> Result<Vec<usize>, LoadError> {
        self.tensors
            .get(name)
            .map(|t| t.shape.clone())
            .ok_or_else(|| self.missing(name))
    }

    /// The dtype of tensor `name` as stored, without taking it.
    pub(crate) fn dtype_of(&self, name: &str) -> Result<DType, LoadError> {
        let stored = self.tensors.get(name).ok_or_else(|| self.missing(name))?;
        self.float_dtype(name, stored.dtype)
    }

    /// Takes tensor `name`, checking its shape, decoded from the file, converted to `dtype` and
    /// placed on the device (each tensor is taken once).
    pub(crate) fn take(&mut self, name: &str, shape: &[usize], dtype: DType) -> Result<Tensor, LoadError> {
        let stored = self.tensors.remove(name).ok_or_else(|| self.missing(name))?;
        self.float_dtype(name, stored.dtype)?;
        if stored.shape != shape {
            return Err(LoadError::TensorShape {
                path: self.path.clone(),
                tensor: name.to_owned(),
                expected: shape.to_vec(),
                found: stored.shape,
            });
        }
        let failed = |source: candle_core::Error| LoadError::Tensor {
            path: self.path.clone(),
            source,
        };
        let bytes = &self.bytes[stored.bytes.clone()];
        let placed = if dtype == DType::F32 && self.device.is_cpu() {
            // Every CPU load of float32 matrices (int8 and bf16 are made from them): decoded
            // straight into float32 by the pool's threads. candle's way — the stored tensor copied
            // out, then converted one value at a time on one thread — was 1.5 of the 2.5 s an f16
            // ModernBERT-large took to load on 2 Zen 4 cores.
            let values = decode_f32(stored.dtype, bytes).ok_or_else(|| {
                failed(candle_core::Error::Msg(format!(
                    "'{name}': {} bytes are not a whole number of {:?} values",
                    bytes.len(),
                    stored.dtype
                )))
            })?;
            Tensor::from_vec(values, stored.shape.as_slice(), &Device::Cpu).map_err(failed)?
        } else {
            let view = TensorView::new(stored.dtype, stored.shape, bytes)
                .map_err(|e| failed(candle_core::Error::Msg(format!("{name}: {e}"))))?;
            let tensor = view.load(&Device::Cpu).map_err(failed)?;
            tensor
                .to_dtype(dtype)
                .and_then(|t| t.to_device(&self.device))
                .map_err(failed)?
        };
        self.release(stored.bytes);
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

    /// Drops the mapping's pages of `bytes` (a tensor decoded) from this process's resident memory:
    /// the file stays in the page cache, and the whole file mapped would otherwise count in the
    /// worker's memory until the model is built. Best effort: a refusal leaves the pages mapped.
    #[allow(unsafe_code)]
    fn release(&self, bytes: Range<usize>) {
        // SAFETY: the mapping is shared, read-only and of a file nobody writes (see `map`): after
        // `MADV_DONTNEED` a read of these bytes faults the same contents back in from the file, so
        // a reference into the mapping (none is left once the tensor is decoded) could not see
        // them change. memmap2 rounds the start down to a page.
        let _ = unsafe {
            self.bytes
                .unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, bytes.start, bytes.len())
        };
    }

    /// `stored` as candle's dtype where it is a float the model can take (F32, F16, BF16).
    fn float_dtype(&self, name: &str, stored: safetensors::Dtype) -> Result<DType, LoadError> {
        match stored {
            safetensors::Dtype::F32 => Ok(DType::F32),
            safetensors::Dtype::F16 => Ok(DType::F16),
            safetensors::Dtype::BF16 => Ok(DType::BF16),
            other => Err(LoadError::TensorDtype {
                path: self.path.clone(),
                tensor: name.to_owned(),
                dtype: format!("{other:?}").to_uppercase(),
            }),
        }
    }

    fn missing(&self, name: &str) -> LoadError {
        LoadError::MissingTensor {
            path: self.path.clone(),
            tensor: name.to_owned(),
        }
    }
}

/// `bytes` of a stored F32, F16 or BF16 tensor (little-endian, as safetensors keeps them) as float32
/// values, decoded in parallel on the current rayon pool; `None` for another dtype or a length that
/// is not a whole number of values. Every conversion is exact, so the values are candle's
/// `to_dtype`'s.
fn decode_f32(dtype: safetensors::Dtype, bytes: &[u8]) -> Option<Vec<f32>> {
    use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};
    use rayon::prelude::*;

    /// Values a task decodes: enough to outweigh a task's overhead, few enough that the smallest
    /// matrix of ModernBERT-base or -large (768² or 1024² values) splits into 9 or 16 tasks.
    const TASK: usize = 1 << 16;
    /// Values converted at a time through a stack buffer (the bytes need not be aligned for `u16`).
    const RUN: usize = 1024;
    let width = match dtype {
        safetensors::Dtype::F32 => 4,
        safetensors::Dtype::F16 | safetensors::Dtype::BF16 => 2,
        _ => return None,
    };
    if !bytes.len().is_multiple_of(width) {
        return None;
    }
    let mut values = vec![0f32; bytes.len() / width];
    values
        .par_chunks_mut(TASK)
        .zip(bytes.par_chunks(TASK * width))
        .for_each(|(out, stored)| match dtype {
            safetensors::Dtype::F32 => {
                for (value, word) in out.iter_mut().zip(stored.chunks_exact(4)) {
                    *value = f32::from_le_bytes([word[0], word[1], word[2], word[3]]);
                }
            }
            safetensors::Dtype::BF16 => {
                // A bf16 is a float32's upper half.
                for (value, half) in out.iter_mut().zip(stored.chunks_exact(2)) {
                    *value = f32::from_bits(u32::from(u16::from_le_bytes([half[0], half[1]])) << 16);
                }
            }
            _ => {
                // F16: through `half`'s slice conversion, which uses F16C where the CPU has it.
                let mut bits = [0u16; RUN];
                for (out, stored) in out.chunks_mut(RUN).zip(stored.chunks(RUN * 2)) {
                    let bits = &mut bits[..out.len()];
                    for (b, half) in bits.iter_mut().zip(stored.chunks_exact(2)) {
                        *b = u16::from_le_bytes([half[0], half[1]]);
                    }
                    bits.reinterpret_cast::<half::f16>().convert_to_f32_slice(out);
                }
            }
        });
    Some(values)
}

/// Lower-case hex SHA-256 of the file at `path`, read through the page cache (a mapping would count
/// the whole file in the worker's resident memory while it is hashed).
pub(crate) fn file_sha256(path: &Path) -> Result<String, LoadError> {
    laya::checkpoint::sha256_of(path).map_err(|e| LoadError::Tensor {
        path: path.to_path_buf(),
        source: candle_core::Error::Msg(e.to_string()),
    })
}

/// The file at `path`, mapped read-only.
// Mapping a file is `unsafe` in memmap2 because another process could change or truncate it while
// it is mapped: the bytes would change under the hash and the decoder, or a read past a truncated
// end would raise SIGBUS. Checkpoint files are not rewritten in place: `layad fetch` downloads each
// blob to a temporary file and renames it into place (hub/src/lib.rs), which leaves a mapping of
// the old file intact; and the mapping lives only until the model is built.
#[allow(unsafe_code)]
fn map(path: &Path) -> std::io::Result<memmap2::Mmap> {
    let file = std::fs::File::open(path)?;
    // SAFETY: see above: the file is not modified while mapped.
    unsafe { memmap2::Mmap::map(&file) }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    /// A safetensors file of `tensors` in a fresh directory (kept alive by the returned guard).
    fn file(tensors: &[(&str, Tensor)]) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("model.safetensors");
        let tensors: HashMap<String, Tensor> = tensors.iter().map(|(n, t)| ((*n).to_owned(), t.clone())).collect();
        candle_core::safetensors::save(&tensors, &path).expect("write safetensors");
        (dir, path)
    }

    fn f16_matrix(seed: u32, rows: usize, cols: usize) -> Tensor {
        let values: Vec<f32> = (0..rows * cols)
            .map(|i| ((i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) % 2001) as f32 / 1000.0 - 1.0)
            .collect();
        Tensor::from_vec(values, (rows, cols), &Device::Cpu)
            .and_then(|t| t.to_dtype(DType::F16))
            .expect("tensor")
    }

    #[test]
    fn tensors_taken_one_by_one_are_the_file_s_values_and_the_hash_is_the_file_s() {
        // Two seeds: what holds for one set of values must hold for another.
        for seed in [1, 77] {
            let (a, b) = (f16_matrix(seed, 96, 40), f16_matrix(seed + 1, 7, 3));
            let (_dir, path) = file(&[("a", a.clone()), ("b", b.clone())]);
            let expected_sha = laya::checkpoint::sha256_of(&path).expect("hash");
            let mut weights = Weights::read(&path, &Device::Cpu, None).expect("read");
            assert_eq!(weights.dtype_of("a").expect("dtype"), DType::F16);
            assert_eq!(weights.shape_of("b").expect("shape"), vec![7, 3]);
            // Taken in the other order than the file's, converted to f32 once.
            let taken_b = weights.take("b", &[7, 3], DType::F32).expect("take b");
            let taken_a = weights.take("a", &[96, 40], DType::F32).expect("take a");
            for (taken, stored) in [(taken_a, a), (taken_b, b)] {
                let want = stored
                    .to_dtype(DType::F32)
                    .and_then(|t| t.flatten_all()?.to_vec1::<f32>());
                assert_eq!(taken.flatten_all().and_then(|t| t.to_vec1::<f32>()).ok(), want.ok());
            }
            assert_eq!(weights.sha256().expect("hashed"), expected_sha);
            weights.finish().expect("every tensor taken");
            // A hash the caller gives is the one reported (nothing hashed again).
            let mut given = Weights::read(&path, &Device::Cpu, Some("given".to_owned())).expect("read");
            assert_eq!(given.sha256().expect("given"), "given");
        }
    }

    #[test]
    fn float32_is_decoded_from_every_stored_float_dtype_as_candle_converts_it() {
        // More values than one decoding task (2¹⁶) and not a whole number of 1024-value runs, with
        // zeros of both signs, subnormals of f16 and bf16, the largest f16, infinities and NaN.
        let specials = [
            0.0,
            -0.0,
            6.0e-8,
            -3.0e-5,
            65504.0,
            1.0e-39,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
        ];
        for seed in [3u32, 91] {
            let values: Vec<f32> = (0..70_007u32)
                .map(|i| match specials.get((i.wrapping_mul(seed) % 997) as usize) {
                    Some(&special) => special,
                    None => f32::from_bits(i.wrapping_mul(2_654_435_761).wrapping_add(seed)) % 1.0e4,
                })
                .collect();
            let stored = Tensor::from_vec(values, (7, 10_001), &Device::Cpu).expect("tensor");
            for dtype in [DType::F32, DType::F16, DType::BF16] {
                let in_file = stored.to_dtype(dtype).expect("stored dtype");
                let (_dir, path) = file(&[("w", in_file.clone())]);
                let mut weights = Weights::read(&path, &Device::Cpu, Some("given".to_owned())).expect("read");
                let taken = weights.take("w", &[7, 10_001], DType::F32).expect("take");
                let bits = |t: &Tensor| -> Vec<u32> {
                    let values = t.flatten_all().and_then(|t| t.to_vec1::<f32>()).expect("values");
                    values.iter().map(|v| v.to_bits()).collect()
                };
                let want = in_file.to_dtype(DType::F32).expect("candle's conversion");
                assert_eq!(taken.dims(), &[7, 10_001]);
                assert!(
                    bits(&taken) == bits(&want),
                    "{dtype:?}, seed {seed}: not candle's values"
                );
                // Taken in its own dtype, the tensor is the file's.
                let (_dir, path) = file(&[("w", in_file.clone())]);
                let mut weights = Weights::read(&path, &Device::Cpu, Some("given".to_owned())).expect("read");
                let kept = weights.take("w", &[7, 10_001], dtype).expect("take as stored");
                assert_eq!(kept.dtype(), dtype);
                let as_f32 = kept.to_dtype(DType::F32).expect("f32");
                assert!(bits(&as_f32) == bits(&want), "{dtype:?} kept as stored, seed {seed}");
            }
        }
    }

    #[test]
    fn a_wrong_tensor_is_refused_naming_it() {
        let ids = Tensor::new(&[1i64, 2, 3], &Device::Cpu).expect("tensor");
        let (_dir, path) = file(&[("w", f16_matrix(3, 4, 2)), ("ids", ids), ("extra", f16_matrix(5, 2, 2))]);
        let mut weights = Weights::read(&path, &Device::Cpu, None).expect("read");
        let message = |e: LoadError| e.to_string();
        let shape = message(weights.take("w", &[2, 4], DType::F32).expect_err("wrong shape"));
        assert!(shape.contains("'w' has shape [4, 2], expected [2, 4]"), "{shape}");
        let dtype = message(weights.take("ids", &[3], DType::F32).expect_err("integers"));
        assert!(dtype.contains("'ids' is I64"), "{dtype}");
        let missing = message(weights.take("nowhere", &[1], DType::F32).expect_err("missing"));
        assert!(missing.contains("'nowhere' is missing"), "{missing}");
        let left = message(weights.finish().expect_err("one tensor left"));
        assert!(left.contains("unexpected tensor(s) extra"), "{left}");
    }

    #[test]
    fn a_truncated_file_is_refused_naming_it() {
        let (_dir, path) = file(&[("w", f16_matrix(9, 64, 64))]);
        let bytes = std::fs::read(&path).expect("read");
        std::fs::write(&path, &bytes[..bytes.len() - 100]).expect("truncate");
        let refused = Weights::read(&path, &Device::Cpu, None)
            .map(|_| ())
            .expect_err("truncated");
        let message = refused.to_string();
        assert!(message.contains(&path.display().to_string()), "{message}");
        assert!(message.contains("not a complete safetensors file"), "{message}");
    }
}
