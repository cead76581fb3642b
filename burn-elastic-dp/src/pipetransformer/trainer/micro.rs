//! The trainer's micro-batch count M: chosen for every shape from unit times measured at a few
//! micro-batch sizes (profiled costs, no count configured), else the paper's rule.

use burn::prelude::*;
use burn_freeze::{Activation, Differentiable, StackOptimizer, StackTypes};
use burn_pipe::balance::UnitState;
use burn_pipe::choose_micro_batches;
use burn_pipe::micro::{
    MicroBatchChoice, MicroBatchQuery, MicroBatchTimes, micro_batch_profile_sizes,
    profile_micro_batches,
};

use super::config::TrainerConfig;
use super::error::TrainerError;
use super::rules::CostModel;
use super::transition::shape_of;
use crate::group::ReplicaGroup;
use burn_freeze::CacheHolder;
use burn_freeze::FreezeFront;

/// What the trainer knows of micro-batch times, and the count it chose.
#[derive(Debug)]
pub(super) struct MicroBatchRule {
    /// Unit times at several micro-batch sizes: measured on the first batch
    /// under profiled costs, or given
    /// ([`Trainer::set_micro_batch_times`](super::Trainer::set_micro_batch_times)).
    times: Option<MicroBatchTimes>,
    /// Whether M is still to be chosen before the next step (a new or
    /// resumed trainer).
    pending: bool,
    /// The choice the group runs with, if M was chosen.
    choice: Option<MicroBatchChoice>,
}

impl Default for MicroBatchRule {
    fn default() -> Self {
        Self {
            times: None,
            pending: true,
            choice: None,
        }
    }
}

impl MicroBatchRule {
    /// The choice the group runs with: `None` while the paper's rule or a
    /// configured count holds.
    pub(super) fn choice(&self) -> Option<&MicroBatchChoice> {
        self.choice.as_ref()
    }

    /// Takes `times` (which must time every unit of `group`'s model) and
    /// chooses M for the group's shape at once.
    pub(super) fn set_times<S: StackTypes, O: StackOptimizer<S>>(
        &mut self,
        times: MicroBatchTimes,
        group: &mut ReplicaGroup<S, O>,
        config: &TrainerConfig,
    ) -> Result<Option<&MicroBatchChoice>, TrainerError> {
        let units = group.num_units();
        if times.units() != units {
            return Err(TrainerError::InvalidConfig {
                field: "micro_batch_times",
                value: format!("a table of {} units", times.units()),
                accepted: "a table that times every unit of the model",
            });
        }
        self.times = Some(times);
        self.choose(group, config);
        Ok(self.choice())
    }

    /// Before the first step (of a new or resumed trainer, after the unit
    /// costs' profile): the unit times measured at a few micro-batch sizes
    /// on `input` (a copy of the model on `device`) when the costs are
    /// profiled ([`CostModel::Profiled`]), no table was given and no count
    /// is configured; then M chosen for the group's shape. A run that
    /// starts at one stage measures nothing (K never grows; one stage has no
    /// bubble: M = 1).
    pub(super) fn measure_if_pending<S, O>(
        &mut self,
        group: &mut ReplicaGroup<S, O>,
        config: &TrainerConfig,
        device: &Device<S::Backend>,
        input: &S::Input,
    ) -> Result<(), TrainerError>
    where
        S: StackTypes<Output: Differentiable<S::Backend>>,
        O: StackOptimizer<S>,
    {
        if !self.pending {
            return Ok(());
        }
        self.pending = false;
        // One stage has no bubble to fill, and no rule lengthens a pipeline:
        // a run that starts at K = 1 keeps the paper's M = 1 and pays no
        // profile (on MiniLM, as long as a fifth of a short run).
        if let CostModel::Profiled { repeats } = config.costs
            && config.measures_micro_batches(shape_of(group).stages())
            && self.times.is_none()
        {
            // The largest batch a replica can get: the global batch of one.
            let largest = config.batch.global_batch(1).min(input.batch_size());
            let sizes = micro_batch_profile_sizes(largest);
            let stack = group.to_layer_stack()?;
            let measured = profile_micro_batches(&stack, input.clone(), device, &sizes, repeats)
                .map_err(|error| {
                    tracing::warn!(%error, "micro-batch sizes not profiled; the paper's micro-batch count holds")
                })
                .ok();
            // Every process chooses from the same table: the slowest's.
            self.times = super::agree::micro_batch_times(group, measured)?;
        }
        self.choose(group, config);
        Ok(())
    }

    /// M for the group's shape from the table, set on the group and
    /// logged; the choice, or `None` when the paper's rule or a configured
    /// count holds (then the group keeps its configured count). Asked for
    /// every shape the run takes (at its first step and after each
    /// transition), by burn-pipe's step model ([`choose_micro_batches`]).
    /// Without a table (a fixed `micro_batches`, or parameter-count costs and
    /// no table given) the paper's rule holds
    /// ([`PipelineConfig::micro_batches`](burn_pipe::PipelineConfig::micro_batches)).
    pub(super) fn choose<S: StackTypes, O: StackOptimizer<S>>(
        &mut self,
        group: &mut ReplicaGroup<S, O>,
        config: &TrainerConfig,
    ) -> Option<MicroBatchChoice> {
        let configured = config.replicas.pipeline.micro_batches;
        let times = self.times.as_ref().filter(|_| configured.is_none())?;
        let shape = shape_of(group);
        if shape.replicas == 0 {
            return None;
        }
        let units = group.num_units();
        let front = group.front();
        // Stage 0's frozen units, as the pipeline serves them, when the
        // cache serves them.
        let cached = if group.cache().is_some() {
            burn_freeze::plumbing::cached_prefix(front, &shape.balance)
        } else {
            0
        };
        let states: Vec<UnitState> = (0..units)
            .map(|u| UnitState::of(u, front, cached))
            .collect();
        let total = group.total_replicas();
        let batch_per_replica = config.batch.global_batch(total) / total;
        let query = MicroBatchQuery {
            balance: &shape.balance,
            states: &states,
            batch_per_replica,
            schedule: config.replicas.pipeline.schedule,
        };
        let applied = choose_micro_batches(times, &query)
            .map_err(|e| e.to_string())
            .and_then(|choice| {
                let set = group.set_micro_batches(Some(choice.micro_batches));
                set.map(|()| choice).map_err(|e| e.to_string())
            });
        match applied {
            Ok(choice) => {
                tracing::info!(
                    K = shape.stages(),
                    R = shape.replicas,
                    batch_per_replica,
                    M = choice.micro_batches,
                    predicted_ms = format!("{:.2}", choice.predicted_step_s * 1e3),
                    paper_M = choice.paper_micro_batches,
                    paper_predicted_ms = choice
                        .predicted(choice.paper_micro_batches)
                        .map(|s| format!("{:.2}", s * 1e3)),
                    "micro-batches chosen from measured times"
                );
                self.choice = Some(choice.clone());
                Some(choice)
            }
            Err(error) => {
                tracing::warn!(%error, "micro-batches not chosen; the paper's count holds");
                // Cannot fail: `None` is always a valid count.
                let _ = group.set_micro_batches(None);
                self.choice = None;
                None
            }
        }
    }
}

/// Micro-batches per replica with `stages` stages: the group's own (chosen
/// or configured) at its current length, the configured rule at another.
pub(super) fn micro_batches<S: StackTypes, O: StackOptimizer<S>>(
    group: &ReplicaGroup<S, O>,
    config: &TrainerConfig,
    stages: usize,
) -> usize {
    if group.num_replicas() > 0 && group.num_stages() == stages {
        group.micro_batches()
    } else {
        config.replicas.pipeline.micro_batches_for(stages)
    }
}

/// The fewest samples a step takes with `replicas` replicas (the whole
/// group's) of `micro_batches` micro-batches each: one per micro-batch of
/// every replica. The configuration's check and every step ask this.
pub(super) fn min_batch(replicas: usize, micro_batches: usize) -> usize {
    replicas * micro_batches
}

/// [`min_batch`] of `group` at `stages` stages.
pub(super) fn group_min_batch<S: StackTypes, O: StackOptimizer<S>>(
    group: &ReplicaGroup<S, O>,
    config: &TrainerConfig,
    stages: usize,
) -> usize {
    min_batch(group.total_replicas(), micro_batches(group, config, stages))
}
