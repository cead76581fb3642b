//! The shape rule, AutoPipe's and AutoDP's decision: the starting
//! pipeline ([`initial_shape`], or memory-aware: [`fitting_start`], the
//! fewest stages whose every stage fits the per-device memory budget) and,
//! after the freeze front moved, the pipeline's length and balance and the
//! number of replicas ([`reshape`]).
//! The [`Trainer`](crate::Trainer) applies it at every transition, and the
//! planner ([`plan`](crate::pipetransformer::plan::plan)) calls it for every epoch it
//! predicts: one rule. Unit costs follow burn-pipe's one cost rule
//! ([`UnitCosts`]).

use burn_pipe::{
    MemoryQuery, Schedule, StageMemory, UnitCosts, UnitMemory, balance_exact, compress,
    default_micro_batches, largest_stage,
};
use serde::{Deserialize, Serialize};

use crate::sampler::BatchPolicy;

/// A pipeline shape: stages, units per stage, replicas.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shape {
    /// Units per stage (K = its length).
    pub balance: Vec<usize>,
    /// Data-parallel replicas (R).
    pub replicas: usize,
}

impl Shape {
    /// K.
    pub fn stages(&self) -> usize {
        self.balance.len()
    }

    /// The same pipeline with `replicas` replicas.
    pub fn with_replicas(&self, replicas: usize) -> Shape {
        Shape {
            balance: self.balance.clone(),
            replicas,
        }
    }
}

/// What AutoPipe and AutoDP may do.
#[derive(Debug, Clone, PartialEq)]
pub struct Reshaping {
    /// AutoPipe runs.
    pub pipe: bool,
    /// AutoDP runs.
    pub dp: bool,
    /// Frozen outputs are cached: frozen units cost nothing, and all sit on
    /// stage 0 where the cache serves them.
    pub cache: bool,
    /// Devices in all.
    pub devices: usize,
    /// The largest stage's cost before anything froze: a stage may not
    /// grow beyond it (the memory bound of the paper's compression; used
    /// when `memory` is `None`).
    pub initial_largest: f64,
    /// Memory-aware AutoPipe: after the front moves the pipeline falls to
    /// the fewest stages (dividing the devices) whose every stage fits the
    /// budget and whose modelled step is not slower; `None`: the paper's
    /// compression under `initial_largest`.
    pub memory: Option<MemoryFit>,
}

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
    fn fitting_balance(
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
) -> Result<(Shape, f64), NoFit> {
    let counts = stage_counts(devices, costs.len());
    for &stages in &counts {
        let balanced = balance_exact(&costs.active, stages);
        if let Some(balance) = fit.fitting_balance(balanced, 0, devices, true) {
            let largest = largest_stage(&costs.active, &balance);
            let replicas = (devices / stages).max(1);
            return Ok((Shape { balance, replicas }, largest));
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
) -> Result<(Shape, f64), StartError> {
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
fn modelled_step(stage_costs: &[f64], balance: &[usize], fit: &MemoryFit, devices: usize) -> f64 {
    let (batch, micro) = fit.per_replica(balance.len(), devices);
    let micro = micro.clamp(1, batch.max(1)) as f64;
    let k = balance.len() as f64;
    largest_stage(stage_costs, balance) * batch as f64 * (micro + k - 1.0) / micro
}

impl Reshaping {
    /// What AutoPipe (`pipe`) and AutoDP (`dp`) may do, AutoCache (`cache`)
    /// serving the frozen prefix or not, on `devices` devices, the largest
    /// stage at the start costing `initial_largest`.
    pub fn new(pipe: bool, dp: bool, cache: bool, devices: usize, initial_largest: f64) -> Self {
        Self {
            pipe,
            dp,
            cache,
            devices,
            initial_largest,
            memory: None,
        }
    }

    /// The same, memory-aware (see [`Reshaping::memory`]).
    pub fn with_memory(self, memory: Option<MemoryFit>) -> Self {
        Self { memory, ..self }
    }
}

/// The balance of `stages` stages for units whose first `front` are frozen.
/// With the cache on, frozen units cost nothing and go to stage 0 (the cache
/// serves them there), the active units split exactly; otherwise all units
/// split exactly at their freeze-aware costs.
fn balance_for(costs: &UnitCosts, front: usize, stages: usize, cache: bool) -> Vec<usize> {
    if cache && front > 0 {
        let active = &costs.active[front..];
        let mut balance = balance_exact(active, stages.min(active.len()));
        balance[0] += front;
        balance
    } else {
        balance_exact(&costs.at(front, false), stages)
    }
}

/// The starting shape: `stages` stages balanced exactly on the active
/// costs, and its largest stage's cost.
pub fn initial_shape(costs: &UnitCosts, stages: usize, replicas: usize) -> (Shape, f64) {
    let balance = balance_exact(&costs.active, stages);
    let largest = largest_stage(&costs.active, &balance);
    (Shape { balance, replicas }, largest)
}

/// The shape after the front moved to `front`: AutoPipe halves the pipeline
/// while the exact partition of the freeze-aware costs into half as many
/// stages keeps its largest stage within `initial_largest` (the paper's
/// compression, with the exact partitioner), and rebalances; AutoDP then
/// runs `devices / K` replicas. A part that is off keeps its value.
///
/// ```
/// use burn_elastic_dp::shape::{Reshaping, Shape, initial_shape, reshape};
/// use burn_pipe::UnitCosts;
///
/// let costs = UnitCosts::from_params(&[1; 8], 1.0 / 3.0);
/// let (start, largest) = initial_shape(&costs, 4, 1);
/// let rules = Reshaping { pipe: true, dp: true, cache: true, devices: 4, initial_largest: largest, memory: None };
/// // Half the units frozen and cached: 2 stages do what 4 did, on 2 replicas.
/// let next = reshape(&costs, 4, &start, &rules);
/// assert_eq!(next, Shape { balance: vec![6, 2], replicas: 2 });
/// ```
pub fn reshape(costs: &UnitCosts, front: usize, current: &Shape, rules: &Reshaping) -> Shape {
    let units = costs.active.len();
    let trainable = units - front.min(units);
    let balance = if rules.pipe && trainable > 0 && rules.memory.is_some() {
        let fit = rules.memory.as_ref().expect("checked");
        fitting_reshape(costs, front, current, rules, fit)
    } else if rules.pipe && trainable > 0 {
        let stages = current.stages();
        let stages = if rules.cache && front > 0 {
            compress(
                &costs.active[front..],
                stages.min(trainable),
                rules.initial_largest,
            )
        } else {
            compress(&costs.at(front, false), stages, rules.initial_largest)
        };
        balance_for(costs, front, stages, rules.cache)
    } else {
        current.balance.clone()
    };
    let replicas = if rules.dp {
        (rules.devices / balance.len()).max(1)
    } else {
        current.replicas
    };
    Shape { balance, replicas }
}

/// Memory-aware AutoPipe after the front moved: the fewest stages (a
/// divisor of the devices, at most the current count) whose balance fits the
/// budget and whose modelled step is not slower than the current count's;
/// the current balance when nothing else fits.
fn fitting_reshape(
    costs: &UnitCosts,
    front: usize,
    current: &Shape,
    rules: &Reshaping,
    fit: &MemoryFit,
) -> Vec<usize> {
    let units = costs.len();
    let trainable = units - front.min(units);
    let stage_costs = costs.at(front, rules.cache && front > 0);
    let most = if rules.cache && front > 0 {
        trainable
    } else {
        units
    };
    // With the cache every frozen unit stays on stage 0, where the cache
    // serves them: no balance on memory that would move them.
    let rebalance = !(rules.cache && front > 0);
    let balance_of = |stages: usize| {
        let balanced = balance_for(costs, front, stages, rules.cache);
        fit.fitting_balance(balanced, front, rules.devices, rebalance)
    };
    let stay = balance_of(current.stages().min(most)).unwrap_or_else(|| current.balance.clone());
    let stay_time = modelled_step(&stage_costs, &stay, fit, rules.devices);
    stage_counts(rules.devices, most)
        .into_iter()
        .filter(|&k| k < stay.len())
        .filter_map(balance_of)
        .find(|balance| modelled_step(&stage_costs, balance, fit, rules.devices) <= stay_time)
        .unwrap_or(stay)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(pipe: bool, dp: bool, cache: bool, initial_largest: f64) -> Reshaping {
        Reshaping {
            pipe,
            dp,
            cache,
            devices: 8,
            initial_largest,
            memory: None,
        }
    }

    #[test]
    fn the_pipeline_shortens_and_replicas_grow_as_the_front_moves() {
        let costs = UnitCosts::from_params(&[1; 16], 1.0 / 3.0);
        let (mut shape, largest) = initial_shape(&costs, 8, 1);
        assert_eq!(shape.balance, vec![2; 8]);
        let mut seen = Vec::new();
        for front in [0, 8, 12, 14, 15] {
            shape = reshape(&costs, front, &shape, &rules(true, true, true, largest));
            assert_eq!(shape.balance.iter().sum::<usize>(), 16);
            assert!(largest_stage(&costs.at(front, true), &shape.balance) <= largest);
            seen.push((shape.stages(), shape.replicas));
        }
        assert_eq!(seen, vec![(8, 1), (4, 2), (2, 4), (1, 8), (1, 8)]);
    }

    #[test]
    fn frozen_units_sit_on_stage_zero_when_cached() {
        let costs = UnitCosts::from_params(&[3, 1, 1, 1, 1, 1, 1, 3], 0.5);
        let (shape, largest) = initial_shape(&costs, 4, 1);
        let next = reshape(&costs, 3, &shape, &rules(true, true, true, largest));
        let mut start = 0;
        for (stage, &n) in next.balance.iter().enumerate() {
            if stage > 0 {
                assert!(start >= 3, "a frozen unit on stage {stage}");
            }
            start += n;
        }
    }

    #[test]
    fn a_part_that_is_off_keeps_its_value() {
        let costs = UnitCosts::from_params(&[1; 8], 1.0 / 3.0);
        let (shape, largest) = initial_shape(&costs, 4, 1);
        let no_pipe = reshape(&costs, 6, &shape, &rules(false, true, true, largest));
        assert_eq!(no_pipe.balance, shape.balance);
        assert_eq!(no_pipe.replicas, 2); // 8 devices, 4 stages
        let no_dp = reshape(&costs, 6, &shape, &rules(true, false, true, largest));
        assert_eq!(no_dp.replicas, 1);
        assert!(no_dp.stages() < 4);
        // Without the cache frozen units still cost their forward pass.
        let uncached = reshape(&costs, 4, &shape, &rules(true, true, false, largest));
        let cached = reshape(&costs, 4, &shape, &rules(true, true, true, largest));
        assert!(uncached.stages() >= cached.stages());
    }

    #[test]
    fn every_unit_frozen_keeps_the_shape() {
        let costs = UnitCosts::from_params(&[1; 4], 1.0 / 3.0);
        let (shape, largest) = initial_shape(&costs, 2, 1);
        let next = reshape(&costs, 4, &shape, &rules(true, false, true, largest));
        assert_eq!(next, shape);
    }
}
