//! What a trainer shows of itself: its configuration, front, costs, rate, group, counts and model.

use burn_freeze::{InnerInput, InnerOutput, LayerStack};
use burn_pipe::UnitCosts;

use super::bounds::TrainerTypes;
use super::error::TrainerError;
use super::{Trainer, TrainerConfig};
use crate::group::ReplicaGroup;

impl<TT: TrainerTypes> Trainer<TT> {
    /// The configuration.
    pub fn config(&self) -> &TrainerConfig {
        &self.config
    }

    /// The freeze front (frozen units; once a step lost every replica, the
    /// front they had).
    pub fn front(&self) -> usize {
        self.group.front()
    }

    /// Frozen layers (the policy's F).
    pub fn frozen_layers(&self) -> usize {
        self.auto.frozen_layers()
    }

    /// AutoPipe's unit costs (profiled on the first batch when so
    /// configured, unless the run is one stage throughout: then parameter
    /// counts, which decide nothing there).
    pub fn unit_costs(&self) -> &UnitCosts {
        &self.costs
    }

    /// The learning rate of the last step (before the first, the
    /// configured one): [`TrainerConfig::lr`] or the schedule's rate (see
    /// [`set_lr_scheduler`](Self::set_lr_scheduler)), scaled linearly with
    /// the current replica count under
    /// [`BatchPolicy::PerReplica`](crate::BatchPolicy::PerReplica).
    pub fn learning_rate(&self) -> f64 {
        let replicas = self.group.total_replicas();
        match self.sampler.as_ref() {
            Some(sampler) => sampler.learning_rate(self.last_base_lr, self.base_replicas, replicas),
            None => self.last_base_lr,
        }
    }

    /// The replica group.
    pub fn group(&self) -> &ReplicaGroup<TT::Stack, TT::Optimizer> {
        &self.group
    }

    /// Epochs finished.
    pub fn epoch(&self) -> usize {
        self.epoch
    }

    /// Optimizer steps taken.
    pub fn steps(&self) -> usize {
        self.steps
    }

    /// The model's output for evaluation (no graph; dropout off). Fails
    /// with [`ElasticError::GroupLost`](crate::ElasticError::GroupLost) once
    /// a step lost every replica.
    pub fn forward_inner(
        &self,
        input: InnerInput<TT::Stack>,
    ) -> Result<InnerOutput<TT::Stack>, TrainerError> {
        Ok(self.group.forward_inner(input)?)
    }

    /// A copy of the whole model (frozen units too), to evaluate or save.
    /// Fails with [`ElasticError::GroupLost`](crate::ElasticError::GroupLost)
    /// once a step lost every replica (resume from a checkpoint).
    pub fn to_layer_stack(&self) -> Result<LayerStack<TT::Stack>, TrainerError> {
        Ok(self.group.to_layer_stack()?)
    }

    /// The trained model; the trainer ends. Fails with
    /// [`ElasticError::GroupLost`](crate::ElasticError::GroupLost) once a
    /// step lost every replica.
    pub fn into_layer_stack(self) -> Result<LayerStack<TT::Stack>, TrainerError> {
        Ok(self.group.into_layer_stack()?)
    }
}
