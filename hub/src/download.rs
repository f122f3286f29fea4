//! One file's bytes: downloaded into `blobs/<etag>.incomplete`, resumed with `Range` after a cut
//! (restarted when the server ignores `Range`), then verified against the ETag before it is kept.

use std::io::Read;
use std::path::Path;

use reqwest::StatusCode;
use reqwest::header::CONTENT_RANGE;
use sha1::Sha1;
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;

use crate::api::{Hub, backoff};
use crate::error::FetchError;
use crate::progress::{FileProgress, Progress};

/// Bytes buffered before a write to disk.
const WRITE_BUFFER: usize = 1 << 20;

/// What the finished file must hash to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Integrity {
    /// SHA-256 of the bytes: the ETag of an LFS file.
    Sha256(String),
    /// Git's blob id, SHA-1 of `blob <len>\0<bytes>`: the ETag of a file stored in git.
    GitBlobSha1(String),
    /// An ETag that is neither; only the size can be checked.
    Unknown,
}

impl Integrity {
    /// What an ETag promises: 64 hex digits are a SHA-256, 40 a git blob id.
    pub(crate) fn from_etag(etag: &str) -> Self {
        let hex = etag.chars().all(|c| c.is_ascii_hexdigit());
        match etag.len() {
            64 if hex => Integrity::Sha256(etag.to_ascii_lowercase()),
            40 if hex => Integrity::GitBlobSha1(etag.to_ascii_lowercase()),
            _ => Integrity::Unknown,
        }
    }
}

/// A file to download.
pub(crate) struct Target<'a> {
    /// Path in the repo, for messages.
    pub(crate) repo_path: &'a str,
    /// The resolve URL.
    pub(crate) url: reqwest::Url,
    /// Announced size, when known.
    pub(crate) size: Option<u64>,
    /// What the bytes must hash to.
    pub(crate) integrity: Integrity,
}

/// Downloads `target` into `incomplete` (resuming from its current length), retrying cuts up to
/// `retries` times, and verifies it. Returns the bytes transferred by this call. On a hash
/// mismatch the partial file is deleted.
pub(crate) async fn download(
    hub: &Hub,
    target: &Target<'_>,
    incomplete: &Path,
    retries: u32,
    progress: &mut Progress,
) -> Result<u64, FetchError> {
    if let Some(blobs) = incomplete.parent() {
        std::fs::create_dir_all(blobs).map_err(FetchError::io(blobs))?;
    }
    let mut transferred = 0u64;
    let mut tries = 0u32;
    loop {
        let mut have = file_len(incomplete)?;
        if target.size.is_some_and(|size| have > size) {
            truncate(incomplete)?;
            have = 0;
        }
        if target.size.is_some_and(|size| have == size) {
            break;
        }
        let mut file_progress = progress.file(target.repo_path, target.size, have);
        let outcome = fetch_from(hub, target, incomplete, have, &mut transferred, &mut file_progress).await;
        let now = file_len(incomplete)?;
        let outcome = outcome.and_then(|()| match target.size {
            Some(expected) if now != expected => Err(FetchError::Size {
                file: target.repo_path.to_owned(),
                expected,
                actual: now,
            }),
            _ => Ok(()),
        });
        match outcome {
            Ok(()) => {
                file_progress.finish(now);
                break;
            }
            Err(e) if retryable(&e) && tries < retries => {
                tries += 1;
                file_progress.note(&format!(
                    "{}: interrupted at {} ({e}); resuming, retry {tries} of {retries}",
                    target.repo_path,
                    crate::progress::human(now)
                ));
                tokio::time::sleep(backoff(tries - 1)).await;
            }
            Err(e) => {
                file_progress.interrupt();
                return Err(e);
            }
        }
    }
    verify(target, incomplete).await?;
    Ok(transferred)
}

/// A short body, or a partial file the server cannot extend, is worth another try, like a network
/// error.
fn retryable(error: &FetchError) -> bool {
    error.is_transient() || matches!(error, FetchError::Size { .. } | FetchError::Status { status: 416, .. })
}

/// One `GET` from byte `have` on, appended to `incomplete`.
async fn fetch_from(
    hub: &Hub,
    target: &Target<'_>,
    incomplete: &Path,
    have: u64,
    transferred: &mut u64,
    file_progress: &mut FileProgress<'_>,
) -> Result<(), FetchError> {
    let url = target.url.as_str();
    let mut response = hub.get(&target.url, have).await?;
    let status = response.status();
    let mut at = have;
    match status {
        StatusCode::PARTIAL_CONTENT if have > 0 => {
            let range = response.headers().get(CONTENT_RANGE).and_then(|v| v.to_str().ok());
            let expected = format!("bytes {have}-");
            if !range.is_some_and(|r| r.starts_with(&expected)) {
                return Err(FetchError::BadResponse {
                    url: url.to_owned(),
                    problem: format!("asked for bytes {have}- but got Content-Range {range:?}"),
                });
            }
        }
        StatusCode::OK => {
            if have > 0 {
                file_progress.note(&format!(
                    "{}: the server does not resume downloads; starting again from 0",
                    target.repo_path
                ));
                truncate(incomplete)?;
                at = 0;
            }
        }
        StatusCode::RANGE_NOT_SATISFIABLE => {
            // The partial file is not a prefix of anything the server has: start over.
            truncate(incomplete)?;
            return Err(FetchError::status(url, status));
        }
        _ => return Err(FetchError::status(url, status)),
    }
    let file = tokio::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(incomplete)
        .await
        .map_err(FetchError::io(incomplete))?;
    let mut writer = tokio::io::BufWriter::with_capacity(WRITE_BUFFER, file);
    let body = loop {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                writer.write_all(&chunk).await.map_err(FetchError::io(incomplete))?;
                at += chunk.len() as u64;
                *transferred += chunk.len() as u64;
                file_progress.advance(at);
            }
            Ok(None) => break Ok(()),
            Err(e) => break Err(FetchError::transport(url, e)),
        }
    };
    // Keep what arrived even when the body was cut: the next try resumes after it.
    writer.flush().await.map_err(FetchError::io(incomplete))?;
    writer.get_ref().sync_data().await.map_err(FetchError::io(incomplete))?;
    body
}

/// Hashes the finished file; on a mismatch deletes it and names the file in the error.
async fn verify(target: &Target<'_>, incomplete: &Path) -> Result<(), FetchError> {
    let (algorithm, expected) = match &target.integrity {
        Integrity::Sha256(hex) => ("SHA-256", hex.clone()),
        Integrity::GitBlobSha1(hex) => ("git blob SHA-1", hex.clone()),
        Integrity::Unknown => return Ok(()),
    };
    let path = incomplete.to_path_buf();
    let integrity = target.integrity.clone();
    let actual = tokio::task::spawn_blocking(move || hash_file(&path, &integrity))
        .await
        .map_err(|e| FetchError::io(incomplete)(std::io::Error::other(e)))??;
    if actual == expected {
        return Ok(());
    }
    std::fs::remove_file(incomplete).map_err(FetchError::io(incomplete))?;
    Err(FetchError::Checksum {
        file: target.repo_path.to_owned(),
        algorithm,
        expected,
        actual,
    })
}

/// The file's hash in the form `integrity` asks for, as lower-case hex.
fn hash_file(path: &Path, integrity: &Integrity) -> Result<String, FetchError> {
    let mut file = std::fs::File::open(path).map_err(FetchError::io(path))?;
    let mut buffer = vec![0u8; WRITE_BUFFER];
    let mut feed = |update: &mut dyn FnMut(&[u8])| -> Result<(), FetchError> {
        loop {
            let n = file.read(&mut buffer).map_err(FetchError::io(path))?;
            if n == 0 {
                return Ok(());
            }
            update(&buffer[..n]);
        }
    };
    let digest = match integrity {
        Integrity::Sha256(_) => {
            let mut hasher = Sha256::new();
            feed(&mut |bytes| hasher.update(bytes))?;
            hex(&hasher.finalize())
        }
        Integrity::GitBlobSha1(_) => {
            let len = file_len(path)?;
            let mut hasher = Sha1::new();
            hasher.update(format!("blob {len}\0").as_bytes());
            feed(&mut |bytes| hasher.update(bytes))?;
            hex(&hasher.finalize())
        }
        Integrity::Unknown => String::new(),
    };
    Ok(digest)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Length of `path`, 0 when it does not exist.
fn file_len(path: &Path) -> Result<u64, FetchError> {
    match std::fs::metadata(path) {
        Ok(meta) => Ok(meta.len()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(0),
        Err(e) => Err(FetchError::io(path)(e)),
    }
}

/// Empties `path` (creating it if needed).
fn truncate(path: &Path) -> Result<(), FetchError> {
    std::fs::File::create(path).map(drop).map_err(FetchError::io(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etags_say_which_hash_to_check() {
        let sha256 = "C4AB9B72F820DD912FC8C40AC3FF7B4220A60093E418C8E21A33862E96169FC1";
        assert_eq!(
            Integrity::from_etag(sha256),
            Integrity::Sha256(sha256.to_ascii_lowercase())
        );
        let sha1 = "0123456789abcdef0123456789abcdef01234567";
        assert_eq!(Integrity::from_etag(sha1), Integrity::GitBlobSha1(sha1.to_owned()));
        assert_eq!(Integrity::from_etag("v1-abc"), Integrity::Unknown);
    }

    #[test]
    fn git_blob_ids_match_git() {
        // `printf 'hello\n' | git hash-object --stdin` prints ce013625030ba8dba906f756967f9e9ca394464a.
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("f");
        std::fs::write(&path, "hello\n").expect("write");
        let id = hash_file(&path, &Integrity::GitBlobSha1(String::new())).expect("hash");
        assert_eq!(id, "ce013625030ba8dba906f756967f9e9ca394464a");
        let sha = hash_file(&path, &Integrity::Sha256(String::new())).expect("hash");
        assert_eq!(sha, "5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03");
    }
}
