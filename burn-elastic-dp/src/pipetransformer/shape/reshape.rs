//! After the freeze front moved: the pipeline's length and balance and the number of replicas.

use burn_pipe::UnitCosts;
use burn_pipe::balance::compress;

use super::form::{PipelineShape, balance_for};
use super::memory::{MemoryFit, modelled_step, stage_counts};

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

/// The shape after the front moved to `front`: AutoPipe halves the pipeline
/// while the exact partition of the freeze-aware costs into half as many
/// stages keeps its largest stage within `initial_largest` (the paper's
/// compression, with the exact partitioner), and rebalances; AutoDP then
/// runs `devices / K` replicas. A part that is off keeps its value.
///
/// The [`Trainer`](crate::Trainer) applies it at every transition, and the
/// planner ([`plan`](crate::pipetransformer::plan::plan)) calls it for every
/// epoch it predicts: one rule. Unit costs follow burn-pipe's one cost rule
/// ([`UnitCosts`]).
pub(crate) fn reshape(
    costs: &UnitCosts,
    front: usize,
    current: &PipelineShape,
    rules: &Reshaping,
) -> PipelineShape {
    let units = costs.active.len();
    let trainable = units - front.min(units);
    let balance = if let Some(fit) = rules
        .memory
        .as_ref()
        .filter(|_| rules.pipe && trainable > 0)
    {
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
    PipelineShape { balance, replicas }
}

/// Memory-aware AutoPipe after the front moved: the fewest stages (a
/// divisor of the devices, at most the current count) whose balance fits the
/// budget and whose modelled step is not slower than the current count's;
/// the current balance when nothing else fits.
fn fitting_reshape(
    costs: &UnitCosts,
    front: usize,
    current: &PipelineShape,
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
