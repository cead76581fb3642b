//! A counting global allocator: live heap bytes and their peak, to measure
//! on a CPU backend (tensors on the heap) the activations a unit keeps.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

static CURRENT: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);
static USED: AtomicBool = AtomicBool::new(false);

/// The system allocator, counting live bytes and their peak, so that on a
/// CPU backend (where tensors live on the heap) the activations a unit
/// keeps can be measured and a run's peak compared with the estimate.
///
/// A library cannot choose the allocator: a binary that wants the counts
/// installs [`HeapCounter`]; elsewhere [`HeapCounter::installed`] is false
/// and the counts stay at zero.
///
/// ```
/// // In your binary (or test) crate:
/// #[global_allocator]
/// static HEAP: burn_pipe::balance::HeapCounter = burn_pipe::balance::HeapCounter;
///
/// let before = burn_pipe::balance::HeapCounter::reset_peak();
/// let v = vec![0u8; 1 << 20];
/// assert!(burn_pipe::balance::HeapCounter::installed());
/// assert!(burn_pipe::balance::HeapCounter::peak() - before >= 1 << 20);
/// drop(v);
/// ```
pub struct HeapCounter;

// SAFETY: every call forwards to the system allocator with the caller's
// layout; the counters are atomics.
unsafe impl GlobalAlloc for HeapCounter {
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

impl HeapCounter {
    /// Whether the counting allocator is the process's allocator.
    pub fn installed() -> bool {
        USED.load(Ordering::Relaxed)
    }

    /// Live bytes now.
    pub fn current() -> usize {
        CURRENT.load(Ordering::Relaxed)
    }

    /// Starts a new peak at the current level and returns that level.
    pub fn reset_peak() -> usize {
        let now = Self::current();
        PEAK.store(now, Ordering::Relaxed);
        now
    }

    /// Highest live bytes since the last [`reset_peak`](Self::reset_peak).
    pub fn peak() -> usize {
        PEAK.load(Ordering::Relaxed)
    }
}
