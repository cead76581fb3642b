//! Quiet worker panics: a stage's or replica's panic becomes an error that
//! names where it happened, so the standard panic message is not printed too.

use std::sync::Once;

static INSTALL: Once = Once::new();

/// Name prefixes of the threads whose panics are caught and reported as
/// errors.
const WORKERS: [&str; 2] = ["burn-pipe ", "burn-elastic-dp "];

/// Installs the filtering hook once per process (in front of whatever hook
/// is there then). A panic in a stage or replica thread becomes an error
/// that names where it happened; the standard panic message and backtrace
/// would repeat it on the user's terminal. Panics of this crate's (and
/// burn-elastic-dp's) worker threads, recognised by their names, are logged
/// at `debug` instead; every other thread's panic goes to the hook that was
/// installed before.
pub(crate) fn quiet_worker_panics() {
    INSTALL.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let thread = std::thread::current();
            let worker = thread
                .name()
                .is_some_and(|name| WORKERS.iter().any(|w| name.starts_with(w)));
            if worker {
                tracing::debug!(thread = thread.name(), %info, "worker panic, reported as an error");
            } else {
                previous(info);
            }
        }));
    });
}
