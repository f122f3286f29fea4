//! The host side of the `bc1s-masked` graph contract, in float32: the few tensors it needs from the
//! checkpoint, the graph inputs of one row padded to its bucket, and the act head after the graph.
//!
//! Layouts are the graph's (batch, channels, 1, length) ones, flattened row-major, so an executor
//! copies them into its arrays as they are.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor};
use half::{bf16, f16};
use laya::checkpoint::Checkpoint;
use layad_proto::{InvalidForward, Row, RowLimits, RowOutput};
use serde_json::Value;

/// Option slots of the graph (`max_options` in a manifest); rows with more markers are refused.
pub const SLOTS: usize = 32;
/// Additive mask value the graph takes for a forbidden key: FP16-safe, and exp(-1e4) is 0 in FP16 and FP32.
pub const MASKED: f32 = -1e4;

/// Why the host tensors could not be read.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// The weights file could not be read.
    #[error("{path}: {source}", path = path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The operating system's reason.
        source: std::io::Error,
    },
    /// The weights file or one of its tensors is not what the host expects.
    #[error("{path}: {problem}", path = path.display())]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        problem: String,
    },
    /// The act head could not be evaluated.
    #[error("act head: {0}")]
    ActHead(#[from] candle_core::Error),
}

/// Why a row cannot be turned into graph inputs: always the request's fault.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum RowError {
    /// The row breaks the worker protocol's row contract, or is longer than its bucket.
    #[error(transparent)]
    Contract(#[from] InvalidForward),
    /// More option markers than the graph has slots.
    #[error("the row has {markers} option markers; the Neural Engine graph takes at most {SLOTS}")]
    TooManyMarkers {
        /// Markers in the row.
        markers: usize,
    },
}

/// A token-embedding table kept in the dtype it is stored in (the f16 file of a published checkpoint
/// stays half the size of an f32 copy); rows are widened to f32 when gathered.
enum Table {
    F32(Vec<f32>),
    F16(Vec<f16>),
    Bf16(Vec<bf16>),
}

impl Table {
    fn row_into(&self, row: usize, width: usize, out: &mut [f32]) {
        let range = row * width..(row + 1) * width;
        match self {
            Table::F32(data) => out.copy_from_slice(&data[range]),
            Table::F16(data) => out.iter_mut().zip(&data[range]).for_each(|(o, v)| *o = v.to_f32()),
            Table::Bf16(data) => out.iter_mut().zip(&data[range]).for_each(|(o, v)| *o = v.to_f32()),
        }
    }
}

/// What the host needs from a checkpoint: token embeddings, type embeddings and the act head.
pub struct HostWeights {
    /// The checkpoint's name, for messages.
    name: String,
    /// Its longest row.
    max_len: usize,
    table: Table,
    vocab: usize,
    hidden: usize,
    /// `[3, hidden]`, f32.
    type_emb: Vec<f32>,
    /// `[hidden + 4, 256]` (transposed `act_head.0.weight`), f32, CPU.
    act_dense_t: Tensor,
    act_dense_b: Tensor,
    /// `[256, n_act]`.
    act_out_t: Tensor,
    act_out_b: Tensor,
    /// Half of `local_attention`: keys further than this from a query are masked in sliding layers.
    half_window: usize,
}

impl HostWeights {
    /// Reads the five host tensors of `checkpoint`'s weights file (only their bytes, not the file);
    /// `name` is what the worker serves it as.
    pub fn load(name: &str, checkpoint: &Checkpoint) -> Result<Self, HostError> {
        let path = &checkpoint.weights.path;
        let (vocab, hidden) = (checkpoint.encoder.vocab_size, checkpoint.encoder.hidden_size);
        let mut file = TensorFile::open(path)?;
        let table = file.read("encoder.embeddings.tok_embeddings.weight", &[vocab, hidden])?;
        let type_emb = file.read("type_emb.weight", &[3, hidden])?.into_f32();
        let act_dense = file.read_any("act_head.0.weight")?;
        let (act_hidden, n_act) = match (&act_dense.1[..], file.shape_of("act_head.2.weight")?.as_slice()) {
            ([h, input], [n, h2]) if *input == hidden + 4 && h == h2 => (*h, *n),
            (dense, out) => {
                return Err(file.invalid(format!(
                    "act head shapes {dense:?} and {out:?} do not fit hidden size {hidden} (expected [H, {}] and [A, H])",
                    hidden + 4
                )));
            }
        };
        let act_dense_b = file.read("act_head.0.bias", &[act_hidden])?.into_f32();
        let act_out = file.read("act_head.2.weight", &[n_act, act_hidden])?.into_f32();
        let act_out_b = file.read("act_head.2.bias", &[n_act])?.into_f32();
        let cpu = &Device::Cpu;
        let transposed = |data: Vec<f32>, rows: usize, cols: usize| -> Result<Tensor, HostError> {
            Ok(Tensor::from_vec(data, (rows, cols), cpu)?.t()?.contiguous()?)
        };
        Ok(Self {
            name: name.to_owned(),
            max_len: checkpoint.agent.max_len,
            table,
            vocab,
            hidden,
            type_emb,
            act_dense_t: transposed(act_dense.0.into_f32(), act_hidden, hidden + 4)?,
            act_dense_b: Tensor::from_vec(act_dense_b, act_hidden, cpu)?,
            act_out_t: transposed(act_out, n_act, act_hidden)?,
            act_out_b: Tensor::from_vec(act_out_b, n_act, cpu)?,
            half_window: checkpoint.encoder.local_attention / 2,
        })
    }

    /// Hidden size C.
    pub fn hidden(&self) -> usize {
        self.hidden
    }

    /// Vocabulary size.
    pub fn vocab(&self) -> usize {
        self.vocab
    }

    /// What a row of this checkpoint may hold when padded to `bucket`.
    pub fn limits(&self, bucket: u32) -> RowLimits {
        RowLimits {
            checkpoint: self.name.clone(),
            vocab_size: u32::try_from(self.vocab).unwrap_or(u32::MAX),
            max_len: u32::try_from(self.max_len).unwrap_or(u32::MAX),
            longest_bucket: Some(bucket),
        }
    }

    /// The graph inputs of `row` padded to `bucket`.
    pub fn inputs(&self, row: &Row, bucket: u32) -> Result<GraphInputs, RowError> {
        let len = row.ids.len();
        let l = bucket as usize;
        check_row(row, &self.limits(bucket))?;
        let c = self.hidden;
        // (1, C, 1, L): channel-major, so each token's row is scattered with stride L.
        let mut embeddings = vec![0f32; c * l];
        let mut token = vec![0f32; c];
        for (t, &id) in row.ids.iter().enumerate() {
            self.table.row_into(id as usize, c, &mut token);
            for (channel, &value) in token.iter().enumerate() {
                embeddings[channel * l + t] = value;
            }
        }
        let (full_mask, local_mask) = masks(len, l, self.half_window);
        let q = row.qtype.index() as usize;
        let mut marker_map = vec![0f32; l * SLOTS];
        for (slot, &position) in row.markers.iter().enumerate() {
            marker_map[position as usize * SLOTS + slot] = 1.0;
        }
        Ok(GraphInputs {
            bucket,
            hidden: c,
            embeddings,
            full_mask,
            local_mask,
            type_vector: self.type_emb[q * c..(q + 1) * c].to_vec(),
            marker_map,
        })
    }

    /// Finishes a row in float32 from the graph's outputs (spec §4.3 steps 5–6): keeps the first
    /// `options` logits, computes the act features, runs the act head on `cls ‖ features`, softmax.
    pub fn finish(&self, outputs: &GraphOutputs, options: usize) -> Result<RowOutput, HostError> {
        let logits = outputs.logits[..options.min(outputs.logits.len())].to_vec();
        let features = worker_gpu::model::act_features(&logits, options);
        let mut input = outputs.cls.clone();
        input.extend_from_slice(&features);
        let input = Tensor::from_vec(input, (1, self.hidden + 4), &Device::Cpu)?;
        let hidden = input
            .matmul(&self.act_dense_t)?
            .broadcast_add(&self.act_dense_b)?
            .gelu_erf()?;
        let act_logits = hidden
            .matmul(&self.act_out_t)?
            .broadcast_add(&self.act_out_b)?
            .flatten_all()?
            .to_vec1::<f32>()?;
        Ok(RowOutput {
            logits,
            act_probabilities: worker_gpu::model::act_softmax(&act_logits),
        })
    }
}

/// Checks `row` against the row contract within `limits` (tokens, ids, markers, and that its
/// bucket holds it), then against the graph's option slots.
pub fn check_row(row: &Row, limits: &RowLimits) -> Result<(), RowError> {
    limits.check(0, row)?;
    if row.markers.len() > SLOTS {
        return Err(RowError::TooManyMarkers {
            markers: row.markers.len(),
        });
    }
    Ok(())
}

/// `full_mask` and `local_mask` in the graph's (1, key, 1, query) layout for a row of `len` tokens
/// padded to `bucket`: padded keys masked for every query; sliding layers also mask keys further
/// than `half_window` from the query.
fn masks(len: usize, bucket: usize, half_window: usize) -> (Vec<f32>, Vec<f32>) {
    let mut full = vec![0f32; bucket * bucket];
    let mut local = vec![0f32; bucket * bucket];
    for key in 0..bucket {
        for query in 0..bucket {
            let padded = if key < len { 0.0 } else { MASKED };
            let outside = if key.abs_diff(query) > half_window { MASKED } else { 0.0 };
            full[key * bucket + query] = padded;
            local[key * bucket + query] = padded + outside;
        }
    }
    (full, local)
}

/// Inputs of one prediction, float32, in the graph's layouts (flattened row-major).
#[derive(Clone, Debug, PartialEq)]
pub struct GraphInputs {
    /// Length bucket L.
    pub bucket: u32,
    /// Hidden size C.
    pub hidden: usize,
    /// `embeddings` (1, C, 1, L): token-embedding rows before the embedding norm; padding zero.
    pub embeddings: Vec<f32>,
    /// `full_mask` (1, L, 1, L), (batch, key, 1, query): 0 for a real key, −1e4 for padding.
    pub full_mask: Vec<f32>,
    /// `local_mask` (1, L, 1, L): `full_mask` plus −1e4 outside the sliding window.
    pub local_mask: Vec<f32>,
    /// `type_vectors` (1, C, 1, 1): the question type's row of `type_emb`.
    pub type_vector: Vec<f32>,
    /// `marker_map` (1, L, 1, 32): 1 at (marker position, option slot).
    pub marker_map: Vec<f32>,
}

impl GraphInputs {
    /// Shape of each input in the graph, by name, in the manifest's order.
    pub fn shapes(hidden: usize, bucket: u32) -> [(&'static str, [usize; 4]); 5] {
        let (c, l) = (hidden, bucket as usize);
        [
            ("embeddings", [1, c, 1, l]),
            ("full_mask", [1, l, 1, l]),
            ("local_mask", [1, l, 1, l]),
            ("type_vectors", [1, c, 1, 1]),
            ("marker_map", [1, l, 1, SLOTS]),
        ]
    }

    /// Each input's name and data, in [`GraphInputs::shapes`] order.
    pub fn named(&self) -> [(&'static str, &[f32]); 5] {
        [
            ("embeddings", &self.embeddings),
            ("full_mask", &self.full_mask),
            ("local_mask", &self.local_mask),
            ("type_vectors", &self.type_vector),
            ("marker_map", &self.marker_map),
        ]
    }
}

/// Outputs of one prediction, float32.
#[derive(Clone, Debug, PartialEq)]
pub struct GraphOutputs {
    /// `logits` (1, 1, 1, 32): the scorer's output per slot.
    pub logits: Vec<f32>,
    /// `cls` (1, C, 1, 1): the decision head's output at position 0.
    pub cls: Vec<f32>,
}

impl GraphOutputs {
    /// Shape of each output in the graph, by name.
    pub fn shapes(hidden: usize) -> [(&'static str, [usize; 4]); 2] {
        [("logits", [1, 1, 1, SLOTS]), ("cls", [1, hidden, 1, 1])]
    }

    /// True when every value is finite.
    pub fn is_finite(&self) -> bool {
        self.logits.iter().chain(&self.cls).all(|v| v.is_finite())
    }
}

/// A tensor as read: data and shape.
struct Raw(Table, Vec<usize>);

impl Table {
    fn into_f32(self) -> Vec<f32> {
        match self {
            Table::F32(data) => data,
            Table::F16(data) => data.iter().map(|v| v.to_f32()).collect(),
            Table::Bf16(data) => data.iter().map(|v| v.to_f32()).collect(),
        }
    }
}

/// A safetensors file read tensor by tensor: the header once, then only the bytes asked for.
struct TensorFile {
    path: PathBuf,
    file: File,
    header: serde_json::Map<String, Value>,
    data_start: u64,
}

impl TensorFile {
    fn open(path: &Path) -> Result<Self, HostError> {
        let io = |source| HostError::Io {
            path: path.to_path_buf(),
            source,
        };
        let mut file = File::open(path).map_err(io)?;
        let mut len = [0u8; 8];
        file.read_exact(&mut len).map_err(io)?;
        let len = u64::from_le_bytes(len);
        let invalid = |problem: String| HostError::Invalid {
            path: path.to_path_buf(),
            problem,
        };
        let size = file.metadata().map_err(io)?.len();
        if len.saturating_add(8) > size {
            return Err(invalid(format!("header length {len} does not fit in the file")));
        }
        let mut header = vec![0u8; usize::try_from(len).map_err(|_| invalid("header too large".into()))?];
        file.read_exact(&mut header).map_err(io)?;
        let header: Value =
            serde_json::from_slice(&header).map_err(|e| invalid(format!("header is not valid JSON: {e}")))?;
        let Value::Object(header) = header else {
            return Err(invalid("header is not a JSON object".into()));
        };
        Ok(Self {
            path: path.to_path_buf(),
            file,
            header,
            data_start: 8 + len,
        })
    }

    fn invalid(&self, problem: String) -> HostError {
        HostError::Invalid {
            path: self.path.clone(),
            problem,
        }
    }

    fn entry(&self, name: &str) -> Result<(&str, Vec<usize>, u64, u64), HostError> {
        let entry = self
            .header
            .get(name)
            .ok_or_else(|| self.invalid(format!("tensor '{name}' is missing")))?;
        let bad = |what: &str| self.invalid(format!("tensor '{name}': {what}"));
        let dtype = entry
            .get("dtype")
            .and_then(Value::as_str)
            .ok_or_else(|| bad("no dtype"))?;
        let shape = entry
            .get("shape")
            .and_then(Value::as_array)
            .and_then(|dims| {
                dims.iter()
                    .map(|d| d.as_u64().and_then(|d| usize::try_from(d).ok()))
                    .collect::<Option<Vec<_>>>()
            })
            .ok_or_else(|| bad("shape is not a list of sizes"))?;
        let offsets: Option<Vec<u64>> = entry
            .get("data_offsets")
            .and_then(Value::as_array)
            .map(|o| o.iter().filter_map(Value::as_u64).collect());
        match offsets.as_deref() {
            Some(&[start, end]) if start <= end => Ok((dtype, shape, start, end)),
            _ => Err(bad("data_offsets missing or malformed")),
        }
    }

    fn shape_of(&self, name: &str) -> Result<Vec<usize>, HostError> {
        Ok(self.entry(name)?.1)
    }

    fn read(&mut self, name: &str, shape: &[usize]) -> Result<Table, HostError> {
        let Raw(table, found) = self.read_any(name)?;
        if found != shape {
            return Err(self.invalid(format!("tensor '{name}' has shape {found:?}, expected {shape:?}")));
        }
        Ok(table)
    }

    fn read_any(&mut self, name: &str) -> Result<Raw, HostError> {
        let (dtype, shape, start, end) = self.entry(name)?;
        let dtype = dtype.to_owned();
        let width = match dtype.as_str() {
            "F32" => 4,
            "F16" | "BF16" => 2,
            other => return Err(self.invalid(format!("tensor '{name}' is {other}; expected F32, F16 or BF16"))),
        };
        let count: usize = shape.iter().product();
        if end - start != (count * width) as u64 {
            return Err(self.invalid(format!(
                "tensor '{name}': {} bytes for shape {shape:?} of {dtype}",
                end - start
            )));
        }
        let mut bytes = vec![0u8; count * width];
        let path = self.path.clone();
        let io = |source| HostError::Io {
            path: path.clone(),
            source,
        };
        self.file.seek(SeekFrom::Start(self.data_start + start)).map_err(io)?;
        self.file.read_exact(&mut bytes).map_err(io)?;
        let table = match dtype.as_str() {
            "F32" => Table::F32(
                bytes
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                    .collect(),
            ),
            "F16" => Table::F16(
                bytes
                    .chunks_exact(2)
                    .map(|b| f16::from_le_bytes([b[0], b[1]]))
                    .collect(),
            ),
            _ => Table::Bf16(
                bytes
                    .chunks_exact(2)
                    .map(|b| bf16::from_le_bytes([b[0], b[1]]))
                    .collect(),
            ),
        };
        Ok(Raw(table, shape))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use laya::question::QuestionType;

    fn row(ids: Vec<u32>, markers: Vec<u32>, qtype: u32) -> Row {
        let qtype = QuestionType::from_index(qtype).expect("a question type");
        Row { ids, markers, qtype }
    }

    #[test]
    fn masks_are_key_major_and_mask_padding_and_the_window() {
        // 3 real tokens in a bucket of 5, half window 1.
        let (full, local) = masks(3, 5, 1);
        let at = |m: &[f32], key: usize, query: usize| m[key * 5 + query];
        for query in 0..5 {
            for key in 0..5 {
                let padded = if key < 3 { 0.0 } else { MASKED };
                assert_eq!(at(&full, key, query), padded, "full key {key} query {query}");
                let window = if key.abs_diff(query) > 1 { MASKED } else { 0.0 };
                assert_eq!(at(&local, key, query), padded + window, "local key {key} query {query}");
            }
        }
        // A padded key outside the window carries both penalties.
        assert_eq!(at(&local, 4, 0), 2.0 * MASKED);
        assert_eq!(at(&local, 0, 4), MASKED);
        assert_eq!(at(&local, 2, 1), 0.0);
    }

    /// A checkpoint with `vocab` ids whose rows pad to `bucket`.
    fn limits(vocab: u32, bucket: u32) -> RowLimits {
        RowLimits {
            checkpoint: "english".into(),
            vocab_size: vocab,
            max_len: 512,
            longest_bucket: Some(bucket),
        }
    }

    #[test]
    fn rows_the_graph_cannot_take_are_refused() {
        let contract = |e: InvalidForward| Err(RowError::Contract(e));
        let ok = row(vec![1, 2, 3], vec![1, 2], 0);
        assert_eq!(check_row(&ok, &limits(10, 4)), Ok(()));
        assert_eq!(
            check_row(&row(vec![1; 5], vec![1], 0), &limits(10, 4)),
            contract(InvalidForward::RowLongerThanBuckets {
                row: 0,
                len: 5,
                bucket: 4
            })
        );
        let many: Vec<u32> = (0..33).collect();
        assert_eq!(
            check_row(&row(vec![1; 40], many, 0), &limits(10, 64)),
            Err(RowError::TooManyMarkers { markers: 33 })
        );
        let slots: Vec<u32> = (0..32).collect();
        assert_eq!(check_row(&row(vec![1; 40], slots, 0), &limits(10, 64)), Ok(()));
        assert_eq!(
            check_row(&row(vec![], vec![], 0), &limits(10, 4)),
            contract(InvalidForward::EmptyRow { row: 0 })
        );
        assert_eq!(
            check_row(&row(vec![1], vec![], 0), &limits(10, 4)),
            contract(InvalidForward::NoMarkers { row: 0 })
        );
        assert_eq!(
            check_row(&row(vec![1, 2], vec![2], 0), &limits(10, 4)),
            contract(InvalidForward::MarkerOutsideRow {
                row: 0,
                marker: 0,
                position: 2,
                len: 2
            })
        );
        assert_eq!(
            check_row(&row(vec![1, 10], vec![1], 0), &limits(10, 4)),
            contract(InvalidForward::IdOutOfRange {
                row: 0,
                position: 1,
                id: 10,
                checkpoint: "english".into(),
                vocab_size: 10
            })
        );
    }
}
