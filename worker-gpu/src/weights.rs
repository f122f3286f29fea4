//! Reading `model.safetensors` strictly: every tensor the model asks for must exist with exactly the
//! shape the configs imply, and every tensor in the file must be asked for (upstream's strict load).
//!
//! Tensors are decoded on the CPU in their file dtype and converted once, on the way to the device.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};

use crate::error::LoadError;

/// The tensors of one weights file, handed out one by one to the blocks that own them.
pub(crate) struct Weights {
    path: PathBuf,
    tensors: BTreeMap<String, Tensor>,
    taken: BTreeSet<String>,
    device: Device,
}

impl Weights {
    /// Decodes every tensor of the safetensors file at `path`; `device` is where taken tensors go.
    pub(crate) fn read(path: &Path, device: &Device) -> Result<Self, LoadError> {
        let tensors = candle_core::safetensors::load(path, &Device::Cpu).map_err(|source| LoadError::Tensor {
            path: path.to_path_buf(),
            source,
        })?;
        Ok(Self {
            path: path.to_path_buf(),
            tensors: tensors.into_iter().collect(),
            taken: BTreeSet::new(),
            device: device.clone(),
        })
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

    /// Takes tensor `name`, checking its shape, converted to `dtype` and placed on the device.
    pub(crate) fn take(&mut self, name: &str, shape: &[usize], dtype: DType) -> Result<Tensor, LoadError> {
        let tensor = self.tensors.get(name).ok_or_else(|| self.missing(name))?;
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
        self.taken.insert(name.to_owned());
        Ok(placed)
    }

    /// Fails when the file holds tensors nobody took.
    pub(crate) fn finish(self) -> Result<(), LoadError> {
        let unexpected: Vec<String> = self
            .tensors
            .into_keys()
            .filter(|name| !self.taken.contains(name))
            .collect();
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
