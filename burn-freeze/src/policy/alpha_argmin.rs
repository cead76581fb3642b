//! PipeTransformer's rule (the paper's): the alpha bound combined with the argmin of per-layer
//! gradient norms, once per epoch.

use burn::config::Config;

use serde::{Deserialize, Serialize};

use super::alpha::{alpha_most, check_alpha};
use super::{FreezePolicy, FreezeState, GradNorm, PolicyState};
use crate::PolicyConfigError;

/// Which per-layer gradient statistic [`AlphaArgmin`] takes the argmin of.
///
/// Both are read from the gradients the optimizer sees (after the
/// data-parallel all-reduce where there are replicas), with no extra
/// backward pass.
///
/// ```
/// use burn_freeze::{AlphaArgmin, AlphaArgminConfig, ArgminStatistic, FreezePolicy, FreezeState, GradNorm};
///
/// let state = FreezeState { frozen_layers: 0, num_layers: 3, epoch: 0, step: 0 };
/// let n = |l2: f64| Some(GradNorm { l1: l2, l2 });
/// // Layer 0's two step gradients have norm 1 each but point in opposite
/// // directions: their sum is 0. Layers 1 and 2 keep their direction.
/// let steps = [[n(1.0), n(0.4), n(0.8)], [n(1.0), n(0.4), n(0.8)]];
/// let accumulated = [n(0.0), n(0.8), n(1.6)];
///
/// let mut paper = AlphaArgmin::new(AlphaArgminConfig::new().with_alpha(1.0)).unwrap();
/// assert!(paper.needs_gradient_sums()); // the default: AccumulatedGradient
/// paper.epoch_gradient_sums(state, &accumulated);
/// assert_eq!(paper.after_epoch(state), Some(1)); // through layer 0
///
/// let mut summed = AlphaArgmin::new(
///     AlphaArgminConfig::new()
///         .with_alpha(1.0)
///         .with_statistic(ArgminStatistic::SummedStepNorms),
/// )
/// .unwrap();
/// for step in &steps {
///     summed.after_step(state, step);
/// }
/// assert_eq!(summed.after_epoch(state), Some(2)); // 2.0, 0.8, 1.6: through layer 1
/// ```
#[derive(Config, Debug, Copy, PartialEq, Eq)]
pub enum ArgminStatistic {
    /// The paper's code: per layer, the L2 norm of the epoch's accumulated
    /// gradient, `||sum_t g_{l,t}||`. Directions that cancel across steps
    /// (a converged layer oscillating around its optimum) give a small
    /// norm. The target keeps one running sum per trainable parameter
    /// ([`FreezeFront::set_gradient_sums`](crate::FreezeFront::set_gradient_sums)),
    /// reset at each epoch's end.
    AccumulatedGradient,
    /// Per layer, each step's L2 gradient norm summed over the epoch's
    /// steps, `sum_t ||g_{l,t}||`: no running sums, only one scalar per
    /// layer; it cannot see directions cancel.
    SummedStepNorms,
}

/// Settings of [`AlphaArgmin`].
#[derive(Config, Debug)]
pub struct AlphaArgminConfig {
    /// Most of the remaining layers frozen per epoch (paper: 1/3 conservative, 0.5 default).
    #[config(default = 0.5)]
    pub alpha: f64,
    /// The per-layer statistic of the argmin.
    #[config(default = "ArgminStatistic::AccumulatedGradient")]
    pub statistic: ArgminStatistic,
}

impl AlphaArgminConfig {
    /// Checks the values: alpha in (0, 1].
    ///
    /// ```
    /// use burn_freeze::AlphaArgminConfig;
    ///
    /// assert!(AlphaArgminConfig::new().validate().is_ok());
    /// let error = AlphaArgminConfig::new().with_alpha(0.0).validate().unwrap_err();
    /// assert_eq!((error.field, error.accepted), ("alpha", "a number in (0, 1]"));
    /// ```
    pub fn validate(&self) -> Result<(), PolicyConfigError> {
        check_alpha(self.alpha)
    }
}

/// What [`AlphaArgmin`] keeps between decisions, as its checkpoint stores it.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
struct AlphaArgminState {
    /// Per layer, the summed step norms of the epoch so far.
    sums: Vec<Option<f64>>,
}

/// PipeTransformer's AutoFreeze rule, evaluated at the end of each epoch `T`:
///
/// `F_T = min(ceil(F + alpha * (L - F)), argmin_{l in [F, L)} ||g_l|| + 1)`
///
/// where `||g_l||` is, by default, the L2 norm of layer `l`'s gradient
/// accumulated over the epoch's steps, `||sum_t g_{l,t}||`, as in the
/// paper's code ([`ArgminStatistic::AccumulatedGradient`]); the sum of each
/// step's norm, `sum_t ||g_{l,t}||`, is the other choice
/// ([`ArgminStatistic::SummedStepNorms`]). Reading chosen: the layer with
/// the smallest norm is frozen itself (`+ 1`: the front moves *through*
/// it), since it is the most converged one, and the alpha bound is rounded
/// up like the closed form ([`alpha_front`](crate::alpha_front)). An epoch
/// without gradient statistics keeps the front.
///
/// With the accumulated gradient the policy keeps no statistics of its own
/// between decisions ([`save_state`](FreezePolicy::save_state) gives `None`):
/// the sums are the target's, one per trainable parameter, and a checkpoint
/// does not store them, so a run resumed mid-epoch accumulates from the
/// resumed step on (its epoch's decision sees that part of the epoch). The
/// summed step norms are carried by the checkpoint and resume exactly.
///
/// ```
/// use burn_freeze::{AlphaArgmin, AlphaArgminConfig, FreezePolicy, FreezeState, GradNorm};
///
/// let mut rule = AlphaArgmin::new(AlphaArgminConfig::new().with_alpha(1.0 / 3.0)).unwrap();
/// let state = FreezeState { frozen_layers: 0, num_layers: 12, epoch: 0, step: 0 };
/// // Layer 2's accumulated gradient is the smallest: freeze layers 0..=2
/// // (within the bound of 4).
/// let norms: Vec<_> = (0..12).map(|l| Some(GradNorm { l1: 1.0, l2: if l == 2 { 0.1 } else { 1.0 } })).collect();
/// rule.epoch_gradient_sums(state, &norms);
/// assert_eq!(rule.after_epoch(state), Some(3));
/// ```
#[derive(Debug, Clone)]
pub struct AlphaArgmin {
    alpha: f64,
    statistic: ArgminStatistic,
    sums: Vec<Option<f64>>,
}

impl AlphaArgmin {
    /// The rule with `config`'s alpha and statistic; an error naming the
    /// field when [`AlphaArgminConfig::validate`] refuses a value.
    pub fn new(config: AlphaArgminConfig) -> Result<Self, PolicyConfigError> {
        config.validate()?;
        Ok(Self {
            alpha: config.alpha,
            statistic: config.statistic,
            sums: Vec::new(),
        })
    }

    /// The statistic the argmin is taken of.
    pub fn statistic(&self) -> ArgminStatistic {
        self.statistic
    }

    /// The front the rule picks from `frozen` of `layers` layers and per-layer
    /// norms (`None` for layers without statistics).
    pub fn decide(&self, frozen: usize, layers: usize, norms: &[Option<f64>]) -> usize {
        let bound = frozen + alpha_most(self.alpha, frozen, layers);
        let argmin = (frozen..layers)
            .filter_map(|l| norms.get(l).copied().flatten().map(|n| (l, n)))
            .min_by(|a, b| a.1.total_cmp(&b.1))
            .map(|(l, _)| l);
        match argmin {
            Some(l) => bound.min(l + 1).max(frozen),
            None => frozen,
        }
    }
}

impl FreezePolicy for AlphaArgmin {
    fn after_step(&mut self, _state: FreezeState, norms: &[Option<GradNorm>]) -> Option<usize> {
        if self.statistic != ArgminStatistic::SummedStepNorms {
            return None;
        }
        if self.sums.len() < norms.len() {
            self.sums.resize(norms.len(), None);
        }
        for (sum, norm) in self.sums.iter_mut().zip(norms) {
            if let Some(norm) = norm {
                *sum = Some(sum.unwrap_or(0.0) + norm.l2);
            }
        }
        None
    }

    fn needs_gradient_sums(&self) -> bool {
        self.statistic == ArgminStatistic::AccumulatedGradient
    }

    fn epoch_gradient_sums(&mut self, _state: FreezeState, norms: &[Option<GradNorm>]) {
        if self.statistic == ArgminStatistic::AccumulatedGradient {
            self.sums = norms.iter().map(|n| n.map(|n| n.l2)).collect();
        }
    }

    fn after_epoch(&mut self, state: FreezeState) -> Option<usize> {
        let sums = std::mem::take(&mut self.sums);
        if sums.iter().all(Option::is_none) {
            tracing::warn!("AlphaArgmin: no gradient statistics this epoch; the front stays");
            return None;
        }
        Some(self.decide(state.frozen_layers, state.num_layers, &sums))
    }

    fn save_state(&self) -> Option<PolicyState> {
        if self.statistic == ArgminStatistic::AccumulatedGradient {
            // The sums are the target's (per parameter); between decisions
            // the policy holds nothing.
            return None;
        }
        PolicyState::typed(&AlphaArgminState {
            sums: self.sums.clone(),
        })
    }

    fn load_state(&mut self, state: PolicyState) {
        if self.statistic == ArgminStatistic::AccumulatedGradient {
            return;
        }
        self.sums = match state.read::<AlphaArgminState>() {
            Some(saved) => saved.sums,
            // A checkpoint written before typed states: the sums were
            // `series[0]`.
            None => state.series.into_iter().next().unwrap_or_default(),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_alpha_is_refused_not_run() {
        for alpha in [0.0, 1.5, f64::NAN] {
            let error = AlphaArgmin::new(AlphaArgminConfig::new().with_alpha(alpha)).unwrap_err();
            assert_eq!(error.field, "alpha");
        }
    }

    #[test]
    fn the_summed_norms_survive_a_checkpoint_typed_and_in_the_old_layout() {
        let config = || AlphaArgminConfig::new().with_statistic(ArgminStatistic::SummedStepNorms);
        let mut a = AlphaArgmin::new(config()).unwrap();
        let s = FreezeState {
            frozen_layers: 0,
            num_layers: 3,
            epoch: 0,
            step: 1,
        };
        let n = |l2: f64| Some(GradNorm { l1: l2, l2 });
        a.after_step(s, &[n(1.0), n(0.2), n(0.5)]);
        let saved = a.save_state().unwrap();
        assert!(saved.series.is_empty() && saved.state.is_some());
        let mut b = AlphaArgmin::new(config()).unwrap();
        b.load_state(saved);
        assert_eq!(b.sums, a.sums);
        let mut old = AlphaArgmin::new(config()).unwrap();
        old.load_state(PolicyState {
            series: vec![a.sums.clone()],
            counter: 0,
            state: None,
        });
        assert_eq!(old.sums, a.sums);
        assert_eq!(a.after_epoch(s), b.after_epoch(s));
    }
}
