//! The C allocator's settings for the binaries of `examples`.

/// Makes glibc's malloc keep freed memory for reuse instead of returning it
/// to the system (no `mmap` for big blocks, no trimming of the heap's top).
/// The process's resident memory then stays at its peak. Returns whether
/// the settings were taken; a no-op returning `false` off Linux with glibc.
///
/// Training allocates and frees tensors of megabytes to tens of megabytes
/// every step (a MiniLM-sized BERT's word-embedding gradient alone is 47 MB).
/// glibc's malloc serves such blocks with `mmap` and unmaps them when they
/// are freed, so every step pays the page faults of fresh memory again: on
/// the CPU backend `bench elastic --quick` spent more time in the kernel than
/// in its own code (sys 22 s of a 37 s run). [`keep_freed_memory`] makes
/// glibc serve big blocks from its heap and keep freed memory for reuse;
/// every binary here calls it first. Measured on this project's 2-core
/// machine: plain Burn training of a 12-layer BERT (hidden 128, batch 64)
/// 173-178 -> 263-267 samples/s; `bench elastic`'s all-reduce of 91 MB
/// 35 -> 11-16 ms. (jemalloc, tried too, was slower than glibc's default on
/// the first workload.)
///
/// Your own binaries can do the same, or set the equivalent environment
/// variable
/// `GLIBC_TUNABLES=glibc.malloc.mmap_threshold=2147483647:glibc.malloc.trim_threshold=2147483647`;
/// the libraries of this workspace leave the allocator to the binary.
pub fn keep_freed_memory() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallopt only changes the allocator's thresholds; called
        // before the process allocates much, from its first thread.
        let mmap = unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, i32::MAX) };
        let trim = unsafe { libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX) };
        mmap == 1 && trim == 1
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}
