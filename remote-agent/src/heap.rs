//! How the agent's allocator keeps and gives back memory a transfer frees.
//!
//! By default glibc's malloc gives a buffer of 128 KiB or more a mapping of
//! its own, and hands back a heap's free top over twice that, so each
//! 256 KiB piece a pull reads, or a part a push writes, comes in fresh pages
//! the kernel must fault in and zero: about a sixth of the agent's CPU per
//! pull. The `serve` process lets malloc keep what it frees
//! ([`keep_freed_memory`]), and its session gives it back a little after its
//! last transfer request ends ([`give_back_freed_memory`]), so that an idle
//! agent holds no more than before. musl's allocator has no such settings;
//! there both do nothing.

/// Buffers up to this size come from the heap, where freed ones are reused:
/// above a request's 2 MiB and a piece's 256 KiB.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const MMAP_THRESHOLD: libc::c_int = 4 << 20;
/// Free memory at the heap's top kept for reuse while a transfer runs.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const TRIM_THRESHOLD: libc::c_int = 16 << 20;

/// Sets the process's allocator to keep freed buffers for reuse. For a
/// process of its own only: it changes the whole process.
pub fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets allocator parameters.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
        libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD);
        // One heap for every thread: the session's few threads rarely
        // allocate at once, and `malloc_trim` gives back the free top of
        // the main heap only; another thread's heap would keep its own.
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

/// Returns the free memory of every heap to the kernel.
pub fn give_back_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free memory; it takes the heaps'
    // locks like any allocation.
    unsafe {
        libc::malloc_trim(0);
    }
}
