//! `memory::release_freed_memory` hands back what glibc kept after a thread freed it. Alone in its
//! test binary: the process's resident size is what it reads.

/// Resident anonymous memory of this process, KiB (`/proc/self/status`).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn rss_anon_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|line| line.strip_prefix("RssAnon:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("RssAnon")
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[test]
fn memory_a_thread_freed_behind_a_live_block_goes_back() {
    const BLOCKS: usize = 64;
    const BLOCK: usize = 4 << 20;
    let before = rss_anon_kib();
    // A worker thread, as the pool's are, freeing matrices of a few MB, as a load does. Once a block
    // of 16 MB was freed, glibc serves blocks up to that size from the thread's arena instead of
    // mapping each (its dynamic mmap threshold, up to 32 MB); a small block allocated after each matrix stays
    // alive (as what a load keeps does), so the freed matrices are holes, not the arena's top.
    let keep = std::thread::spawn(|| {
        drop(std::hint::black_box(vec![1u8; 16 << 20]));
        let (blocks, keep): (Vec<Vec<u8>>, Vec<Vec<u8>>) = (0..BLOCKS)
            .map(|i| (vec![u8::try_from(i % 251).unwrap_or(1); BLOCK], vec![7u8; 64]))
            .unzip();
        drop(blocks);
        keep
    })
    .join()
    .expect("thread");
    let held = rss_anon_kib();
    let total_kib = (BLOCKS * BLOCK / 1024) as u64;
    assert!(
        held > before + total_kib / 2,
        "glibc kept the freed blocks: {before} → {held} KiB"
    );
    assert!(worker_gpu::memory::release_freed_memory(), "something was released");
    let after = rss_anon_kib();
    assert!(after + total_kib / 2 < held, "handed back: {held} → {after} KiB");
    assert!(keep.iter().all(|k| k == &[7u8; 64]));
}
