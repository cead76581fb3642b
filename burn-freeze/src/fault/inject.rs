//! The fault registry (only with the `fault-injection` feature): one fault
//! armed at a time, fired once as an error, a panic or a stall.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use super::Phase;

/// A fault to inject.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fault {
    /// Where.
    pub phase: Phase,
    /// Only at this stage (or replica, for a replica's points), if given.
    pub stage: Option<usize>,
    /// Only at this micro-batch, if given.
    pub micro_batch: Option<usize>,
    /// Panic instead of returning an error.
    pub panic: bool,
    /// Instead of failing, stall this long where the fault fires, then
    /// carry on: a computation stuck for a while (a replica that does not
    /// arrive). `panic` is then ignored.
    pub stall: Option<std::time::Duration>,
}

static ARMED: AtomicBool = AtomicBool::new(false);
static FAULT: Mutex<Option<Fault>> = Mutex::new(None);

/// Arms `fault` (replacing one armed before); it fires once.
pub fn arm(fault: Fault) {
    *FAULT.lock().unwrap_or_else(|e| e.into_inner()) = Some(fault);
    ARMED.store(true, Ordering::SeqCst);
}

/// Disarms the fault; returns whether it was still armed (had not fired).
pub fn disarm() -> bool {
    ARMED.store(false, Ordering::SeqCst);
    FAULT
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .take()
        .is_some()
}

/// An injected fault that fired as an error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Injected {
    /// Where.
    pub phase: Phase,
    /// The stage (or replica) it fired at.
    pub stage: Option<usize>,
    /// The micro-batch it fired at.
    pub micro_batch: Option<usize>,
}

impl std::fmt::Display for Injected {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "injected fault in {}", self.phase.name())?;
        if let Some(stage) = self.stage {
            write!(f, " at stage {stage}")?;
        }
        if let Some(micro_batch) = self.micro_batch {
            write!(f, ", micro-batch {micro_batch}")?;
        }
        Ok(())
    }
}

/// Fires the armed fault if it matches: panics, or returns it as an error.
pub fn check(
    phase: Phase,
    stage: Option<usize>,
    micro_batch: Option<usize>,
) -> Result<(), Injected> {
    if !ARMED.load(Ordering::Relaxed) {
        return Ok(());
    }
    let mut armed = FAULT.lock().unwrap_or_else(|e| e.into_inner());
    let Some(fault) = *armed else {
        return Ok(());
    };
    let matches = fault.phase == phase
        && fault.stage.is_none_or(|s| Some(s) == stage)
        && fault.micro_batch.is_none_or(|m| Some(m) == micro_batch);
    if !matches {
        return Ok(());
    }
    *armed = None;
    ARMED.store(false, Ordering::SeqCst);
    drop(armed);
    let injected = Injected {
        phase,
        stage,
        micro_batch,
    };
    if let Some(stall) = fault.stall {
        tracing::debug!(%injected, ?stall, "injected stall");
        std::thread::sleep(stall);
        return Ok(());
    }
    if fault.panic {
        panic!("{injected} (a panic)");
    }
    Err(injected)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A point that no code reaches, so no other unit test can trip over
    /// the armed fault.
    const SPAWN: Phase = Phase::new("test spawn");

    fn spawn_at(stage: usize, panic: bool) -> Fault {
        Fault {
            phase: SPAWN,
            stage: Some(stage),
            micro_batch: None,
            panic,
            stall: None,
        }
    }

    #[test]
    fn an_armed_fault_fires_once_where_it_matches() {
        arm(spawn_at(1, false));
        assert!(check(Phase::CACHE_READ, Some(1), None).is_ok());
        assert!(check(SPAWN, Some(0), None).is_ok());
        let injected = check(SPAWN, Some(1), None).unwrap_err();
        assert_eq!(
            injected.to_string(),
            "injected fault in test spawn at stage 1"
        );
        assert!(check(SPAWN, Some(1), None).is_ok(), "fires once");
        assert!(!disarm(), "it had fired");

        arm(spawn_at(2, true));
        let panic = std::panic::catch_unwind(|| check(SPAWN, Some(2), None)).unwrap_err();
        let message = panic.downcast_ref::<String>().cloned().unwrap_or_default();
        assert!(message.contains("test spawn at stage 2"), "{message}");

        arm(spawn_at(3, false));
        assert!(disarm(), "still armed");
        assert!(check(SPAWN, Some(3), None).is_ok());
    }
}
