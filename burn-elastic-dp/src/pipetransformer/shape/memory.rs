//! Memory-aware AutoPipe's start: the fewest stages whose every stage fits the per-device budget.

use burn_pipe::balance::{MemoryQuery, StageMemory, largest_stage};
use burn_pipe::{Schedule, UnitCosts, UnitMemory, balance_exact, default_micro_batches};

use crate::sampler::BatchPolicy;

use super::form::{PipelineShape, initial_shape};

/// Memory-aware AutoPipe's budget, and what its estimate of a stage's
/// memory needs (see [`UnitMemory::stages`]).
#[derive(Debug, Clone, PartialEq)]
pub struct MemoryFit {
    /// Per-unit parameter and activation bytes.
    pub units: UnitMemory,
    /// Bytes one device may hold; `u64::MAX`: unlimited.
    pub device_bytes: u64,
    /// Samples per step (per replica follows from it).
    pub batch: BatchPolicy,
    /// Micro-batches per step; `None`: the paper's count for each K.
    pub micro_batches: Option<usize>,
    /// The pipeline's schedule.
    pub schedule: Schedule,
    /// Optimizer state per parameter, in copies of the parameters.
    pub optimizer_slots: f64,
}

/// No partition of the model fits the per-device budget.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NoFit {
    /// The unit that does not fit a device alone, or the first unit of the
    /// stage that needs the most at the longest pipeline the devices allow.
    pub unit: usize,
    /// Whether `unit` does not fit even alone.
    pub alone: bool,
    /// Bytes it (or its stage) needs.
    pub needed: u64,
    /// The budget.
    pub budget: u64,
    /// Stages tried at most.
    pub stages: usize,
}

/// A configured starting stage over the budget.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StageOver {
    /// The stage.
    pub stage: usize,
    /// Stages at the start.
    pub stages: usize,
    /// Bytes it needs.
    pub needed: u64,
    /// The budget.
    pub budget: u64,
}

/// Why no starting shape was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StartError {
    /// No partition over the devices fits.
    NoFit(NoFit),
    /// The configured start has a stage over the budget.
    StageOver(StageOver),
}

impl MemoryFit {
    /// The fit a run keeps (the trainer's and the planner's one rule): with
    /// a budget in `memory`, or with the start left to memory-aware AutoPipe
    /// (`stages` unset, then without a budget every model fits one device);
    /// `None`: the paper's rule (a fixed start, compression under the
    /// starting largest stage). `device_bytes` and `optimizer_slots` are
    /// the budget's (`MemoryConfig`'s fields).
    pub fn for_run(
        stages: Option<usize>,
        device_bytes: Option<u64>,
        optimizer_slots: f64,
        units: &UnitMemory,
        batch: BatchPolicy,
        micro_batches: Option<usize>,
        schedule: Schedule,
    ) -> Option<MemoryFit> {
        if stages.is_some() && device_bytes.is_none() {
            return None;
        }
        Some(MemoryFit {
            units: units.clone(),
            device_bytes: device_bytes.unwrap_or(u64::MAX),
            batch,
            micro_batches,
            schedule,
            optimizer_slots,
        })
    }

    /// Samples per replica and micro-batches of a pipeline of `stages`
    /// stages over `devices` devices (`devices / stages` replicas).
    fn per_replica(&self, stages: usize, devices: usize) -> (usize, usize) {
        let replicas = (devices / stages).max(1);
        let batch = self.batch.global_batch(replicas).div_ceil(replicas);
        let micro = self
            .micro_batches
            .unwrap_or_else(|| default_micro_batches(stages));
        (batch, micro)
    }

    /// What each stage of `balance` holds with units `0..front` frozen,
    /// over `devices` devices.
    pub fn stage_memory(
        &self,
        balance: &[usize],
        front: usize,
        devices: usize,
    ) -> Vec<StageMemory> {
        let (batch, micro_batches) = self.per_replica(balance.len(), devices);
        self.units.stages(&MemoryQuery {
            balance,
            front,
            batch,
            micro_batches,
            schedule: self.schedule,
            optimizer_slots: self.optimizer_slots,
        })
    }

    /// Whether every stage of `balance` fits the budget.
    pub fn fits(&self, balance: &[usize], front: usize, devices: usize) -> bool {
        self.stage_memory(balance, front, devices)
            .iter()
            .all(|stage| stage.total() <= self.device_bytes)
    }

    /// A balance of `stages` stages at `front` that fits: the time-balanced
    /// `balanced` when it does, else (when `rebalance`) the one balanced on
    /// memory.
    pub(super) fn fitting_balance(
        &self,
        balanced: Vec<usize>,
        front: usize,
        devices: usize,
        rebalance: bool,
    ) -> Option<Vec<usize>> {
        if self.fits(&balanced, front, devices) {
            return Some(balanced);
        }
        if !rebalance {
            return None;
        }
        let (batch, micro) = self.per_replica(balanced.len(), devices);
        let micro_samples = batch.div_ceil(micro.clamp(1, batch.max(1)));
        // Each unit's bytes with the most micro-batches a stage holds
        // (stage 0's); the exact partitioner then minimises the largest.
        let in_flight = match self.schedule {
            Schedule::GPipe if balanced.len() > 1 => micro,
            Schedule::GPipe => 1,
            Schedule::OneFOneB => balanced.len().min(micro),
        };
        let bytes: Vec<f64> = (0..self.units.len())
            .map(|u| {
                (self.units)
                    .unit(
                        u,
                        u < front,
                        micro_samples * in_flight,
                        self.optimizer_slots,
                    )
                    .total() as f64
            })
            .collect();
        let by_memory = balance_exact(&bytes, balanced.len());
        self.fits(&by_memory, front, devices).then_some(by_memory)
    }
}

/// The stage counts a pipeline over `devices` devices may have: the
/// divisors of `devices` (every device used: `devices / K` replicas) up to
/// `units`, fewest first.
pub fn stage_counts(devices: usize, units: usize) -> Vec<usize> {
    (1..=devices.min(units))
        .filter(|k| devices % k == 0)
        .collect()
}

/// Memory-aware AutoPipe's start: the fewest stages (a divisor of
/// `devices`) whose every stage fits `fit`'s budget, balanced exactly on
/// the active costs (or, where that balance does not fit, on memory), with
/// `devices / K` replicas; and the largest stage's cost. Fails with the unit
/// that does not fit when no partition fits.
///
/// ```
/// use burn_elastic_dp::shape::{MemoryFit, fitting_start};
/// use burn_pipe::UnitCosts;
/// use burn_elastic_dp::BatchPolicy;
/// use burn_pipe::{Schedule, UnitMemory};
///
/// let costs = UnitCosts::from_params(&[100; 8], 1.0 / 3.0);
/// let mut fit = MemoryFit {
///     units: UnitMemory::from_param_counts(&[100; 8], 4), // 400 bytes a unit
///     device_bytes: u64::MAX,
///     batch: BatchPolicy::FixedGlobal { batch: 32 },
///     micro_batches: None,
///     schedule: Schedule::OneFOneB,
///     optimizer_slots: 2.0, // parameters, gradients and Adam: 1600 bytes a unit
/// };
/// // Unlimited: one stage, four replicas.
/// assert_eq!(fitting_start(&costs, &fit, 4).unwrap().0.stages(), 1);
/// // A quarter of the model per device: four stages.
/// fit.device_bytes = 2 * 1600;
/// assert_eq!(fitting_start(&costs, &fit, 4).unwrap().0.balance, vec![2; 4]);
/// // Less than one unit: an error naming it.
/// fit.device_bytes = 1000;
/// assert_eq!(fitting_start(&costs, &fit, 4).unwrap_err().unit, 0);
/// ```
pub fn fitting_start(
    costs: &UnitCosts,
    fit: &MemoryFit,
    devices: usize,
) -> Result<(PipelineShape, f64), NoFit> {
    let counts = stage_counts(devices, costs.len());
    for &stages in &counts {
        let balanced = balance_exact(&costs.active, stages);
        if let Some(balance) = fit.fitting_balance(balanced, 0, devices, true) {
            let largest = largest_stage(&costs.active, &balance);
            let replicas = (devices / stages).max(1);
            return Ok((PipelineShape { balance, replicas }, largest));
        }
    }
    let longest = *counts.last().unwrap_or(&1);
    let (batch, micro) = fit.per_replica(longest, devices);
    let micro_samples = batch.div_ceil(micro.clamp(1, batch.max(1)));
    if let Some((unit, needed)) =
        fit.units
            .unit_over(fit.device_bytes, micro_samples, fit.optimizer_slots)
    {
        return Err(NoFit {
            unit,
            alone: true,
            needed,
            budget: fit.device_bytes,
            stages: longest,
        });
    }
    let balance = balance_exact(&costs.active, longest);
    let stages = fit.stage_memory(&balance, 0, devices);
    let (worst, needed) = stages
        .iter()
        .enumerate()
        .map(|(s, m)| (s, m.total()))
        .max_by_key(|&(_, bytes)| bytes)
        .unwrap_or((0, 0));
    let unit = balance[..worst].iter().sum();
    Err(NoFit {
        unit,
        alone: false,
        needed,
        budget: fit.device_bytes,
        stages: longest,
    })
}

/// The starting shape (the trainer's and the planner's one rule): `fixed`
/// (stages, replicas) balanced exactly on the active costs when given,
/// which must then fit `fit`'s budget; else memory-aware AutoPipe's
/// [`fitting_start`] under `fit`. Returns the shape and its largest stage's
/// cost.
pub fn starting_shape(
    costs: &UnitCosts,
    fixed: Option<(usize, usize)>,
    fit: Option<&MemoryFit>,
    devices: usize,
) -> Result<(PipelineShape, f64), StartError> {
    let (shape, largest) = match (fixed, fit) {
        (Some((stages, replicas)), _) => initial_shape(costs, stages, replicas),
        (None, Some(fit)) => fitting_start(costs, fit, devices).map_err(StartError::NoFit)?,
        (None, None) => initial_shape(costs, devices.min(costs.len()).max(1), 1),
    };
    if let Some(fit) = fit {
        let held = fit.stage_memory(&shape.balance, 0, devices);
        if let Some((stage, over)) = held
            .iter()
            .enumerate()
            .find(|(_, m)| m.total() > fit.device_bytes)
        {
            return Err(StartError::StageOver(StageOver {
                stage,
                stages: shape.stages(),
                needed: over.total(),
                budget: fit.device_bytes,
            }));
        }
    }
    Ok((shape, largest))
}

/// The modelled time of a step of `balance` on `stage_costs` over
/// `devices` devices: the largest stage per micro-batch, times the
/// micro-batches plus the pipeline's fill, for a replica's share.
pub(super) fn modelled_step(
    stage_costs: &[f64],
    balance: &[usize],
    fit: &MemoryFit,
    devices: usize,
) -> f64 {
    let (batch, micro) = fit.per_replica(balance.len(), devices);
    let micro = micro.clamp(1, batch.max(1)) as f64;
    let k = balance.len() as f64;
    largest_stage(stage_costs, balance) * batch as f64 * (micro + k - 1.0) / micro
}
