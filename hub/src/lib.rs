//! `layad fetch`: downloads Laya checkpoints from the Hugging Face Hub into the standard Hugging
//! Face cache, laid out exactly as `huggingface_hub` lays it out, so upstream laya and layad share one copy.
//!
//! [`fetch`] lists the `convaiinnovations/laya` bundle at `main` (english at its root,
//! `multilingual/`, `typed-decisions/`), then brings in only the five files each checkpoint needs
//! ([`CHECKPOINT_FILES`]): a file already in the snapshot costs no request, a blob already in the
//! cache (same ETag, another commit or checkpoint) costs one `HEAD`, anything else is downloaded to
//! `blobs/<etag>.incomplete`, resumed with `Range` after a cut, verified (SHA-256 for LFS files, the
//! git blob SHA-1 for the others: the ETags the Hub sends) and only then renamed into place.
//! `refs/main` is written last, so an interrupted fetch never leaves `refs/main` pointing at a
//! half-filled snapshot.
//!
//! HTTP: `reqwest` with `rustls-tls` and default features off. The Hub needs https; this gives TLS
//! in pure Rust plus `ring` (a C compiler, which the toolchain has anyway) with Mozilla's root
//! certificates compiled in — no system OpenSSL, no cmake — on the hyper/tokio stack the
//! workspace already builds; and unlike bare hyper it brings redirects (the Hub sends LFS files to
//! a CDN, and drops `Authorization` when the redirect leaves the Hub's origin) and the
//! `HTTPS_PROXY`/`NO_PROXY` variables that `huggingface_hub` users rely on. A proxy that inspects
//! TLS is trusted through the CA bundle variables `requests` reads (see [`FetchOptions::ca_bundle`]).

mod api;
mod cache;
mod download;
mod error;
mod options;
mod progress;

use std::path::Path;

use laya::checkpoint::{CheckpointError, Location, Origin, find_in_hf_cache};
use laya::routing::{BUNDLE_REPO, CheckpointName};

pub use error::FetchError;
pub use options::{DEFAULT_ENDPOINT, FetchOptions, ProgressStyle};

use crate::api::Hub;
use crate::cache::RepoCache;
use crate::download::{Integrity, Target};
use crate::progress::{Progress, human};

/// The files of one checkpoint, relative to its folder; nothing else is downloaded.
pub const CHECKPOINT_FILES: [&str; 5] = [
    "rl_agent_config.json",
    "model.safetensors",
    "encoder/config.json",
    "tokenizer/tokenizer.json",
    "tokenizer/tokenizer_config.json",
];

/// The branch fetched, as upstream laya 0.3.20 fetches it.
const REVISION: &str = "main";

/// A checkpoint now complete in the cache.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FetchedCheckpoint {
    /// Which checkpoint.
    pub name: CheckpointName,
    /// Its snapshot directory and commit, as [`laya::checkpoint::find_in_hf_cache`] will find it.
    pub location: Location,
    /// Its files, in [`CHECKPOINT_FILES`] order.
    pub files: Vec<FetchedFile>,
}

impl FetchedCheckpoint {
    /// Bytes this fetch transferred over the network for the checkpoint.
    pub fn transferred_bytes(&self) -> u64 {
        self.files
            .iter()
            .map(|f| match f.state {
                FileState::Downloaded { transferred } => transferred,
                FileState::InSnapshot | FileState::BlobReused => 0,
            })
            .sum()
    }
}

/// One file of a fetched checkpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FetchedFile {
    /// Path in the repo, e.g. `multilingual/model.safetensors`.
    pub repo_path: String,
    /// Size on disk.
    pub size: u64,
    /// How it got there.
    pub state: FileState,
}

/// How a file came to be in the snapshot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileState {
    /// It already was: no request was made.
    InSnapshot,
    /// Its blob was already in the cache (another commit or checkpoint); only linked.
    BlobReused,
    /// Downloaded now; `transferred` excludes bytes kept from an earlier interrupted download.
    Downloaded {
        /// Bytes received by this fetch.
        transferred: u64,
    },
}

/// Makes each named checkpoint complete in the cache at the bundle's current `main` commit and
/// returns where each is (`layad fetch`). With `options.offline`, makes no request: succeeds only
/// if every checkpoint is already complete in the cache, else [`FetchError::Offline`].
pub async fn fetch(names: &[CheckpointName], options: &FetchOptions) -> Result<Vec<FetchedCheckpoint>, FetchError> {
    let unique = unique(names);
    if options.offline {
        let (found, missing) = split_cached(&unique, &options.cache_dir)?;
        return if missing.is_empty() {
            Ok(found)
        } else {
            Err(offline_error(&missing, &options.cache_dir))
        };
    }
    fetch_online(&unique, options).await
}

/// Returns each named checkpoint from the cache when all its files are there (no request at all),
/// and fetches only the others (`serve` at start-up); with `options.offline` a missing one is
/// [`FetchError::Offline`]. Results are in the order of `names`.
pub async fn ensure_cached(
    names: &[CheckpointName],
    options: &FetchOptions,
) -> Result<Vec<FetchedCheckpoint>, FetchError> {
    let unique = unique(names);
    let (mut found, missing) = split_cached(&unique, &options.cache_dir)?;
    if !missing.is_empty() {
        if options.offline {
            return Err(offline_error(&missing, &options.cache_dir));
        }
        found.extend(fetch_online(&missing, options).await?);
    }
    found.sort_by_key(|c| unique.iter().position(|&n| n == c.name));
    Ok(found)
}

/// `names` without repeats, first occurrence kept.
fn unique(names: &[CheckpointName]) -> Vec<CheckpointName> {
    let mut unique: Vec<CheckpointName> = Vec::new();
    for &name in names {
        if !unique.contains(&name) {
            unique.push(name);
        }
    }
    unique
}

/// The online part of [`fetch`].
async fn fetch_online(unique: &[CheckpointName], options: &FetchOptions) -> Result<Vec<FetchedCheckpoint>, FetchError> {
    if unique.is_empty() {
        return Ok(Vec::new());
    }
    let mut progress = Progress::stderr(options.progress);
    let hub = Hub::new(options)?;
    let repo = RepoCache::new(&options.cache_dir, BUNDLE_REPO);
    let info = hub.repo_info(BUNDLE_REPO, REVISION).await?;
    let commit = info.commit.as_str();
    let wanted: Vec<(CheckpointName, Vec<String>)> =
        unique.iter().map(|&name| (name, checkpoint_paths(name))).collect();
    for path in wanted.iter().flat_map(|(_, paths)| paths) {
        if !info.files.contains(path) {
            return Err(FetchError::NotInRepo {
                repo: BUNDLE_REPO.to_owned(),
                revision: commit.to_owned(),
                path: path.clone(),
            });
        }
    }
    let listed: Vec<&str> = unique.iter().map(|n| n.as_str()).collect();
    progress.note(&format!(
        "{BUNDLE_REPO} at {commit} ({}): {} into {}",
        options.endpoint,
        listed.join(", "),
        options.cache_dir.display()
    ));
    let mut fetched = Vec::new();
    for (name, paths) in wanted {
        let mut files = Vec::new();
        for path in paths {
            let (state, size) = ensure_file(&hub, &repo, commit, &path, options.retries, &mut progress).await?;
            files.push(FetchedFile {
                repo_path: path,
                size,
                state,
            });
        }
        let location = Location {
            dir: subfolder(repo.snapshot(commit), name),
            origin: Origin::HfCache {
                repo: BUNDLE_REPO.to_owned(),
                subfolder: name.subfolder().map(str::to_owned),
                revision: commit.to_owned(),
            },
        };
        fetched.push(FetchedCheckpoint { name, location, files });
    }
    let previous = repo.read_ref(REVISION);
    if previous.as_deref() != Some(commit) {
        repo.write_ref(REVISION, commit)?;
        if let Some(previous) = previous {
            note_left_behind(&repo, &previous, commit, unique, &mut progress);
        }
    }
    let total: u64 = fetched.iter().map(FetchedCheckpoint::transferred_bytes).sum();
    progress.note(&format!("fetched {}: {} downloaded", listed.join(", "), human(total)));
    Ok(fetched)
}

/// The repo paths of a checkpoint's files.
fn checkpoint_paths(name: CheckpointName) -> Vec<String> {
    CHECKPOINT_FILES
        .iter()
        .map(|file| match name.subfolder() {
            Some(sub) => format!("{sub}/{file}"),
            None => (*file).to_owned(),
        })
        .collect()
}

/// The checkpoint's folder inside a snapshot.
fn subfolder(snapshot: std::path::PathBuf, name: CheckpointName) -> std::path::PathBuf {
    match name.subfolder() {
        Some(sub) => snapshot.join(sub),
        None => snapshot,
    }
}

/// Makes `snapshots/<commit>/<path>` exist: already there, linked to a cached blob, or downloaded.
async fn ensure_file(
    hub: &Hub,
    repo: &RepoCache,
    commit: &str,
    path: &str,
    retries: u32,
    progress: &mut Progress,
) -> Result<(FileState, u64), FetchError> {
    let size_on_disk = |state: FileState| {
        let pointer = repo.pointer(commit, path);
        let size = std::fs::metadata(&pointer).map_err(FetchError::io(&pointer))?.len();
        Ok((state, size))
    };
    if repo.has_file(commit, path) {
        return size_on_disk(FileState::InSnapshot);
    }
    let meta = hub.file_meta(BUNDLE_REPO, commit, path).await?;
    if repo.has_blob(&meta.etag) {
        repo.link(commit, path, &meta.etag)?;
        return size_on_disk(FileState::BlobReused);
    }
    let _lock = repo
        .lock_blob(&meta.etag, || {
            progress.note(&format!("{path}: another process is downloading it; waiting"));
        })
        .await?;
    // The other process may have finished it while we waited.
    if repo.has_blob(&meta.etag) {
        repo.link(commit, path, &meta.etag)?;
        return size_on_disk(FileState::BlobReused);
    }
    let integrity = Integrity::from_etag(&meta.etag);
    if meta.lfs && !matches!(integrity, Integrity::Sha256(_)) {
        progress.note(&format!(
            "{path}: the Hub's LFS ETag {} is not a SHA-256; only the size can be checked",
            meta.etag
        ));
    }
    let target = Target {
        repo_path: path,
        url: hub.resolve_url(BUNDLE_REPO, commit, path),
        size: meta.size,
        integrity,
    };
    let incomplete = repo.incomplete(&meta.etag);
    let transferred = download::download(hub, &target, &incomplete, retries, progress).await?;
    let blob = repo.blob(&meta.etag);
    std::fs::rename(&incomplete, &blob).map_err(FetchError::io(&blob))?;
    repo.link(commit, path, &meta.etag)?;
    size_on_disk(FileState::Downloaded { transferred })
}

/// Splits `names` into checkpoints complete in the cache (every file of [`CHECKPOINT_FILES`]
/// present where [`find_in_hf_cache`] finds them) and the others.
fn split_cached(
    names: &[CheckpointName],
    cache_dir: &Path,
) -> Result<(Vec<FetchedCheckpoint>, Vec<CheckpointName>), FetchError> {
    let mut found = Vec::new();
    let mut missing = Vec::new();
    for &name in names {
        let location = match find_in_hf_cache(cache_dir, name) {
            Ok(location) => location,
            Err(CheckpointError::NotFound { .. }) => {
                missing.push(name);
                continue;
            }
            Err(e) => return Err(FetchError::Cache(e)),
        };
        let sizes: Option<Vec<u64>> = CHECKPOINT_FILES
            .iter()
            .map(|file| std::fs::metadata(location.dir.join(file)).ok().map(|m| m.len()))
            .collect();
        let Some(sizes) = sizes else {
            missing.push(name);
            continue;
        };
        let subfolder = match &location.origin {
            Origin::HfCache { subfolder, .. } => subfolder.clone(),
            Origin::Directory => None,
        };
        let files = CHECKPOINT_FILES
            .iter()
            .zip(sizes)
            .map(|(file, size)| FetchedFile {
                repo_path: subfolder
                    .as_ref()
                    .map_or_else(|| (*file).to_owned(), |sub| format!("{sub}/{file}")),
                size,
                state: FileState::InSnapshot,
            })
            .collect();
        found.push(FetchedCheckpoint { name, location, files });
    }
    Ok((found, missing))
}

/// [`FetchError::Offline`] for `missing`.
fn offline_error(missing: &[CheckpointName], cache_dir: &Path) -> FetchError {
    let names: Vec<&str> = missing.iter().map(|n| n.as_str()).collect();
    FetchError::Offline {
        names: names.join(" "),
        cache: cache_dir.to_path_buf(),
    }
}

/// After `refs/main` moved, says which checkpoints stayed at the old commit (and so are no longer
/// found in the cache until fetched again).
fn note_left_behind(
    repo: &RepoCache,
    previous: &str,
    commit: &str,
    fetched: &[CheckpointName],
    progress: &mut Progress,
) {
    let left: Vec<&str> = CheckpointName::ALL
        .into_iter()
        .filter(|name| !fetched.contains(name))
        .filter(|&name| {
            subfolder(repo.snapshot(previous), name)
                .join(CHECKPOINT_FILES[0])
                .is_file()
        })
        .filter(|&name| {
            !subfolder(repo.snapshot(commit), name)
                .join(CHECKPOINT_FILES[0])
                .is_file()
        })
        .map(CheckpointName::as_str)
        .collect();
    if !left.is_empty() {
        progress.note(&format!(
            "main moved from {previous} to {commit}; {} stayed at the old commit: run `layad fetch {}` to update",
            left.join(", "),
            left.join(" ")
        ));
    }
}
