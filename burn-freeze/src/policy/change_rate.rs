//! The gradient-change rule of AutoFreeze (Liu et al. 2021), as carried by
//! PipeTransformer's released code, evaluated every N steps.

use burn::config::Config;
use serde::{Deserialize, Serialize};

use super::{FreezePolicy, FreezeState, GradNorm, PolicyState};
use crate::PolicyConfigError;

/// How the change rates and the threshold turn into a front.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ChangeRateReading {
    /// Liu et al.'s intent, the default: a layer whose gradient has stopped
    /// changing has converged, so freeze the longest prefix of active layers
    /// whose rate is strictly below the threshold.
    ConvergedPrefix,
    /// What PipeTransformer's released code does: freeze through the first
    /// active layer whose rate is at or above the threshold.
    ReleasedCode,
}

/// Settings of [`ChangeRate`].
#[derive(Config, Debug)]
pub struct ChangeRateConfig {
    /// Steps between evaluations.
    #[config(default = 100)]
    pub every_steps: usize,
    /// Percentile of the active layers' change rates used as threshold.
    #[config(default = 50.0)]
    pub percentile: f64,
    /// How rates and threshold become a front.
    #[config(default = "ChangeRateReading::ConvergedPrefix")]
    pub reading: ChangeRateReading,
}

impl ChangeRateConfig {
    /// Checks the values: `every_steps` at least 1, `percentile` in
    /// [0, 100]; the error names the field, the value and the range.
    ///
    /// ```
    /// use burn_freeze::ChangeRateConfig;
    ///
    /// assert!(ChangeRateConfig::new().validate().is_ok());
    /// let error = ChangeRateConfig::new().with_percentile(101.0).validate().unwrap_err();
    /// assert_eq!(error.to_string(), "percentile = 101 is not accepted: expected [0, 100]");
    /// ```
    pub fn validate(&self) -> Result<(), PolicyConfigError> {
        if self.every_steps == 0 {
            return Err(PolicyConfigError::new("every_steps", 0, "at least 1"));
        }
        if !(0.0..=100.0).contains(&self.percentile) {
            return Err(PolicyConfigError::new(
                "percentile",
                self.percentile,
                "[0, 100]",
            ));
        }
        Ok(())
    }
}

/// What [`ChangeRate`] keeps between evaluations, as its checkpoint stores
/// it. A sum that is not finite is stored as `None` and read back as 0.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
struct ChangeRateState {
    /// Per layer, the L1 norms summed since the last evaluation.
    current: Vec<Option<f64>>,
    /// Per layer, the sums at the last evaluation (`None` before the first).
    previous: Option<Vec<Option<f64>>>,
    /// Steps since the rule started.
    steps: usize,
}

/// The `p`-th percentile of `values` with linear interpolation between
/// closest ranks (NumPy's default); `None` for no values.
pub(crate) fn percentile(values: &[f64], p: f64) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let rank = (p / 100.0).clamp(0.0, 1.0) * (sorted.len() - 1) as f64;
    let (low, high) = (rank.floor() as usize, rank.ceil() as usize);
    Some(sorted[low] + (sorted[high] - sorted[low]) * (rank - low as f64))
}

/// The front picked from the change rates of the active layers
/// (`rates[i]` is layer `frozen + i`'s) with the given percentile threshold.
pub(crate) fn change_rate_front(
    frozen: usize,
    rates: &[f64],
    pct: f64,
    reading: ChangeRateReading,
) -> usize {
    let Some(threshold) = percentile(rates, pct) else {
        return frozen;
    };
    match reading {
        ChangeRateReading::ConvergedPrefix => {
            frozen + rates.iter().take_while(|&&rate| rate < threshold).count()
        }
        ChangeRateReading::ReleasedCode => match rates.iter().position(|&rate| rate >= threshold) {
            Some(i) => frozen + i + 1,
            None => frozen,
        },
    }
}

/// Evaluates every `every_steps` steps: per-layer gradient L1 norms are summed
/// between evaluations; the change rate of layer `l` is `|prev - cur| / prev`;
/// the threshold is a percentile of the active layers' rates (see
/// [`ChangeRateReading`] for how the front follows). The first evaluation
/// only records `prev`.
///
/// ```
/// use burn_freeze::{ChangeRate, ChangeRateConfig, FreezePolicy, FreezeState, GradNorm};
///
/// let mut rule = ChangeRate::new(ChangeRateConfig::new().with_every_steps(1)).unwrap();
/// let mut state = FreezeState { frozen_layers: 0, num_layers: 4, epoch: 0, step: 1 };
/// let norms = |v: [f64; 4]| v.map(|l1| Some(GradNorm { l1, l2: l1 })).to_vec();
/// assert_eq!(rule.after_step(state, &norms([1.0, 1.0, 1.0, 1.0])), None); // first: records only
/// state.step = 2;
/// // Rates 0.01, 0.02, 0.5, 0.4: median 0.21; layers 0 and 1 have settled.
/// assert_eq!(rule.after_step(state, &norms([0.99, 0.98, 0.5, 0.6])), Some(2));
/// ```
#[derive(Debug, Clone)]
pub struct ChangeRate {
    config: ChangeRateConfig,
    current: Vec<f64>,
    previous: Option<Vec<f64>>,
    steps: usize,
}

impl ChangeRate {
    /// The rule with `config`; an error naming the field when
    /// [`ChangeRateConfig::validate`] refuses a value (`every_steps` of 0,
    /// a percentile outside [0, 100]).
    ///
    /// ```
    /// use burn_freeze::{ChangeRate, ChangeRateConfig};
    ///
    /// let error = ChangeRate::new(ChangeRateConfig::new().with_every_steps(0)).unwrap_err();
    /// assert_eq!(error.field, "every_steps");
    /// ```
    pub fn new(config: ChangeRateConfig) -> Result<Self, PolicyConfigError> {
        config.validate()?;
        Ok(Self {
            config,
            current: Vec::new(),
            previous: None,
            steps: 0,
        })
    }
}

impl FreezePolicy for ChangeRate {
    fn after_step(&mut self, state: FreezeState, norms: &[Option<GradNorm>]) -> Option<usize> {
        if self.current.len() < norms.len() {
            self.current.resize(norms.len(), 0.0);
        }
        for (sum, norm) in self.current.iter_mut().zip(norms) {
            *sum += norm.map_or(0.0, |n| n.l1);
        }
        self.steps += 1;
        if !self.steps.is_multiple_of(self.config.every_steps) {
            return None;
        }
        let current = std::mem::take(&mut self.current);
        let previous = self.previous.replace(current.clone())?;
        let frozen = state.frozen_layers;
        // Rates of the active layers that have statistics at both evaluations,
        // stopping at the first that does not.
        let rates: Vec<f64> = (frozen..state.num_layers)
            .map_while(|l| {
                let (prev, cur) = (*previous.get(l)?, *current.get(l)?);
                (prev > 0.0).then(|| (prev - cur).abs() / prev)
            })
            .collect();
        let front = change_rate_front(frozen, &rates, self.config.percentile, self.config.reading);
        tracing::debug!(?rates, frozen, front, "ChangeRate evaluated");
        (front > frozen).then_some(front)
    }

    fn save_state(&self) -> Option<PolicyState> {
        let some = |v: &[f64]| v.iter().map(|x| x.is_finite().then_some(*x)).collect();
        PolicyState::typed(&ChangeRateState {
            current: some(&self.current),
            previous: self.previous.as_deref().map(some),
            steps: self.steps,
        })
    }

    fn load_state(&mut self, state: PolicyState) {
        let values = |v: Vec<Option<f64>>| v.into_iter().map(|x| x.unwrap_or(0.0)).collect();
        let saved = state.read::<ChangeRateState>().unwrap_or_else(|| {
            // A checkpoint written before typed states: `series[0]` the
            // current sums, `series[1]` the previous ones, `counter` the
            // steps.
            let mut series = state.series.into_iter();
            ChangeRateState {
                current: series.next().unwrap_or_default(),
                previous: series.next(),
                steps: state.counter,
            }
        });
        self.current = values(saved.current);
        self.previous = saved.previous.map(values);
        self.steps = saved.steps;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_settings_are_refused_not_panicked_on() {
        let every = ChangeRate::new(ChangeRateConfig::new().with_every_steps(0)).unwrap_err();
        assert_eq!(
            (every.field, every.value.as_str(), every.accepted),
            ("every_steps", "0", "at least 1")
        );
        for pct in [-1.0, 100.5, f64::NAN] {
            let error = ChangeRate::new(ChangeRateConfig::new().with_percentile(pct)).unwrap_err();
            assert_eq!(error.field, "percentile");
        }
        assert!(ChangeRate::new(ChangeRateConfig::new().with_percentile(100.0)).is_ok());
    }

    #[test]
    fn a_resumed_rule_decides_as_the_one_it_continues_typed_and_from_the_old_layout() {
        let config = || ChangeRateConfig::new().with_every_steps(2);
        let s = FreezeState {
            frozen_layers: 0,
            num_layers: 3,
            epoch: 0,
            step: 1,
        };
        let n = |v: [f64; 3]| v.map(|l1| Some(GradNorm { l1, l2: l1 })).to_vec();
        let mut a = ChangeRate::new(config()).unwrap();
        for _ in 0..3 {
            a.after_step(s, &n([1.0, 1.0, 1.0]));
        }
        let saved = a.save_state().unwrap();
        assert!(saved.series.is_empty() && saved.counter == 0);
        let mut b = ChangeRate::new(config()).unwrap();
        b.load_state(saved.clone());
        assert_eq!(b.save_state(), Some(saved));
        let old_layout = PolicyState {
            series: vec![vec![Some(1.0); 3], vec![Some(2.0); 3]],
            counter: 3,
            state: None,
        };
        let mut c = ChangeRate::new(config()).unwrap();
        c.load_state(old_layout);
        let last = n([1.0, 0.5, 0.1]);
        let (x, y, z) = (
            a.after_step(s, &last),
            b.after_step(s, &last),
            c.after_step(s, &last),
        );
        assert_eq!(x, Some(1));
        assert_eq!((x, x), (y, z));
    }

    #[test]
    fn percentile_interpolates_between_closest_ranks() {
        assert_eq!(percentile(&[3.0, 1.0, 2.0], 50.0), Some(2.0));
        assert_eq!(percentile(&[1.0, 2.0], 50.0), Some(1.5));
        assert_eq!(percentile(&[], 50.0), None);
    }

    /// The rates from the released code's log (12 layers, 5 frozen).
    #[test]
    fn change_rate_rule_on_the_released_logs_numbers() {
        let rates = [0.064, 0.045, 0.025, 0.021, 0.024, 0.027, 0.0245]; // layers 5..11
        let median = percentile(&rates, 50.0).unwrap();
        assert!((median - 0.025).abs() < 1e-12, "median {median}");
        // Threshold: the median, 0.025. Layer 5 still changes fast (6.4%), so
        // the converged-prefix reading freezes nothing more; the released
        // code's reading freezes through layer 5.
        assert_eq!(
            change_rate_front(5, &rates, 50.0, ChangeRateReading::ConvergedPrefix),
            5
        );
        assert_eq!(
            change_rate_front(5, &rates, 50.0, ChangeRateReading::ReleasedCode),
            6
        );
        // Where the front of the active layers has settled, the converged-prefix
        // reading freezes exactly that prefix.
        let settled = [0.001, 0.002, 0.03, 0.004, 0.05, 0.06, 0.07];
        assert_eq!(
            change_rate_front(5, &settled, 50.0, ChangeRateReading::ConvergedPrefix),
            7
        );
        assert_eq!(
            change_rate_front(5, &settled, 50.0, ChangeRateReading::ReleasedCode),
            8
        );
    }
}
