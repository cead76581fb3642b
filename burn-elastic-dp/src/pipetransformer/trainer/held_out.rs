//! The freeze rule's held-out loss: samples carved out of the training data once, scored every
//! few steps for the guard that thaws a freeze after which the loss rises.

use burn::data::dataloader::batcher::Batcher;
use burn::data::dataset::Dataset;
use burn::tensor::ElementConversion;
use burn_freeze::{AutodiffActivation, FreezePolicy};

use super::bounds::{CacheableStack, TrainerBackend, TrainerInput, TrainerOutput, TrainerTypes};
use super::epoch::EpochTally;
use super::error::TrainerError;
use super::{Trainer, fetch};
use crate::sampler::ElasticSampler;

/// Held-out samples when the configuration names no count: a sixteenth of
/// the data, at most this many.
const DEFAULT_HELD_OUT_MOST: usize = 256;

impl<TT: TrainerTypes> Trainer<TT> {
    /// Held-out samples of a dataset of `len`: none unless AutoFreeze runs
    /// a rule that reads a held-out loss.
    fn held_out_samples(&self, len: usize) -> usize {
        let wants = self.config.parts.freeze && self.auto.policy().held_out_every().is_some();
        match (wants, self.config.held_out) {
            (false, _) => 0,
            (true, Some(samples)) => samples,
            (true, None) => (len / 16).min(DEFAULT_HELD_OUT_MOST),
        }
    }

    /// The sampler over a dataset of `len` samples, the held-out ones
    /// carved out (a function of the configuration and `len` alone, so that
    /// a resumed run and every rank carve the same).
    pub(super) fn make_sampler(&self, len: usize) -> Result<ElasticSampler, TrainerError> {
        let sampler = ElasticSampler::new(len, self.config.batch, self.config.seed)?;
        match self.held_out_samples(len) {
            0 => Ok(sampler),
            samples => Ok(sampler.with_held_out(samples)?),
        }
    }

    /// After a step, when the freeze rule asks for it: the held-out loss,
    /// fed to the rule, and the transition that follows when it moved the
    /// front (a thaw); whether it moved.
    pub(super) fn guard_after_step<I, D, Bt>(
        &mut self,
        dataset: &D,
        batcher: &Bt,
        tally: &mut EpochTally,
    ) -> Result<bool, TrainerError>
    where
        TT::Stack: CacheableStack,
        D: Dataset<I>,
        Bt: Batcher<TrainerBackend<TT>, I, (TrainerInput<TT>, TT::Targets)>,
    {
        if !self.config.parts.freeze || !self.auto.wants_held_out_loss() {
            return Ok(false);
        }
        let indices = match self.sampler.as_ref() {
            Some(sampler) if !sampler.held_out().is_empty() => sampler.held_out().to_vec(),
            _ => return Ok(false),
        };
        let loss = self.held_out_loss(dataset, batcher, &indices)?;
        let front = self.group.front();
        let moved = self.auto.held_out_loss(&mut self.group, loss)?;
        if self.group.front() != front {
            tally.transition(self.transition(front)?);
            return Ok(true);
        }
        Ok(moved.is_some())
    }

    /// The trainer's loss on the samples `indices` with the current
    /// weights, forward only (no graph); the same on every rank of a job
    /// (each rank's value replaced by the largest).
    fn held_out_loss<I, D, Bt>(
        &mut self,
        dataset: &D,
        batcher: &Bt,
        indices: &[usize],
    ) -> Result<f64, TrainerError>
    where
        TT::Stack: CacheableStack,
        D: Dataset<I>,
        Bt: Batcher<TrainerBackend<TT>, I, (TrainerInput<TT>, TT::Targets)>,
    {
        let started = std::time::Instant::now();
        let device = self.devices[0].clone();
        let (input, targets) = fetch(dataset, batcher, indices, &device)?;
        let output = self.group.forward_inner(input.inner());
        let output = <TrainerOutput<TT> as AutodiffActivation<_>>::from_inner(output);
        let loss: f64 = (*self.loss)(output, targets).into_scalar().elem();
        let loss = if self.group.spans_processes() {
            self.group.agree_max(vec![loss])?[0]
        } else {
            loss
        };
        tracing::debug!(loss, millis = started.elapsed().as_secs_f64() * 1e3, "held-out loss");
        Ok(loss)
    }
}
