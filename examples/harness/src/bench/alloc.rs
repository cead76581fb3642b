//! Peak-memory figures on the CPU, from burn-pipe's counting allocator.

use burn_pipe::balance::HeapCounter;

/// Whether the counting allocator is in use.
///
/// The `bench` binary installs [`burn_pipe::balance::HeapCounter`] (which also lets
/// memory-aware AutoPipe measure activations); elsewhere the counters stay
/// at zero and [`installed`] is false.
pub fn installed() -> bool {
    HeapCounter::installed()
}

/// Live bytes now.
pub fn current() -> usize {
    HeapCounter::current()
}

/// Starts a new peak at the current level and returns that level.
pub fn reset_peak() -> usize {
    HeapCounter::reset_peak()
}

/// Highest live bytes since the last [`reset_peak`].
pub fn peak() -> usize {
    HeapCounter::peak()
}
