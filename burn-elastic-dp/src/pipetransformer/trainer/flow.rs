//! What an epoch's observer returns: `()` (go on) or a [`ControlFlow`] that can stop the epoch
//! after a step, and the report of an epoch so stopped.

use std::ops::ControlFlow;

use super::Trainer;
use super::bounds::TrainerTypes;
use super::epoch::{EpochEnd, EpochTally};
use super::log::EpochReport;

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

impl<TT: TrainerTypes> Trainer<TT> {
    /// Whether an epoch is under way: started, not finished (it stopped
    /// part-way, by its observer, an error, or a checkpoint taken inside
    /// it); the next [`fit_epoch`](Self::fit_epoch) goes on with it.
    pub fn epoch_in_progress(&self) -> bool {
        self.mid_epoch
    }

    /// Whether the epoch under way has samples left.
    pub(super) fn epoch_left(&self) -> bool {
        self.sampler.as_ref().is_some_and(|s| s.remaining() > 0)
    }

    /// What the epoch's end adds to `tally`.
    pub(super) fn epoch_end(&self, tally: &EpochTally) -> EpochEnd {
        EpochEnd {
            epoch: self.epoch,
            frozen_layers: self.auto.frozen_layers(),
            front: self.front(),
            micro_batches: self.micro_batches(tally.ran_with().stages()),
            cache_after: self.cache_counts(),
        }
    }

    /// The report of an epoch its observer stopped: the steps this call
    /// ran; the epoch stays open (not logged, not counted).
    pub(super) fn stopped_report(&self, tally: EpochTally) -> EpochReport {
        let end = self.epoch_end(&tally);
        tally.report(end)
    }
}
