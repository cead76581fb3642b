//! What a trainer shows of itself: its configuration, front, costs, rate, group, counts and model.

use burn_freeze::{InnerInput, InnerOutput, LayerStack};
use burn_pipe::UnitCosts;

use super::bounds::TrainerTypes;
use super::{Trainer, TrainerConfig};
use crate::group::ReplicaGroup;

impl<TT: TrainerTypes> Trainer<TT> {
    /// The configuration.
    pub fn config(&self) -> &TrainerConfig {
        &self.config
    }

    /// The freeze front (frozen units).
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

    /// The model's output for evaluation (no graph; dropout off).
    pub fn forward_inner(&self, input: InnerInput<TT::Stack>) -> InnerOutput<TT::Stack> {
        self.group.forward_inner(input)
    }

    /// A copy of the whole model (frozen units too), to evaluate or save.
    pub fn to_layer_stack(&self) -> LayerStack<TT::Stack> {
        self.group.to_layer_stack()
    }

    /// The trained model; the trainer ends.
    pub fn into_layer_stack(self) -> LayerStack<TT::Stack> {
        self.group.into_layer_stack()
    }
}
