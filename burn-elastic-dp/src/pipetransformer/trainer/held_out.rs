//! The freeze rule's held-out loss: the user's validation batch, or samples carved out of the
//! training data once, scored every few steps for the rule and its guard.

use burn::data::dataloader::batcher::Batcher;
use burn::data::dataset::Dataset;
use burn::tensor::ElementConversion;
use burn_freeze::{Activation, AutodiffActivation, FreezePolicy};

use super::bounds::{CacheableStack, TrainerBackend, TrainerInput, TrainerOutput, TrainerTypes};
use super::epoch::EpochTally;
use super::error::TrainerError;
use super::{Trainer, fetch};
use crate::sampler::ElasticSampler;

/// Held-out samples when the configuration names no count: a sixteenth of
/// the data, at most this many.
const DEFAULT_HELD_OUT_MOST: usize = 256;

impl<TT: TrainerTypes> Trainer<TT> {
    /// Scores the freeze rule's held-out loss on `input` and `targets`, a
    /// batch of the user's validation set, instead of samples carved out of
    /// the training data: every training sample is then trained on. Give
    /// [`TrainerConfig::held_out`](crate::TrainerConfig::held_out) `Some(0)` so that nothing is carved; a
    /// configuration that carves is refused (the carve is a function of the
    /// configuration, so that a resumed run carves the same). The batch
    /// moves to the first device and is scored there, forward only; on a
    /// resumed run, set it again. Across processes each rank scores its own
    /// batch and the largest loss counts, so give every rank the same one.
    ///
    /// ```
    /// use burn::backend::{Autodiff, Flex};
    /// use burn::nn::loss::CrossEntropyLossConfig;
    /// use burn::nn::{Linear, LinearConfig};
    /// use burn::optim::AdamConfig;
    /// use burn::prelude::*;
    /// use burn_elastic_dp::TrainerConfig;
    /// use burn_freeze::LayerStack;
    ///
    /// #[derive(Module, Debug)]
    /// pub struct Dense<B: Backend> { linear: Linear<B> }
    /// impl<B: Backend> Dense<B> {
    ///     pub fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> { self.linear.forward(x).tanh() }
    /// }
    /// burn_freeze::unit!(Dense<B>: Tensor<B, 2> => Tensor<B, 2>);
    ///
    /// type B = Autodiff<Flex>;
    /// let device = Default::default();
    /// let dense = |i, o| Dense::<B> { linear: LinearConfig::new(i, o).init(&device) };
    /// let stack = || LayerStack::new(dense(4, 8), (0..2).map(|_| dense(8, 8)).collect(), dense(8, 2));
    /// let cross_entropy = CrossEntropyLossConfig::new().init(&device);
    /// let loss = move |logits, y| cross_entropy.forward(logits, y);
    /// let validation = || (Tensor::<B, 2>::ones([6, 4], &device), Tensor::<B, 1, Int>::zeros([6], &device));
    ///
    /// // The default configuration carves held-out samples: refused. (One
    /// // trainer on these devices at a time: it is dropped before the next.)
    /// let mut trainer = TrainerConfig::new()
    ///     .init(stack(), vec![device; 2], || AdamConfig::new().init(), loss.clone())?;
    /// let (x, y) = validation();
    /// assert!(trainer.set_validation(x, y).is_err());
    /// drop(trainer);
    ///
    /// // Nothing carved: the validation batch feeds the freeze rule.
    /// let mut trainer = TrainerConfig::new()
    ///     .with_held_out(Some(0))
    ///     .init(stack(), vec![device; 2], || AdamConfig::new().init(), loss)?;
    /// let (x, y) = validation();
    /// trainer.set_validation(x, y)?;
    /// # Ok::<(), burn_elastic_dp::TrainerError>(())
    /// ```
    pub fn set_validation(
        &mut self,
        input: TrainerInput<TT>,
        targets: TT::Targets,
    ) -> Result<(), TrainerError> {
        if self.rule_reads_held_out() && self.config.held_out != Some(0) {
            return Err(TrainerError::InvalidConfig {
                field: "held_out",
                value: format!("{:?}", self.config.held_out),
                accepted: "Some(0) with a validation batch (set_validation): carved samples would go untrained and unused",
            });
        }
        let device = &self.devices[0];
        self.held_out_batch = Some((input.to_device(device), targets.to_device(device)));
        Ok(())
    }

    /// Whether AutoFreeze runs a rule that reads a held-out loss.
    fn rule_reads_held_out(&self) -> bool {
        self.config.parts.freeze && self.auto.policy().held_out_every().is_some()
    }

    /// Held-out samples of a dataset of `len`: none unless AutoFreeze runs
    /// a rule that reads a held-out loss.
    fn held_out_samples(&self, len: usize) -> usize {
        match (self.rule_reads_held_out(), self.config.held_out) {
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
        let (input, targets) = match &self.held_out_batch {
            Some(batch) => batch.clone(),
            None => {
                // The carved samples, fetched once and kept.
                let indices = match self.sampler.as_ref() {
                    Some(sampler) if !sampler.held_out().is_empty() => sampler.held_out().to_vec(),
                    _ => return Ok(false),
                };
                let batch = fetch(dataset, batcher, &indices, &self.devices[0])?;
                self.held_out_batch = Some(batch.clone());
                batch
            }
        };
        let loss = self.held_out_loss(input, targets)?;
        let front = self.group.front();
        let moved = self.auto.held_out_loss(&mut self.group, loss)?;
        if self.group.front() != front {
            tally.transition(self.transition(front)?);
            return Ok(true);
        }
        Ok(moved.is_some())
    }

    /// The trainer's loss on the held-out batch with the current weights,
    /// forward only (no graph); the same on every rank of a job (each
    /// rank's value replaced by the largest).
    fn held_out_loss(
        &mut self,
        input: TrainerInput<TT>,
        targets: TT::Targets,
    ) -> Result<f64, TrainerError>
    where
        TT::Stack: CacheableStack,
    {
        let started = std::time::Instant::now();
        let output = self.group.forward_inner(input.inner())?;
        let output = <TrainerOutput<TT> as AutodiffActivation<_>>::from_inner(output);
        let loss: f64 = (*self.loss)(output, targets).into_scalar().elem();
        let loss = if self.group.spans_processes() {
            self.group.agree_max(vec![loss])?[0]
        } else {
            loss
        };
        tracing::debug!(
            loss,
            millis = started.elapsed().as_secs_f64() * 1e3,
            "held-out loss"
        );
        Ok(loss)
    }
}
