//! The trainer's learning rate at each step: the configured rate or a schedule's (see
//! `schedule.rs`), scaled with the replicas under a per-replica batch.

use serde::{Deserialize, Serialize};

use super::error::TrainerError;
use super::schedule::{LrSource, Schedule};
use crate::sampler::ElasticSampler;

/// The learning rate of a run: where each step's base rate comes from,
/// the base of the last step, and the replica count the base is tuned for.
pub(super) struct LearningRate {
    schedule: Schedule,
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
            schedule: Schedule::default(),
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

    /// The rate of step `step` (the schedule asked when it has not been for
    /// this step, else `fixed`), scaled as [`current`](Self::current) says;
    /// remembered as the last rate.
    pub(super) fn next(
        &mut self,
        step: usize,
        fixed: f64,
        sampler: Option<&ElasticSampler>,
        replicas: usize,
    ) -> Result<f64, TrainerError> {
        self.last_base = self.schedule.rate(step, fixed)?;
        Ok(self.current(sampler, replicas))
    }

    /// Sets where the base rates come from (a checkpoint's state waiting
    /// for it restored into it).
    pub(super) fn set_source(&mut self, source: Box<dyn LrSource>) -> Result<(), TrainerError> {
        self.schedule.set(source)
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
            lr_schedule: self.schedule.save()?,
        })
    }

    /// Takes a checkpoint's state: the reference, and the schedule's state
    /// (applied when a schedule is set).
    pub(super) fn restore(&mut self, state: RateState) {
        self.base_replicas = state.base_replicas;
        self.schedule.restore(state.lr_schedule);
    }
}
