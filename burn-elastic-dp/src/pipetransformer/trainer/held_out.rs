//! The freeze rule's held-out loss: the user's validation batch, or samples carved out of the
//! training data once, scored every few steps for the rule and its guard.

use burn::data::dataloader::batcher::Batcher;
use burn::data::dataset::Dataset;
use burn::prelude::*;
use burn::tensor::ElementConversion;
use burn_freeze::plumbing::{Flow, InnerFlow};
use burn_freeze::{Activation, AutodiffActivation, StackOptimizer};

use super::SharedLoss;
use super::bounds::CacheableStack;
use super::config::TrainerConfig;
use super::error::TrainerError;
use crate::group::ReplicaGroup;
use crate::sampler::ElasticSampler;

/// Held-out samples when the configuration names no count: a sixteenth of
/// the data, at most this many.
const DEFAULT_HELD_OUT_MOST: usize = 256;

/// The held-out batch of a run whose freeze rule reads a held-out loss:
/// the user's validation batch, or the carved samples once fetched.
pub(super) struct HeldOut<I, T, F> {
    /// Whether AutoFreeze runs a rule that reads a held-out loss.
    read: bool,
    /// The configured count of carved samples.
    configured: Option<usize>,
    batch: Option<(I, T)>,
    /// The batch's activation after the frozen units it last ran through
    /// (stage 0's, [`ReplicaGroup::cached_prefix`]), with the unit it
    /// enters at: the batch never changes and frozen units never do, so the
    /// next check runs only the units frozen since and the ones still
    /// training. A thaw below it starts again from the input.
    prefix: Option<(usize, F)>,
}

impl<I: Clone, T: Clone, F> HeldOut<I, T, F> {
    /// For a run of `config` whose freeze rule reads a held-out loss when
    /// `rule_reads` is set.
    pub(super) fn new(config: &TrainerConfig, rule_reads: bool) -> Self {
        Self {
            read: config.parts.freeze && rule_reads,
            configured: config.held_out,
            batch: None,
            prefix: None,
        }
    }

    /// Sets the user's validation batch; refused when the configuration
    /// carves samples (see [`Trainer::set_validation`](super::Trainer::set_validation)).
    pub(super) fn set_validation(&mut self, input: I, targets: T) -> Result<(), TrainerError> {
        if self.read && self.configured != Some(0) {
            return Err(TrainerError::InvalidConfig {
                field: "held_out",
                value: format!("{:?}", self.configured),
                accepted: "Some(0) with a validation batch (set_validation): carved samples would go untrained and unused",
            });
        }
        self.batch = Some((input, targets));
        self.forget_prefix();
        Ok(())
    }

    /// Drops the batch's kept activation (frozen units thawed, or weights
    /// restored from a checkpoint): the next check starts from the input.
    pub(super) fn forget_prefix(&mut self) {
        self.prefix = None;
    }

    /// Held-out samples of a dataset of `len`: none unless the rule reads a
    /// held-out loss.
    fn samples(&self, len: usize) -> usize {
        match (self.read, self.configured) {
            (false, _) => 0,
            (true, Some(samples)) => samples,
            (true, None) => (len / 16).min(DEFAULT_HELD_OUT_MOST),
        }
    }

    /// The sampler of `config` over a dataset of `len` samples, the
    /// held-out ones carved out (a function of the configuration and `len`
    /// alone, so that a resumed run and every rank carve the same).
    pub(super) fn sampler(
        &self,
        config: &TrainerConfig,
        len: usize,
    ) -> Result<ElasticSampler, TrainerError> {
        let sampler = ElasticSampler::new(len, config.batch, config.seed)?;
        match self.samples(len) {
            0 => Ok(sampler),
            samples => Ok(sampler.with_held_out(samples)?),
        }
    }

    /// The batch to score: the validation batch, else the carved samples
    /// `carved` of `dataset`, batched by `batcher` on `device` once and kept;
    /// `None` when there is neither. With it, its kept activation.
    pub(super) fn batch<B, Item, D, Bt>(
        &mut self,
        dataset: &D,
        batcher: &Bt,
        carved: &[usize],
        device: &Device<B>,
    ) -> Result<Option<(I, T, &mut Option<(usize, F)>)>, TrainerError>
    where
        B: Backend,
        D: Dataset<Item>,
        Bt: Batcher<B, Item, (I, T)>,
    {
        if self.batch.is_none() && !carved.is_empty() {
            self.batch = Some(super::fetch(dataset, batcher, carved, device)?);
        }
        let prefix = &mut self.prefix;
        Ok(self
            .batch
            .clone()
            .map(|(input, targets)| (input, targets, prefix)))
    }
}

/// `loss` on a held-out batch with `group`'s current weights, forward only
/// (no graph), the frozen units run only once per front (`prefix` keeps the
/// batch's activation at the front; the same batch at every call); the same
/// on every rank of a job (each rank's value replaced by the largest).
pub(super) fn held_out_loss<S, O, T>(
    group: &ReplicaGroup<S, O>,
    loss: &SharedLoss<S, T>,
    prefix: &mut Option<(usize, InnerFlow<S>)>,
    input: S::Input,
    targets: T,
) -> Result<f64, TrainerError>
where
    S: CacheableStack,
    O: StackOptimizer<S>,
    T: Activation<S::Backend>,
{
    let started = std::time::Instant::now();
    let front = group.cached_prefix();
    let (from, flow) = match prefix.take() {
        Some((entry, kept)) if entry <= front => (entry, kept),
        _ => (0, Flow::Input(input.inner())),
    };
    let flow = group.forward_frozen_inner(flow, from, front)?;
    *prefix = Some((front, flow.clone()));
    let output = group.forward_inner_from(flow, front)?;
    let output = <S::Output as AutodiffActivation<_>>::from_inner(output);
    let loss: f64 = (**loss)(output, targets).into_scalar().elem();
    let loss = if group.spans_processes() {
        group.agree_max(vec![loss])?[0]
    } else {
        loss
    };
    tracing::debug!(
        loss,
        from,
        front,
        millis = started.elapsed().as_secs_f64() * 1e3,
        "held-out loss"
    );
    Ok(loss)
}
