//! The candle executor: the graph contract computed on the CPU with the checkpoint's own weights,
//! through worker-gpu's model (`LayaModel::forward_graph`), so it runs where Core ML does not.
//!
//! In f16 it rounds the graph's inputs and outputs to FP16, as Core ML's FP16 I/O does, and runs
//! matmuls in f16 (norms and softmax stay f32): close to, not identical with, the Neural Engine.

use candle_core::{DType, Device, Tensor};
use half::f16;
use laya::checkpoint::Checkpoint;
use worker_gpu::model::GraphRowInputs;
use worker_gpu::{LayaModel, Precision};

use super::{Executor, ExecutorError, ExecutorInfo};
use crate::host::{GraphInputs, GraphOutputs, SLOTS};

/// One checkpoint's model on the CPU, serving every bucket up to `longest`.
pub struct CandleExecutor {
    model: LayaModel,
    precision: Precision,
    hidden: usize,
    longest: u32,
}

impl CandleExecutor {
    /// Loads `checkpoint` (named `name` in errors) in `precision` (f32 or f16) for buckets up to `longest`.
    pub fn load(
        name: &str,
        checkpoint: &Checkpoint,
        precision: Precision,
        longest: u32,
    ) -> Result<Self, worker_gpu::LoadError> {
        let dtype = match precision {
            Precision::F32 => DType::F32,
            // `AneOptions::check` refuses bf16 and int8 before any load.
            Precision::F16 | Precision::Bf16 | Precision::Int8 => DType::F16,
        };
        let model = LayaModel::load_with_positions(name, checkpoint, &Device::Cpu, dtype, longest as usize)?;
        Ok(Self {
            model,
            precision: if dtype == DType::F32 {
                Precision::F32
            } else {
                Precision::F16
            },
            hidden: checkpoint.encoder.hidden_size,
            longest,
        })
    }

    /// Values as the graph's I/O carries them: FP16 in f16, untouched in f32.
    fn io(&self, values: &[f32]) -> Vec<f32> {
        match self.precision {
            Precision::F32 => values.to_vec(),
            _ => values.iter().map(|&v| f16::from_f32(v).to_f32()).collect(),
        }
    }
}

impl Executor for CandleExecutor {
    fn info(&self) -> ExecutorInfo {
        ExecutorInfo {
            name: "candle",
            device: "cpu",
            precision: self.precision,
        }
    }

    fn predict(&mut self, bucket: u32, inputs: &GraphInputs) -> Result<GraphOutputs, ExecutorError> {
        if bucket == 0 || bucket > self.longest {
            return Err(ExecutorError::UnknownBucket(bucket));
        }
        let shape_error = |problem: String| ExecutorError::Shape {
            bucket,
            hidden: inputs.hidden,
            problem,
        };
        if inputs.bucket != bucket || inputs.hidden != self.hidden {
            return Err(shape_error(format!(
                "built for bucket {} and hidden size {}; the model has hidden size {}",
                inputs.bucket, inputs.hidden, self.hidden
            )));
        }
        for (name, dims) in GraphInputs::shapes(self.hidden, bucket) {
            let data = inputs
                .named()
                .into_iter()
                .find(|(n, _)| *n == name)
                .map(|(_, d)| d.len());
            let want: usize = dims.iter().product();
            if data != Some(want) {
                return Err(shape_error(format!(
                    "{name} has {data:?} values, expected {want} ({dims:?})"
                )));
            }
        }
        let (l, c) = (bucket as usize, self.hidden);
        let runtime = |e: candle_core::Error| ExecutorError::Runtime(format!("candle: {e}"));
        let cpu = &Device::Cpu;
        let tensor = |data: Vec<f32>, shape: (usize, usize)| Tensor::from_vec(data, shape, cpu);
        // The graph's (1, C, 1, L) and (1, key, 1, query) layouts, turned to the model's [L, C] and [query, key].
        let embeddings = tensor(self.io(&inputs.embeddings), (c, l))
            .and_then(|t| t.t()?.contiguous())
            .map_err(runtime)?;
        let mask = |data: &[f32]| tensor(self.io(data), (l, l)).and_then(|t| t.t()?.contiguous());
        let full_mask = mask(&inputs.full_mask).map_err(runtime)?;
        let local_mask = mask(&inputs.local_mask).map_err(runtime)?;
        let type_vector = Tensor::from_vec(self.io(&inputs.type_vector), c, cpu).map_err(runtime)?;
        let marker_map = tensor(inputs.marker_map.clone(), (l, SLOTS)).map_err(runtime)?;
        let out = self
            .model
            .forward_graph(&GraphRowInputs {
                embeddings: &embeddings,
                full_mask: &full_mask,
                local_mask: &local_mask,
                type_vector: &type_vector,
                marker_map: &marker_map,
            })
            .map_err(runtime)?;
        Ok(GraphOutputs {
            logits: self.io(&out.slot_logits),
            cls: self.io(&out.cls),
        })
    }
}
