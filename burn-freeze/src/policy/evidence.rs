//! Freezing on evidence: a prefix freezes once its gradients have turned to
//! noise, and a held-out loss that rises after a freeze thaws it again.

use burn::config::Config;

use super::{FreezePolicy, FreezeState, GradNorm, PolicyState, ceil_tolerant};

/// Settings of [`Evidence`].
#[derive(Config, Debug, PartialEq)]
pub struct EvidenceConfig {
    /// Steps per window: the gradient statistics are read, and the rule
    /// decides, every `every_steps` steps (at least 2).
    #[config(default = 16)]
    pub every_steps: usize,
    /// A layer is quiet in a window when the share of its gradient that is
    /// signal ([`signal_share`]) is below this, in [0, 1).
    #[config(default = 0.1)]
    pub signal_below: f64,
    /// Windows in a row a layer must be quiet before it may freeze (at
    /// least 1).
    #[config(default = 3)]
    pub patience: usize,
    /// The most one decision freezes: this share of the active layers
    /// (rounded up), in (0, 1]: the paper's alpha bound.
    #[config(default = 0.5)]
    pub alpha: f64,
    /// The guard: a held-out loss more than this many of its measured
    /// noise above its level before a freeze thaws that freeze (at least 0).
    #[config(default = 3.0)]
    pub rise_tolerance: f64,
    /// Held-out losses after a freeze that the guard watches (at least 1).
    #[config(default = 3)]
    pub watch: usize,
}

impl EvidenceConfig {
    /// Checks the values; the message names the field and its range.
    pub fn check(&self) -> Result<(), String> {
        let fail = |field: &str, value: String, range: &str| {
            Err(format!("{field} must be {range}, got {value}"))
        };
        if self.every_steps < 2 {
            return fail("every_steps", self.every_steps.to_string(), "at least 2");
        }
        if !(0.0..1.0).contains(&self.signal_below) {
            return fail("signal_below", self.signal_below.to_string(), "in [0, 1)");
        }
        if self.patience == 0 {
            return fail("patience", "0".into(), "at least 1");
        }
        if !(self.alpha > 0.0 && self.alpha <= 1.0) {
            return fail("alpha", self.alpha.to_string(), "in (0, 1]");
        }
        if !(self.rise_tolerance.is_finite() && self.rise_tolerance >= 0.0) {
            return fail(
                "rise_tolerance",
                self.rise_tolerance.to_string(),
                "a number >= 0",
            );
        }
        if self.watch == 0 {
            return fail("watch", "0".into(), "at least 1");
        }
        Ok(())
    }
}

/// The share of a layer's gradient that is signal over a window of `steps`
/// steps, from the norm of the window's summed gradient and the sum of the
/// steps' squared norms: with gradients `g_t = mu + noise_t`,
/// `||sum g||^2 / sum ||g||^2 = (steps mu^2 + sigma^2) / (mu^2 + sigma^2)`,
/// so `(ratio - 1) / (steps - 1)` estimates `mu^2 / (mu^2 + sigma^2)`: 1 for
/// a gradient that points the same way at every step, 0 for pure noise. It
/// is scale-free (the learning rate, the loss's scale and the layer's size
/// cancel) and absolute (no comparison with other layers). Clamped to
/// [0, 1]; `None` without a gradient or for fewer than 2 steps.
///
/// ```
/// use burn_freeze::signal_share;
///
/// // The same gradient every step: all signal.
/// assert_eq!(signal_share(4.0 * 2.0, 4.0 * 4.0, 4), Some(1.0));
/// // Orthogonal gradients of norm 2: the sum's norm is 2 * sqrt(4) = 4.
/// assert_eq!(signal_share(4.0, 4.0 * 4.0, 4), Some(0.0));
/// ```
pub fn signal_share(summed_norm: f64, squared_norms: f64, steps: usize) -> Option<f64> {
    if steps < 2 || !(squared_norms > 0.0) || !summed_norm.is_finite() {
        return None;
    }
    let ratio = summed_norm * summed_norm / squared_norms;
    Some(((ratio - 1.0) / (steps - 1) as f64).clamp(0.0, 1.0))
}

/// The held-out losses the guard reads, and the freeze it watches.
#[derive(Debug, Clone, Default, PartialEq)]
struct Guard {
    /// Held-out losses since the start, in order.
    losses: Vec<f64>,
    /// The freeze under watch: the layer front before it, the loss level
    /// before it, the noise then, and the held-out losses seen since.
    watching: Option<Watch>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
struct Watch {
    from: usize,
    to: usize,
    level: f64,
    noise: f64,
    seen: usize,
}

/// The default freeze rule: freezes a prefix of layers only on evidence
/// that it has stopped learning, and thaws a freeze that the held-out loss
/// says was too early.
///
/// - **Evidence.** Every [`every_steps`](EvidenceConfig::every_steps)
///   steps each active layer's [`signal_share`] is read from the window's
///   summed gradient and its steps' norms (the gradients the optimizer saw:
///   all-reduced, so every replica and rank reads the same). A layer whose
///   share stayed below [`signal_below`](EvidenceConfig::signal_below) for
///   [`patience`](EvidenceConfig::patience) windows in a row has stopped
///   learning: its gradient is noise around a point it no longer leaves.
///   The longest prefix of such layers freezes, at most
///   [`alpha`](EvidenceConfig::alpha) of the active layers at once. A layer
///   still pushed one way, on a task whose lower layers must learn, keeps
///   training however long it takes; the rule never freezes on a clock.
/// - **Guard.** When the trainer feeds it held-out losses
///   ([`FreezePolicy::held_out_loss`]), each freeze is watched for
///   [`watch`](EvidenceConfig::watch) losses: one above the level before the
///   freeze by more than [`rise_tolerance`](EvidenceConfig::rise_tolerance)
///   times the loss's measured noise (the spread of its steps before the
///   freeze) thaws the freeze, and the layers it had frozen wait twice as
///   many quiet windows before they may freeze again.
///
/// ```
/// use burn_freeze::{Evidence, EvidenceConfig, FreezePolicy, FreezeState, GradNorm};
///
/// let config = EvidenceConfig::new().with_every_steps(4).with_patience(1);
/// let mut rule = Evidence::new(config);
/// let state = FreezeState { frozen_layers: 0, num_layers: 2, epoch: 0, step: 4 };
/// let step = [Some(GradNorm { l1: 1.0, l2: 1.0 }); 2];
/// for _ in 0..4 {
///     rule.after_step(state, &step);
/// }
/// // Layer 0's four gradients cancelled out (noise), layer 1's added up.
/// let summed = [Some(GradNorm { l1: 2.0, l2: 1.0 }), Some(GradNorm { l1: 8.0, l2: 4.0 })];
/// assert_eq!(rule.window_gradient_sums(state, &summed), Some(1));
/// ```
#[derive(Debug, Clone)]
pub struct Evidence {
    config: EvidenceConfig,
    /// Per layer, the window's sum of squared step norms.
    squared: Vec<f64>,
    /// Steps in the window so far.
    steps: usize,
    /// Per layer, quiet windows in a row.
    quiet: Vec<usize>,
    /// Per layer, the quiet windows it needs (patience, doubled by thaws).
    needed: Vec<usize>,
    guard: Guard,
}

impl Evidence {
    /// The rule with `config` (see [`EvidenceConfig::check`]; values out of
    /// range are clamped into it).
    pub fn new(config: EvidenceConfig) -> Self {
        let config = EvidenceConfig {
            every_steps: config.every_steps.max(2),
            patience: config.patience.max(1),
            watch: config.watch.max(1),
            ..config
        };
        Self {
            config,
            squared: Vec::new(),
            steps: 0,
            quiet: Vec::new(),
            needed: Vec::new(),
            guard: Guard::default(),
        }
    }

    /// The settings.
    pub fn config(&self) -> &EvidenceConfig {
        &self.config
    }

    fn grow(&mut self, layers: usize) {
        if self.quiet.len() < layers {
            self.squared.resize(layers, 0.0);
            self.quiet.resize(layers, 0);
            self.needed.resize(layers, self.config.patience);
        }
    }

    /// The front the evidence allows from `state`: the longest prefix of
    /// active layers quiet long enough, within the alpha bound.
    fn evidence_front(&self, state: FreezeState) -> usize {
        let frozen = state.frozen_layers;
        let active = state.num_layers.saturating_sub(frozen);
        let most = ceil_tolerant(self.config.alpha * active as f64).max(1);
        let settled = (frozen..state.num_layers)
            .take_while(|&l| self.quiet.get(l).copied().unwrap_or(0) >= self.needed[l])
            .count();
        frozen + settled.min(most)
    }

    /// The loss's level (mean of the last `watch` losses) and noise (the
    /// spread of its steps, at least a thousandth of the level).
    fn level_and_noise(&self) -> Option<(f64, f64)> {
        let n = self.config.watch.max(2);
        let losses = &self.guard.losses;
        if losses.len() < 2 {
            return None;
        }
        let recent = &losses[losses.len().saturating_sub(n + 1)..];
        let level = recent.iter().sum::<f64>() / recent.len() as f64;
        let steps: Vec<f64> = recent.windows(2).map(|w| w[1] - w[0]).collect();
        let mean = steps.iter().sum::<f64>() / steps.len() as f64;
        let var = steps.iter().map(|d| (d - mean).powi(2)).sum::<f64>() / steps.len() as f64;
        Some((level, var.sqrt().max(level.abs() * 1e-3)))
    }
}

impl FreezePolicy for Evidence {
    fn after_step(&mut self, state: FreezeState, norms: &[Option<GradNorm>]) -> Option<usize> {
        self.grow(norms.len().max(state.num_layers));
        for (squared, norm) in self.squared.iter_mut().zip(norms) {
            *squared += norm.map_or(0.0, |n| n.l2 * n.l2);
        }
        self.steps += 1;
        None
    }

    fn needs_gradient_sums(&self) -> bool {
        true
    }

    fn gradient_sum_window(&self) -> Option<usize> {
        Some(self.config.every_steps)
    }

    fn window_gradient_sums(
        &mut self,
        state: FreezeState,
        norms: &[Option<GradNorm>],
    ) -> Option<usize> {
        self.grow(norms.len().max(state.num_layers));
        let steps = std::mem::take(&mut self.steps);
        let squared = std::mem::replace(&mut self.squared, vec![0.0; self.quiet.len()]);
        let shares: Vec<Option<f64>> = (0..state.num_layers)
            .map(|l| {
                let summed = norms.get(l).copied().flatten()?;
                signal_share(summed.l2, squared[l], steps)
            })
            .collect();
        for (l, share) in shares.iter().enumerate() {
            self.quiet[l] = match share {
                Some(s) if *s < self.config.signal_below => self.quiet[l] + 1,
                Some(_) => 0,
                None => self.quiet[l],
            };
        }
        tracing::info!(
            step = state.step,
            frozen = state.frozen_layers,
            shares = ?shares.iter().map(|s| s.map(|v| (v * 1000.0).round() / 1000.0)).collect::<Vec<_>>(),
            "Evidence: signal share per layer"
        );
        if self.guard.watching.is_some() {
            return None;
        }
        let front = self.evidence_front(state);
        if front > state.frozen_layers {
            if let Some((level, noise)) = self.level_and_noise() {
                self.guard.watching = Some(Watch {
                    from: state.frozen_layers,
                    to: front,
                    level,
                    noise,
                    seen: 0,
                });
            }
            return Some(front);
        }
        None
    }

    fn held_out_every(&self) -> Option<usize> {
        Some(self.config.every_steps)
    }

    fn held_out_loss(&mut self, state: FreezeState, loss: f64) -> Option<usize> {
        if !loss.is_finite() {
            return None;
        }
        self.guard.losses.push(loss);
        let watch = self.guard.watching.as_mut()?;
        watch.seen += 1;
        let limit = watch.level + self.config.rise_tolerance * watch.noise;
        tracing::info!(
            step = state.step,
            loss,
            level = watch.level,
            limit,
            "Evidence guard: held-out loss after a freeze"
        );
        if loss > limit && state.frozen_layers == watch.to {
            let from = watch.from;
            let to = watch.to;
            self.guard.watching = None;
            for l in from..to.min(self.needed.len()) {
                self.needed[l] = self.needed[l].saturating_mul(2);
                self.quiet[l] = 0;
            }
            tracing::info!(from = to, to = from, loss, limit, "Evidence guard: thaw");
            return Some(from);
        }
        if watch.seen >= self.config.watch || state.frozen_layers != watch.to {
            self.guard.watching = None;
        }
        None
    }

    fn save_state(&self) -> Option<PolicyState> {
        let floats = |v: &[f64]| v.iter().copied().map(Some).collect::<Vec<_>>();
        let counts = |v: &[usize]| v.iter().map(|&c| Some(c as f64)).collect::<Vec<_>>();
        let watch = self.guard.watching.map_or(Vec::new(), |w| {
            vec![
                Some(w.from as f64),
                Some(w.to as f64),
                Some(w.level),
                Some(w.noise),
                Some(w.seen as f64),
            ]
        });
        Some(PolicyState {
            series: vec![
                floats(&self.squared),
                counts(&self.quiet),
                counts(&self.needed),
                floats(&self.guard.losses),
                watch,
            ],
            counter: self.steps,
        })
    }

    fn load_state(&mut self, state: PolicyState) {
        let mut series = state.series.into_iter();
        let mut next = || series.next().unwrap_or_default();
        let floats = |v: Vec<Option<f64>>| v.into_iter().map(|x| x.unwrap_or(0.0)).collect();
        let counts = |v: Vec<Option<f64>>| {
            v.into_iter()
                .map(|x| x.unwrap_or(0.0).max(0.0) as usize)
                .collect()
        };
        self.squared = floats(next());
        self.quiet = counts(next());
        self.needed = counts(next());
        self.guard.losses = floats(next());
        let watch: Vec<f64> = floats(next());
        self.guard.watching = (watch.len() == 5).then(|| Watch {
            from: watch[0] as usize,
            to: watch[1] as usize,
            level: watch[2],
            noise: watch[3],
            seen: watch[4] as usize,
        });
        self.steps = state.counter;
        let layers = self.quiet.len();
        self.squared.resize(layers, 0.0);
        self.needed.resize(layers, self.config.patience);
    }
}
