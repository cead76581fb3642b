//! Fault injection for reliability tests: the points where a test may make a pipeline, a
//! replica or the activation cache fail (live only with the `fault-injection` feature).

#[cfg(any(test, feature = "fault-injection"))]
mod inject;

#[cfg(any(test, feature = "fault-injection"))]
pub use inject::{Fault, Injected, arm, check, disarm};

/// Where a fault fires.
///
/// The code of this workspace calls [`check`] at each such point (a stage's
/// forward or backward pass, an optimizer step, an all-reduce, a cache read
/// or write, a repartition, a replica spawn). What it does depends on the
/// `fault-injection` cargo feature of `burn-freeze`:
///
/// - **without it** (every ordinary build), [`check`] is an inlined no-op
///   that returns `Ok(())` and [`Injected`] is an empty enum, so the
///   compiler drops the error paths; the registry (`arm`, `disarm`, `Fault`)
///   is not compiled at all.
/// - **with it** (the workspace's tests turn it on through their
///   dev-dependencies), a test arms one `Fault` with `arm`, and the first
///   `check` that matches it fires once: an error, a panic or a stall.
///   Disarmed, each check is one relaxed atomic load. Tests that arm faults
///   must not run concurrently with others that could reach the same points.
///
/// ```
/// use burn_freeze::fault::{self, Phase};
///
/// // Nothing armed: every point passes.
/// assert!(fault::check(Phase::Forward, Some(0), Some(3)).is_ok());
/// ```
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

/// An injected fault that fired as an error. Without the `fault-injection`
/// feature no fault can fire, and this type has no value.
#[cfg(not(any(test, feature = "fault-injection")))]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Injected {}

#[cfg(not(any(test, feature = "fault-injection")))]
impl std::fmt::Display for Injected {
    fn fmt(&self, _: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {}
    }
}

/// A fault point: without the `fault-injection` feature, nothing to check.
#[cfg(not(any(test, feature = "fault-injection")))]
#[inline(always)]
pub fn check(
    _phase: Phase,
    _stage: Option<usize>,
    _micro_batch: Option<usize>,
) -> Result<(), Injected> {
    Ok(())
}
