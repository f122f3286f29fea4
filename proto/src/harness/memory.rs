//! Resident memory of the worker process for Describe: the current size where the platform reports it
//! (Linux `/proc`), and the peak from `getrusage` (Linux and macOS; the macOS path is not verified here).

use crate::pb;

/// Current and peak resident set size, each when available.
pub(crate) fn current() -> pb::Memory {
    pb::Memory {
        rss_bytes: current_rss_bytes(),
        peak_rss_bytes: peak_rss_bytes(),
    }
}

#[cfg(target_os = "linux")]
fn current_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    parse_vm_rss(&status)
}

#[cfg(not(target_os = "linux"))]
fn current_rss_bytes() -> Option<u64> {
    None
}

/// `VmRSS:   123456 kB` → bytes.
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
fn parse_vm_rss(status: &str) -> Option<u64> {
    let line = status.lines().find_map(|line| line.strip_prefix("VmRSS:"))?;
    let kib: u64 = line.trim().strip_suffix("kB")?.trim().parse().ok()?;
    Some(kib * 1024)
}

fn peak_rss_bytes() -> Option<u64> {
    let usage = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_SELF).ok()?;
    let max_rss = u64::try_from(usage.max_rss()).ok()?;
    // getrusage reports kilobytes on Linux and bytes on macOS.
    Some(if cfg!(target_os = "macos") {
        max_rss
    } else {
        max_rss * 1024
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_proc_status() {
        let status = "Name:\tlayad\nVmPeak:\t  9000 kB\nVmRSS:\t   12345 kB\nThreads:\t3\n";
        assert_eq!(parse_vm_rss(status), Some(12345 * 1024));
        assert_eq!(parse_vm_rss("Name:\tx\n"), None);
    }

    #[test]
    fn reports_this_process() {
        let memory = current();
        let peak = memory.peak_rss_bytes.expect("getrusage works on Linux and macOS");
        assert!(peak > 1 << 20, "peak {peak}");
        if cfg!(target_os = "linux") {
            let rss = memory.rss_bytes.expect("Linux has /proc");
            assert!(rss > 1 << 20 && rss <= peak, "rss {rss} peak {peak}");
        }
    }
}
