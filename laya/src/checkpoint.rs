//! Finding and opening Laya checkpoints: a local directory or the Hugging Face cache (the
//! `convaiinnovations/laya` bundle with its subfolders, or the standalone repos), read file by file.
//!
//! A [`Checkpoint`] knows where it came from (revision), what its weights are (SHA-256 of the bytes
//! on disk, tensor table), and holds its configs and tokenizer. No tensor data is loaded here.

use std::io::Read;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::config::{AgentConfig, EncoderConfig};
pub use crate::error::CheckpointError;
use crate::routing::{BUNDLE_REPO, CheckpointName};
use crate::tokenizer::LayaTokenizer;

/// Where a checkpoint's files were found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Origin {
    /// A directory given directly.
    Directory,
    /// A snapshot in the Hugging Face cache.
    HfCache {
        /// Repo id, e.g. `convaiinnovations/laya`.
        repo: String,
        /// Subfolder inside the snapshot, if any.
        subfolder: Option<String>,
        /// The commit the snapshot belongs to (from `refs/main`).
        revision: String,
    },
}

/// A checkpoint directory and where it came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Location {
    /// The directory holding `rl_agent_config.json`, `model.safetensors`, `encoder/`, `tokenizer/`.
    pub dir: PathBuf,
    /// How it was found.
    pub origin: Origin,
}

impl Location {
    /// A checkpoint directory given directly.
    pub fn directory(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            origin: Origin::Directory,
        }
    }

    /// A checkpoint directory, recognised as a Hugging Face snapshot when its path reads
    /// `…/models--owner--name/snapshots/<revision>[/subfolder]` (how workers learn the revision
    /// of the directory the supervisor hands them).
    pub fn from_path(dir: impl Into<PathBuf>) -> Self {
        let dir = dir.into();
        let parts: Vec<&str> = dir.components().filter_map(|c| c.as_os_str().to_str()).collect();
        let snapshot = parts
            .iter()
            .rposition(|p| *p == "snapshots")
            .filter(|i| *i >= 1 && i + 1 < parts.len());
        let origin = snapshot.and_then(|i| {
            let repo = parts[i - 1].strip_prefix("models--")?.replacen("--", "/", 1);
            let revision = parts[i + 1].to_owned();
            let rest = &parts[i + 2..];
            let subfolder = (!rest.is_empty()).then(|| rest.join("/"));
            Some(Origin::HfCache {
                repo,
                subfolder,
                revision,
            })
        });
        Self {
            origin: origin.unwrap_or(Origin::Directory),
            dir,
        }
    }

    /// The commit the files belong to, when known.
    pub fn revision(&self) -> Option<&str> {
        match &self.origin {
            Origin::HfCache { revision, .. } => Some(revision),
            Origin::Directory => None,
        }
    }
}

/// The Hugging Face hub cache directory: `HF_HUB_CACHE`, else `HF_HOME/hub`, else
/// `$XDG_CACHE_HOME/huggingface/hub`, else `~/.cache/huggingface/hub` (huggingface_hub's order).
pub fn hf_hub_cache_dir() -> Option<PathBuf> {
    let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from);
    if let Some(dir) = var("HF_HUB_CACHE") {
        return Some(dir);
    }
    if let Some(home) = var("HF_HOME") {
        return Some(home.join("hub"));
    }
    if let Some(xdg) = var("XDG_CACHE_HOME") {
        return Some(xdg.join("huggingface").join("hub"));
    }
    var("HOME").map(|home| home.join(".cache").join("huggingface").join("hub"))
}

/// The cache folder of a repo: `models--owner--name`.
fn repo_folder(cache: &Path, repo: &str) -> PathBuf {
    cache.join(format!("models--{}", repo.replace('/', "--")))
}

/// The snapshot directory `refs/main` points at, with its revision.
fn snapshot(cache: &Path, repo: &str) -> Result<Option<(PathBuf, String)>, CheckpointError> {
    let folder = repo_folder(cache, repo);
    let refs = folder.join("refs").join("main");
    if !refs.is_file() {
        return Ok(None);
    }
    let revision = std::fs::read_to_string(&refs).map_err(|source| CheckpointError::Io {
        path: refs.clone(),
        source,
    })?;
    let revision = revision.trim().to_owned();
    if revision.is_empty() || !revision.chars().all(|c| c.is_ascii_alphanumeric()) {
        return Err(CheckpointError::Invalid {
            path: refs,
            problem: format!("expected a commit id, found {revision:?}"),
        });
    }
    let dir = folder.join("snapshots").join(&revision);
    if !dir.is_dir() {
        return Err(CheckpointError::Invalid {
            path: refs,
            problem: format!("points at revision {revision}, but {} does not exist", dir.display()),
        });
    }
    Ok(Some((dir, revision)))
}

/// Finds any repo's checkpoint in the Hugging Face cache (an extra checkpoint's `"owner/name"` or
/// `["owner/name", "subfolder"]`): the snapshot `refs/main` points at, plus the subfolder. The
/// revision is that snapshot's, as for the built-ins.
pub fn find_repo_in_hf_cache(cache: &Path, repo: &str, subfolder: Option<&str>) -> Result<Location, CheckpointError> {
    let Some((snapshot_dir, revision)) = snapshot(cache, repo)? else {
        return Err(CheckpointError::NotFound {
            name: repo.to_owned(),
            searched: repo_folder(cache, repo).join("refs/main").display().to_string(),
        });
    };
    let dir = subfolder.map_or(snapshot_dir.clone(), |sub| snapshot_dir.join(sub));
    if !dir.is_dir() {
        return Err(CheckpointError::Missing { path: dir });
    }
    Ok(Location {
        dir,
        origin: Origin::HfCache {
            repo: repo.to_owned(),
            subfolder: subfolder.map(str::to_owned),
            revision,
        },
    })
}

/// Finds a published checkpoint in the Hugging Face cache: the bundle repo first (english at its
/// root, the others in subfolders), then the standalone `laya-multilingual` / `laya-typed-decisions`.
pub fn find_in_hf_cache(cache: &Path, name: CheckpointName) -> Result<Location, CheckpointError> {
    let mut searched = Vec::new();
    let bundle_sub = name.subfolder();
    if let Some((dir, revision)) = snapshot(cache, BUNDLE_REPO)? {
        let dir = bundle_sub.map_or(dir.clone(), |sub| dir.join(sub));
        if dir.join("rl_agent_config.json").is_file() {
            let origin = Origin::HfCache {
                repo: BUNDLE_REPO.to_owned(),
                subfolder: bundle_sub.map(str::to_owned),
                revision,
            };
            return Ok(Location { dir, origin });
        }
        searched.push(dir.display().to_string());
    } else {
        searched.push(repo_folder(cache, BUNDLE_REPO).join("refs/main").display().to_string());
    }
    if let Some(sub) = bundle_sub {
        let repo = format!("{BUNDLE_REPO}-{sub}");
        if let Some((dir, revision)) = snapshot(cache, &repo)? {
            if dir.join("rl_agent_config.json").is_file() {
                return Ok(Location {
                    dir,
                    origin: Origin::HfCache {
                        repo,
                        subfolder: None,
                        revision,
                    },
                });
            }
            searched.push(dir.display().to_string());
        } else {
            searched.push(repo_folder(cache, &repo).join("refs/main").display().to_string());
        }
    }
    Err(CheckpointError::NotFound {
        name: name.as_str().to_owned(),
        searched: searched.join(", "),
    })
}

/// The longest safetensors header read (64 MiB; the `safetensors` crate allows 100 MB): a Laya
/// checkpoint's header is a few kilobytes, and a wrong length field must not allocate gigabytes.
const MAX_HEADER: u64 = 1 << 26;

/// One tensor's entry in the safetensors header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    /// Tensor name, e.g. `encoder.layers.0.attn.Wqkv.weight`.
    pub name: String,
    /// safetensors dtype, e.g. `F16`.
    pub dtype: String,
    /// Shape.
    pub shape: Vec<usize>,
}

/// What `model.safetensors` holds, read from the file actually on disk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WeightsFile {
    /// Path of the file (symlinks not resolved).
    pub path: PathBuf,
    /// Lower-case hex SHA-256 of the file's bytes.
    pub sha256: String,
    /// Size in bytes.
    pub size: u64,
    /// The tensor table from the header, in the order of the tensors' data in the file.
    pub tensors: Vec<TensorInfo>,
}

impl WeightsFile {
    /// Hashes the file and reads its header; checks that every tensor lies inside the file and that
    /// the four parts of a decision model are present.
    pub fn inspect(path: &Path) -> Result<Self, CheckpointError> {
        let mut weights = Self::inspect_header(path)?;
        weights.sha256 = sha256_of(path)?;
        Ok(weights)
    }

    /// [`WeightsFile::inspect`] without the hash (`sha256` empty): the header and the file's size.
    ///
    /// Only the header is read (its 8-byte length, then that much JSON), not the gigabyte of tensor
    /// data after it; the `safetensors` crate parses and validates it (known dtypes, offsets that
    /// tile the data with no gap, each tensor's byte length equal to its shape times its dtype), as
    /// candle will when the worker loads the file, so a checkpoint refused there is refused here.
    fn inspect_header(path: &Path) -> Result<Self, CheckpointError> {
        let io = |source| CheckpointError::Io {
            path: path.to_path_buf(),
            source,
        };
        let invalid = |problem: String| CheckpointError::Invalid {
            path: path.to_path_buf(),
            problem,
        };
        let mut file = open_weights(path)?;
        let size = file.metadata().map_err(io)?.len();
        let mut length = [0u8; 8];
        file.read_exact(&mut length)
            .map_err(|_| invalid("shorter than a safetensors header".to_owned()))?;
        let header_len = u64::from_le_bytes(length);
        // `SafeTensors::read_metadata` wants the whole file in memory (or mapped, which is unsafe
        // code); reading the header ourselves keeps this a read of a few kilobytes.
        let header_end = header_len
            .checked_add(8)
            .filter(|end| *end <= size && *end <= MAX_HEADER)
            .and_then(|end| usize::try_from(end).ok());
        let header_end =
            header_end.ok_or_else(|| invalid(format!("header length {header_len} does not fit in the file")))?;
        let mut header = vec![0u8; header_end - 8];
        file.read_exact(&mut header).map_err(io)?;
        let metadata: safetensors::tensor::Metadata = serde_json::from_slice(&header).map_err(|e| {
            invalid(match e.classify() {
                serde_json::error::Category::Data => format!("header does not describe safetensors tensors: {e}"),
                _ => format!("header is not valid JSON: {e}"),
            })
        })?;
        // The crate's own rule (`read_metadata`): the tensors end exactly where the file does.
        let data_len = size - header_end as u64;
        let covered = metadata.data_len() as u64;
        if covered != data_len {
            let why = if covered > data_len {
                "truncated"
            } else {
                "trailing bytes"
            };
            return Err(invalid(format!(
                "the header's tensors need {covered} bytes of data but the file has {data_len} after the header ({why})"
            )));
        }
        // `offset_keys` and `info` read the same table: every name has its entry.
        let tensors: Vec<TensorInfo> = metadata
            .offset_keys()
            .into_iter()
            .filter_map(|name| {
                let info = metadata.info(&name)?;
                Some(TensorInfo {
                    dtype: info.dtype.to_string(),
                    shape: info.shape.clone(),
                    name,
                })
            })
            .collect();
        for prefix in ["encoder.", "type_emb.", "scorer.", "act_head."] {
            if !tensors.iter().any(|t| t.name.starts_with(prefix)) {
                return Err(invalid(format!(
                    "missing '{prefix}' parameters; expected a Laya decision model with encoder and decision heads"
                )));
            }
        }
        Ok(Self {
            path: path.to_path_buf(),
            sha256: String::new(),
            size,
            tensors,
        })
    }

    /// The tensor called `name`, if present.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }
}

/// Opens the weights file, saying `Missing` when it is not there.
fn open_weights(path: &Path) -> Result<std::fs::File, CheckpointError> {
    std::fs::File::open(path).map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            CheckpointError::Missing {
                path: path.to_path_buf(),
            }
        } else {
            CheckpointError::Io {
                path: path.to_path_buf(),
                source: e,
            }
        }
    })
}

/// Lower-case hex SHA-256 of `bytes`, as [`WeightsFile::sha256`] holds it.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

fn hex(digest: &[u8]) -> String {
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// Lower-case hex SHA-256 of the file at `path`, read in 4 MiB pieces (through the page cache,
/// mapping nothing into the caller's memory).
pub fn sha256_of(path: &Path) -> Result<String, CheckpointError> {
    let mut file = open_weights(path)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 22];
    loop {
        let n = file.read(&mut buf).map_err(|source| CheckpointError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hex(&hasher.finalize()))
}

/// A checkpoint opened from disk: configs, tokenizer and weights table.
#[derive(Debug)]
pub struct Checkpoint {
    /// Where the files are.
    pub location: Location,
    /// `rl_agent_config.json`.
    pub agent: AgentConfig,
    /// `encoder/config.json`.
    pub encoder: EncoderConfig,
    /// `tokenizer/`.
    pub tokenizer: LayaTokenizer,
    /// `model.safetensors`.
    pub weights: WeightsFile,
}

impl Checkpoint {
    /// Opens every file of the checkpoint at `location`, hashing the weights.
    pub fn open(location: Location) -> Result<Self, CheckpointError> {
        let mut checkpoint = Self::open_unhashed(location)?;
        checkpoint.hash_weights()?;
        Ok(checkpoint)
    }

    /// Hashes the weights file into `weights.sha256` (after [`Checkpoint::open_unhashed`]).
    pub fn hash_weights(&mut self) -> Result<(), CheckpointError> {
        self.weights.sha256 = sha256_of(&self.weights.path)?;
        Ok(())
    }

    /// Everything [`Checkpoint::open`] does but the hash: `weights.sha256` is empty, for a caller
    /// that reads the weights' bytes anyway to hash them with [`sha256_hex`] as it loads them (a
    /// worker: the file is then read once, not twice, and the hash of a full-size checkpoint,
    /// seconds of start-up, runs beside the decoding), or that hashes later with
    /// [`Checkpoint::hash_weights`] (the supervisor, once its workers have started loading).
    pub fn open_unhashed(location: Location) -> Result<Self, CheckpointError> {
        let dir = &location.dir;
        if !dir.is_dir() {
            return Err(CheckpointError::Missing { path: dir.clone() });
        }
        let required = |rel: &str| {
            let path = dir.join(rel);
            if path.exists() {
                Ok(path)
            } else {
                Err(CheckpointError::Missing { path })
            }
        };
        let agent = AgentConfig::load(&required("rl_agent_config.json")?)?;
        let encoder = EncoderConfig::load(&required("encoder/config.json")?)?;
        let tokenizer = LayaTokenizer::load(&required("tokenizer")?)?;
        let weights = WeightsFile::inspect_header(&required("model.safetensors")?)?;
        for clamped in &agent.temperatures.clamped {
            tracing::warn!(
                checkpoint = %dir.display(),
                entry = %clamped.entry,
                raw = %clamped.raw,
                applied = clamped.applied,
                "temperature outside [0.5, 5.0] or not a number; confidence from this entry is uncalibrated"
            );
        }
        if tokenizer.vocab_size() > encoder.vocab_size {
            return Err(CheckpointError::Invalid {
                path: dir.join("tokenizer/tokenizer.json"),
                problem: format!(
                    "the tokenizer has {} ids but encoder/config.json says vocab_size {}",
                    tokenizer.vocab_size(),
                    encoder.vocab_size
                ),
            });
        }
        Ok(Self {
            location,
            agent,
            encoder,
            tokenizer,
            weights,
        })
    }

    /// Number of act classes, from the shape of `act_head.2.weight` (upstream's `n_act`).
    pub fn n_act(&self) -> Option<usize> {
        self.weights
            .tensor("act_head.2.weight")
            .and_then(|t| t.shape.first().copied())
    }
}
