//! What runs the in-graph part of the `bc1s-masked` contract: the narrow [`Executor`] trait, and its
//! two implementations, Core ML on the Neural Engine (macOS only) and candle on the CPU (everywhere).
//!
//! The trait takes and returns exactly the graph's tensors, so the host code around it (inputs,
//! act head, admission, parity gate) is the same whichever executor runs, and is tested on Linux.

pub mod candle;
#[cfg(target_os = "macos")]
pub mod coreml;

use layad_proto::PlacementReport;
use worker_gpu::Precision;

use crate::host::{GraphInputs, GraphOutputs};

/// What an executor is and where it runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExecutorInfo {
    /// `coreml` or `candle`.
    pub name: &'static str,
    /// Device in use: `ane` or `cpu`.
    pub device: &'static str,
    /// Compute precision of the graph.
    pub precision: Precision,
}

impl ExecutorInfo {
    /// `name device precision`, e.g. `coreml ane f16`.
    pub fn label(&self) -> String {
        format!("{} {} {}", self.name, self.device, self.precision)
    }
}

/// Why an executor failed.
#[derive(Debug, thiserror::Error)]
pub enum ExecutorError {
    /// The executor has no graph for this bucket.
    #[error("no graph loaded for length bucket {0}")]
    UnknownBucket(u32),
    /// The inputs do not have the graph's shapes.
    #[error("inputs for bucket {bucket} with hidden size {hidden} do not match the graph: {problem}")]
    Shape {
        /// The bucket asked for.
        bucket: u32,
        /// Hidden size of the inputs.
        hidden: usize,
        /// What does not match.
        problem: String,
    },
    /// The runtime failed to load or run a graph.
    #[error("{0}")]
    Runtime(String),
}

/// Runs one checkpoint's graph, one prediction at a time.
pub trait Executor: Send {
    /// Name, device, precision.
    fn info(&self) -> ExecutorInfo;

    /// Runs the graph of `bucket` on `inputs` (built for that bucket).
    fn predict(&mut self, bucket: u32, inputs: &GraphInputs) -> Result<GraphOutputs, ExecutorError>;

    /// Evidence that `bucket`'s graph runs where the executor says, timed on `inputs`; `None` for an
    /// executor whose placement is not in doubt (candle runs where it is told).
    fn placement_probe(&mut self, bucket: u32, inputs: &GraphInputs) -> Result<Option<PlacementReport>, ExecutorError> {
        let _ = (bucket, inputs);
        Ok(None)
    }
}

/// Where each value of a row-major array of `shape` lives in a buffer laid out with `strides` (in
/// elements), as offsets in row-major order; `None` when the strides do not fit `shape` or the
/// buffer's `capacity` (in elements). Core ML pads some dimensions of its arrays (notably FP16
/// outputs of Neural Engine graphs), so its buffers are never assumed dense.
pub fn strided_offsets(shape: &[usize], strides: &[isize], capacity: usize) -> Option<Vec<usize>> {
    if shape.len() != strides.len() || strides.iter().any(|&s| s < 0) {
        return None;
    }
    let count: usize = shape.iter().product();
    let mut offsets = Vec::with_capacity(count);
    let mut index = vec![0usize; shape.len()];
    for _ in 0..count {
        let offset: usize = index.iter().zip(strides).map(|(&i, &s)| i * s.unsigned_abs()).sum();
        if offset >= capacity {
            return None;
        }
        offsets.push(offset);
        // Next index, last dimension fastest.
        for dim in (0..shape.len()).rev() {
            index[dim] += 1;
            if index[dim] < shape[dim] {
                break;
            }
            index[dim] = 0;
        }
    }
    Some(offsets)
}

#[cfg(test)]
mod tests {
    use super::strided_offsets;

    #[test]
    fn dense_strides_are_the_identity_and_padded_ones_skip_the_padding() {
        assert_eq!(strided_offsets(&[1, 2, 1, 3], &[6, 3, 3, 1], 6), Some((0..6).collect()));
        // The last dimension padded from 3 to 8 elements (an ANE output's 16-byte rows in FP16).
        assert_eq!(
            strided_offsets(&[1, 2, 1, 3], &[16, 8, 8, 1], 16),
            Some(vec![0, 1, 2, 8, 9, 10])
        );
        // A buffer too small for the strides, a negative stride, a rank mismatch.
        assert_eq!(strided_offsets(&[2, 3], &[8, 1], 10), None);
        assert_eq!(strided_offsets(&[2, 3], &[-3, 1], 6), None);
        assert_eq!(strided_offsets(&[2, 3], &[3], 6), None);
    }
}
