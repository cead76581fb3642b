//! Stopping a run at a step boundary when asked (a scheduler's preemption: SIGTERM): a flag the
//! trainer reads after every step, carried across processes in the step headers.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::error::ElasticError;

/// The exit code of a process that stopped because it was asked to (a
/// SIGTERM), after writing its checkpoint: `EX_TEMPFAIL` of sysexits.h, so
/// that a launcher loop or a scheduler can tell "stopped, resume me" from
/// a failure (1) and a usage error (2).
pub const STOPPED_EXIT_CODE: i32 = 75;

/// A request to stop at the next step boundary, shared between whoever
/// raises it (a signal handler, another thread) and the
/// [`Trainer`](crate::Trainer) that watches it
/// ([`Trainer::set_stop_signal`](crate::Trainer::set_stop_signal)). The
/// trainer then writes a checkpoint and returns
/// [`TrainerError::Stopped`](crate::TrainerError::Stopped).
///
/// ```
/// use burn_elastic_dp::StopSignal;
///
/// let signal = StopSignal::new();
/// let handle = signal.clone();
/// assert!(!signal.raised());
/// handle.raise();
/// assert!(signal.raised());
/// ```
#[derive(Debug, Clone, Default)]
pub struct StopSignal(Arc<AtomicBool>);

impl StopSignal {
    /// A signal not raised.
    pub fn new() -> Self {
        Self::default()
    }

    /// A signal raised when this process receives SIGTERM (how schedulers
    /// such as Slurm preempt a job): the first SIGTERM no longer ends the
    /// process, the run stops at its next step boundary instead; a second
    /// one ends it at once (exit code 1). SIGINT (Ctrl-C) is left alone.
    /// Fails where the handler cannot be installed (never elsewhere than
    /// on Unix, where nothing is installed).
    pub fn on_termination() -> Result<Self, ElasticError> {
        let signal = Self::new();
        #[cfg(unix)]
        {
            let term = signal_hook::consts::SIGTERM;
            let install = |error: std::io::Error| {
                ElasticError::BadNodeConfig(format!("installing the SIGTERM handler: {error}"))
            };
            // Order matters: the shutdown is armed by the flag the first
            // SIGTERM raises.
            signal_hook::flag::register_conditional_shutdown(term, 1, Arc::clone(&signal.0))
                .map_err(install)?;
            signal_hook::flag::register(term, Arc::clone(&signal.0)).map_err(install)?;
        }
        Ok(signal)
    }

    /// Asks the run to stop at its next step boundary.
    pub fn raise(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    /// Whether the signal was raised.
    pub fn raised(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}
