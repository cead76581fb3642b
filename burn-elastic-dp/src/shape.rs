//! The shape rule, AutoPipe's and AutoDP's decision: the starting
//! pipeline ([`initial_shape`]) and, after the freeze front moved, the
//! pipeline's length and balance and the number of replicas ([`reshape`]).
//! The [`Trainer`](crate::Trainer) applies it at every transition, and the
//! planner ([`plan`](crate::plan::plan)) calls it for every epoch it
//! predicts: one rule. Unit costs follow burn-pipe's one cost rule
//! ([`UnitCosts`]).

pub use burn_pipe::UnitCosts;
use burn_pipe::{balance_exact, compress, largest_stage};
use serde::{Deserialize, Serialize};

use crate::trainer::Parts;

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
#[derive(Debug, Clone, Copy, PartialEq)]
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
    /// grow beyond it (the memory bound of the paper's compression).
    pub initial_largest: f64,
}

impl Reshaping {
    /// What AutoPipe and AutoDP may do when `parts` run on `devices`
    /// devices, the largest stage at the start costing `initial_largest`.
    pub fn for_parts(parts: Parts, devices: usize, initial_largest: f64) -> Self {
        Self {
            pipe: parts.pipe,
            dp: parts.dp,
            cache: parts.cache,
            devices,
            initial_largest,
        }
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
/// use burn_elastic_dp::shape::{Reshaping, Shape, UnitCosts, initial_shape, reshape};
///
/// let costs = UnitCosts::from_params(&[1; 8], 1.0 / 3.0);
/// let (start, largest) = initial_shape(&costs, 4, 1);
/// let rules = Reshaping { pipe: true, dp: true, cache: true, devices: 4, initial_largest: largest };
/// // Half the units frozen and cached: 2 stages do what 4 did, on 2 replicas.
/// let next = reshape(&costs, 4, &start, &rules);
/// assert_eq!(next, Shape { balance: vec![6, 2], replicas: 2 });
/// ```
pub fn reshape(costs: &UnitCosts, front: usize, current: &Shape, rules: &Reshaping) -> Shape {
    let units = costs.active.len();
    let trainable = units - front.min(units);
    let balance = if rules.pipe && trainable > 0 {
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
