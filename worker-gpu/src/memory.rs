//! Handing the memory a load freed back to the system.
//!
//! glibc keeps a freed block in the arena of the thread that freed it until the arena's top is
//! free, and a checkpoint's load frees most of what it allocated on the pool's threads: the float32
//! weights that int8 and bf16 replace, packing's copies. A full-size ModernBERT-large int8 worker
//! held 1.2–1.5 GB when ready, 0.6 GB once they were handed back (docs/benchmarks/notes.md, stop 55).

/// Returns the free memory of every glibc arena to the system (`malloc_trim(0)`); `true` when some
/// was. Elsewhere (macOS, musl) a no-op that returns `false`: their allocators hand free pages
/// back on their own.
pub fn release_freed_memory() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: `malloc_trim` walks glibc's own arenas under their locks and touches no memory
        // the program holds; it may be called from any thread at any time.
        #[allow(unsafe_code)]
        let released = unsafe { libc::malloc_trim(0) };
        released == 1
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}
