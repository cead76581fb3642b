//! The heap allocator of this crate's binaries: jemalloc (the
//! `tikv-jemallocator` crate), the system allocator on MSVC.
//!
//! Training allocates and frees tensors of tens of megabytes every step (a
//! MiniLM-sized BERT's word-embedding gradient alone is 47 MB). glibc's
//! malloc serves such blocks with `mmap` and gives them back to the system
//! when freed, so every step pays the page faults of fresh memory again: on
//! the CPU backend `bench elastic --quick` spent more time in the kernel
//! than in its own code (sys 22 s of a 37 s run). jemalloc keeps freed pages
//! for reuse, provided its blocks over 8 MB do not go to its own arena that
//! purges at once (`oversize_threshold:0`) and freed pages wait 30 s before
//! they are returned (`dirty_decay_ms`, `muzzy_decay_ms`). Every binary here
//! installs it with these options, [`install!`](crate::install_allocator):
//!
//! ```ignore
//! examples::install_allocator!();
//! ```
//!
//! Your own binaries may do the same (or, with glibc, set
//! `GLIBC_TUNABLES=glibc.malloc.mmap_threshold=2147483647:glibc.malloc.trim_threshold=4294967295`);
//! the libraries of this workspace leave the allocator to the binary.

/// The allocator the binaries install.
#[cfg(not(target_env = "msvc"))]
pub use tikv_jemallocator::Jemalloc as Heap;

/// The allocator the binaries install.
#[cfg(target_env = "msvc")]
pub use std::alloc::System as Heap;

/// jemalloc's options for training (a literal, for [`OPTIONS`] and the
/// NUL-ended `malloc_conf` of [`install_allocator!`](crate::install_allocator)).
#[doc(hidden)]
#[macro_export]
macro_rules! jemalloc_options {
    () => {
        "oversize_threshold:0,dirty_decay_ms:30000,muzzy_decay_ms:30000"
    };
}

/// jemalloc's options for training: big blocks reused, freed pages kept 30 s.
pub const OPTIONS: &str = jemalloc_options!();

/// Installs `$alloc` (by default [`Heap`]) as the binary's global allocator,
/// with jemalloc's [`OPTIONS`] (read from its `malloc_conf` symbol at
/// start-up; the `_RJEM_MALLOC_CONF` environment variable still overrides
/// them).
#[macro_export]
macro_rules! install_allocator {
    () => {
        $crate::install_allocator!($crate::allocator::Heap);
    };
    ($alloc:path) => {
        #[global_allocator]
        static ALLOC: $alloc = $alloc;

        /// jemalloc's options, NUL-ended.
        #[cfg(not(target_env = "msvc"))]
        #[allow(non_upper_case_globals)]
        #[unsafe(export_name = "_rjem_malloc_conf")]
        pub static malloc_conf: &[u8] = concat!($crate::jemalloc_options!(), "\0").as_bytes();
    };
}
