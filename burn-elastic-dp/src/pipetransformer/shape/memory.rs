//! Memory-aware AutoPipe's start: the fewest stages whose every stage fits the per-device budget.

use burn_pipe::balance::{MemoryQuery, StageMemory, largest_stage};
use burn_pipe::{Schedule, UnitCosts, UnitMemory, balance_exact, default_micro_batches};

use crate::sampler::BatchPolicy;

use super::form::PipelineShape;

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

/// The fewest stages (a divisor of
/// `devices`) whose every stage fits `fit`'s budget, balanced exactly on
/// the active costs (or, where that balance does not fit, on memory), with
/// `devices / K` replicas; and the largest stage's cost. Fails with the unit
/// that does not fit when no partition fits.
pub(super) fn fewest_fitting_stages(
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
