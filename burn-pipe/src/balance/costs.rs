//! What a unit costs: its measured times, its state in a run, and the one
//! cost rule of a frozen or cached unit.

use std::time::Duration;

use burn::serde::{Deserialize, Serialize};
use burn_freeze::{LayerStack, StackTypes};

/// Measured time of one unit for one batch.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(crate = "burn::serde")]
pub struct UnitProfile {
    /// Forward pass.
    pub forward: Duration,
    /// Backward pass (gradients of the unit's input and parameters).
    pub backward: Duration,
}

impl UnitProfile {
    /// Cost of the unit in seconds: forward plus backward while it trains,
    /// forward only once frozen, nothing once its output is cached (the rule
    /// of [`UnitCosts`], which holds it for every unit).
    ///
    /// ```
    /// use std::time::Duration;
    /// use burn_pipe::UnitProfile;
    ///
    /// let unit = UnitProfile { forward: Duration::from_millis(1), backward: Duration::from_millis(2) };
    /// assert_eq!(unit.cost(false, false), 0.003);
    /// assert_eq!(unit.cost(true, false), 0.001);
    /// assert_eq!(unit.cost(true, true), 0.0);
    /// ```
    pub fn cost(&self, frozen: bool, cached: bool) -> f64 {
        let state = match (frozen, cached) {
            (false, _) => UnitState::Training,
            (true, false) => UnitState::Frozen,
            (true, true) => UnitState::Cached,
        };
        UnitCosts::from_profile(std::slice::from_ref(self)).cost(0, state)
    }
}

/// Parameter count of each unit of `stack`, as costs.
pub fn unit_param_costs<S: StackTypes>(stack: &LayerStack<S>) -> Vec<f64> {
    stack.unit_params().into_iter().map(|n| n as f64).collect()
}

/// Where a unit stands in a run: training, frozen (its forward pass runs,
/// without a backward pass), or frozen and served by the activation cache
/// (it does not run at all).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnitState {
    /// Forward and backward.
    Training,
    /// Forward only.
    Frozen,
    /// Nothing: the cache serves its output.
    Cached,
}

impl UnitState {
    /// The state of unit `unit` with units `0..front` frozen, of which the
    /// first `cached` come from the cache (`cached` at most `front`).
    ///
    /// ```
    /// use burn_pipe::balance::UnitState;
    ///
    /// let states: Vec<_> = (0..4).map(|u| UnitState::of(u, 3, 1)).collect();
    /// assert_eq!(states, [UnitState::Cached, UnitState::Frozen, UnitState::Frozen, UnitState::Training]);
    /// ```
    pub fn of(unit: usize, front: usize, cached: usize) -> Self {
        if unit >= front {
            Self::Training
        } else if unit < cached {
            Self::Cached
        } else {
            Self::Frozen
        }
    }
}

/// Each unit's cost while it trains and once frozen: the one cost rule of a
/// frozen or cached unit (see [`UnitCosts::cost`]), which the partitioner,
/// the trainer's shape rule and the planner use.
///
/// ```
/// use burn_pipe::UnitCosts;
///
/// let costs = UnitCosts::scaled(&[3.0, 3.0, 3.0], 1.0 / 3.0);
/// assert_eq!(costs.at(2, false), vec![1.0, 1.0, 3.0]);
/// assert_eq!(costs.at(2, true), vec![0.0, 0.0, 3.0]);
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(crate = "burn::serde")]
pub struct UnitCosts {
    /// Forward and backward.
    pub active: Vec<f64>,
    /// Forward only.
    pub frozen: Vec<f64>,
}

impl UnitCosts {
    /// From parameter counts, a frozen unit costing `frozen_factor` of an
    /// active one (about 1/3 when cost is forward plus backward time; the
    /// paper discounts frozen layers' memory by 1/6).
    pub fn from_params(params: &[usize], frozen_factor: f64) -> Self {
        let active: Vec<f64> = params.iter().map(|&n| n as f64).collect();
        Self::scaled(&active, frozen_factor)
    }

    /// From active costs, a frozen unit costing `frozen_factor` of an
    /// active one.
    pub fn scaled(active: &[f64], frozen_factor: f64) -> Self {
        Self {
            active: active.to_vec(),
            frozen: active.iter().map(|c| c * frozen_factor).collect(),
        }
    }

    /// From measured times ([`profile_units`](crate::profile_units)): an
    /// active unit costs its forward plus backward seconds, a frozen one its
    /// forward seconds.
    pub fn from_profile(profile: &[UnitProfile]) -> Self {
        Self {
            active: profile
                .iter()
                .map(|p| (p.forward + p.backward).as_secs_f64())
                .collect(),
            frozen: profile.iter().map(|p| p.forward.as_secs_f64()).collect(),
        }
    }

    /// Units.
    pub fn len(&self) -> usize {
        self.active.len()
    }

    /// Whether there is no unit.
    pub fn is_empty(&self) -> bool {
        self.active.is_empty()
    }

    /// The cost of unit `unit` in `state`: its active cost while training,
    /// its frozen cost once frozen, nothing once cached.
    pub fn cost(&self, unit: usize, state: UnitState) -> f64 {
        match state {
            UnitState::Training => self.active[unit],
            UnitState::Frozen => self.frozen[unit],
            UnitState::Cached => 0.0,
        }
    }

    /// Per-unit costs with units `0..front` frozen, all of them served by
    /// the cache when `cached`; what AutoPipe balances.
    pub fn at(&self, front: usize, cached: bool) -> Vec<f64> {
        let cached = if cached { front } else { 0 };
        (0..self.len())
            .map(|u| self.cost(u, UnitState::of(u, front, cached)))
            .collect()
    }

    /// The work of one pass over every unit with units `0..front` frozen,
    /// the first `cached` of them served by the cache.
    pub fn work(&self, front: usize, cached: usize) -> f64 {
        // `0.0 +`: an empty f64 sum is -0.0.
        0.0 + (0..self.len())
            .map(|u| self.cost(u, UnitState::of(u, front, cached)))
            .sum::<f64>()
    }

    /// The ideal speed-up of a run whose epochs train with frozen units
    /// `fronts[T]` (non-decreasing) over training every unit every epoch:
    /// work alone, no bubble, all-reduce or transition. With `cache`, an
    /// epoch's cache holds what the epoch before froze (the first epoch at
    /// a new front still computes its newly frozen units, to fill it).
    ///
    /// ```
    /// use burn_pipe::UnitCosts;
    ///
    /// let costs = UnitCosts::scaled(&[3.0; 4], 1.0 / 3.0);
    /// // 12 + (1 + 1 + 6) + (0 + 0 + 6) without the cache's help at first.
    /// assert_eq!(costs.ideal_speedup(&[0, 2, 2], true), 36.0 / 26.0);
    /// assert_eq!(costs.ideal_speedup(&[0, 2, 2], false), 36.0 / 28.0);
    /// ```
    pub fn ideal_speedup(&self, fronts: &[usize], cache: bool) -> f64 {
        let full = self.work(0, 0) * fronts.len() as f64;
        let work: f64 = self
            .epoch_fronts(fronts, cache)
            .into_iter()
            .map(|(front, cached)| self.work(front, cached))
            .sum();
        full / work
    }

    /// Each epoch's `(front, cached)` for epochs that train with frozen
    /// units `fronts[T]` (at most every unit): with `cache`, the units the
    /// epoch before froze are served from the cache, the newly frozen ones
    /// still run (to fill it); without, none is cached.
    ///
    /// ```
    /// use burn_pipe::UnitCosts;
    ///
    /// let costs = UnitCosts::scaled(&[1.0; 4], 0.5);
    /// assert_eq!(costs.epoch_fronts(&[0, 2, 3, 9], true), vec![(0, 0), (2, 0), (3, 2), (4, 3)]);
    /// assert_eq!(costs.epoch_fronts(&[0, 2], false), vec![(0, 0), (2, 0)]);
    /// ```
    pub fn epoch_fronts(&self, fronts: &[usize], cache: bool) -> Vec<(usize, usize)> {
        let mut previous = 0;
        fronts
            .iter()
            .map(|&front| {
                let front = front.min(self.len());
                let cached = if cache { previous.min(front) } else { 0 };
                previous = front;
                (front, cached)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_cost_rule_for_frozen_and_cached_units() {
        use std::time::Duration;
        let profile: Vec<UnitProfile> = (1..=4)
            .map(|ms| UnitProfile {
                forward: Duration::from_millis(ms),
                backward: Duration::from_millis(2 * ms),
            })
            .collect();
        let costs = UnitCosts::from_profile(&profile);
        for front in 0..=4 {
            for cached in [false, true] {
                let per_unit: Vec<f64> = profile
                    .iter()
                    .enumerate()
                    .map(|(u, p)| p.cost(u < front, cached))
                    .collect();
                assert_eq!(costs.at(front, cached), per_unit);
                let sum = 0.0 + per_unit.iter().sum::<f64>();
                assert_eq!(costs.work(front, if cached { front } else { 0 }), sum);
            }
        }
        // A cache filled up to unit 1 of a front at 3: unit 0 costs nothing,
        // units 1 and 2 their forward pass.
        let work = costs.work(3, 1);
        assert!((work - (0.002 + 0.003 + 0.012)).abs() < 1e-12, "{work}");
    }
}
