//! Memory-aware AutoPipe in the trainer: the per-device budget ([`MemoryConfig`]), the units'
//! memory (parameters, measured activations), the start that fits and the fit later shapes keep.

use burn::config::Config;
use burn_freeze::{Differentiable, LayerStack, StackTypes};
use burn_pipe::{HeapCounter, UnitMemory, measure_unit_memory};

use super::Trainer;
use super::bounds::{TrainerBackend, TrainerInput, TrainerOutput, TrainerTypes};
use super::config::TrainerConfig;
use super::error::{TrainerError, invalid};
use crate::pipetransformer::shape::{MemoryFit, Shape, starting_shape};
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
/// ([`burn_pipe::HeapCounter`] installed as the global allocator: CPU
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
/// assert!(config.check(4).is_ok());
/// ```
#[derive(Config, Debug, PartialEq)]
pub struct MemoryConfig {
    /// Bytes one device may hold for its stage (at least 1); `None`:
    /// unlimited.
    #[config(default = "None")]
    pub device_bytes: Option<u64>,
    /// The optimizer's state per parameter, in copies of the parameters
    /// (Adam: 2, SGD with momentum: 1, plain SGD: 0); in [0, 16]. The
    /// running gradient sums of [`FreezeRule::AlphaArgmin`](crate::FreezeRule)'s
    /// default statistic (the accumulated gradient) are one more copy of
    /// the active parameters, not counted here: add 1 for them (Adam: 3).
    #[config(default = 2.0)]
    pub optimizer_slots: f64,
}

impl MemoryConfig {
    /// Checks the budget's values; the error names the field and its range.
    pub fn check(&self) -> Result<(), TrainerError> {
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
    /// The memory fit the shape rule keeps, for units of `memory` (see
    /// [`MemoryFit::for_run`]).
    pub(super) fn memory_fit(&self, memory: &UnitMemory) -> Option<MemoryFit> {
        MemoryFit::for_run(
            self.stages,
            self.memory.device_bytes,
            self.memory.optimizer_slots,
            memory,
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
    /// let error = config.check_memory(&[100; 8], 4, 4).unwrap_err();
    /// assert!(matches!(error, TrainerError::DoesNotFit { unit: 0, alone: true, .. }));
    /// let start = TrainerConfig::new().check_memory(&[100; 8], 4, 4).unwrap();
    /// assert_eq!((start.stages(), start.replicas), (1, 4));
    /// ```
    pub fn check_memory(
        &self,
        unit_params: &[usize],
        element_bytes: usize,
        devices: usize,
    ) -> Result<Shape, TrainerError> {
        self.check(devices)?;
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
    ) -> Result<(Shape, f64), TrainerError> {
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

/// The units' memory before the first batch: parameter bytes only.
pub(super) fn starting_memory<S: StackTypes>(stack: &LayerStack<S>) -> UnitMemory {
    UnitMemory::from_param_counts(&stack.unit_params(), burn_pipe::float_bytes::<S::Backend>())
}

/// Whether the first batch should measure the units' activations: a
/// budget is given (without one every stage fits, and the measurement,
/// two forward passes with graphs held, would decide nothing), the shape
/// rule keeps a memory fit, and the heap is counted.
pub(super) fn measure_pending(config: &TrainerConfig, memory: &UnitMemory) -> bool {
    config.memory.device_bytes.is_some()
        && config.memory_fit(memory).is_some()
        && HeapCounter::installed()
}

impl<TT: TrainerTypes> Trainer<TT> {
    /// The units' memory figures: parameter bytes, and the activation bytes
    /// per sample measured on the first batch (0 until then, or where the
    /// heap is not counted).
    pub fn unit_memory(&self) -> &UnitMemory {
        &self.memory
    }

    /// The estimate of what each stage of the current shape holds (see
    /// [`UnitMemory::stages`]), at the current front.
    pub fn stage_memory(&self) -> Vec<burn_pipe::StageMemory> {
        let fit = self.memory_fit().unwrap_or_else(|| {
            let unlimited = MemoryConfig::new();
            MemoryFit::for_run(
                None,
                unlimited.device_bytes,
                unlimited.optimizer_slots,
                &self.memory,
                self.config.batch,
                self.config.replicas.pipeline.micro_batches,
                self.config.replicas.pipeline.schedule,
            )
            .expect("a fit without stages")
        });
        fit.stage_memory(
            &self.shape().balance,
            self.group.front(),
            self.devices.len(),
        )
    }

    /// The fit the shape rule keeps now (see [`TrainerConfig::memory_fit`]).
    pub(super) fn memory_fit(&self) -> Option<MemoryFit> {
        self.config.memory_fit(&self.memory)
    }

    /// Before the first step, where pending: the units' activations
    /// measured on `input`, then the starting shape decided again on them
    /// (and on the profiled costs) and the group moved to it.
    pub(super) fn measure_memory_if_pending(
        &mut self,
        input: &TrainerInput<TT>,
    ) -> Result<(), TrainerError>
    where
        TrainerOutput<TT>: Differentiable<TrainerBackend<TT>>,
    {
        if !self.memory_pending {
            return Ok(());
        }
        let stack = self.group.to_layer_stack()?;
        let measured = measure_unit_memory(&stack, input.clone(), &self.devices[0]);
        // Every process starts on the same figures: the largest measured.
        self.memory = super::agree::unit_memory(&self.group, measured)?;
        self.memory_pending = false;
        tracing::info!(activations = ?self.memory.activations, "activation bytes per sample measured");
        self.restart_shape()
    }

    /// The starting shape decided again (on new costs or memory figures),
    /// the group moved to it.
    pub(super) fn restart_shape(&mut self) -> Result<(), TrainerError> {
        let current = self.shape();
        let (shape, largest) =
            self.config
                .start_shape(&self.costs, &self.memory, self.devices.len())?;
        if self.move_to(&current, &shape)? {
            self.base_replicas = self.group.total_replicas();
        }
        self.initial_largest = largest;
        Ok(())
    }
}
