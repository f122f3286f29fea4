//! The supervisor's private runtime directory: one per running instance, `<base>/<pid>-<random>`,
//! holding its workers' sockets and `instance.json` (pid, bound address, configuration file), which
//! `layad reload` reads to find the server.
//!
//! The base (`workers.socket_dir`, else `$XDG_RUNTIME_DIR/layad`, else `<temp>/layad-<uid>`) is
//! created with mkdir 0700 and opened without following a symlink; a symlink, a non-directory or a
//! directory owned by another user is refused at start-up and left untouched. An instance holds an
//! exclusive `flock` on its directory while it runs (the kernel drops it when the process dies, even
//! by SIGKILL), so a directory whose lock is free and whose pid is gone is a dead instance's: the
//! next instance to start removes it.

use std::fs::{File, Permissions};
use std::net::SocketAddr;
use std::os::fd::OwnedFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg, OFlag, open, openat};
use nix::sys::stat::{Mode, mkdirat};
use nix::unistd::Pid;
use serde_json::{Value, json};

use crate::process::WorkersError;

/// The record of a running instance, in its directory.
const RECORD: &str = "instance.json";

/// This instance's directory, locked for as long as the value lives; dropping it removes the
/// directory (call it once the workers have stopped).
#[derive(Debug)]
pub struct RuntimeDir {
    path: PathBuf,
    // The lock says "in use" to every other instance; released when this process ends.
    _lock: Flock<OwnedFd>,
}

/// A running instance as its record describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InstanceRecord {
    /// The supervisor's process id.
    pub pid: u32,
    /// The address its HTTP listener is bound to.
    pub listen: SocketAddr,
    /// The configuration file it was started with (absolute), if any.
    pub config: Option<PathBuf>,
}

impl RuntimeDir {
    /// Checks (or creates) `base`, removes the directories of dead instances in it, and creates and
    /// locks this instance's own directory.
    pub fn create(base: &Path) -> Result<Self, WorkersError> {
        let fail = |reason: String| WorkersError::SocketDir {
            dir: base.to_owned(),
            reason,
        };
        let base_fd = open_base(base)?;
        remove_dead_instances(base, &base_fd);
        let random = crate::process::nonce::random_hex(4).map_err(|e| fail(format!("no random bytes: {e}")))?;
        let name = format!("{}-{random}", std::process::id());
        mkdirat(&base_fd, name.as_str(), Mode::S_IRWXU)
            .map_err(|e| fail(format!("cannot create the instance directory {name}: {e}")))?;
        let fd = open_dir_at(&base_fd, &name).map_err(|e| fail(format!("cannot open {name}: {e}")))?;
        let file = File::from(fd);
        // mkdir's mode went through the umask, which only takes bits away; set it exactly.
        file.set_permissions(Permissions::from_mode(0o700))
            .map_err(|e| fail(format!("cannot set mode 0700 on {name}: {e}")))?;
        let lock = Flock::lock(OwnedFd::from(file), FlockArg::LockExclusiveNonblock)
            .map_err(|(_, e)| fail(format!("cannot lock {name}: {e}")))?;
        Ok(Self {
            path: base.join(name),
            _lock: lock,
        })
    }

    /// The directory: the worker sockets go here.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes `instance.json` (replacing it whole), for `layad reload` to find this server.
    pub fn record(&self, record: &InstanceRecord) -> std::io::Result<()> {
        let text = json!({
            "pid": record.pid,
            "listen": record.listen.to_string(),
            "config": record.config.as_ref().map(|c| c.display().to_string()),
        })
        .to_string();
        let partial = self.path.join(format!(".{RECORD}.partial"));
        std::fs::write(&partial, text)?;
        std::fs::rename(&partial, self.path.join(RECORD))
    }
}

impl Drop for RuntimeDir {
    fn drop(&mut self) {
        if let Err(error) = std::fs::remove_dir_all(&self.path) {
            tracing::warn!(dir = %self.path.display(), %error, "cannot remove the runtime directory");
        }
    }
}

/// The records of the instances running in `base` (those holding their lock), oldest pid first.
/// Instances whose record cannot be read (still starting) are left out.
pub fn running_instances(base: &Path) -> Vec<InstanceRecord> {
    let Ok(entries) = std::fs::read_dir(base) else {
        return Vec::new();
    };
    let mut found: Vec<InstanceRecord> = entries
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name().into_string().ok()?;
            instance_pid(&name)?;
            let dir = base.join(&name);
            let fd = open(
                &dir,
                OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                Mode::empty(),
            )
            .ok()?;
            // A shared lock granted means nobody holds the exclusive one: a dead instance.
            if Flock::lock(fd, FlockArg::LockSharedNonblock).is_ok() {
                return None;
            }
            parse_record(&std::fs::read_to_string(dir.join(RECORD)).ok()?)
        })
        .collect();
    found.sort_by_key(|r| r.pid);
    found
}

fn parse_record(text: &str) -> Option<InstanceRecord> {
    let value: Value = serde_json::from_str(text).ok()?;
    Some(InstanceRecord {
        pid: u32::try_from(value["pid"].as_u64()?).ok()?,
        listen: value["listen"].as_str()?.parse().ok()?,
        config: value["config"].as_str().map(PathBuf::from),
    })
}

/// The pid in an instance directory's name (`<pid>-<8 hex digits>`), or `None` for anything else.
fn instance_pid(name: &str) -> Option<i32> {
    let (pid, random) = name.split_once('-')?;
    let hex = random.len() == 8 && random.bytes().all(|b| b.is_ascii_hexdigit());
    hex.then(|| pid.parse().ok()).flatten()
}

fn open_dir_at(dir: &OwnedFd, name: &str) -> nix::Result<OwnedFd> {
    openat(
        dir,
        name,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
}

/// Creates `base` if it is missing (its last component with mkdir 0700, which never follows a
/// symlink), opens it without following one, and checks it is a directory of this user's. Group and
/// other access to a directory of ours is taken away (through the open descriptor, so nothing can
/// be swapped in between).
fn open_base(base: &Path) -> Result<OwnedFd, WorkersError> {
    let fail = |reason: String| WorkersError::SocketDir {
        dir: base.to_owned(),
        reason,
    };
    if let Some(parent) = base.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(|e| fail(format!("cannot create its parent: {e}")))?;
    }
    match std::fs::DirBuilder::new().mode(0o700).create(base) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(fail(format!("cannot create it: {e}"))),
    }
    let metadata = std::fs::symlink_metadata(base).map_err(|e| fail(format!("cannot stat it: {e}")))?;
    if metadata.file_type().is_symlink() {
        let target = std::fs::read_link(base).map_or_else(|_| "?".to_owned(), |t| t.display().to_string());
        return Err(fail(format!(
            "is a symbolic link (to {target}); layad never follows one there: point workers.socket_dir at a \
             real directory of this user's"
        )));
    }
    let fd = match open(
        base,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(Errno::ELOOP) => return Err(fail("is a symbolic link; layad never follows one there".to_owned())),
        Err(Errno::ENOTDIR) => return Err(fail("is not a directory".to_owned())),
        Err(e) => return Err(fail(format!("cannot open it: {e}"))),
    };
    let file = File::from(fd);
    let metadata = file.metadata().map_err(|e| fail(format!("cannot stat it: {e}")))?;
    let uid = nix::unistd::geteuid().as_raw();
    if metadata.uid() != uid {
        return Err(fail(format!(
            "is owned by uid {}, not by this user (uid {uid}); layad keeps its worker sockets only in a \
             directory of its own user's",
            metadata.uid()
        )));
    }
    let mode = metadata.mode() & 0o777;
    if mode & 0o077 != 0 {
        tracing::warn!(dir = %base.display(), mode = format!("{mode:04o}"), "socket directory is not private; setting mode 0700");
        file.set_permissions(Permissions::from_mode(0o700))
            .map_err(|e| fail(format!("has mode {mode:04o} and cannot be made private: {e}")))?;
    }
    Ok(OwnedFd::from(file))
}

/// Removes the directories of instances that died without cleaning up: lock free and pid gone.
fn remove_dead_instances(base: &Path, base_fd: &OwnedFd) {
    let Ok(entries) = std::fs::read_dir(base) else { return };
    for entry in entries.flatten() {
        let Some(name) = entry.file_name().into_string().ok() else {
            continue;
        };
        let Some(pid) = instance_pid(&name) else { continue };
        // EPERM: alive, someone else's. Only ESRCH says the process is gone.
        if nix::sys::signal::kill(Pid::from_raw(pid), None) != Err(Errno::ESRCH) {
            continue;
        }
        let Ok(fd) = open_dir_at(base_fd, &name) else { continue };
        if let Ok(lock) = Flock::lock(fd, FlockArg::LockExclusiveNonblock) {
            match std::fs::remove_dir_all(base.join(&name)) {
                Ok(()) => {
                    tracing::info!(dir = %base.join(&name).display(), "removed the runtime directory of a dead instance")
                }
                Err(error) => {
                    tracing::warn!(dir = %base.join(&name).display(), %error, "cannot remove a dead instance's directory")
                }
            }
            drop(lock);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base_in(root: &tempfile::TempDir) -> PathBuf {
        root.path().join("sockets")
    }

    #[test]
    fn each_instance_gets_its_own_locked_private_directory() {
        let root = tempfile::tempdir().expect("tempdir");
        let base = base_in(&root);
        let (a, b) = (
            RuntimeDir::create(&base).expect("a"),
            RuntimeDir::create(&base).expect("b"),
        );
        assert_ne!(a.path(), b.path());
        for dir in [&base, a.path(), b.path()] {
            assert_eq!(
                std::fs::metadata(dir).expect("dir").mode() & 0o777,
                0o700,
                "{}",
                dir.display()
            );
        }
        // Both are alive: a third instance removes neither.
        let c = RuntimeDir::create(&base).expect("c");
        assert!(a.path().is_dir() && b.path().is_dir());
        let record = InstanceRecord {
            pid: std::process::id(),
            listen: "127.0.0.1:8642".parse().expect("addr"),
            config: Some("/etc/layad.toml".into()),
        };
        a.record(&record).expect("record");
        assert_eq!(running_instances(&base), vec![record]);
        let path = c.path().to_owned();
        drop(c);
        assert!(!path.exists(), "dropping removes the directory");
    }

    #[test]
    fn a_dead_instances_directory_is_removed_and_a_live_ones_kept() {
        let root = tempfile::tempdir().expect("tempdir");
        let base = base_in(&root);
        let _ours = RuntimeDir::create(&base).expect("create");
        // pid_max is below 2^22 on Linux and 99999 on macOS: this pid does not exist.
        let dead = base.join("2147483646-0badcafe");
        std::fs::create_dir(&dead).expect("dead");
        std::fs::write(dead.join("gpu-0-0.sock"), b"").expect("stale socket");
        let unrelated = base.join("notes");
        std::fs::create_dir(&unrelated).expect("unrelated");
        let _next = RuntimeDir::create(&base).expect("next");
        assert!(!dead.exists(), "the dead instance's directory is removed");
        assert!(unrelated.exists(), "anything not named like an instance is left alone");
    }

    #[test]
    fn a_symlink_or_a_non_directory_is_refused_and_left_untouched() {
        let root = tempfile::tempdir().expect("tempdir");
        let target = root.path().join("target");
        std::fs::create_dir(&target).expect("target");
        std::fs::set_permissions(&target, Permissions::from_mode(0o755)).expect("chmod");
        let link = root.path().join("link");
        std::os::unix::fs::symlink(&target, &link).expect("symlink");
        let error = RuntimeDir::create(&link).expect_err("refused").to_string();
        assert!(error.contains("is a symbolic link"), "{error}");
        assert_eq!(std::fs::metadata(&target).expect("target").mode() & 0o777, 0o755);
        assert_eq!(std::fs::read_dir(&target).expect("list").count(), 0);

        let file = root.path().join("file");
        std::fs::write(&file, b"x").expect("file");
        let error = RuntimeDir::create(&file).expect_err("refused").to_string();
        assert!(error.contains("is not a directory"), "{error}");
    }

    #[test]
    fn a_shared_directory_of_ours_is_made_private() {
        let root = tempfile::tempdir().expect("tempdir");
        let base = base_in(&root);
        std::fs::create_dir(&base).expect("base");
        std::fs::set_permissions(&base, Permissions::from_mode(0o777)).expect("chmod");
        let _dir = RuntimeDir::create(&base).expect("create");
        assert_eq!(std::fs::metadata(&base).expect("base").mode() & 0o777, 0o700);
    }

    #[test]
    fn instance_names_are_pid_dash_eight_hex_digits() {
        assert_eq!(instance_pid("1234-0badcafe"), Some(1234));
        for other in ["1234", "x-0badcafe", "1234-0badcaf", "1234-0badcafeg", "gpu-0-0.sock"] {
            assert_eq!(instance_pid(other), None, "{other}");
        }
    }
}
