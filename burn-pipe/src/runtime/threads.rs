//! Scoped worker threads started before their work is handed out, so that a
//! thread that cannot start loses nothing: no work has moved yet.

use std::thread::{self, Scope, ScopedJoinHandle};

use crossbeam_channel::Sender;

use crate::runtime::error::PipeError;
use crate::runtime::quiet::quiet_worker_panics;

/// A started worker thread, waiting for its work.
pub(crate) struct Worker<'scope, W, R> {
    slot: Sender<W>,
    handle: ScopedJoinHandle<'scope, Option<R>>,
}

impl<'scope, W, R> Worker<'scope, W, R> {
    /// Hands the worker its work; join the handle for its result.
    pub fn hand(self, work: W) -> ScopedJoinHandle<'scope, Option<R>> {
        // The worker waits for its slot to be filled or dropped: it is there.
        if self.slot.send(work).is_err() {
            unreachable!("a started worker waits for its work");
        }
        self.handle
    }
}

/// Starts `count` scoped threads named `"burn-pipe {what} {s}"`, thread `s`
/// waiting for its work and then returning `run(s, work)`. Their panics are
/// quiet ([`quiet_worker_panics`]): `run` catches them and reports them as
/// errors. Fails, naming the first stage whose thread could not start
/// ([`PipeError::Spawn`], or an injected fault at
/// [`STAGE_THREAD`](crate::fault::STAGE_THREAD)), before any work moves:
/// the threads already started end at once.
pub(crate) fn start<'scope, 'env, W, R, F>(
    scope: &'scope Scope<'scope, 'env>,
    what: &'static str,
    count: usize,
    run: F,
) -> Result<Vec<Worker<'scope, W, R>>, PipeError>
where
    W: Send + 'scope,
    R: Send + 'scope,
    F: Fn(usize, W) -> R + Send + Copy + 'scope,
{
    (0..count)
        .map(|stage| {
            let spawn_failed = |message: String| PipeError::Spawn {
                stage,
                what,
                message,
            };
            burn_freeze::fault::check(crate::fault::STAGE_THREAD, Some(stage), None)
                .map_err(|injected| spawn_failed(injected.to_string()))?;
            let (slot, work) = crossbeam_channel::bounded::<W>(1);
            let handle = thread::Builder::new()
                .name(format!("burn-pipe {what} {stage}"))
                .spawn_scoped(scope, move || {
                    quiet_worker_panics();
                    // Bounded: the slot is filled, or dropped, as soon as
                    // every thread has started.
                    let work = work.recv().ok()?;
                    Some(run(stage, work))
                })
                .map_err(|error| spawn_failed(error.to_string()))?;
            Ok(Worker { slot, handle })
        })
        .collect()
}

/// A worker's result, once it ran its work.
///
/// # Panics
/// When the worker panicked: `run` catches its panics.
pub(crate) fn join<R>(handle: ScopedJoinHandle<'_, Option<R>>) -> R {
    handle
        .join()
        .ok()
        .flatten()
        .expect("a worker given its work catches its panics and returns")
}
