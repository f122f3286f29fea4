//! The CPU quota of this process's cgroup — a container's CPU limit (`podman run --cpus`, a
//! Kubernetes `limits.cpu`) — and the threads per worker it leaves for pools with `threads = 0`.
//!
//! Why the supervisor reads it: a worker started without `--threads` sizes its pool with
//! `std::thread::available_parallelism`, which honours the quota, but each worker does so alone, so
//! a pool of two workers under a 4-CPU limit ran 2 × 4 compute threads, and the kernel throttled
//! the container for the excess. Only the supervisor knows how many workers share the quota.
//! Without a quota nothing changes: workers with `threads = 0` still share the machine's cores.
//!
//! The quota is read as the kernel exposes it: the cgroup of this process from
//! `/proc/self/cgroup`, the hierarchy's mount from `/proc/self/mountinfo`, then `cpu.max` (cgroup
//! v2: `max 100000` or `<quota> <period>`) or `cpu.cfs_quota_us` / `cpu.cfs_period_us` (v1: `-1`
//! when unlimited) in that cgroup and every ancestor up to the mount, the smallest one winning
//! (a limit on a parent caps its children). Every read goes through a root directory, so the tests
//! run it on sample files.

use std::fs;
use std::path::{Path, PathBuf};

use layad_config::{Device, PoolConfig, WorkerKind};

/// A CPU quota in force on this process.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CpuQuota {
    /// CPUs' worth of time per period (quota ÷ period), e.g. 2.5.
    pub cpus: f64,
    /// The cgroup version that set it.
    pub version: CgroupVersion,
}

/// Which cgroup interface a quota came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupVersion {
    /// The unified hierarchy's `cpu.max`.
    V2,
    /// The v1 `cpu` controller's `cpu.cfs_quota_us` / `cpu.cfs_period_us`.
    V1,
}

impl CpuQuota {
    /// The quota on this process, if any.
    pub fn current() -> Option<Self> {
        Self::read(Path::new("/"))
    }

    /// The quota as seen under `root` (`/` on a live system; a directory of sample files in tests):
    /// the smaller of the v2 and v1 quotas where both hierarchies limit the process.
    pub fn read(root: &Path) -> Option<Self> {
        let cgroups = fs::read_to_string(under(root, "/proc/self/cgroup")).ok()?;
        let mountinfo = fs::read_to_string(under(root, "/proc/self/mountinfo")).ok()?;
        let mounts = parse_mountinfo(&mountinfo);
        let mut best: Option<Self> = None;
        for (version, path) in parse_cgroups(&cgroups) {
            let Some(mount) = mounts.iter().find(|m| m.version == version) else {
                continue;
            };
            if let Some(cpus) = smallest_quota(root, mount, &path, version) {
                let found = Self { cpus, version };
                best = Some(match best {
                    Some(b) if b.cpus <= cpus => b,
                    _ => found,
                });
            }
        }
        best
    }

    /// Whole CPUs of the quota, at least one (2.5 CPUs → 2), as `available_parallelism` counts it.
    pub fn whole_cpus(&self) -> u32 {
        (self.cpus.floor() as u32).max(1)
    }
}

/// Threads per worker for the pools with `threads = 0` that run on the CPU (device `cpu` or `auto`;
/// `auto` may find a GPU, which ignores the count), so that all of them together fit `cpus`: what
/// pools with a set `threads` take is subtracted first, the rest is shared equally, at least one
/// thread each. `None` when no such pool exists.
pub fn threads_per_worker(pools: &[PoolConfig], cpus: u32) -> Option<u32> {
    let on_cpu = |p: &&PoolConfig| p.worker == WorkerKind::Gpu && matches!(p.device, Device::Cpu | Device::Auto);
    let set: u32 = pools
        .iter()
        .filter(on_cpu)
        .filter(|p| p.threads > 0)
        .map(|p| p.threads.saturating_mul(p.workers))
        .sum();
    let sharing: u32 = pools
        .iter()
        .filter(on_cpu)
        .filter(|p| p.threads == 0)
        .map(|p| p.workers)
        .sum();
    (sharing > 0).then(|| (cpus.saturating_sub(set) / sharing).max(1))
}

/// `path` (absolute) under `root`.
fn under(root: &Path, path: &str) -> PathBuf {
    root.join(path.trim_start_matches('/'))
}

/// One cgroup hierarchy's mount: where it is mounted and which cgroup its mount point shows.
#[derive(Debug, PartialEq)]
struct CgroupMount {
    version: CgroupVersion,
    /// The cgroup at the mount point (`/` on the host; the container's own one in a container
    /// without a cgroup namespace).
    root: String,
    mount_point: String,
}

/// The cgroup2 mount and the v1 mount holding the `cpu` controller, from `/proc/self/mountinfo`
/// (`id parent major:minor root mount-point options [optional...] - fstype source super-options`).
fn parse_mountinfo(text: &str) -> Vec<CgroupMount> {
    let mut mounts = Vec::new();
    for line in text.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let left: Vec<&str> = left.split(' ').collect();
        let right: Vec<&str> = right.split(' ').collect();
        let (Some(root), Some(mount_point), Some(fstype)) = (left.get(3), left.get(4), right.first()) else {
            continue;
        };
        let version = match *fstype {
            "cgroup2" => CgroupVersion::V2,
            "cgroup" if right.get(2).is_some_and(|opts| opts.split(',').any(|o| o == "cpu")) => CgroupVersion::V1,
            _ => continue,
        };
        if mounts.iter().any(|m: &CgroupMount| m.version == version) {
            continue;
        }
        mounts.push(CgroupMount {
            version,
            root: unescape_mount_field(root),
            mount_point: unescape_mount_field(mount_point),
        });
    }
    mounts
}

/// mountinfo writes space, tab, newline and backslash in paths as octal escapes (`\040`).
fn unescape_mount_field(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|b| (b'0'..=b'7').contains(b)));
        match (bytes[i], octal) {
            (b'\\', Some(d)) => {
                out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
                i += 4;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// This process's cgroup in the unified hierarchy (`0::/path`) and in the v1 `cpu` controller's
/// (`N:cpu,cpuacct:/path`), from `/proc/self/cgroup`.
fn parse_cgroups(text: &str) -> Vec<(CgroupVersion, String)> {
    let mut found = Vec::new();
    for line in text.lines() {
        let mut fields = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) = (fields.next(), fields.next(), fields.next()) else {
            continue;
        };
        if id == "0" && controllers.is_empty() {
            found.push((CgroupVersion::V2, path.to_owned()));
        } else if controllers.split(',').any(|c| c == "cpu") {
            found.push((CgroupVersion::V1, path.to_owned()));
        }
    }
    found
}

/// The smallest quota (in CPUs) from the cgroup at `path` up to the hierarchy's mount point.
fn smallest_quota(root: &Path, mount: &CgroupMount, path: &str, version: CgroupVersion) -> Option<f64> {
    // The cgroup's directory below the mount point; a path outside the mount's root (a cgroup
    // namespace, an unusual mount) leaves the mount point itself, the nearest cgroup visible.
    let relative = path
        .strip_prefix(mount.root.trim_end_matches('/'))
        .filter(|rest| rest.is_empty() || rest.starts_with('/'))
        .unwrap_or("");
    let top = under(root, &mount.mount_point);
    let mut dir = top.join(relative.trim_start_matches('/'));
    let mut smallest: Option<f64> = None;
    loop {
        let quota = match version {
            CgroupVersion::V2 => fs::read_to_string(dir.join("cpu.max"))
                .ok()
                .and_then(|t| parse_cpu_max(&t)),
            CgroupVersion::V1 => {
                let quota = fs::read_to_string(dir.join("cpu.cfs_quota_us")).ok();
                let period = fs::read_to_string(dir.join("cpu.cfs_period_us")).ok();
                quota.zip(period).and_then(|(q, p)| parse_cfs(&q, &p))
            }
        };
        if let Some(q) = quota {
            smallest = Some(smallest.map_or(q, |s: f64| s.min(q)));
        }
        if dir == top || !dir.pop() || !dir.starts_with(&top) {
            break;
        }
    }
    smallest
}

/// `cpu.max`: `max <period>` (no quota) or `<quota> <period>` in microseconds.
fn parse_cpu_max(text: &str) -> Option<f64> {
    let mut fields = text.split_whitespace();
    let quota: f64 = fields.next()?.parse().ok()?;
    let period: f64 = fields.next()?.parse().ok()?;
    (quota > 0.0 && period > 0.0).then_some(quota / period)
}

/// v1: `cpu.cfs_quota_us` (`-1`: no quota) over `cpu.cfs_period_us`.
fn parse_cfs(quota: &str, period: &str) -> Option<f64> {
    let quota: i64 = quota.trim().parse().ok()?;
    let period: i64 = period.trim().parse().ok()?;
    (quota > 0 && period > 0).then_some(quota as f64 / period as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Writes `files` (absolute paths) under a fresh directory standing in for `/`.
    fn system(files: &[(&str, &str)]) -> tempfile::TempDir {
        let root = tempfile::tempdir().expect("tempdir");
        for (path, text) in files {
            let file = under(root.path(), path);
            fs::create_dir_all(file.parent().expect("parent")).expect("mkdir");
            fs::write(file, text).expect("write");
        }
        root
    }

    const V2_MOUNTINFO: &str = "\
24 1 0:22 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
25 1 0:23 / /proc rw,nosuid - proc proc rw
";

    #[test]
    fn reads_a_v2_quota_in_a_cgroup_namespace() {
        // podman/Kubernetes on a v2 host: the container's own cgroup is `/` at the mount point.
        let root = system(&[
            ("/proc/self/cgroup", "0::/\n"),
            ("/proc/self/mountinfo", V2_MOUNTINFO),
            ("/sys/fs/cgroup/cpu.max", "250000 100000\n"),
        ]);
        let quota = CpuQuota::read(root.path()).expect("a quota");
        assert_eq!(
            quota,
            CpuQuota {
                cpus: 2.5,
                version: CgroupVersion::V2
            }
        );
        assert_eq!(quota.whole_cpus(), 2);
    }

    #[test]
    fn v2_without_a_limit_is_no_quota() {
        let root = system(&[
            ("/proc/self/cgroup", "0::/user.slice/session-1.scope\n"),
            ("/proc/self/mountinfo", V2_MOUNTINFO),
            ("/sys/fs/cgroup/cpu.max", "max 100000\n"),
            ("/sys/fs/cgroup/user.slice/cpu.max", "max 100000\n"),
            ("/sys/fs/cgroup/user.slice/session-1.scope/cpu.max", "max 100000\n"),
        ]);
        assert_eq!(CpuQuota::read(root.path()), None);
    }

    #[test]
    fn a_parents_smaller_v2_limit_wins() {
        // A pod's limit on kubepods/pod… caps the container's own, larger one below it.
        let root = system(&[
            ("/proc/self/cgroup", "0::/kubepods/pod1/ctr\n"),
            ("/proc/self/mountinfo", V2_MOUNTINFO),
            ("/sys/fs/cgroup/kubepods/cpu.max", "max 100000\n"),
            ("/sys/fs/cgroup/kubepods/pod1/cpu.max", "100000 100000\n"),
            ("/sys/fs/cgroup/kubepods/pod1/ctr/cpu.max", "400000 100000\n"),
        ]);
        assert_eq!(CpuQuota::read(root.path()).map(|q| q.cpus), Some(1.0));
    }

    const V1_MOUNTINFO: &str = "\
30 25 0:26 / /sys/fs/cgroup ro,nosuid,nodev,noexec - tmpfs tmpfs ro,mode=755
35 30 0:31 /machine.slice/libpod-abc.scope /sys/fs/cgroup/cpu,cpuacct ro,nosuid,nodev,noexec,relatime - cgroup cgroup rw,cpu,cpuacct
36 30 0:32 /machine.slice/libpod-abc.scope /sys/fs/cgroup/cpuset ro,nosuid - cgroup cgroup rw,cpuset
37 30 0:33 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw
";

    #[test]
    fn reads_a_v1_quota_without_a_cgroup_namespace() {
        // podman with runc on a v1 host: /proc/self/cgroup names the host's path, which is the
        // mount's root, so the quota is the mount point's own file.
        let root = system(&[
            (
                "/proc/self/cgroup",
                "12:cpuset:/machine.slice/libpod-abc.scope\n4:cpu,cpuacct:/machine.slice/libpod-abc.scope\n0::/machine.slice/libpod-abc.scope\n",
            ),
            ("/proc/self/mountinfo", V1_MOUNTINFO),
            ("/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us", "150000\n"),
            ("/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us", "100000\n"),
            // The unified hierarchy of a hybrid host carries no controller: no cpu.max there.
        ]);
        let quota = CpuQuota::read(root.path()).expect("a quota");
        assert_eq!(
            quota,
            CpuQuota {
                cpus: 1.5,
                version: CgroupVersion::V1
            }
        );
        assert_eq!(quota.whole_cpus(), 1);
    }

    #[test]
    fn reads_podman_runc_on_this_v1_host() {
        // As read inside `podman run --runtime runc --cpus 1.5` on the CI machine (Debian 12,
        // cgroup v1 with `cpu` and `cpuacct` mounted apart, a `0::` line but no cgroup2 mount).
        let id = "/libpod_parent/libpod-38a8287db622";
        let root = system(&[
            (
                "/proc/self/cgroup",
                &format!("4:memory:{id}\n2:cpuacct:{id}\n1:cpu:{id}\n0::{id}\n"),
            ),
            (
                "/proc/self/mountinfo",
                &format!(
                    "93 84 0:48 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime - tmpfs tmpfs rw,mode=755\n\
                     94 93 0:29 {id} /sys/fs/cgroup/cpu ro,nosuid,nodev,noexec,relatime - cgroup cgroup rw,cpu\n\
                     95 93 0:30 {id} /sys/fs/cgroup/cpuacct ro,nosuid,nodev,noexec,relatime - cgroup cgroup rw,cpuacct\n"
                ),
            ),
            ("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", "150000\n"),
            ("/sys/fs/cgroup/cpu/cpu.cfs_period_us", "100000\n"),
        ]);
        assert_eq!(
            CpuQuota::read(root.path()),
            Some(CpuQuota {
                cpus: 1.5,
                version: CgroupVersion::V1
            })
        );
    }

    #[test]
    fn v1_unlimited_below_a_limited_parent() {
        let root = system(&[
            ("/proc/self/cgroup", "3:cpu,cpuacct:/kubepods/pod1/ctr\n"),
            (
                "/proc/self/mountinfo",
                "35 30 0:31 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n",
            ),
            ("/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us", "-1\n"),
            ("/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us", "100000\n"),
            ("/sys/fs/cgroup/cpu,cpuacct/kubepods/pod1/cpu.cfs_quota_us", "400000\n"),
            ("/sys/fs/cgroup/cpu,cpuacct/kubepods/pod1/cpu.cfs_period_us", "100000\n"),
            ("/sys/fs/cgroup/cpu,cpuacct/kubepods/pod1/ctr/cpu.cfs_quota_us", "-1\n"),
            (
                "/sys/fs/cgroup/cpu,cpuacct/kubepods/pod1/ctr/cpu.cfs_period_us",
                "100000\n",
            ),
        ]);
        assert_eq!(
            CpuQuota::read(root.path()).map(|q| (q.cpus, q.version)),
            Some((4.0, CgroupVersion::V1))
        );
    }

    #[test]
    fn no_cgroup_files_is_no_quota() {
        // macOS, or /proc hidden by a sandbox.
        let root = system(&[]);
        assert_eq!(CpuQuota::read(root.path()), None);
    }

    #[test]
    fn mount_paths_are_unescaped() {
        let mounts = parse_mountinfo("35 30 0:31 / /mnt/cg\\040v1 rw - cgroup cgroup rw,cpuacct,cpu\n");
        assert_eq!(
            mounts,
            [CgroupMount {
                version: CgroupVersion::V1,
                root: "/".into(),
                mount_point: "/mnt/cg v1".into()
            }]
        );
        // A v1 hierarchy with `cpuacct` alone is not the `cpu` controller.
        assert!(parse_mountinfo("35 30 0:31 / /x rw - cgroup cgroup rw,cpuacct\n").is_empty());
    }

    fn pool(device: Device, workers: u32, threads: u32) -> PoolConfig {
        PoolConfig {
            device,
            workers,
            threads,
            ..PoolConfig::named("p")
        }
    }

    #[test]
    fn the_quota_is_shared_by_the_cpu_workers() {
        // Two workers in 4 CPUs: two threads each (each alone would have sized itself to 4).
        assert_eq!(threads_per_worker(&[pool(Device::Auto, 2, 0)], 4), Some(2));
        // A pool with its own count takes it first; the rest is shared.
        assert_eq!(
            threads_per_worker(&[pool(Device::Cpu, 1, 2), pool(Device::Cpu, 3, 0)], 8),
            Some(2)
        );
        // Never fewer than one thread, even with more workers than CPUs.
        assert_eq!(threads_per_worker(&[pool(Device::Cpu, 3, 0)], 2), Some(1));
        // GPU pools take no CPU threads; with no pool left to size there is nothing to say.
        assert_eq!(
            threads_per_worker(&[pool(Device::Cuda, 2, 0), pool(Device::Cpu, 1, 0)], 4),
            Some(4)
        );
        assert_eq!(threads_per_worker(&[pool(Device::Cpu, 2, 3)], 4), None);
    }
}
