//! Starting a replica's thread, written once: the fault point, the thread's
//! name, its quiet panics, and an [`ElasticError::Spawn`] naming the replica
//! when it cannot start.

use std::thread::{self, Builder, JoinHandle, Scope, ScopedJoinHandle};

use burn_freeze::fault::Phase;

use crate::error::ElasticError;

/// A replica's thread about to start: checked at fault point `phase`
/// ([`REPLICA_THREAD`](crate::fault::REPLICA_THREAD) or
/// [`REGISTER_THREAD`](crate::fault::REGISTER_THREAD)) and named
/// `burn-elastic-dp {what} {replica}`; its panics are left to the joiner
/// (not printed: [`burn_pipe::quiet_worker_panics`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct ReplicaThread {
    /// The fault point checked before the thread starts.
    pub phase: Phase,
    /// The replica the thread works for.
    pub replica: usize,
    /// What the thread runs, as [`ElasticError::Spawn`] names it.
    pub what: &'static str,
}

impl ReplicaThread {
    /// Starts a detached thread running `body`.
    pub(crate) fn spawn<T: Send + 'static>(
        self,
        body: impl FnOnce() -> T + Send + 'static,
    ) -> Result<JoinHandle<T>, ElasticError> {
        self.start(|builder| builder.spawn(quiet(body)))
    }

    /// Starts a thread of `scope` running `body`.
    pub(crate) fn spawn_scoped<'scope, 'env, T: Send + 'scope>(
        self,
        scope: &'scope Scope<'scope, 'env>,
        body: impl FnOnce() -> T + Send + 'scope,
    ) -> Result<ScopedJoinHandle<'scope, T>, ElasticError> {
        self.start(|builder| builder.spawn_scoped(scope, quiet(body)))
    }

    /// The fault point, then `spawn` on a named builder; either failure an
    /// [`ElasticError::Spawn`] naming the replica.
    fn start<H>(
        self,
        spawn: impl FnOnce(Builder) -> std::io::Result<H>,
    ) -> Result<H, ElasticError> {
        let failed = |message: String| ElasticError::Spawn {
            replica: self.replica,
            what: self.what,
            message,
        };
        burn_freeze::fault::check(self.phase, Some(self.replica), None)
            .map_err(|injected| failed(injected.to_string()))?;
        let name = format!("burn-elastic-dp {} {}", self.what, self.replica);
        spawn(thread::Builder::new().name(name)).map_err(|error| failed(error.to_string()))
    }
}

/// Replica `replica`'s caught `panic` (a joined thread's, or one caught
/// around its work) as the error that names it.
pub(crate) fn panicked(replica: usize, panic: Box<dyn std::any::Any + Send>) -> ElasticError {
    ElasticError::ReplicaPanicked {
        replica,
        message: burn_pipe::plumbing::panic_message(panic.as_ref()),
    }
}

/// `body`, its panic not printed (the joiner reports it).
fn quiet<T>(body: impl FnOnce() -> T) -> impl FnOnce() -> T {
    move || {
        burn_pipe::plumbing::quiet_worker_panics();
        body()
    }
}

#[cfg(test)]
mod tests {
    use burn_freeze::fault::{self, Fault};

    use super::*;
    use crate::fault::{REGISTER_THREAD, REPLICA_THREAD};

    /// A replica no other test's group has: the armed fault fires here only.
    const REPLICA: usize = 41;

    fn arm(phase: Phase) {
        fault::arm(Fault {
            phase,
            stage: Some(REPLICA),
            micro_batch: None,
            panic: false,
            stall: None,
        });
    }

    #[test]
    fn an_injected_start_fault_is_a_spawn_error_naming_the_replica_for_each_way_to_start() {
        let start_of = |phase, what| ReplicaThread {
            phase,
            replica: REPLICA,
            what,
        };
        arm(REGISTER_THREAD);
        let error = start_of(REGISTER_THREAD, "registration")
            .spawn(|| ())
            .unwrap_err();
        assert!(!fault::disarm(), "the fault fired");
        assert_eq!(
            error.to_string(),
            "replica 41: could not start its registration thread: injected fault in registration thread start at stage 41"
        );

        arm(REPLICA_THREAD);
        let scoped = thread::scope(|scope| {
            start_of(REPLICA_THREAD, "optimizer step")
                .spawn_scoped(scope, || ())
                .map(|_| ())
        });
        assert!(!fault::disarm(), "the fault fired");
        assert!(
            matches!(
                scoped,
                Err(ElasticError::Spawn {
                    replica: REPLICA,
                    what: "optimizer step",
                    ..
                })
            ),
            "{scoped:?}"
        );

        // Nothing armed: the thread starts, named, and runs its body.
        let handle = start_of(REPLICA_THREAD, "step")
            .spawn(|| thread::current().name().map(str::to_string))
            .unwrap();
        assert_eq!(
            handle.join().unwrap().as_deref(),
            Some("burn-elastic-dp step 41")
        );
    }
}
