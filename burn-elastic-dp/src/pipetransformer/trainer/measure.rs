//! What the trainer measures of the model for its shape rule: the units' costs (parameter counts,
//! or times profiled on the first batch), their memory (parameters, activations measured on the
//! first batch) and their times at several micro-batch sizes; the rule ([`ShapeRule`]) decides
//! every shape and micro-batch count on them.

use burn::prelude::*;
use burn_freeze::{
    Activation, Differentiable, FreezeFront, LayerStack, StackOptimizer, StackTypes,
};
use burn_pipe::balance::{HeapCounter, measure_unit_memory};
use burn_pipe::micro::{
    MicroBatchChoice, MicroBatchTimes, micro_batch_profile_sizes, profile_micro_batches,
};
use burn_pipe::{UnitCosts, UnitMemory, UnitProfile, profile_units};
use serde::{Deserialize, Serialize};

use super::config::TrainerConfig;
use super::error::TrainerError;
use super::rules::CostModel;
use super::transition::shape_of;
use crate::group::ReplicaGroup;
use crate::pipetransformer::shape::{MicroBatches, ShapeRule, ShapeSettings};

/// Timed runs of the micro-batch table's largest size when the unit costs
/// are parameter counts (profiled costs use their own `repeats`): the
/// fastest counts.
pub(super) const MICRO_BATCH_REPEATS: usize = 3;

/// The cores `devices` share when they are threads of one machine: more
/// than one device, all the same (logical CPU devices); this machine's
/// cores over the MPI ranks started on it (OpenMPI's
/// `OMPI_COMM_WORLD_LOCAL_SIZE`, MPICH's `MPI_LOCALNRANKS`), at least 1.
/// `None` for devices of their own.
fn shared_cores<D: PartialEq>(devices: &[D]) -> Option<usize> {
    let logical = devices.len() > 1 && devices.iter().all(|d| *d == devices[0]);
    if !logical {
        return None;
    }
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let ranks_here = ["OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"]
        .iter()
        .find_map(|name| std::env::var(name).ok()?.parse::<usize>().ok())
        .unwrap_or(1)
        .max(1);
    Some((cores / ranks_here).max(1))
}

/// The measurements a run's shapes are decided on, and the rule that
/// decides them.
pub(super) struct Measurements {
    /// The one owner of the run's shape decisions, on what is measured.
    rule: ShapeRule,
    /// Whether the costs still wait for the first batch's profile.
    profile_pending: bool,
    /// Whether the activations still wait for the first batch.
    memory_pending: bool,
    /// Whether the micro-batch times still wait for the first batch.
    micro_pending: bool,
    /// The micro-batch count the group runs with, and how it was chosen.
    micro: Option<MicroBatches>,
}

/// What a checkpoint keeps of the measurements (fields of `state.json`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct MeasuredState {
    pub costs: UnitCosts,
    pub initial_largest: f64,
    pub profile_pending: bool,
    /// The units' memory figures (absent in checkpoints from before
    /// memory-aware AutoPipe).
    #[serde(default)]
    pub memory: Option<UnitMemory>,
    #[serde(default)]
    pub memory_pending: bool,
    /// The micro-batch times M is chosen from (absent in checkpoints from
    /// before they were kept: a resumed run measures them again), so that
    /// a resumed run chooses the M the run it continues chose, on any
    /// number of devices.
    #[serde(default)]
    pub micro_batch_times: Option<MicroBatchTimes>,
}

impl Measurements {
    /// Before the first batch: parameter counts as costs and as memory,
    /// and what the first batch is to measure under `config` on `devices`.
    pub(super) fn start<S: StackTypes>(
        stack: &LayerStack<S>,
        config: &TrainerConfig,
        devices: &[Device<S::Backend>],
    ) -> Self {
        let params = stack.unit_params();
        // Parameter counts until the first batch is profiled.
        let (frozen_factor, profile_pending) = match config.costs {
            CostModel::Parameters { frozen_factor } => (frozen_factor, false),
            CostModel::Profiled { .. } => (1.0 / 3.0, true),
        };
        let memory =
            UnitMemory::from_param_counts(&params, burn_pipe::balance::float_bytes::<S::Backend>());
        let settings = ShapeSettings {
            shared_cores: shared_cores(devices),
            ..config.shape_settings(devices.len())
        };
        let rule = ShapeRule::new(
            settings,
            UnitCosts::from_params(&params, frozen_factor),
            config.with_evidence(&memory),
        );
        // Activations are measured only where they can decide something: a
        // budget is given, the shape rule keeps a memory fit, the heap is
        // counted.
        let memory_pending = config.memory.device_bytes.is_some()
            && rule.memory_fit().is_some()
            && HeapCounter::installed();
        Self {
            rule,
            profile_pending,
            memory_pending,
            micro_pending: true,
            micro: None,
        }
    }

    /// The shape rule, on what is measured so far.
    pub(super) fn rule(&self) -> &ShapeRule {
        &self.rule
    }

    /// The shape rule, to decide the start again on what was measured.
    pub(super) fn rule_mut(&mut self) -> &mut ShapeRule {
        &mut self.rule
    }

    /// The micro-batch count the group runs with, when it was measured.
    pub(super) fn micro_batch_choice(&self) -> Option<&MicroBatchChoice> {
        self.micro.as_ref().and_then(MicroBatches::choice)
    }

    /// Before the first step, where pending: the units' activations, then
    /// their times, measured on `input` (a copy of `group`'s model on the
    /// first of `devices`), agreed across processes. Whether the start is to be
    /// decided again on them. A run at one stage that nothing can deepen
    /// (the activations measured, or none to measure) profiles nothing: one
    /// stage has no balance, and no rule lengthens a pipeline (on MiniLM
    /// the profile cost seconds of every run's first epoch).
    pub(super) fn measure_first_batch<S, O>(
        &mut self,
        group: &ReplicaGroup<S, O>,
        config: &TrainerConfig,
        devices: &[Device<S::Backend>],
        input: &S::Input,
    ) -> Result<bool, TrainerError>
    where
        S: StackTypes<Output: Differentiable<S::Backend>>,
        O: StackOptimizer<S>,
    {
        let device = &devices[0];
        let mut changed = false;
        if self.memory_pending {
            let measured = measure_unit_memory(&group.to_layer_stack()?, input.clone(), device)?;
            // Every process starts on the same figures: the largest measured.
            let measured = super::agree::unit_memory(group, measured)?;
            tracing::info!(activations = ?measured.activations, "activation bytes per sample measured");
            self.rule.set_memory(config.with_evidence(&measured));
            self.memory_pending = false;
            changed = true;
        }
        if let CostModel::Profiled { repeats } = config.costs
            && self.profile_pending
        {
            self.profile_pending = false;
            let stages = match changed {
                // The trainer decides the start again on what changed.
                true => self.rule.start()?,
                false => shape_of(group),
            };
            if stages.stages() == 1 {
                tracing::info!("one stage throughout: unit costs not profiled");
            } else {
                let from_table =
                    self.profile_with_micro_table(group, config, device, input, stages.stages())?;
                let profile = match from_table {
                    Some(profile) => profile,
                    None => {
                        let profile =
                            profile_units(&group.to_layer_stack()?, input.clone(), device, repeats)?;
                        // Every process balances on the same times: the slowest's.
                        super::agree::unit_profiles(group, profile)?
                    }
                };
                self.rule.set_costs(UnitCosts::from_profile(&profile));
                changed = true;
                tracing::info!("unit costs profiled; the pipeline is balanced on them");
            }
        }
        Ok(changed)
    }

    /// Before the first step (of a new or resumed trainer): the unit times
    /// at a few micro-batch sizes, measured on `input` (a copy of the model
    /// on `device`) when the rule wants them (no count configured,
    /// measuring on, a pipeline at the start, no table given or
    /// checkpointed), agreed across processes; then M for the group's
    /// shape, set on the group. A run that starts at one stage measures
    /// nothing (K never grows; one stage has no bubble: M = 1).
    pub(super) fn measure_micro_batches<S, O>(
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
        if !self.micro_pending {
            return Ok(());
        }
        self.micro_pending = false;
        if self.rule.wants_micro_batch_times(shape_of(group).stages()) {
            let agreed = micro_batch_table(group, config, device, input)?;
            self.rule.set_micro_batch_times(agreed);
        }
        self.apply_micro_batches(group)
    }

    /// Where the run also wants the micro-batch table (see
    /// [`measure_micro_batches`](Self::measure_micro_batches)) for a start
    /// of `stages`: the table measured now and kept, and its row at the
    /// first batch's size, which is the unit profile of that batch (the
    /// table's largest size is the whole batch, timed as
    /// [`profile_units`] times it, with the same repeats): one profile of
    /// the batch, not two (on MiniLM the second cost seconds of the first
    /// epoch). `None` where no table is wanted or it could not be
    /// measured: the caller profiles the units itself.
    fn profile_with_micro_table<S, O>(
        &mut self,
        group: &ReplicaGroup<S, O>,
        config: &TrainerConfig,
        device: &Device<S::Backend>,
        input: &S::Input,
        stages: usize,
    ) -> Result<Option<Vec<UnitProfile>>, TrainerError>
    where
        S: StackTypes<Output: Differentiable<S::Backend>>,
        O: StackOptimizer<S>,
    {
        if !self.micro_pending || !self.rule.wants_micro_batch_times(stages) {
            return Ok(None);
        }
        let Some(table) = micro_batch_table(group, config, device, input)? else {
            return Ok(None);
        };
        let row = (table.sizes().last() == Some(&input.batch_size()))
            .then(|| table.profiles().last().cloned())
            .flatten();
        self.rule.set_micro_batch_times(Some(table));
        Ok(row)
    }

    /// Takes `times` (which must time every unit of `group`'s model) and
    /// chooses M for the group's shape at once; no measuring follows.
    pub(super) fn set_micro_batch_times<S: StackTypes, O: StackOptimizer<S>>(
        &mut self,
        times: MicroBatchTimes,
        group: &mut ReplicaGroup<S, O>,
    ) -> Result<Option<&MicroBatchChoice>, TrainerError> {
        let units = group.num_units();
        if times.units() != units {
            return Err(TrainerError::InvalidRunValue {
                what: "micro_batch_times",
                value: format!("a table of {} units", times.units()),
                accepted: "a table that times every unit of the model",
            });
        }
        self.rule.set_micro_batch_times(Some(times));
        self.micro_pending = false;
        self.apply_micro_batches(group)?;
        Ok(self.micro_batch_choice())
    }

    /// M for the group's shape, from the rule, set on the group and
    /// logged; asked at the first step and after every transition.
    pub(super) fn apply_micro_batches<S: StackTypes, O: StackOptimizer<S>>(
        &mut self,
        group: &mut ReplicaGroup<S, O>,
    ) -> Result<(), TrainerError> {
        let shape = shape_of(group);
        if shape.replicas == 0 {
            return Ok(());
        }
        let total = group.total_replicas();
        let chosen = self.rule.micro_batches(&shape, group.front(), total);
        group.set_micro_batches(Some(chosen.count))?;
        if let Some(choice) = chosen.choice() {
            tracing::info!(
                K = shape.stages(),
                R = shape.replicas,
                M = choice.micro_batches,
                predicted_ms = format!("{:.2}", choice.predicted_step_s * 1e3),
                paper_M = choice.paper_micro_batches,
                paper_predicted_ms = choice
                    .predicted(choice.paper_micro_batches)
                    .map(|s| format!("{:.2}", s * 1e3)),
                "micro-batches chosen from measured times"
            );
        }
        self.micro = Some(chosen);
        Ok(())
    }

    /// What a checkpoint keeps.
    pub(super) fn state(&self) -> MeasuredState {
        MeasuredState {
            costs: self.rule.costs().clone(),
            initial_largest: self.rule.initial_largest(),
            profile_pending: self.profile_pending,
            memory: Some(self.rule.memory().clone()),
            memory_pending: self.memory_pending,
            micro_batch_times: self.rule.micro_batch_times().cloned(),
        }
    }

    /// Takes a checkpoint's measurements (the micro-batch times too: then
    /// nothing is measured again, and every shape gets the M the run it
    /// continues would have chosen).
    pub(super) fn restore(&mut self, state: MeasuredState) {
        self.rule.set_costs(state.costs);
        self.rule.set_initial_largest(state.initial_largest);
        self.profile_pending = state.profile_pending;
        if let Some(memory) = state.memory {
            self.rule.set_memory(memory);
            self.memory_pending = state.memory_pending;
        }
        if let Some(times) = state.micro_batch_times {
            self.rule.set_micro_batch_times(Some(times));
        }
    }
}

/// The micro-batch table of `group`'s model, measured on `input` (a copy
/// of the model on `device`) at sizes up to the largest batch a replica
/// can get, the largest timed `repeats` times (the profiled costs' count,
/// else [`MICRO_BATCH_REPEATS`]) and the rest once
/// ([`profile_micro_batches`]); agreed across processes (every process
/// chooses from the slowest's). `None`, with a warning, where profiling
/// failed on any process: the paper's micro-batch count holds.
fn micro_batch_table<S, O>(
    group: &ReplicaGroup<S, O>,
    config: &TrainerConfig,
    device: &Device<S::Backend>,
    input: &S::Input,
) -> Result<Option<MicroBatchTimes>, TrainerError>
where
    S: StackTypes<Output: Differentiable<S::Backend>>,
    O: StackOptimizer<S>,
{
    let repeats = match config.costs {
        CostModel::Profiled { repeats } => repeats,
        CostModel::Parameters { .. } => MICRO_BATCH_REPEATS,
    };
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
    super::agree::micro_batch_times(group, measured)
}
