//! A pipeline's shape: its stages' balance and its replicas, and the paper's fixed start.

use burn_pipe::balance::largest_stage;
use burn_pipe::{UnitCosts, balance_exact};
use serde::{Deserialize, Serialize};

/// A pipeline shape: stages, units per stage, replicas.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PipelineShape {
    /// Units per stage (K = its length).
    pub balance: Vec<usize>,
    /// Data-parallel replicas (R).
    pub replicas: usize,
}

impl PipelineShape {
    /// K.
    pub fn stages(&self) -> usize {
        self.balance.len()
    }

    /// The same pipeline with `replicas` replicas.
    pub fn with_replicas(&self, replicas: usize) -> PipelineShape {
        PipelineShape {
            balance: self.balance.clone(),
            replicas,
        }
    }
}

/// The balance of `stages` stages for units whose first `front` are frozen.
/// With the cache on, frozen units cost nothing and go to stage 0 (the cache
/// serves them there), the active units split exactly; otherwise all units
/// split exactly at their freeze-aware costs.
pub(super) fn balance_for(
    costs: &UnitCosts,
    front: usize,
    stages: usize,
    cache: bool,
) -> Vec<usize> {
    if cache && front > 0 {
        let active = &costs.active[front..];
        let mut balance = balance_exact(active, stages.min(active.len()));
        balance[0] += front;
        balance
    } else {
        balance_exact(&costs.at(front, false), stages)
    }
}

/// `stages` stages balanced exactly on the active
/// costs, and its largest stage's cost.
pub(crate) fn balanced_shape(
    costs: &UnitCosts,
    stages: usize,
    replicas: usize,
) -> (PipelineShape, f64) {
    let balance = balance_exact(&costs.active, stages);
    let largest = largest_stage(&costs.active, &balance);
    (PipelineShape { balance, replicas }, largest)
}
