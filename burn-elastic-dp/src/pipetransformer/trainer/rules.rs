//! The run's rules: which parts run, the freeze rule, the layer map and the cost model, each
//! checking its own values.

use burn::config::Config;
use burn_freeze::{
    AlphaArgminConfig, ArgminStatistic, ChangeRateConfig, EvidenceConfig, FixedSchedule,
    PolicyConfigError,
};

use super::error::{TrainerError, invalid};

/// Which of PipeTransformer's four parts run; every combination is valid
/// (the paper's ablations). With `freeze` off nothing freezes, so the other
/// three have nothing to act on and the run is pipeline (+ data-parallel)
/// training of a fixed shape.
#[derive(Config, Debug, Copy, PartialEq, Eq)]
pub struct Parts {
    /// AutoFreeze: the freeze policy moves the front.
    #[config(default = true)]
    pub freeze: bool,
    /// AutoPipe: after the front moves, re-plan the active units into the
    /// fewest stages whose largest is no larger than at the start.
    #[config(default = true)]
    pub pipe: bool,
    /// AutoDP: run as many pipeline replicas as the devices hold
    /// (`devices / stages`), growing as AutoPipe shortens the pipeline.
    /// Off, the replicas stay at the start's count, `devices / K` at the
    /// starting K (one for the paper's start, K = devices; D / K for a
    /// memory-aware start of K stages), as the freed devices idle.
    #[config(default = true)]
    pub dp: bool,
    /// AutoCache: serve the frozen prefix's outputs from a per-sample cache.
    #[config(default = true)]
    pub cache: bool,
}

impl Parts {
    /// Whether AutoCache serves anything: it caches the frozen prefix, so
    /// only when AutoFreeze runs too.
    ///
    /// ```
    /// use burn_elastic_dp::Parts;
    ///
    /// assert!(Parts::new().caches());
    /// assert!(!Parts::new().with_freeze(false).caches());
    /// ```
    pub fn caches(self) -> bool {
        self.cache && self.freeze
    }
}

/// The freeze policy, in layers (see [`LayerSpec`]): which of burn-freeze's
/// policies (implementations of its [`FreezePolicy`](burn_freeze::FreezePolicy) trait) the trainer
/// runs, and with what values; the configuration names a rule, the trainer
/// makes the policy from it.
#[derive(Config, Debug, PartialEq)]
pub enum FreezeRule {
    /// The paper's alpha closed form, once per epoch: `ceil(L (1 - (1 -
    /// alpha)^T))` layers frozen in epoch `T` (gradient-free).
    AlphaSchedule {
        /// In (0, 1]: the share of the remaining layers frozen per epoch.
        alpha: f64,
    },
    /// The paper's AutoFreeze, once per epoch: the alpha bound combined with
    /// the argmin of the epoch's per-layer gradient norms (burn-freeze's
    /// [`AlphaArgmin`](burn_freeze::AlphaArgmin)).
    ///
    /// ```
    /// use burn_elastic_dp::{FreezeRule, TrainerConfig};
    /// use burn_freeze::{ArgminStatistic, EvidenceConfig};
    ///
    /// // The paper's code: the norm of each layer's epoch-accumulated gradient.
    /// let paper = FreezeRule::AlphaArgmin { alpha: 1.0 / 3.0, statistic: None };
    /// assert_eq!(paper.argmin_statistic(), Some(ArgminStatistic::AccumulatedGradient));
    /// // Each step's norm summed over the epoch instead.
    /// let steps = FreezeRule::AlphaArgmin {
    ///     alpha: 1.0 / 3.0,
    ///     statistic: Some(ArgminStatistic::SummedStepNorms),
    /// };
    /// assert!(TrainerConfig::new().with_freeze(steps).validate(4).is_ok());
    /// // A configuration written before the statistic existed still parses.
    /// let old: FreezeRule = serde_json::from_str(r#"{"AlphaArgmin":{"alpha":0.5}}"#).unwrap();
    /// assert_eq!(old, FreezeRule::AlphaArgmin { alpha: 0.5, statistic: None });
    /// ```
    AlphaArgmin {
        /// In (0, 1]: the most of the remaining layers one epoch freezes.
        alpha: f64,
        /// The per-layer statistic; `None` (or absent from a configuration
        /// file) is the default, [`ArgminStatistic::AccumulatedGradient`].
        statistic: Option<ArgminStatistic>,
    },
    /// The gradient-change rule (Liu et al.), every `every_steps` steps.
    ChangeRate {
        /// Steps between evaluations (at least 1).
        every_steps: usize,
        /// Percentile of the active layers' change rates used as the
        /// threshold, in [0, 100].
        percentile: f64,
    },
    /// The default: the bottom block of layers still training freezes once
    /// training no longer gains from updating it (its share of the loss's
    /// first-order decrease, measured each step on a batch none of its moves
    /// since the last check saw, stays under a bound for checks in a row), or a prefix once
    /// the held-out loss has stopped improving; nothing before that loss
    /// has learned, and a freeze after which it rises is thawed
    /// (burn-freeze's [`Evidence`](burn_freeze::Evidence)). Checks run a
    /// few times an epoch, scaled to the run. The held-out loss is measured
    /// on [`TrainerConfig::held_out`](crate::TrainerConfig::held_out)
    /// samples carved out of the training data (the frozen units run once
    /// per front on them, the rest shared among the replicas); the weight
    /// snapshot the gains read is one more copy of the trainable
    /// parameters, counted in the memory budget.
    ///
    /// ```
    /// use burn_elastic_dp::{FreezeRule, TrainerConfig};
    /// use burn_freeze::EvidenceConfig;
    ///
    /// let default = TrainerConfig::new();
    /// assert_eq!(default.freeze, FreezeRule::Evidence { rule: EvidenceConfig::new() });
    /// let patient = FreezeRule::Evidence { rule: EvidenceConfig::new().with_patience(5) };
    /// assert!(default.with_freeze(patient).validate(4).is_ok());
    /// let bad = FreezeRule::Evidence { rule: EvidenceConfig::new().with_alpha(2.0) };
    /// assert!(TrainerConfig::new().with_freeze(bad).validate(4).is_err());
    /// ```
    Evidence {
        /// The rule's settings.
        rule: EvidenceConfig,
    },
    /// A fixed number of frozen layers per epoch (the last entry holds
    /// afterwards). The list may go down: an entry below the one before
    /// thaws layers ([`FreezeFront::unfreeze_to`](burn_freeze::FreezeFront::unfreeze_to)),
    /// and the shape rule derives K and R again from the start.
    ///
    /// ```
    /// use burn_elastic_dp::{FreezeRule, TrainerConfig};
    ///
    /// let up_and_down = FreezeRule::Fronts { layers: vec![0, 2, 3, 1, 2] };
    /// assert!(TrainerConfig::new().with_freeze(up_and_down).validate(4).is_ok());
    /// ```
    Fronts {
        /// `layers[T]` layers frozen in epoch `T`.
        layers: Vec<usize>,
    },
}

impl FreezeRule {
    /// The statistic of [`FreezeRule::AlphaArgmin`] (its default when
    /// `None`); `None` for the other rules.
    pub fn argmin_statistic(&self) -> Option<ArgminStatistic> {
        match self {
            FreezeRule::AlphaArgmin { statistic, .. } => {
                Some(statistic.unwrap_or(ArgminStatistic::AccumulatedGradient))
            }
            _ => None,
        }
    }
}

/// [`FreezeRule::AlphaArgmin`]'s settings as burn-freeze's config.
pub(crate) fn argmin_config(alpha: f64, statistic: Option<ArgminStatistic>) -> AlphaArgminConfig {
    AlphaArgminConfig::new()
        .with_alpha(alpha)
        .with_statistic(statistic.unwrap_or(ArgminStatistic::AccumulatedGradient))
}

/// [`FreezeRule::ChangeRate`]'s settings as burn-freeze's config.
pub(crate) fn change_rate_config(every_steps: usize, percentile: f64) -> ChangeRateConfig {
    ChangeRateConfig::new()
        .with_every_steps(every_steps)
        .with_percentile(percentile)
}

/// How the freeze policy's layers map onto the stack's units.
#[derive(Config, Debug, Copy, PartialEq, Eq)]
pub enum LayerSpec {
    /// Every unit is a layer.
    PerUnit,
    /// `layers` layers of `per_layer` consecutive units each, starting at
    /// unit `offset` (ViT and BERT: offset 1, 2 units per block).
    Uniform {
        /// First unit of layer 0.
        offset: usize,
        /// Units per layer (at least 1).
        per_layer: usize,
        /// Layers.
        layers: usize,
    },
}

/// Where AutoPipe's unit costs come from.
#[derive(Config, Debug, Copy, PartialEq)]
pub enum CostModel {
    /// Each unit's forward and backward time on the real backend, measured
    /// on the first batch before training (the fastest of `repeats`, at
    /// least 1); a frozen unit costs its forward time.
    Profiled {
        /// Timed runs per unit.
        repeats: usize,
    },
    /// Parameter counts (deterministic; for tests and planning); a frozen
    /// unit costs `frozen_factor` of an active one, in [0, 1].
    Parameters {
        /// Cost of a frozen unit relative to a training one.
        frozen_factor: f64,
    },
}

impl FreezeRule {
    /// Checks the rule's values by the rule's own check in burn-freeze
    /// ([`EvidenceConfig::validate`], [`ChangeRateConfig::validate`],
    /// [`AlphaArgminConfig::validate`], [`FixedSchedule::validate`]): the
    /// error, [`TrainerError::InvalidFreezeRule`], names the field by its
    /// path in the configuration (`freeze.alpha`, `freeze.rule.patience`),
    /// the value and its range.
    ///
    /// ```
    /// use burn_elastic_dp::{FreezeRule, TrainerError};
    /// use burn_freeze::EvidenceConfig;
    ///
    /// let bad = FreezeRule::Evidence { rule: EvidenceConfig::new().with_patience(0) };
    /// let error = bad.validate().unwrap_err();
    /// assert_eq!(error.to_string(), "freeze.rule.patience = 0 is not accepted: expected at least 1");
    /// assert!(matches!(error, TrainerError::InvalidFreezeRule { path: "freeze.rule", .. }));
    /// ```
    pub fn validate(&self) -> Result<(), TrainerError> {
        let (path, checked): (_, Result<(), PolicyConfigError>) = match self {
            FreezeRule::AlphaSchedule { alpha } => (
                "freeze",
                FixedSchedule::Alpha {
                    layers: 0,
                    alpha: *alpha,
                }
                .validate(),
            ),
            FreezeRule::AlphaArgmin { alpha, statistic } => {
                ("freeze", argmin_config(*alpha, *statistic).validate())
            }
            FreezeRule::ChangeRate {
                every_steps,
                percentile,
            } => (
                "freeze",
                change_rate_config(*every_steps, *percentile).validate(),
            ),
            FreezeRule::Evidence { rule } => ("freeze.rule", rule.validate()),
            // Any list: an entry below the one before thaws layers, and
            // one beyond the model is clamped to it (AutoFreeze).
            FreezeRule::Fronts { .. } => ("freeze", Ok(())),
        };
        checked.map_err(|error| TrainerError::InvalidFreezeRule { path, error })
    }
}

impl LayerSpec {
    /// Checks the map's values; the error names the field and its range.
    pub fn validate(&self) -> Result<(), TrainerError> {
        if let LayerSpec::Uniform {
            per_layer, layers, ..
        } = *self
        {
            if per_layer == 0 {
                return Err(invalid("layers.per_layer", 0, "at least 1"));
            }
            if layers == 0 {
                return Err(invalid("layers.layers", 0, "at least 1"));
            }
        }
        Ok(())
    }
}

impl CostModel {
    /// Checks the model's values; the error names the field and its range.
    pub fn validate(&self) -> Result<(), TrainerError> {
        match *self {
            CostModel::Profiled { repeats: 0 } => Err(invalid("costs.repeats", 0, "at least 1")),
            CostModel::Parameters { frozen_factor } if !(0.0..=1.0).contains(&frozen_factor) => {
                Err(invalid("costs.frozen_factor", frozen_factor, "[0, 1]"))
            }
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use burn_freeze::EvidenceConfig;

    use super::*;
    use crate::TrainerConfig;

    /// The message a configuration with `rule` is refused with.
    fn refusal(rule: FreezeRule) -> (String, TrainerError) {
        let error = TrainerConfig::new()
            .with_freeze(rule)
            .validate(4)
            .unwrap_err();
        (error.to_string(), error)
    }

    #[test]
    fn each_rule_is_refused_by_its_own_check_named_by_its_path() {
        let evidence = |rule: EvidenceConfig| FreezeRule::Evidence { rule };
        let cases = [
            (
                evidence(EvidenceConfig::new().with_patience(0)),
                "freeze.rule.patience = 0 is not accepted: expected at least 1",
            ),
            (
                evidence(EvidenceConfig::new().with_rise_tolerance(-1.0)),
                "freeze.rule.rise_tolerance = -1 is not accepted: expected a number >= 0",
            ),
            (
                evidence(EvidenceConfig::new().with_converged_checks(0)),
                "freeze.rule.converged_checks = 0 is not accepted: expected at least 1",
            ),
            (
                evidence(EvidenceConfig::new().with_alpha(1.5)),
                "freeze.rule.alpha = 1.5 is not accepted: expected a number in (0, 1]",
            ),
            (
                FreezeRule::AlphaSchedule { alpha: 0.0 },
                "freeze.alpha = 0 is not accepted: expected a number in (0, 1]",
            ),
            (
                FreezeRule::AlphaArgmin {
                    alpha: 2.0,
                    statistic: None,
                },
                "freeze.alpha = 2 is not accepted: expected a number in (0, 1]",
            ),
            (
                FreezeRule::ChangeRate {
                    every_steps: 0,
                    percentile: 50.0,
                },
                "freeze.every_steps = 0 is not accepted: expected at least 1",
            ),
            (
                FreezeRule::ChangeRate {
                    every_steps: 10,
                    percentile: 120.0,
                },
                "freeze.percentile = 120 is not accepted: expected [0, 100]",
            ),
        ];
        for (rule, message) in cases {
            let (text, error) = refusal(rule);
            assert_eq!(text, message);
            assert!(
                matches!(error, TrainerError::InvalidFreezeRule { .. }),
                "{error:?}"
            );
        }
    }

    #[test]
    fn the_typed_error_is_passed_on_whole() {
        let rule = FreezeRule::Evidence {
            rule: EvidenceConfig::new().with_signal_below(1.0),
        };
        match refusal(rule).1 {
            TrainerError::InvalidFreezeRule { path, error } => {
                assert_eq!(path, "freeze.rule");
                assert_eq!(error.field, "signal_below");
                assert_eq!(error.value, "1");
                assert_eq!(error.accepted, "a number in (0, 1)");
            }
            other => panic!("expected the rule's error, got {other:?}"),
        }
    }

    #[test]
    fn a_bad_rule_is_an_error_where_the_policy_is_made_not_a_panic() {
        let config = TrainerConfig::new().with_freeze(FreezeRule::ChangeRate {
            every_steps: 0,
            percentile: 50.0,
        });
        assert!(config.policy(4).is_err());
        let good = TrainerConfig::new().with_freeze(FreezeRule::AlphaArgmin {
            alpha: 1.0,
            statistic: None,
        });
        assert!(good.policy(4).unwrap().needs_gradient_sums());
    }
}
