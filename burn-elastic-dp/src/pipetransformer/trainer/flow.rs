//! What an epoch's observer returns: `()` (go on) or a [`ControlFlow`] that can stop the epoch
//! after a step, and the report of an epoch so stopped.

use std::ops::ControlFlow;

/// The result of [`Trainer::fit_epoch_observed`]'s observer: `()` goes on,
/// a [`ControlFlow`] goes on or stops the epoch after the step.
///
/// Across the ranks of an MPI job, break on every rank after the same step
/// (decide from what every rank sees alike: the step count is, a step's
/// loss, the mean over this rank's samples, is not; to stop a job on a
/// signal use
/// [`Trainer::set_stop_signal`], which agrees the step in the step
/// headers). A rank that breaks alone leaves the others waiting at the next
/// step: that step fails within its bound, naming the rank.
///
/// ```
/// use std::ops::ControlFlow;
/// use burn_elastic_dp::StepFlow;
///
/// assert!(().into_flow().is_continue());
/// assert!(ControlFlow::Break(()).into_flow().is_break());
/// ```
pub trait StepFlow {
    /// Whether the epoch goes on.
    fn into_flow(self) -> ControlFlow<()>;
}

impl StepFlow for () {
    fn into_flow(self) -> ControlFlow<()> {
        ControlFlow::Continue(())
    }
}

impl StepFlow for ControlFlow<()> {
    fn into_flow(self) -> ControlFlow<()> {
        self
    }
}
