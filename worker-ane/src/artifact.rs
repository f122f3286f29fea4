//! Converted artifacts on disk and their admission: finding `<artifacts>/<checkpoint>/L<bucket>/`,
//! reading `manifest.json` and `parity.json`, and checking every field against the loaded checkpoint.
//!
//! Every refusal names the file and the field, so an operator knows which artifact to rebuild.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use laya::question::QuestionType;
use serde::Deserialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::host::{GraphInputs, GraphOutputs, SLOTS};

/// `format` of a manifest.
pub const FORMAT: &str = "layad-ane-artifact";
/// `format_version` this worker reads.
pub const FORMAT_VERSION: u32 = 1;
/// `graph` this worker's host code builds inputs for.
pub const GRAPH: &str = "bc1s-masked";
/// `graph_version` of that contract.
pub const GRAPH_VERSION: u32 = 1;

/// Why an artifact was refused.
#[derive(Debug, thiserror::Error)]
pub enum ArtifactError {
    /// A file or directory the artifact needs is absent.
    #[error("{path}: missing", path = path.display())]
    Missing {
        /// What is absent.
        path: PathBuf,
    },
    /// A file could not be read.
    #[error("{path}: {source}", path = path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The operating system's reason.
        source: std::io::Error,
    },
    /// A file is not the JSON it should be (serde's message names the field).
    #[error("{path}: {problem}", path = path.display())]
    Malformed {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        problem: String,
    },
    /// A field does not match what was loaded or what this worker runs.
    #[error("{path}: field `{field}` is {found}, expected {expected}", path = path.display())]
    Mismatch {
        /// The file.
        path: PathBuf,
        /// The field, dotted for nested ones (`inputs.embeddings.shape`).
        field: String,
        /// What is expected.
        expected: String,
        /// What the file says.
        found: String,
    },
}

/// One input or output as a manifest declares it.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct TensorSpec {
    /// Feature name.
    pub name: String,
    /// Shape.
    pub shape: Vec<u64>,
    /// Element type, `float16`.
    pub dtype: String,
}

/// `manifest.json` of one bucket. Fields this worker does not check (`layout_check`, `converter`,
/// `deployment_target`, `created_at`) are kept as they are, for logs.
#[derive(Clone, Debug, Deserialize)]
pub struct Manifest {
    /// `layad-ane-artifact`.
    pub format: String,
    /// 1.
    pub format_version: u32,
    /// `bc1s-masked`.
    pub graph: String,
    /// 1.
    pub graph_version: u32,
    /// Checkpoint name.
    pub checkpoint: String,
    /// 40-hex commit of the checkpoint, when the converter knew it.
    pub revision: Option<String>,
    /// SHA-256 of the `model.safetensors` the graph was converted from.
    pub weights_sha256: String,
    /// Length bucket L.
    pub bucket: u32,
    /// Batch size, 1.
    pub batch: u32,
    /// `float16`.
    pub precision: String,
    /// Option slots, 32.
    pub max_options: u32,
    /// Hidden size C.
    pub hidden_size: u32,
    /// Graph inputs.
    pub inputs: Vec<TensorSpec>,
    /// Graph outputs.
    pub outputs: Vec<TensorSpec>,
    /// Package directory, relative to the manifest: `model.mlpackage`.
    pub package: String,
    /// Hash of the package tree (see [`tree_sha256`]).
    pub tree_sha256: String,
    /// The converter's FP32 layout check.
    #[serde(default)]
    pub layout_check: Option<Value>,
    /// Converter name and versions.
    #[serde(default)]
    pub converter: Option<Value>,
    /// Core ML deployment target.
    #[serde(default)]
    pub deployment_target: Option<String>,
    /// When the artifact was written.
    #[serde(default)]
    pub created_at: Option<String>,
}

/// What a manifest must agree with: the checkpoint as loaded.
#[derive(Clone, Debug)]
pub struct Expected<'a> {
    /// The name the worker serves it under.
    pub checkpoint: &'a str,
    /// SHA-256 of the weights file actually loaded.
    pub weights_sha256: &'a str,
    /// Revision of the loaded snapshot, when known.
    pub revision: Option<&'a str>,
    /// Hidden size from `encoder/config.json`.
    pub hidden_size: usize,
}

/// One bucket's artifact after admission.
#[derive(Clone, Debug)]
pub struct Artifact {
    /// Its directory, `<artifacts>/<checkpoint>/L<bucket>`.
    pub dir: PathBuf,
    /// Its manifest.
    pub manifest: Manifest,
}

impl Artifact {
    /// The package directory.
    pub fn package(&self) -> PathBuf {
        self.dir.join(&self.manifest.package)
    }
}

/// The bucket directories of one checkpoint, `<artifacts>/<checkpoint>/L<n>/` holding a
/// `manifest.json`, by bucket. Missing or empty is an error naming the directory.
pub fn discover(artifacts: &Path, checkpoint: &str) -> Result<BTreeMap<u32, PathBuf>, ArtifactError> {
    let dir = artifacts.join(checkpoint);
    let entries = std::fs::read_dir(&dir).map_err(|source| {
        if source.kind() == std::io::ErrorKind::NotFound {
            ArtifactError::Missing { path: dir.clone() }
        } else {
            ArtifactError::Io {
                path: dir.clone(),
                source,
            }
        }
    })?;
    let mut buckets = BTreeMap::new();
    for entry in entries {
        let entry = entry.map_err(|source| ArtifactError::Io {
            path: dir.clone(),
            source,
        })?;
        let name = entry.file_name();
        let bucket = name
            .to_str()
            .and_then(|n| n.strip_prefix('L'))
            .filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|n| n.parse::<u32>().ok());
        if let Some(bucket) = bucket
            && entry.path().join("manifest.json").is_file()
        {
            buckets.insert(bucket, entry.path());
        }
    }
    if buckets.is_empty() {
        return Err(ArtifactError::Missing {
            path: dir.join("L<bucket>/manifest.json"),
        });
    }
    Ok(buckets)
}

fn read_json(path: &Path) -> Result<Vec<u8>, ArtifactError> {
    std::fs::read(path).map_err(|source| {
        if source.kind() == std::io::ErrorKind::NotFound {
            ArtifactError::Missing {
                path: path.to_path_buf(),
            }
        } else {
            ArtifactError::Io {
                path: path.to_path_buf(),
                source,
            }
        }
    })
}

/// Reads `<dir>/manifest.json` and checks it against `expected` for `bucket`, including the package's
/// tree hash recomputed from its files.
pub fn admit(dir: &Path, bucket: u32, expected: &Expected<'_>) -> Result<Artifact, ArtifactError> {
    let path = dir.join("manifest.json");
    let manifest: Manifest = serde_json::from_slice(&read_json(&path)?).map_err(|e| ArtifactError::Malformed {
        path: path.clone(),
        problem: e.to_string(),
    })?;
    verify(&path, &manifest, bucket, expected)?;
    let package = safe_package(&path, &manifest.package, dir)?;
    let tree = tree_sha256(&package)?;
    check(&path, "tree_sha256", &tree, &manifest.tree_sha256.to_ascii_lowercase())?;
    Ok(Artifact {
        dir: dir.to_path_buf(),
        manifest,
    })
}

fn mismatch(path: &Path, field: &str, expected: impl ToString, found: impl ToString) -> ArtifactError {
    ArtifactError::Mismatch {
        path: path.to_path_buf(),
        field: field.to_owned(),
        expected: expected.to_string(),
        found: found.to_string(),
    }
}

fn check<T: PartialEq + std::fmt::Debug>(path: &Path, field: &str, expected: T, found: T) -> Result<(), ArtifactError> {
    if expected == found {
        Ok(())
    } else {
        Err(mismatch(path, field, format!("{expected:?}"), format!("{found:?}")))
    }
}

/// The manifest's fields against `expected` and this worker's graph contract for `bucket`.
pub fn verify(path: &Path, manifest: &Manifest, bucket: u32, expected: &Expected<'_>) -> Result<(), ArtifactError> {
    check(path, "format", FORMAT, manifest.format.as_str())?;
    check(path, "format_version", FORMAT_VERSION, manifest.format_version)?;
    check(path, "graph", GRAPH, manifest.graph.as_str())?;
    check(path, "graph_version", GRAPH_VERSION, manifest.graph_version)?;
    check(path, "checkpoint", expected.checkpoint, manifest.checkpoint.as_str())?;
    check(
        path,
        "weights_sha256",
        expected.weights_sha256.to_ascii_lowercase(),
        manifest.weights_sha256.to_ascii_lowercase(),
    )?;
    if let (Some(loaded), Some(converted)) = (expected.revision, manifest.revision.as_deref()) {
        check(path, "revision", loaded, converted)?;
    }
    check(path, "bucket", bucket, manifest.bucket)?;
    check(path, "batch", 1, manifest.batch)?;
    check(path, "precision", "float16", manifest.precision.as_str())?;
    check(path, "max_options", SLOTS as u32, manifest.max_options)?;
    check(path, "hidden_size", expected.hidden_size as u32, manifest.hidden_size)?;
    let inputs = GraphInputs::shapes(expected.hidden_size, bucket);
    check_specs(path, "inputs", &inputs, &manifest.inputs)?;
    check_specs(
        path,
        "outputs",
        &GraphOutputs::shapes(expected.hidden_size),
        &manifest.outputs,
    )?;
    Ok(())
}

fn check_specs(
    path: &Path,
    field: &str,
    expected: &[(&'static str, [usize; 4])],
    found: &[TensorSpec],
) -> Result<(), ArtifactError> {
    let names = |specs: Vec<&str>| specs.join(", ");
    let mut found_names: Vec<&str> = found.iter().map(|s| s.name.as_str()).collect();
    let mut expected_names: Vec<&str> = expected.iter().map(|(n, _)| *n).collect();
    found_names.sort_unstable();
    expected_names.sort_unstable();
    if found_names != expected_names {
        return Err(mismatch(path, field, names(expected_names), names(found_names)));
    }
    for (name, shape) in expected {
        let Some(spec) = found.iter().find(|s| s.name == *name) else {
            continue;
        };
        let shape: Vec<u64> = shape.iter().map(|&d| d as u64).collect();
        check(path, &format!("{field}.{name}.shape"), shape, spec.shape.clone())?;
        check(path, &format!("{field}.{name}.dtype"), "float16", spec.dtype.as_str())?;
    }
    Ok(())
}

/// The package directory named by a manifest: a plain name inside the artifact directory.
fn safe_package(manifest: &Path, package: &str, dir: &Path) -> Result<PathBuf, ArtifactError> {
    let plain = !package.is_empty() && package != "." && package != ".." && !package.contains(['/', '\\']);
    if !plain {
        return Err(mismatch(
            manifest,
            "package",
            "a directory name beside manifest.json",
            package,
        ));
    }
    let path = dir.join(package);
    if !path.is_dir() {
        return Err(ArtifactError::Missing { path });
    }
    Ok(path)
}

/// SHA-256 (hex) of the UTF-8 text with one line `<relative path>\0<sha256 hex of the file>\n` per
/// regular file under `root`, sorted bytewise by relative path with `/` separators. A link or any
/// other non-regular entry is refused: it would let content in that the hash does not cover.
pub fn tree_sha256(root: &Path) -> Result<String, ArtifactError> {
    let mut files = Vec::new();
    collect_files(root, "", &mut files)?;
    files.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    let mut tree = Sha256::new();
    for (relative, path) in &files {
        tree.update(relative.as_bytes());
        tree.update(b"\0");
        tree.update(file_sha256(path)?.as_bytes());
        tree.update(b"\n");
    }
    Ok(hex(&tree.finalize()))
}

fn collect_files(dir: &Path, prefix: &str, files: &mut Vec<(String, PathBuf)>) -> Result<(), ArtifactError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| ArtifactError::Io { path, source }
    };
    for entry in std::fs::read_dir(dir).map_err(io(dir))? {
        let entry = entry.map_err(io(dir))?;
        let path = entry.path();
        let name = entry.file_name();
        let name = name.to_str().ok_or_else(|| ArtifactError::Malformed {
            path: path.clone(),
            problem: "file name is not UTF-8".into(),
        })?;
        let relative = if prefix.is_empty() {
            name.to_owned()
        } else {
            format!("{prefix}/{name}")
        };
        let kind = entry.file_type().map_err(io(&path))?;
        if kind.is_dir() {
            collect_files(&path, &relative, files)?;
        } else if kind.is_file() {
            files.push((relative, path));
        } else {
            return Err(ArtifactError::Malformed {
                path,
                problem: "not a regular file or directory (links are refused inside a package)".into(),
            });
        }
    }
    Ok(())
}

/// SHA-256 hex of a file's bytes.
pub fn file_sha256(path: &Path) -> Result<String, ArtifactError> {
    let io = |source| ArtifactError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut file = std::fs::File::open(path).map_err(io)?;
    let mut hasher = Sha256::new();
    let mut buffer = vec![0u8; 1 << 16];
    loop {
        let n = file.read(&mut buffer).map_err(io)?;
        if n == 0 {
            break;
        }
        hasher.update(&buffer[..n]);
    }
    Ok(hex(&hasher.finalize()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// One reference row of `parity.json`: upstream's PyTorch FP32 outputs for a prompt row.
#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct ParityRow {
    /// Token ids.
    pub ids: Vec<u32>,
    /// Marker positions.
    pub markers: Vec<u32>,
    /// Question type (its index in the file: 0 choice, 1 score, 2 noul).
    #[serde(deserialize_with = "question_type")]
    pub qtype: QuestionType,
    /// Upstream's logits, one per marker.
    pub logits: Vec<f32>,
    /// Softmax of upstream's act logits.
    pub act_probabilities: Vec<f32>,
}

/// A question type written as its index; another number is refused with the number named.
fn question_type<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<QuestionType, D::Error> {
    let index = u32::deserialize(deserializer)?;
    QuestionType::from_index(index)
        .ok_or_else(|| serde::de::Error::custom(format!("qtype {index} is not 0 (choice), 1 (score) or 2 (noul)")))
}

/// `parity.json` of one checkpoint.
#[derive(Clone, Debug)]
pub struct ParityFile {
    /// Where it was read from.
    pub path: PathBuf,
    /// Every reference row, in file order.
    pub rows: Vec<ParityRow>,
}

#[derive(Deserialize)]
struct ParityDocument {
    #[serde(default)]
    format: Option<String>,
    checkpoint: String,
    revision: Option<String>,
    weights_sha256: String,
    /// The brief's layout: the rows themselves (the converter writes a count here instead).
    #[serde(default)]
    rows: Value,
    /// The converter's layout: rows grouped by golden case.
    #[serde(default)]
    cases: Vec<ParityCase>,
}

#[derive(Deserialize)]
struct ParityCase {
    rows: Vec<ParityRow>,
}

/// Reads `<artifacts>/<checkpoint>/parity.json` and checks that it was computed for the loaded weights.
pub fn read_parity(path: &Path, expected: &Expected<'_>) -> Result<ParityFile, ArtifactError> {
    let malformed = |problem: String| ArtifactError::Malformed {
        path: path.to_path_buf(),
        problem,
    };
    let document: ParityDocument = serde_json::from_slice(&read_json(path)?).map_err(|e| malformed(e.to_string()))?;
    if let Some(format) = &document.format {
        check(path, "format", "layad-ane-parity", format.as_str())?;
    }
    check(path, "checkpoint", expected.checkpoint, document.checkpoint.as_str())?;
    check(
        path,
        "weights_sha256",
        expected.weights_sha256.to_ascii_lowercase(),
        document.weights_sha256.to_ascii_lowercase(),
    )?;
    if let (Some(loaded), Some(reference)) = (expected.revision, document.revision.as_deref()) {
        check(path, "revision", loaded, reference)?;
    }
    let rows = match document.rows {
        Value::Array(_) => Vec::<ParityRow>::deserialize(document.rows).map_err(|e| malformed(format!("rows: {e}")))?,
        _ => document.cases.into_iter().flat_map(|c| c.rows).collect(),
    };
    if rows.is_empty() {
        return Err(malformed(
            "no reference rows (neither `rows` nor `cases[].rows`)".into(),
        ));
    }
    for (i, row) in rows.iter().enumerate() {
        if row.logits.len() != row.markers.len() || row.act_probabilities.is_empty() {
            return Err(malformed(format!(
                "row {i}: {} logits for {} markers, {} act probabilities",
                row.logits.len(),
                row.markers.len(),
                row.act_probabilities.len()
            )));
        }
    }
    Ok(ParityFile {
        path: path.to_path_buf(),
        rows,
    })
}
