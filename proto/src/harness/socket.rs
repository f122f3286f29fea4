//! The worker's Unix socket: a private directory (0700, ours), a stale socket cleared, the socket bound
//! with mode 0600, and removed at exit only if it is still the one this worker bound.

use std::fs;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use tokio::net::UnixListener;

use crate::error::HarnessError;

/// A socket path whose directory has been checked; nothing is bound yet.
pub(crate) struct SocketPath {
    path: PathBuf,
}

/// The socket this worker bound, identified so that a successor's socket at the same path is never
/// removed: inode numbers are reused at once, so the change time (set by our chmod) is part of it.
pub(crate) struct BoundSocket {
    path: PathBuf,
    identity: FileIdentity,
}

type FileIdentity = (u64, u64, i64, i64);

fn identity(metadata: &fs::Metadata) -> FileIdentity {
    (metadata.dev(), metadata.ino(), metadata.ctime(), metadata.ctime_nsec())
}

impl SocketPath {
    /// Checks (or creates) the private directory and clears a stale socket, so that a worker that
    /// cannot serve on `path` fails before it spends time loading.
    pub(crate) fn prepare(path: &Path) -> Result<Self, HarnessError> {
        let socket_error = |reason: &str| HarnessError::Socket {
            path: path.to_owned(),
            reason: reason.to_owned(),
        };
        let dir = match path.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir,
            _ => {
                return Err(socket_error(
                    "needs a directory part (the directory must be private, mode 0700)",
                ));
            }
        };
        if path.file_name().is_none() {
            return Err(socket_error("has no file name"));
        }
        ensure_private_dir(dir)?;
        clear_stale(path)?;
        Ok(SocketPath { path: path.to_owned() })
    }

    /// Binds the socket (clearing a stale one left since [`SocketPath::prepare`]) and sets mode 0600.
    pub(crate) fn bind(self) -> Result<(UnixListener, BoundSocket), HarnessError> {
        let failed = |reason: String| HarnessError::Socket {
            path: self.path.clone(),
            reason,
        };
        clear_stale(&self.path)?;
        let listener = UnixListener::bind(&self.path).map_err(|e| failed(format!("cannot bind: {e}")))?;
        fs::set_permissions(&self.path, fs::Permissions::from_mode(0o600))
            .map_err(|e| failed(format!("cannot set mode 0600: {e}")))?;
        let metadata = fs::symlink_metadata(&self.path).map_err(|e| failed(format!("cannot stat: {e}")))?;
        Ok((
            listener,
            BoundSocket {
                path: self.path,
                identity: identity(&metadata),
            },
        ))
    }
}

impl BoundSocket {
    /// Removes the socket file if it is still the one bound here; new connections are then refused.
    pub(crate) fn remove(&self) {
        let ours = fs::symlink_metadata(&self.path).is_ok_and(|m| identity(&m) == self.identity);
        if ours && let Err(error) = fs::remove_file(&self.path) {
            tracing::warn!(socket = %self.path.display(), %error, "cannot remove the socket file");
        }
    }
}

/// The directory must exist as a real directory owned by us with mode 0700 (anyone else who can enter
/// it could connect to the worker); a missing one is created that way.
fn ensure_private_dir(dir: &Path) -> Result<(), HarnessError> {
    let failed = |reason: String| HarnessError::SocketDir {
        dir: dir.to_owned(),
        reason,
    };
    let metadata = match fs::symlink_metadata(dir) {
        Ok(metadata) => metadata,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            fs::DirBuilder::new()
                .mode(0o700)
                .create(dir)
                .map_err(|e| failed(format!("does not exist and cannot be created: {e}")))?;
            // The umask may have taken bits away but never adds any; set the mode exactly anyway.
            fs::set_permissions(dir, fs::Permissions::from_mode(0o700))
                .map_err(|e| failed(format!("cannot set mode 0700: {e}")))?;
            fs::symlink_metadata(dir).map_err(|e| failed(format!("cannot stat: {e}")))?
        }
        Err(error) => return Err(failed(format!("cannot stat: {error}"))),
    };
    if !metadata.file_type().is_dir() {
        return Err(failed("is not a directory (a symlink is refused too)".into()));
    }
    let uid = nix::unistd::getuid().as_raw();
    if metadata.uid() != uid {
        return Err(failed(format!(
            "is owned by uid {}, not by this worker's uid {uid}",
            metadata.uid()
        )));
    }
    let mode = metadata.mode() & 0o777;
    if mode != 0o700 {
        return Err(failed(format!("has mode {mode:04o}; it must be 0700 (owner only)")));
    }
    Ok(())
}

/// Removes a socket nobody listens on; refuses a live socket or a path that is not a socket.
fn clear_stale(path: &Path) -> Result<(), HarnessError> {
    let failed = |reason: String| HarnessError::Socket {
        path: path.to_owned(),
        reason,
    };
    match fs::symlink_metadata(path) {
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(error) => Err(failed(format!("cannot stat: {error}"))),
        Ok(metadata) if !metadata.file_type().is_socket() => Err(failed("exists and is not a socket".into())),
        Ok(_) => {
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                return Err(failed("another process is listening on it".into()));
            }
            tracing::info!(socket = %path.display(), "removing a stale socket");
            fs::remove_file(path).map_err(|e| failed(format!("cannot remove the stale socket: {e}")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn creates_a_missing_private_directory_and_binds_0600() {
        let root = tempfile::tempdir().expect("tempdir");
        let path = root.path().join("run").join("worker.sock");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let _guard = runtime.enter();
        let (_listener, bound) = SocketPath::prepare(&path).expect("prepare").bind().expect("bind");
        let dir_mode = fs::metadata(root.path().join("run")).expect("dir").mode() & 0o777;
        assert_eq!(dir_mode, 0o700);
        assert_eq!(fs::symlink_metadata(&path).expect("socket").mode() & 0o777, 0o600);
        // A live socket is refused, not stolen.
        let error = SocketPath::prepare(&path).err().expect("refused");
        assert!(error.to_string().contains("another process is listening"), "{error}");
        bound.remove();
        assert!(!path.exists());
    }

    #[test]
    fn refuses_shared_directories_and_non_sockets() {
        let root = tempfile::tempdir().expect("tempdir");
        fs::set_permissions(root.path(), fs::Permissions::from_mode(0o755)).expect("chmod");
        let error = SocketPath::prepare(&root.path().join("w.sock")).err().expect("refused");
        assert!(
            error
                .to_string()
                .ends_with("has mode 0755; it must be 0700 (owner only)"),
            "{error}"
        );

        fs::set_permissions(root.path(), fs::Permissions::from_mode(0o700)).expect("chmod");
        let file = root.path().join("plain");
        fs::write(&file, b"x").expect("write");
        let error = SocketPath::prepare(&file).err().expect("refused");
        assert!(error.to_string().ends_with("exists and is not a socket"), "{error}");
        let error = SocketPath::prepare(Path::new("w.sock")).err().expect("refused");
        assert!(error.to_string().contains("needs a directory part"), "{error}");
    }

    #[test]
    fn removes_a_stale_socket_but_not_a_successors() {
        let root = tempfile::tempdir().expect("tempdir");
        fs::set_permissions(root.path(), fs::Permissions::from_mode(0o700)).expect("chmod");
        let path = root.path().join("w.sock");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let _guard = runtime.enter();
        let (listener, first) = SocketPath::prepare(&path).expect("prepare").bind().expect("bind");
        drop(listener); // the file stays: a stale socket
        // A successor starts long after; the change time in the identity may come from a coarse clock.
        std::thread::sleep(std::time::Duration::from_millis(30));
        let (_listener, _second) = SocketPath::prepare(&path)
            .expect("stale cleared")
            .bind()
            .expect("bind again");
        first.remove(); // not ours any more
        assert!(path.exists());
    }
}
