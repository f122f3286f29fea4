//! The Hugging Face cache layout exactly as `huggingface_hub` writes it — `models--owner--name/`
//! with `blobs/<etag>`, `snapshots/<commit>/<path>` relative symlinks, `refs/main` — plus its locks.
//!
//! Sharing the layout (and the `.locks/<repo folder>/<etag>.lock` files) is what lets upstream laya
//! and layad use one copy of the weights, and keeps either from reading a blob the other is writing.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use nix::fcntl::{Flock, FlockArg};

use crate::error::FetchError;

/// One repo's folder in the hub cache.
#[derive(Clone, Debug)]
pub(crate) struct RepoCache {
    /// The hub cache (parent of `.locks` and of the repo folder).
    cache_dir: PathBuf,
    /// `models--owner--name`.
    folder_name: String,
}

impl RepoCache {
    /// The folder of model repo `repo` (`owner/name`) in `cache_dir`.
    pub(crate) fn new(cache_dir: &Path, repo: &str) -> Self {
        Self {
            cache_dir: cache_dir.to_path_buf(),
            folder_name: format!("models--{}", repo.replace('/', "--")),
        }
    }

    fn root(&self) -> PathBuf {
        self.cache_dir.join(&self.folder_name)
    }

    /// `blobs/<etag>`: the file's bytes, named by the Hub's ETag.
    pub(crate) fn blob(&self, etag: &str) -> PathBuf {
        self.root().join("blobs").join(etag)
    }

    /// `blobs/<etag>.incomplete`: a download in progress, resumed from its length.
    pub(crate) fn incomplete(&self, etag: &str) -> PathBuf {
        self.root().join("blobs").join(format!("{etag}.incomplete"))
    }

    /// `snapshots/<commit>`: the repo's files at one commit.
    pub(crate) fn snapshot(&self, commit: &str) -> PathBuf {
        self.root().join("snapshots").join(commit)
    }

    /// `snapshots/<commit>/<path>`: where a file of the repo appears.
    pub(crate) fn pointer(&self, commit: &str, repo_path: &str) -> PathBuf {
        self.snapshot(commit).join(repo_path)
    }

    /// Whether `snapshots/<commit>/<path>` exists and leads to a regular file.
    pub(crate) fn has_file(&self, commit: &str, repo_path: &str) -> bool {
        self.pointer(commit, repo_path).is_file()
    }

    /// Whether the blob is complete in the cache (only complete blobs get their final name).
    pub(crate) fn has_blob(&self, etag: &str) -> bool {
        self.blob(etag).is_file()
    }

    /// Points `snapshots/<commit>/<path>` at `blobs/<etag>` with a relative symlink (so the cache
    /// can be moved), replacing whatever was there in one rename.
    pub(crate) fn link(&self, commit: &str, repo_path: &str, etag: &str) -> Result<(), FetchError> {
        let pointer = self.pointer(commit, repo_path);
        let parent = pointer.parent().unwrap_or(&pointer).to_path_buf();
        std::fs::create_dir_all(&parent).map_err(FetchError::io(&parent))?;
        // From snapshots/<commit>/<a>/<b>/<file> back up to the repo folder, then into blobs/.
        let depth = 1 + repo_path.split('/').count();
        let target = format!("{}blobs/{etag}", "../".repeat(depth));
        let file_name = pointer.file_name().map(|n| n.to_string_lossy()).unwrap_or_default();
        let temporary = parent.join(format!(".{file_name}.{}.link", unique_suffix()));
        let _ = std::fs::remove_file(&temporary);
        std::os::unix::fs::symlink(&target, &temporary).map_err(FetchError::io(&temporary))?;
        std::fs::rename(&temporary, &pointer).map_err(FetchError::io(&pointer))
    }

    /// Writes `refs/<name>` = `commit` (no trailing newline, as `huggingface_hub` writes it), atomically.
    pub(crate) fn write_ref(&self, name: &str, commit: &str) -> Result<(), FetchError> {
        let refs = self.root().join("refs");
        std::fs::create_dir_all(&refs).map_err(FetchError::io(&refs))?;
        let path = refs.join(name);
        let temporary = refs.join(format!(".{name}.{}.tmp", unique_suffix()));
        std::fs::write(&temporary, commit).map_err(FetchError::io(&temporary))?;
        std::fs::rename(&temporary, &path).map_err(FetchError::io(&path))
    }

    /// The commit `refs/<name>` names, if the file exists and reads.
    pub(crate) fn read_ref(&self, name: &str) -> Option<String> {
        let text = std::fs::read_to_string(self.root().join("refs").join(name)).ok()?;
        Some(text.trim().to_owned()).filter(|c| !c.is_empty())
    }

    /// Takes `huggingface_hub`'s lock for blob `etag` (`.locks/<repo folder>/<etag>.lock`, flock),
    /// calling `on_wait` first if another process holds it. Released when the guard drops.
    pub(crate) async fn lock_blob(&self, etag: &str, on_wait: impl FnOnce()) -> Result<BlobLock, FetchError> {
        let dir = self.cache_dir.join(".locks").join(&self.folder_name);
        std::fs::create_dir_all(&dir).map_err(FetchError::io(&dir))?;
        let path = dir.join(format!("{etag}.lock"));
        let file = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(FetchError::io(&path))?;
        let file = match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(lock) => return Ok(BlobLock(lock)),
            Err((file, nix::errno::Errno::EWOULDBLOCK)) => file,
            Err((_, errno)) => return Err(FetchError::io(&path)(errno.into())),
        };
        on_wait();
        let waiting = path.clone();
        let locked = tokio::task::spawn_blocking(move || Flock::lock(file, FlockArg::LockExclusive))
            .await
            .map_err(|e| FetchError::io(&waiting)(std::io::Error::other(e)))?;
        locked
            .map(BlobLock)
            .map_err(|(_, errno)| FetchError::io(&path)(errno.into()))
    }
}

/// `<pid>-<n>`: a temporary name no other process or concurrent fetch in this one uses.
fn unique_suffix() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!("{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed))
}

/// An exclusive lock on one blob; other processes that download the same blob wait for it.
#[derive(Debug)]
pub(crate) struct BlobLock(#[allow(dead_code, reason = "held for its Drop, which unlocks")] Flock<File>);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_matches_huggingface_hub() {
        let cache = RepoCache::new(Path::new("/c"), "convaiinnovations/laya");
        assert_eq!(
            cache.blob("ab"),
            Path::new("/c/models--convaiinnovations--laya/blobs/ab")
        );
        assert_eq!(
            cache.incomplete("ab"),
            Path::new("/c/models--convaiinnovations--laya/blobs/ab.incomplete")
        );
        assert_eq!(
            cache.pointer("c0ffee", "multilingual/tokenizer/tokenizer.json"),
            Path::new("/c/models--convaiinnovations--laya/snapshots/c0ffee/multilingual/tokenizer/tokenizer.json")
        );
    }

    #[test]
    fn links_are_relative_and_match_the_fixture_cache() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cache = RepoCache::new(dir.path(), "o/r");
        for (path, expected) in [
            ("model.safetensors", "../../blobs/e1"),
            ("encoder/config.json", "../../../blobs/e1"),
            ("multilingual/tokenizer/tokenizer.json", "../../../../blobs/e1"),
        ] {
            cache.link("c1", path, "e1").expect("link");
            let target = std::fs::read_link(cache.pointer("c1", path)).expect("read link");
            assert_eq!(target, Path::new(expected), "{path}");
        }
        // Re-linking replaces the old link rather than failing.
        cache.link("c1", "model.safetensors", "e2").expect("relink");
        let target = std::fs::read_link(cache.pointer("c1", "model.safetensors")).expect("read link");
        assert_eq!(target, Path::new("../../blobs/e2"));
    }

    #[test]
    fn refs_round_trip_without_newline() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cache = RepoCache::new(dir.path(), "o/r");
        assert_eq!(cache.read_ref("main"), None);
        cache.write_ref("main", "abc123").expect("write ref");
        let raw = std::fs::read_to_string(dir.path().join("models--o--r/refs/main")).expect("read");
        assert_eq!(raw, "abc123");
        assert_eq!(cache.read_ref("main").as_deref(), Some("abc123"));
    }

    #[tokio::test]
    async fn a_held_blob_lock_makes_the_second_taker_wait() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cache = RepoCache::new(dir.path(), "o/r");
        let first = cache
            .lock_blob("e1", || panic!("nobody holds it yet"))
            .await
            .expect("lock");
        assert!(dir.path().join(".locks/models--o--r/e1.lock").is_file());
        let waited = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = waited.clone();
        let second = {
            let cache = cache.clone();
            tokio::spawn(async move {
                cache
                    .lock_blob("e1", move || flag.store(true, std::sync::atomic::Ordering::SeqCst))
                    .await
            })
        };
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        assert!(!second.is_finished(), "the second lock must wait for the first");
        drop(first);
        second.await.expect("join").expect("second lock");
        assert!(waited.load(std::sync::atomic::Ordering::SeqCst));
    }
}
