//! The trainer's learning rate at each step: the configured rate or a source's (a burn-train
//! scheduler, a closure: `lr_source.rs`), scaled with the replicas under a per-replica batch.

use serde::{Deserialize, Serialize};

use super::error::TrainerError;
use super::lr_source::LrSource;
use crate::sampler::ElasticSampler;

/// The learning rate of a run: where each step's base rate comes from
/// (a source, the rate it last gave, and a checkpoint's state that waits
/// for its source: a resumed run sets the source after
/// [`Trainer::resume`](super::Trainer::resume)), the base of the last
/// step, and the replica count the base is tuned for.
pub(super) struct LearningRate {
    /// The scheduled rates' source (`None`: the configured rate).
    source: Option<Box<dyn LrSource>>,
    /// The step last asked of the source and its rate.
    asked: Option<(usize, f64)>,
    /// A checkpoint's source state, kept until a source is set.
    waiting: Option<Vec<u8>>,
    /// The unscaled rate of the last step (before the first: the
    /// configured one).
    last_base: f64,
    /// Replicas at the start (the scaling's reference), every process's.
    base_replicas: usize,
}

/// What a checkpoint keeps of the learning rate (fields of `state.json`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct RateState {
    pub base_replicas: usize,
    /// The learning-rate scheduler's record (Burn's binary recorder), when
    /// one with a state is set.
    #[serde(default)]
    pub lr_schedule: Option<Vec<u8>>,
}

impl LearningRate {
    /// The configured rate `lr`, tuned for `base_replicas` replicas.
    pub(super) fn new(lr: f64, base_replicas: usize) -> Self {
        Self {
            source: None,
            asked: None,
            waiting: None,
            last_base: lr,
            base_replicas,
        }
    }

    /// The rate of the last step at `replicas` replicas (the whole
    /// group's): the base, scaled by the sampler's batch policy.
    pub(super) fn current(&self, sampler: Option<&ElasticSampler>, replicas: usize) -> f64 {
        match sampler {
            Some(sampler) => sampler.learning_rate(self.last_base, self.base_replicas, replicas),
            None => self.last_base,
        }
    }

    /// The rate of step `step` (the source asked when it has not been for
    /// this step, else `fixed`), scaled as [`current`](Self::current) says;
    /// remembered as the last rate.
    pub(super) fn next(
        &mut self,
        step: usize,
        fixed: f64,
        sampler: Option<&ElasticSampler>,
        replicas: usize,
    ) -> Result<f64, TrainerError> {
        self.last_base = self.base_rate(step, fixed)?;
        Ok(self.current(sampler, replicas))
    }

    /// The unscaled rate of step `step`: the source's, else `fixed`. The
    /// source is asked once per optimizer step, in order; a step that fails
    /// is taken again with the rate it was given: the source is asked once
    /// per step index, however many times the step runs.
    fn base_rate(&mut self, step: usize, fixed: f64) -> Result<f64, TrainerError> {
        let Some(source) = self.source.as_mut() else {
            if self.waiting.take().is_some() {
                tracing::warn!(
                    "the checkpoint holds a learning-rate schedule, but none was set after \
                     resuming: training on at the configured lr"
                );
            }
            return Ok(fixed);
        };
        if let Some((asked, lr)) = self.asked
            && asked == step
        {
            return Ok(lr);
        }
        let lr = source.next(step);
        if !(lr.is_finite() && lr >= 0.0) {
            return Err(TrainerError::InvalidRunValue {
                what: "learning-rate schedule",
                value: format!("{lr} at step {step}"),
                accepted: "a finite number of at least 0",
            });
        }
        self.asked = Some((step, lr));
        Ok(lr)
    }

    /// Sets where the base rates come from, restoring a checkpoint's state
    /// waiting for it.
    pub(super) fn set_source(&mut self, mut source: Box<dyn LrSource>) -> Result<(), TrainerError> {
        if let Some(bytes) = self.waiting.take() {
            source.load(bytes).map_err(|e| {
                TrainerError::Checkpoint(format!("the learning-rate schedule's state: {e}"))
            })?;
        }
        self.source = Some(source);
        self.asked = None;
        Ok(())
    }

    /// The scaling's reference becomes `replicas` (the start moved before
    /// the first step).
    pub(super) fn rebase(&mut self, replicas: usize) {
        self.base_replicas = replicas;
    }

    /// What a checkpoint keeps.
    pub(super) fn state(&self) -> Result<RateState, TrainerError> {
        Ok(RateState {
            base_replicas: self.base_replicas,
            lr_schedule: match &self.source {
                Some(source) => source.save().map_err(|e| {
                    TrainerError::Checkpoint(format!("the learning-rate schedule's state: {e}"))
                })?,
                None => None,
            },
        })
    }

    /// Takes a checkpoint's state: the reference, and the source's state
    /// (applied when a source is set).
    pub(super) fn restore(&mut self, state: RateState) {
        self.base_replicas = state.base_replicas;
        self.waiting = state.lr_schedule;
    }
}
