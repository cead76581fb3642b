//! Fault injection for reliability tests: named points where a test may make the code fail
//! (live only with the `fault-injection` feature); each crate names its own points.

#[cfg(any(test, feature = "fault-injection"))]
mod inject;

#[cfg(any(test, feature = "fault-injection"))]
pub use inject::{Fault, Injected, arm, check, disarm};

/// Where a fault fires: a named fault point.
///
/// The set is open: each crate names the points of its own code with
/// [`Phase::new`] (this crate the activation cache's read and write,
/// [`CACHE_READ`](Phase::CACHE_READ) and [`CACHE_WRITE`](Phase::CACHE_WRITE)),
/// so a crate built on this one adds points without this one knowing them.
/// Two points match when their names are equal: give each point a name of
/// its own, which error messages repeat (`"injected fault in cache read"`).
///
/// The code calls [`check`] at each point. What it does depends on the
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
/// /// A point of some crate's own code.
/// const UPLOAD: Phase = Phase::new("upload");
///
/// // Nothing armed: every point passes.
/// assert!(fault::check(UPLOAD, Some(0), Some(3)).is_ok());
/// assert!(fault::check(Phase::CACHE_READ, None, None).is_ok());
/// assert_eq!(UPLOAD.name(), "upload");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Phase(&'static str);

impl Phase {
    /// Reading the frozen prefix from the activation cache.
    pub const CACHE_READ: Phase = Phase::new("cache read");
    /// Writing the frozen prefix to the activation cache.
    pub const CACHE_WRITE: Phase = Phase::new("cache write");
    /// This crate's points.
    pub const ALL: [Phase; 2] = [Phase::CACHE_READ, Phase::CACHE_WRITE];

    /// The point named `name` (lower case, as error messages give it).
    pub const fn new(name: &'static str) -> Self {
        Phase(name)
    }

    /// Lower-case name, as error messages give it.
    pub const fn name(self) -> &'static str {
        self.0
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
