//! The paper's rule: the alpha bound combined with the argmin of per-layer
//! gradient norms, once per epoch.

use burn::config::Config;

use super::{FreezePolicy, FreezeState, GradNorm, ceil_tolerant};

/// Settings of [`AlphaArgmin`].
#[derive(Config, Debug)]
pub struct AlphaArgminConfig {
    /// Most of the remaining layers frozen per epoch (paper: 1/3 conservative, 0.5 default).
    #[config(default = 0.5)]
    pub alpha: f64,
}

/// PipeTransformer's AutoFreeze rule, evaluated at the end of each epoch `T`:
///
/// `F_T = min(ceil(F + alpha * (L - F)), argmin_{l in [F, L)} ||g_l|| + 1)`
///
/// where `||g_l||` is layer `l`'s gradient L2 norm summed over the epoch's
/// steps. Reading chosen: the layer with the smallest norm is frozen itself
/// (`+ 1`: the front moves *through* it), since it is the most converged one,
/// and the alpha bound is rounded up like the closed form
/// ([`alpha_front`](crate::alpha_front)). An epoch without gradient
/// statistics keeps the front.
///
/// ```
/// use burn_freeze::{AlphaArgmin, AlphaArgminConfig, FreezePolicy, FreezeState, GradNorm};
///
/// let mut rule = AlphaArgmin::new(AlphaArgminConfig::new().with_alpha(1.0 / 3.0));
/// let state = FreezeState { frozen_layers: 0, num_layers: 12, epoch: 0, step: 0 };
/// // Layer 2 has the smallest gradient: freeze layers 0..=2 (within the bound of 4).
/// let norms: Vec<_> = (0..12).map(|l| Some(GradNorm { l1: 1.0, l2: if l == 2 { 0.1 } else { 1.0 } })).collect();
/// rule.after_step(state, &norms);
/// assert_eq!(rule.after_epoch(state), Some(3));
/// ```
#[derive(Debug, Clone)]
pub struct AlphaArgmin {
    alpha: f64,
    sums: Vec<Option<f64>>,
}

impl AlphaArgmin {
    /// The rule with `config`'s alpha.
    pub fn new(config: AlphaArgminConfig) -> Self {
        Self {
            alpha: config.alpha,
            sums: Vec::new(),
        }
    }

    /// The front the rule picks from `frozen` of `layers` layers and per-layer
    /// norms (`None` for layers without statistics).
    pub fn decide(&self, frozen: usize, layers: usize, norms: &[Option<f64>]) -> usize {
        let bound =
            ceil_tolerant(frozen as f64 + self.alpha * (layers - frozen) as f64).min(layers);
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

    fn after_epoch(&mut self, state: FreezeState) -> Option<usize> {
        let sums = std::mem::take(&mut self.sums);
        if sums.iter().all(Option::is_none) {
            tracing::warn!("AlphaArgmin: no gradient statistics this epoch; the front stays");
            return None;
        }
        Some(self.decide(state.frozen_layers, state.num_layers, &sums))
    }

    fn save_state(&self) -> Option<super::PolicyState> {
        Some(super::PolicyState {
            series: vec![self.sums.clone()],
            counter: 0,
        })
    }

    fn load_state(&mut self, state: super::PolicyState) {
        self.sums = state.series.into_iter().next().unwrap_or_default();
    }
}
