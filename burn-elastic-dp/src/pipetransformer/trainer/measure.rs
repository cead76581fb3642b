//! What the trainer measures of the model and decides shapes from: the units' costs (parameter
//! counts, or times profiled on the first batch), their memory (parameters, activations
//! measured on the first batch) and the micro-batch rule.

use burn::prelude::*;
use burn_freeze::{Differentiable, LayerStack, StackOptimizer, StackTypes};
use burn_pipe::balance::{HeapCounter, StageMemory, measure_unit_memory};
use burn_pipe::{UnitCosts, UnitMemory, profile_units};
use serde::{Deserialize, Serialize};

use super::config::TrainerConfig;
use super::error::TrainerError;
use super::memory::MemoryConfig;
use super::micro::MicroBatchRule;
use super::rules::CostModel;
use super::transition::shape_of;
use crate::group::ReplicaGroup;
use crate::pipetransformer::shape::{MemoryFit, PipelineShape, reshape};

/// The measurements a run's shapes are decided on.
pub(super) struct Measurements {
    costs: UnitCosts,
    /// Whether the costs still wait for the first batch's profile.
    profile_pending: bool,
    /// The units' memory: parameters, and activations once measured.
    memory: UnitMemory,
    /// Whether the activations still wait for the first batch.
    memory_pending: bool,
    /// The largest stage's cost at the start: no later stage exceeds it.
    initial_largest: f64,
    /// The micro-batch count's times and choice.
    pub(super) micro: MicroBatchRule,
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
}

impl Measurements {
    /// Before the first batch: parameter counts as costs and as memory,
    /// and what the first batch is to measure under `config`.
    pub(super) fn start<S: StackTypes>(stack: &LayerStack<S>, config: &TrainerConfig) -> Self {
        let params = stack.unit_params();
        // Parameter counts until the first batch is profiled.
        let (frozen_factor, profile_pending) = match config.costs {
            CostModel::Parameters { frozen_factor } => (frozen_factor, false),
            CostModel::Profiled { .. } => (1.0 / 3.0, true),
        };
        let memory =
            UnitMemory::from_param_counts(&params, burn_pipe::balance::float_bytes::<S::Backend>());
        // Activations are measured only where they can decide something: a
        // budget is given, the shape rule keeps a memory fit, the heap is
        // counted.
        let memory_pending = config.memory.device_bytes.is_some()
            && config.memory_fit(&memory).is_some()
            && HeapCounter::installed();
        Self {
            costs: UnitCosts::from_params(&params, frozen_factor),
            profile_pending,
            memory,
            memory_pending,
            initial_largest: 0.0,
            micro: MicroBatchRule::default(),
        }
    }

    /// AutoPipe's unit costs.
    pub(super) fn costs(&self) -> &UnitCosts {
        &self.costs
    }

    /// The units' memory figures.
    pub(super) fn memory(&self) -> &UnitMemory {
        &self.memory
    }

    /// The starting shape on what is known over `devices` devices (see
    /// [`TrainerConfig::start_shape`]); its largest stage's cost becomes
    /// the bound later shapes keep.
    pub(super) fn start_shape(
        &mut self,
        config: &TrainerConfig,
        devices: usize,
    ) -> Result<PipelineShape, TrainerError> {
        let (shape, largest) = config.start_shape(&self.costs, &self.memory, devices)?;
        self.initial_largest = largest;
        Ok(shape)
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
            let measured = measure_unit_memory(&group.to_layer_stack()?, input.clone(), device);
            // Every process starts on the same figures: the largest measured.
            self.memory = super::agree::unit_memory(group, measured)?;
            self.memory_pending = false;
            changed = true;
            tracing::info!(activations = ?self.memory.activations, "activation bytes per sample measured");
        }
        if let CostModel::Profiled { repeats } = config.costs
            && self.profile_pending
        {
            self.profile_pending = false;
            let stages = match changed {
                true => {
                    config
                        .start_shape(&self.costs, &self.memory, devices.len())?
                        .0
                }
                false => shape_of(group),
            };
            if stages.stages() == 1 {
                tracing::info!("one stage throughout: unit costs not profiled");
            } else {
                let profile =
                    profile_units(&group.to_layer_stack()?, input.clone(), device, repeats);
                // Every process balances on the same times: the slowest's.
                let profile = super::agree::unit_profiles(group, profile)?;
                self.costs = UnitCosts::from_profile(&profile);
                changed = true;
                tracing::info!("unit costs profiled; the pipeline is balanced on them");
            }
        }
        Ok(changed)
    }

    /// The shape for the front `front`, reached from `front_before` with
    /// the group in `before`, over `devices` devices. Up (or staying), the
    /// shape rule compresses from `before`, no stage costlier than at the
    /// start (the paper's rule) or, with a budget, every stage within it
    /// (memory-aware AutoPipe). Down (a thaw), it cannot lengthen a
    /// pipeline, so the shape is derived from the start: the start shape
    /// (front 0), then the shape rule to `front`, so that AutoPipe
    /// lengthens the pipeline when the memory budget (or the paper's bound)
    /// needs it and AutoDP runs fewer replicas.
    pub(super) fn shape_after(
        &self,
        config: &TrainerConfig,
        devices: usize,
        (front_before, front): (usize, usize),
        before: &PipelineShape,
    ) -> Result<PipelineShape, TrainerError> {
        let start = if front < front_before {
            let (start, _) = config.start_shape(&self.costs, &self.memory, devices)?;
            if front == 0 {
                return Ok(start);
            }
            Some(start)
        } else {
            None
        };
        let rules = (config.parts)
            .reshaping(devices, self.initial_largest)
            .with_memory(config.memory_fit(&self.memory));
        Ok(reshape(
            &self.costs,
            front,
            start.as_ref().unwrap_or(before),
            &rules,
        ))
    }

    /// The estimate of what each stage of `balance` holds at `front` over
    /// `devices` devices (see [`UnitMemory::stages`]).
    pub(super) fn stage_memory(
        &self,
        config: &TrainerConfig,
        balance: &[usize],
        front: usize,
        devices: usize,
    ) -> Vec<StageMemory> {
        let fit = config.memory_fit(&self.memory).or_else(|| {
            let unlimited = MemoryConfig::new();
            MemoryFit::for_run(
                None,
                unlimited.device_bytes,
                unlimited.optimizer_slots,
                &self.memory,
                config.batch,
                config.replicas.pipeline.micro_batches,
                config.replicas.pipeline.schedule,
            )
        });
        match fit {
            Some(fit) => fit.stage_memory(balance, front, devices),
            None => Vec::new(),
        }
    }

    /// What a checkpoint keeps.
    pub(super) fn state(&self) -> MeasuredState {
        MeasuredState {
            costs: self.costs.clone(),
            initial_largest: self.initial_largest,
            profile_pending: self.profile_pending,
            memory: Some(self.memory.clone()),
            memory_pending: self.memory_pending,
        }
    }

    /// Takes a checkpoint's measurements.
    pub(super) fn restore(&mut self, state: MeasuredState) {
        self.costs = state.costs;
        self.initial_largest = state.initial_largest;
        self.profile_pending = state.profile_pending;
        if let Some(memory) = state.memory {
            self.memory = memory;
            self.memory_pending = state.memory_pending;
        }
    }
}
