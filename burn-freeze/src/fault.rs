//! Fault injection for reliability tests: one fault armed at a time, at a
//! chosen phase (and stage and micro-batch where they apply), fired once as
//! an error or a panic where the code reaches it. Disarmed, each check is
//! one relaxed atomic load.
//!
//! Hidden from the documentation: a testing aid of this workspace's crates,
//! not an API. Tests that arm faults must not run concurrently with others
//! that could reach the same points (hold a lock).

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

/// Where a fault fires.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Phase {
    /// A stage's forward pass of a micro-batch.
    Forward,
    /// A stage's backward pass of a micro-batch.
    Backward,
    /// A pipeline's optimizer step.
    Step,
    /// A replica's all-reduce of a stage's gradients.
    AllReduce,
    /// Reading the frozen prefix from the activation cache.
    CacheRead,
    /// Writing the frozen prefix to the activation cache.
    CacheWrite,
    /// Moving units between stages.
    Repartition,
    /// Building a new replica (a copy of a live one).
    Spawn,
}

impl Phase {
    /// Every phase.
    pub const ALL: [Phase; 8] = [
        Phase::Forward,
        Phase::Backward,
        Phase::Step,
        Phase::AllReduce,
        Phase::CacheRead,
        Phase::CacheWrite,
        Phase::Repartition,
        Phase::Spawn,
    ];

    /// Lower-case name, as error messages give it.
    pub fn name(self) -> &'static str {
        match self {
            Phase::Forward => "forward",
            Phase::Backward => "backward",
            Phase::Step => "optimizer step",
            Phase::AllReduce => "all-reduce",
            Phase::CacheRead => "cache read",
            Phase::CacheWrite => "cache write",
            Phase::Repartition => "repartition",
            Phase::Spawn => "replica spawn",
        }
    }
}

/// A fault to inject.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fault {
    /// Where.
    pub phase: Phase,
    /// Only at this stage (or replica, for spawns), if given.
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
