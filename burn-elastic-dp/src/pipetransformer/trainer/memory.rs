//! Memory-aware AutoPipe in the trainer: the per-device budget ([`MemoryConfig`]), the units'
//! memory (parameters, measured activations), the start that fits and the fit later shapes keep.

use burn::config::Config;
use burn_freeze::FreezePolicy;
use burn_pipe::UnitMemory;

use super::config::TrainerConfig;
use super::error::{TrainerError, invalid};
use crate::pipetransformer::shape::{MemoryFit, PipelineShape, starting_shape};
use burn_pipe::UnitCosts;

/// What one device may hold, for memory-aware AutoPipe.
///
/// With [`TrainerConfig::stages`] left at `None` the pipeline starts at
/// the fewest stages (a divisor of the device count) whose every stage
/// fits `device_bytes`: without a budget every model fits one device, so
/// the run starts as pure data parallelism (K = 1, R = devices). Each
/// stage's estimate counts its units' parameters, gradients and optimizer
/// state and the activations of the micro-batches the schedule keeps in
/// flight; a frozen unit counts its parameters only. With a budget,
/// activations are measured on the first batch when the process counts its heap
/// ([`burn_pipe::balance::HeapCounter`] installed as the global allocator: CPU
/// backends); elsewhere they count as 0, and the budget should leave room
/// for them. Burn 0.21's backends do not report a device's capacity, so
/// the budget is given here (`train --device-memory BYTES`); on a CPU,
/// logical devices share one heap, and the budget is how a run (or a test)
/// makes a model not fit one device.
///
/// ```
/// use burn_elastic_dp::{MemoryConfig, TrainerConfig};
///
/// let config = TrainerConfig::new().with_memory(MemoryConfig::new().with_device_bytes(Some(8 << 30)));
/// assert!(config.validate(4).is_ok());
/// ```
#[derive(Config, Debug, PartialEq)]
pub struct MemoryConfig {
    /// Bytes one device may hold for its stage (at least 1); `None`:
    /// unlimited.
    #[config(default = "None")]
    pub device_bytes: Option<u64>,
    /// The optimizer's state per parameter, in copies of the parameters
    /// (Adam: 2, SGD with momentum: 1, plain SGD: 0); in [0, 16]. What
    /// the freeze rule's evidence keeps (a weight snapshot, gradient sums)
    /// is counted on top ([`TrainerConfig::with_evidence`]).
    #[config(default = 2.0)]
    pub optimizer_slots: f64,
}

impl MemoryConfig {
    /// Checks the budget's values; the error names the field and its range.
    pub fn validate(&self) -> Result<(), TrainerError> {
        if self.device_bytes == Some(0) {
            return Err(invalid("memory.device_bytes", 0, "at least 1 byte"));
        }
        let slots = self.optimizer_slots;
        if !(slots.is_finite() && (0.0..=16.0).contains(&slots)) {
            return Err(invalid(
                "memory.optimizer_slots",
                slots,
                "[0, 16] copies of the parameters",
            ));
        }
        Ok(())
    }
}

impl TrainerConfig {
    /// What the freeze rule's evidence keeps beside the training units of
    /// `memory`, added to it: one copy of the parameters of every unit for
    /// the running gradient sums (the consistency signals, the paper's
    /// accumulated-gradient argmin), one of every unit from the first
    /// layer's on for the default rule's weight snapshot (update gains; the
    /// embedding below the layers is not measured). Memory-aware AutoPipe
    /// counts it with the optimizer's state.
    ///
    /// ```
    /// use burn_elastic_dp::{FreezeRule, LayerSpec, Parts, TrainerConfig};
    /// use burn_pipe::UnitMemory;
    ///
    /// let units = UnitMemory::new(vec![100; 4], vec![0; 4]);
    /// let blocks = LayerSpec::Uniform { offset: 1, per_layer: 1, layers: 2 };
    /// let default = TrainerConfig::new().with_layers(blocks);
    /// assert_eq!(default.with_evidence(&units).evidence, [0, 100, 100, 100]);
    /// let schedule = default.clone().with_freeze(FreezeRule::AlphaSchedule { alpha: 0.5 });
    /// assert!(schedule.with_evidence(&units).evidence.iter().all(|&b| b == 0));
    /// let no_freeze = default.with_parts(Parts::new().with_freeze(false));
    /// assert!(no_freeze.with_evidence(&units).evidence.iter().all(|&b| b == 0));
    /// ```
    pub fn with_evidence(&self, memory: &UnitMemory) -> UnitMemory {
        let memory = memory.clone().with_evidence(0, 0.0);
        if !self.parts.freeze {
            return memory;
        }
        let policy = self.policy(1);
        let memory = match policy.needs_gradient_sums() {
            true => memory.with_evidence(0, 1.0),
            false => memory,
        };
        match policy.needs_update_gains() {
            true => {
                let from = self.evidence_from(memory.len());
                memory.with_evidence(from, 1.0)
            }
            false => memory,
        }
    }

    /// The first unit whose update gains the default rule measures: the
    /// first layer's (0 when the map does not fit `units` units).
    pub(crate) fn evidence_from(&self, units: usize) -> usize {
        self.layer_map(units).map_or(0, |map| map.first_unit())
    }

    /// The memory fit the shape rule keeps, for units of `memory` (see
    /// [`MemoryFit::for_run`]).
    pub(super) fn memory_fit(&self, memory: &UnitMemory) -> Option<MemoryFit> {
        MemoryFit::for_run(
            self.stages,
            self.memory.device_bytes,
            self.memory.optimizer_slots,
            &self.with_evidence(memory),
            self.batch,
            self.replicas.pipeline.micro_batches,
            self.replicas.pipeline.schedule,
        )
    }

    /// Checks, before any work, that a stack whose units hold `unit_params`
    /// parameters of `element_bytes` bytes each has a start that fits the
    /// budget on `devices` devices (on parameters, gradients and optimizer
    /// state: activations are measured on the first batch, which checks
    /// again); returns that start, balanced on parameter counts.
    ///
    /// ```
    /// use burn_elastic_dp::{MemoryConfig, TrainerConfig, TrainerError};
    ///
    /// let config = TrainerConfig::new().with_memory(MemoryConfig::new().with_device_bytes(Some(1000)));
    /// // Each unit: 100 parameters of 4 bytes, with gradients and Adam 1600 bytes.
    /// let error = config.validate_memory(&[100; 8], 4, 4).unwrap_err();
    /// assert!(matches!(error, TrainerError::DoesNotFit { unit: 0, alone: true, .. }));
    /// let start = TrainerConfig::new().validate_memory(&[100; 8], 4, 4).unwrap();
    /// assert_eq!((start.stages(), start.replicas), (1, 4));
    /// ```
    pub fn validate_memory(
        &self,
        unit_params: &[usize],
        element_bytes: usize,
        devices: usize,
    ) -> Result<PipelineShape, TrainerError> {
        self.validate(devices)?;
        let memory = UnitMemory::from_param_counts(unit_params, element_bytes);
        let costs = UnitCosts::from_params(unit_params, 1.0 / 3.0);
        Ok(self.start_shape(&costs, &memory, devices)?.0)
    }

    /// The starting shape on `costs` over `devices` devices and its largest
    /// stage's cost: the configured `stages` (which must fit a budget when
    /// one is given), else the fewest stages that fit.
    pub(super) fn start_shape(
        &self,
        costs: &UnitCosts,
        memory: &UnitMemory,
        devices: usize,
    ) -> Result<(PipelineShape, f64), TrainerError> {
        let fit = self.memory_fit(memory);
        let fixed = self
            .stages
            .map(|stages| (stages, self.replicas_for(stages, stages, devices)));
        let (shape, largest) = starting_shape(costs, fixed, fit.as_ref(), devices)?;
        if let Some(fit) = &fit {
            let stages = fit.stage_memory(&shape.balance, 0, devices);
            tracing::info!(
                K = shape.stages(),
                estimated = ?stages.iter().map(|m| m.total()).collect::<Vec<_>>(),
                budget = fit.device_bytes,
                activations_known = memory.knows_activations(),
                "memory per stage (bytes)"
            );
        }
        Ok((shape, largest))
    }
}
