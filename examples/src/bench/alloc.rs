//! A counting global allocator for peak-memory figures on the CPU.
//!
//! The `bench` binary installs [`CountingAlloc`]; elsewhere the counters stay
//! at zero and [`installed`] is false.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

static CURRENT: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);
static USED: AtomicBool = AtomicBool::new(false);

/// The system allocator, counting live bytes and their peak.
pub struct CountingAlloc;

unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwards the caller's layout to the system allocator.
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() {
            let now = CURRENT.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
            USED.store(true, Ordering::Relaxed);
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `alloc` with this layout.
        unsafe { System.dealloc(ptr, layout) };
        CURRENT.fetch_sub(layout.size(), Ordering::Relaxed);
    }
}

/// Whether the counting allocator is in use.
pub fn installed() -> bool {
    USED.load(Ordering::Relaxed)
}

/// Live bytes now.
pub fn current() -> usize {
    CURRENT.load(Ordering::Relaxed)
}

/// Starts a new peak at the current level and returns that level.
pub fn reset_peak() -> usize {
    let now = current();
    PEAK.store(now, Ordering::Relaxed);
    now
}

/// Highest live bytes since the last [`reset_peak`].
pub fn peak() -> usize {
    PEAK.load(Ordering::Relaxed)
}
