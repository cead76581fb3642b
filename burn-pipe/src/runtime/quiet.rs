//! Quiet worker panics: a worker thread whose panics its owner catches and
//! reports as errors naming where they happened marks itself, so that the
//! standard panic message is not printed too.

use std::cell::Cell;
use std::sync::Once;

static INSTALL: Once = Once::new();

thread_local! {
    /// Whether this thread's panics are caught and reported as errors.
    static QUIET: Cell<bool> = const { Cell::new(false) };
}

/// Marks the calling thread as a worker whose panics its owner catches and
/// reports as errors that name where they happened (a pipeline's stage
/// workers, or the worker threads of a crate built on this one): the
/// standard panic message and backtrace would repeat the error on the
/// user's terminal, so this thread's panics are logged at `debug` instead.
/// Every other thread's panic goes to the hook installed before. The mark
/// lasts as long as the thread; call it first thing on a thread of your own.
///
/// Installs the filtering hook once per process (in front of whatever hook
/// is there then).
///
/// ```
/// let worker = std::thread::spawn(|| {
///     burn_pipe::plumbing::quiet_worker_panics();
///     // The owner reports this panic itself (here: the join's error).
///     panic!("stage 3 broke");
/// });
/// let panic = worker.join().unwrap_err();
/// assert_eq!(burn_pipe::plumbing::panic_message(panic.as_ref()), "stage 3 broke");
/// ```
pub fn quiet_worker_panics() {
    INSTALL.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if QUIET.try_with(Cell::get).unwrap_or(false) {
                let thread = std::thread::current();
                tracing::debug!(thread = thread.name(), %info, "worker panic, reported as an error");
            } else {
                previous(info);
            }
        }));
    });
    QUIET.with(|quiet| quiet.set(true));
}
