//! Freezing on evidence: the bottom block of layers still training freezes once training no
//! longer gains from updating it (its share of the loss's decrease, or its gradients' signal),
//! or a prefix once the held-out loss has stopped improving; a freeze after which that loss
//! rises is thawed.

use burn::config::Config;
use serde::{Deserialize, Serialize};

use super::alpha::{alpha_most, check_alpha};
use super::consistency::{ConsistencyMeasure, GradientWindow};
use super::gain_window::{GainReading, GainWindow};
use super::{FreezePolicy, FreezeState, GradNorm, PolicyState};
use crate::PolicyConfigError;

/// The per-layer evidence of [`Evidence`]: what says that training no
/// longer gains from updating a layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum LayerSignal {
    /// Loss-change allocation, the default: the bottom block's share of the
    /// loss's first-order decrease over the check's window, from each
    /// step's update gains (`-<g_t, W_t - W_s>` per layer: the move since
    /// the last check, against the gradient of a batch none of its updates
    /// saw; see
    /// [`FreezeFront::last_update_gains`](crate::FreezeFront::last_update_gains)).
    /// The longest bottom block whose share stays under the bound has
    /// stopped gaining: freezing it gives up at most that share of the
    /// rate at which the loss falls. Costs a snapshot of the trainable
    /// weights a check and one product-sum per parameter a step.
    LossShare,
    /// [`LossShare`](Self::LossShare), and where the model's total gain
    /// over the window is within its noise (a model near convergence, or
    /// one whose batches disagree), each bottom block's gain is read
    /// against the total's upper confidence bound rather than not at all:
    /// a block whose own upper bound stays a small share of the most the
    /// model plausibly gained has stopped gaining, whatever the rest does.
    LossShareBounded,
    /// Update consistency on the gradients: the share of each layer's
    /// gradient energy that persists from step to step, `(||sum_t g_t||^2 -
    /// sum_t ||g_t||^2) / ((n - 1) sum_t ||g_t||^2)`, near 1 while every
    /// batch pushes the layer the same way and near 0 once its updates are
    /// noise (the inverse of its gradient noise scale); a layer under the
    /// bound has stopped gaining. Costs the running gradient sums.
    EnergyShare,
    /// APF's per-parameter sign consistency, `||sum_t g_t||_1 / sum_t
    /// ||g_t||_1` mapped to [0, 1] for the window's length; as
    /// [`EnergyShare`](Self::EnergyShare) otherwise.
    SignConsistency,
}

impl LayerSignal {
    /// The gradient-consistency measure behind the signal, if it is one.
    fn consistency(self) -> Option<ConsistencyMeasure> {
        match self {
            LayerSignal::LossShare | LayerSignal::LossShareBounded => None,
            LayerSignal::EnergyShare => Some(ConsistencyMeasure::EnergyShare),
            LayerSignal::SignConsistency => Some(ConsistencyMeasure::SignConsistency),
        }
    }
}

/// Steps between checks when [`EvidenceConfig::every_steps`] is `None` and
/// no epoch length is known (a policy driven by hand, not by a trainer).
const FALLBACK_EVERY_STEPS: usize = 8;

/// Settings of [`Evidence`].
#[derive(Config, Debug, PartialEq)]
pub struct EvidenceConfig {
    /// Steps between checks (at least 2: the per-layer signal needs two
    /// steps to compare); `None`, the default: scaled to the run, the
    /// epoch's steps over [`checks_per_epoch`](Self::checks_per_epoch), at
    /// least 2. A configuration written with a number still parses.
    #[config(default = "None")]
    pub every_steps: Option<usize>,
    /// Checks per epoch when [`every_steps`](Self::every_steps) is `None`
    /// (at least 1).
    #[config(default = 4)]
    pub checks_per_epoch: usize,
    /// Held-out losses per block of the whole-model plateau test (at least
    /// 1): the rule compares the mean of the last block with the mean of
    /// the block before it (two fresh blocks at the start and after a
    /// thaw, one after a freeze).
    #[config(default = 3)]
    pub patience: usize,
    /// Nothing freezes until the held-out loss has fallen below its first
    /// value by at least this share of it, in [0, 1): a model that has not
    /// learned yet (a plateau at the start) has not converged.
    #[config(default = 0.1)]
    pub learned_drop: f64,
    /// The loss has stopped improving when the last block improved on the
    /// one before by less than this share of all the improvement so far,
    /// in [0, 1).
    #[config(default = 0.05)]
    pub plateau_below: f64,
    /// The most one decision freezes: this share of the active layers
    /// (rounded up), in (0, 1]: the paper's alpha bound.
    #[config(default = 0.5)]
    pub alpha: f64,
    /// The guard: a held-out loss more than this many of its measured
    /// noise above its level before a freeze thaws that freeze (at least
    /// 0), where the rise is also more than
    /// [`plateau_below`](Self::plateau_below) of all the improvement so far
    /// (a smaller change is what the plateau test calls no change).
    #[config(default = 3.0)]
    pub rise_tolerance: f64,
    /// The per-layer evidence ([`LayerSignal`]); `None`: the whole-model
    /// plateau alone (the rule before per-layer evidence).
    #[config(default = "Some(LayerSignal::LossShare)")]
    pub signal: Option<LayerSignal>,
    /// The bound of the per-layer evidence, in (0, 1): the bottom block's
    /// share of the loss's decrease ([`LayerSignal::LossShare`]), or a
    /// layer's gradient signal share (the consistency signals), under
    /// which training no longer gains from updating it.
    #[config(default = 0.25)]
    pub signal_below: f64,
    /// Checks in a row a layer's evidence must stay under
    /// [`signal_below`](Self::signal_below) before it freezes (at least 1;
    /// doubled by each thaw).
    #[config(default = 2)]
    pub converged_checks: usize,
}

impl EvidenceConfig {
    /// Checks the values: on a value out of range, an error naming the
    /// field, the value and the accepted range.
    ///
    /// ```
    /// use burn_freeze::EvidenceConfig;
    ///
    /// let error = EvidenceConfig::new().with_patience(0).validate().unwrap_err();
    /// assert_eq!((error.field, error.accepted), ("patience", "at least 1"));
    /// ```
    pub fn validate(&self) -> Result<(), PolicyConfigError> {
        let fail = |field, value: &dyn std::fmt::Display, range| {
            Err(PolicyConfigError::new(field, value, range))
        };
        if let Some(every) = self.every_steps
            && every < 2
        {
            return fail(
                "every_steps",
                &every,
                "at least 2, or None (scaled to the run)",
            );
        }
        if self.checks_per_epoch == 0 {
            return fail("checks_per_epoch", &0, "at least 1");
        }
        if self.patience == 0 {
            return fail("patience", &0, "at least 1");
        }
        if !(0.0..1.0).contains(&self.learned_drop) {
            return fail("learned_drop", &self.learned_drop, "a number in [0, 1)");
        }
        if !(0.0..1.0).contains(&self.plateau_below) {
            return fail("plateau_below", &self.plateau_below, "a number in [0, 1)");
        }
        check_alpha(self.alpha)?;
        if !(self.rise_tolerance.is_finite() && self.rise_tolerance >= 0.0) {
            return fail("rise_tolerance", &self.rise_tolerance, "a number >= 0");
        }
        if !(self.signal_below > 0.0 && self.signal_below < 1.0) {
            return fail("signal_below", &self.signal_below, "a number in (0, 1)");
        }
        if self.converged_checks == 0 {
            return fail("converged_checks", &0, "at least 1");
        }
        Ok(())
    }
}

/// A freeze the guard watches: the fronts, and the loss's level and noise
/// before it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
struct Watch {
    from: usize,
    to: usize,
    level: f64,
    /// The loss's rise per held-out loss before the freeze (0 if falling).
    rise: f64,
    noise: f64,
    /// Held-out losses seen since the freeze.
    seen: usize,
}

/// The least noise the guard assumes, as a share of the loss's level: a
/// loss flat to a few digits (a task solved, a loss near zero) is not
/// thawed for a wobble of a percent.
const NOISE_FLOOR: f64 = 0.01;

/// Blocks of held-out losses the guard watches after a freeze.
const WATCH_BLOCKS: usize = 4;

/// What the held-out losses say, at one evaluation.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Reading {
    /// Fewer losses than two blocks since the start or the last move.
    Gathering,
    /// The loss has not fallen enough below its first value.
    NotLearned,
    /// The last block improved on the one before by this share of all
    /// the improvement so far.
    Improving(f64),
    /// The same, under the threshold: a plateau.
    Plateau(f64),
}

/// Why the rule froze.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Cause {
    /// The bottom block's per-layer evidence stayed under the bound: its
    /// share of the loss's decrease (or its gradients' signal share).
    LayersConverged,
    /// The whole model's held-out loss stopped improving.
    Plateau(f64),
}

/// Everything [`Evidence`] has gathered, as its checkpoint stores it.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
struct EvidenceState {
    /// Held-out losses since the start, in order.
    losses: Vec<f64>,
    /// Index in `losses` of the first loss after the last move of the front.
    since_move: usize,
    /// Whether that move was a freeze (not a thaw): a freeze leaves the
    /// loss where it was, so the losses before it still compare with the
    /// ones after, and one fresh block decides the next plateau.
    #[serde(default)]
    froze_last: bool,
    /// Losses per plateau block now (patience, doubled by each thaw).
    block: usize,
    watching: Option<Watch>,
    /// Per layer: checks in a row whose signal share was under the bound.
    quiet_checks: Vec<usize>,
    /// The per-layer gradient statistics of the current window.
    window: GradientWindow,
    /// The per-layer update gains of the current window.
    #[serde(default)]
    gains: GainWindow,
    /// Steps of the epoch under way, when a trainer said.
    epoch_steps: Option<usize>,
}

/// The default freeze rule: each layer of the bottom block still training
/// freezes once its own evidence says training no longer gains from
/// updating it, and a freeze that the held-out loss says was too early is
/// thawed.
///
/// A **check** runs every [`every_steps`](EvidenceConfig::every_steps)
/// steps (by default scaled to the run:
/// [`checks_per_epoch`](EvidenceConfig::checks_per_epoch) an epoch) and
/// reads two kinds of evidence:
///
/// - **Per layer: its share of the loss's decrease** (the default,
///   [`LayerSignal::LossShare`]). Every step measures each layer's update
///   gain `-<g_t, W_t - W_s>`: the first-order decrease of the loss on
///   the step's batch, one none of its moves saw, owed to that layer's
///   moves since the last check (over a span of steps an optimizer's
///   oscillations cancel, where a single move's gain reads them as
///   losses). Over the steps of the last two checks, the bottom block's share
///   of the whole model's decrease is read with its uncertainty (the upper
///   bound of two standard errors over the steps). The test is absolute
///   and scale-free, never a rank among the layers: the longest bottom
///   block whose upper bound stays under
///   [`signal_below`](EvidenceConfig::signal_below) for
///   [`converged_checks`](EvidenceConfig::converged_checks) checks in a row
///   has stopped gaining, and freezes (freezing it gives up at most that
///   share of the rate at which the loss falls). A window whose total gain
///   is not clearly positive says nothing of a layer: a gain is read at the
///   end of the moves, where the climb up the curvature that noisy moves
///   made counts against it, so a model still learning under noisy batches
///   can read a total under zero (the held-out loss decides then).
///   The gains cost one snapshot of the trainable weights a check and a
///   product-sum per parameter a step; the snapshot is counted in the
///   memory budget.
///   [`EvidenceConfig::signal`] picks the evidence: the gradients' own
///   consistency ([`LayerSignal::EnergyShare`],
///   [`LayerSignal::SignConsistency`]) is the alternative, and `None` turns
///   per-layer evidence off.
/// - **Whole model: the held-out loss**, on samples never trained on (a
///   trainer reads the user's validation batch, or carves samples out of
///   the training data; a run across processes gives every rank the same
///   value):
///   - *Learned.* Nothing freezes, on either evidence, until the loss has
///     fallen below its first value by
///     [`learned_drop`](EvidenceConfig::learned_drop) of it. On a task whose
///     lower layers must learn first the loss sits at its start for a
///     while, and the gradients of a plateau can look like noise.
///   - *Stopped improving.* The mean of the last
///     [`patience`](EvidenceConfig::patience) losses is compared with the
///     mean of the ones before: an improvement under
///     [`plateau_below`](EvidenceConfig::plateau_below) of all the
///     improvement so far is a plateau, and the bottom layers freeze too.
///     The first test waits for two blocks of fresh losses; after a
///     freeze one fresh block is compared with the block before the
///     freeze (a freeze leaves the loss where it was), so a model that has
///     stopped improving freezes its next block a block later, while one
///     whose loss falls again waits; after a thaw both blocks are fresh.
///   - *Guard.* For four blocks after a freeze, a loss above its trend
///     before the freeze (the last block's level, rising as it rose, never
///     falling) by more than
///     [`rise_tolerance`](EvidenceConfig::rise_tolerance) times the loss's
///     noise (the spread of its steps, at least 1% of the level) thaws the
///     freeze, and the rule then asks for twice the evidence before it
///     freezes again. A rise under
///     [`plateau_below`](EvidenceConfig::plateau_below) of all the
///     improvement so far thaws nothing: the plateau test reads a change
///     that small as none, and a loss near its floor creeps up that much
///     as the layers still training (a head) fit the training samples,
///     which a thaw would not undo.
///
/// One decision freezes at most [`alpha`](EvidenceConfig::alpha) of the
/// active layers (the paper's bound, at least one layer), and the next
/// waits for fresh checks. Every rank of a job reads the same gradients
/// (all-reduced) and the same held-out loss, so every rank decides alike;
/// the state is checkpointed, and a window a checkpoint cuts is closed
/// there, so a resumed run decides as the run it continues.
///
/// ```
/// use burn_freeze::{Evidence, EvidenceConfig, FreezePolicy, FreezeState};
///
/// // The whole-model plateau alone (no gradient sums in this example).
/// let config = EvidenceConfig::new().with_every_steps(Some(2)).with_patience(2).with_signal(None);
/// let mut rule = Evidence::new(config);
/// let mut state = FreezeState { frozen_layers: 0, num_layers: 4, epoch: 0, step: 0 };
/// let mut fronts = Vec::new();
/// // Learning fast, then flat.
/// for loss in [1.0, 0.8, 0.6, 0.4, 0.3, 0.3, 0.3, 0.3] {
///     state.step += 2;
///     if let Some(front) = rule.held_out_loss(state, loss) {
///         state.frozen_layers = front;
///         fronts.push((state.step, front));
///     }
/// }
/// assert_eq!(fronts, [(16, 2)]);
/// ```
#[derive(Debug, Clone)]
pub struct Evidence {
    config: EvidenceConfig,
    state: EvidenceState,
}

impl Evidence {
    /// The rule with `config`. It does not refuse a value: a count of 0 is
    /// taken as 1 and a check every step as every 2; call
    /// [`EvidenceConfig::validate`] first for an error naming a value out
    /// of range (the trainer does).
    pub fn new(config: EvidenceConfig) -> Self {
        let config = EvidenceConfig {
            every_steps: config.every_steps.map(|e| e.max(2)),
            checks_per_epoch: config.checks_per_epoch.max(1),
            patience: config.patience.max(1),
            converged_checks: config.converged_checks.max(1),
            ..config
        };
        Self {
            state: EvidenceState {
                block: config.patience,
                ..EvidenceState::default()
            },
            config,
        }
    }

    /// The settings.
    pub fn config(&self) -> &EvidenceConfig {
        &self.config
    }

    /// Steps between checks now: the configured count, else the epoch's
    /// steps over the checks per epoch (at least 2).
    pub fn every_steps(&self) -> usize {
        match (self.config.every_steps, self.state.epoch_steps) {
            (Some(every), _) => every,
            (None, Some(steps)) => steps.div_ceil(self.config.checks_per_epoch).max(2),
            (None, None) => FALLBACK_EVERY_STEPS,
        }
    }

    /// Whether the held-out loss has fallen enough below its first value.
    fn learned(&self) -> bool {
        let first = self.state.losses.first().copied().unwrap_or(0.0);
        self.improvement() > self.config.learned_drop * first.abs()
    }

    /// All the improvement so far: the held-out loss's first value less its
    /// best (0 before any).
    fn improvement(&self) -> f64 {
        let losses = &self.state.losses;
        let Some(&first) = losses.first() else {
            return 0.0;
        };
        first - losses.iter().copied().fold(f64::INFINITY, f64::min)
    }

    /// What the losses so far say.
    fn reading(&self) -> Reading {
        let block = self.state.block;
        let losses = &self.state.losses;
        let fresh = losses.len() - self.state.since_move.min(losses.len());
        // After a freeze, the last block is fresh and the one before it may
        // come from before the move; at the start and after a thaw (the
        // model changed) both must be fresh.
        let needed = if self.state.froze_last {
            block
        } else {
            2 * block
        };
        if fresh < needed || losses.len() < 2 * block {
            return Reading::Gathering;
        }
        if !self.learned() {
            return Reading::NotLearned;
        }
        let gained = self.improvement();
        let n = losses.len();
        let last = mean(&losses[n - block..]);
        let before = mean(&losses[n - 2 * block..n - block]);
        let progress = (before - last) / gained;
        if progress < self.config.plateau_below {
            Reading::Plateau(progress)
        } else {
            Reading::Improving(progress)
        }
    }

    /// Checks in a row a layer must be quiet now: the configured count,
    /// doubled by each thaw (as the plateau's blocks are).
    fn quiet_needed(&self) -> usize {
        let thaws = self.state.block / self.config.patience;
        self.config.converged_checks.saturating_mul(thaws.max(1))
    }

    /// Reads the window's per-layer signal shares into the layers' quiet
    /// counts and starts the next window; the shares, for the log.
    fn read_window(&mut self, state: FreezeState) -> Vec<Option<f64>> {
        let Some(signal) = self.config.signal else {
            return Vec::new();
        };
        let bound = self.config.signal_below;
        let quiet = &mut self.state.quiet_checks;
        quiet.resize(state.num_layers, 0);
        match signal.consistency() {
            Some(measure) => {
                let shares = self.state.window.shares(state.num_layers, measure);
                if self.state.window.is_empty() {
                    return shares;
                }
                self.state.window.start_window();
                for (layer, share) in shares.iter().enumerate() {
                    quiet[layer] = match share {
                        _ if layer < state.frozen_layers => 0,
                        Some(share) if *share < bound => quiet[layer] + 1,
                        Some(_) => 0,
                        // No reading this window (a layer just thawed).
                        None => 0,
                    };
                }
                shares
            }
            None => {
                // Each bottom block's share of the window's decrease, read
                // with its uncertainty. A window whose total is not clearly
                // positive says nothing of a layer: a gain is read at the
                // end of the move, where the curvature climbed by moves
                // that noise made counts against it, so a model still
                // learning under noisy batches can read a total under zero.
                let bound_uncertain = signal == LayerSignal::LossShareBounded;
                let (block, shares) = match self.state.gains.read(state, bound_uncertain) {
                    GainReading::Unread => return Vec::new(),
                    GainReading::Uncertain | GainReading::NoGain => (0, Vec::new()),
                    GainReading::Shares(shares) => (
                        shares
                            .iter()
                            .take_while(|(_, upper)| *upper < bound)
                            .count(),
                        shares.iter().map(|(share, _)| Some(*share)).collect(),
                    ),
                };
                for (layer, q) in quiet.iter_mut().enumerate() {
                    let in_block =
                        layer >= state.frozen_layers && layer < state.frozen_layers + block;
                    *q = if in_block { *q + 1 } else { 0 };
                }
                shares
            }
        }
    }

    /// Steps of the sliding window of update gains: two checks' worth, at
    /// least 8.
    fn gain_window_steps(&self) -> usize {
        (2 * self.every_steps()).max(8)
    }

    /// The longest bottom block of active layers quiet long enough.
    fn converged_layers(&self, state: FreezeState) -> usize {
        let needed = self.quiet_needed();
        (state.frozen_layers..state.num_layers)
            .take_while(|&layer| {
                self.state
                    .quiet_checks
                    .get(layer)
                    .is_some_and(|&q| q >= needed)
            })
            .count()
    }

    /// Where the guard expects the loss after a freeze: the last block's
    /// mean, rising as fast as it rose from the block before (a loss that
    /// was falling is expected to stay level); and the loss's noise, the
    /// spread of its steps over both blocks, at least
    /// [`NOISE_FLOOR`] of the level.
    fn expectation(&self) -> (f64, f64, f64) {
        let block = self.state.block;
        let losses = &self.state.losses;
        let n = losses.len();
        let last = &losses[n.saturating_sub(block)..];
        let before = &losses[n.saturating_sub(2 * block)..n.saturating_sub(block)];
        let level = mean(last);
        let rise = if before.is_empty() {
            0.0
        } else {
            ((level - mean(before)) / block as f64).max(0.0)
        };
        let both = &losses[n.saturating_sub(2 * block)..];
        let steps: Vec<f64> = both.windows(2).map(|w| w[1] - w[0]).collect();
        let spread = if steps.is_empty() {
            0.0
        } else {
            let m = mean(&steps);
            (steps.iter().map(|d| (d - m).powi(2)).sum::<f64>() / steps.len() as f64).sqrt()
                / std::f64::consts::SQRT_2
        };
        (level, rise, spread.max(level.abs() * NOISE_FLOOR))
    }

    /// The guard's verdict on `loss` for the freeze it watches: the front
    /// to thaw to, when the loss rose too far.
    fn guard(&mut self, state: FreezeState, loss: f64) -> Option<usize> {
        let watch = self.state.watching?;
        if state.frozen_layers != watch.to {
            // The front moved otherwise: nothing of this freeze to thaw.
            self.state.watching = None;
            return None;
        }
        let block = self.state.block;
        let seen = watch.seen + 1;
        // Watched for four blocks: later changes are training's, not the
        // freeze's.
        self.state.watching = (seen < WATCH_BLOCKS * block).then_some(Watch { seen, ..watch });
        let expected = watch.level + watch.rise * (seen as f64 + (block as f64 - 1.0) / 2.0);
        // Above the loss's noise, and a change the plateau test would see.
        let margin = (self.config.rise_tolerance * watch.noise)
            .max(self.config.plateau_below * self.improvement());
        let limit = expected + margin;
        if loss <= limit {
            return None;
        }
        tracing::info!(
            step = state.step,
            loss,
            limit,
            from = watch.to,
            to = watch.from,
            "Evidence: the held-out loss rose after a freeze; thawed"
        );
        self.state.watching = None;
        self.state.block = block.saturating_mul(2);
        self.moved(false);
        Some(watch.from)
    }

    /// After the front moved (`froze`: by a freeze, not a thaw): fresh
    /// evidence for the next decision.
    fn moved(&mut self, froze: bool) {
        self.state.since_move = self.state.losses.len();
        self.state.froze_last = froze;
        self.state.quiet_checks.iter_mut().for_each(|q| *q = 0);
        self.state.gains.clear();
    }

    /// A freeze from `state`'s front by `cause`, at most alpha of the
    /// active layers: the new front, with the guard set to watch it.
    fn freeze(&mut self, state: FreezeState, layers: usize, cause: Cause) -> Option<usize> {
        let frozen = state.frozen_layers;
        let most = alpha_most(self.config.alpha, frozen, state.num_layers);
        if most == 0 || layers == 0 {
            return None;
        }
        let front = frozen + layers.min(most);
        let (level, rise, noise) = self.expectation();
        tracing::info!(
            step = state.step,
            from = frozen,
            to = front,
            ?cause,
            "Evidence: froze"
        );
        self.state.watching = Some(Watch {
            from: frozen,
            to: front,
            level,
            rise,
            noise,
            seen: 0,
        });
        self.moved(true);
        Some(front)
    }
}

fn mean(values: &[f64]) -> f64 {
    values.iter().sum::<f64>() / values.len().max(1) as f64
}

impl FreezePolicy for Evidence {
    fn after_step(&mut self, _state: FreezeState, norms: &[Option<GradNorm>]) -> Option<usize> {
        if self
            .config
            .signal
            .and_then(LayerSignal::consistency)
            .is_some()
        {
            self.state.window.add_step(norms);
        }
        None
    }

    fn needs_gradient_sums(&self) -> bool {
        self.config
            .signal
            .and_then(LayerSignal::consistency)
            .is_some()
    }

    fn needs_update_gains(&self) -> bool {
        matches!(
            self.config.signal,
            Some(LayerSignal::LossShare | LayerSignal::LossShareBounded)
        )
    }

    fn update_gains(&mut self, _state: FreezeState, layers: &[Option<f64>], total: Option<f64>) {
        let steps = self.gain_window_steps();
        self.state.gains.add_step(layers, total, steps);
    }

    fn gradient_sums_per_check(&self) -> bool {
        true
    }

    fn epoch_gradient_sums(&mut self, _state: FreezeState, norms: &[Option<GradNorm>]) {
        self.state.window.close_block(norms);
    }

    fn check_gradient_sums(&mut self, _state: FreezeState, norms: &[Option<GradNorm>]) {
        self.state.window.close_block(norms);
    }

    fn epoch_steps(&mut self, steps: usize) {
        self.state.epoch_steps = (steps > 0).then_some(steps);
    }

    fn held_out_every(&self) -> Option<usize> {
        Some(self.every_steps())
    }

    fn held_out_loss(&mut self, state: FreezeState, loss: f64) -> Option<usize> {
        let shares = self.read_window(state);
        if !loss.is_finite() {
            return None;
        }
        self.state.losses.push(loss);
        if let Some(front) = self.guard(state, loss) {
            return Some(front);
        }
        let reading = self.reading();
        let converged = if self.learned() {
            self.converged_layers(state)
        } else {
            0
        };
        tracing::debug!(
            step = state.step,
            loss,
            ?reading,
            ?shares,
            converged,
            frozen = state.frozen_layers,
            "Evidence"
        );
        if let Reading::Plateau(progress) = reading {
            let active = state.num_layers.saturating_sub(state.frozen_layers);
            return self.freeze(state, active, Cause::Plateau(progress));
        }
        self.freeze(state, converged, Cause::LayersConverged)
    }

    fn save_state(&self) -> Option<PolicyState> {
        PolicyState::typed(&self.state)
    }

    fn load_state(&mut self, state: PolicyState) {
        if let Some(saved) = state.read::<EvidenceState>() {
            self.state = EvidenceState {
                since_move: saved.since_move.min(saved.losses.len()),
                block: saved.block.max(self.config.patience),
                ..saved
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(frozen: usize, step: usize) -> FreezeState {
        FreezeState {
            frozen_layers: frozen,
            num_layers: 12,
            epoch: 0,
            step,
        }
    }

    /// Feeds `losses` one per check, applying every decision; the fronts.
    fn run(rule: &mut Evidence, losses: &[f64]) -> Vec<usize> {
        let mut frozen = 0;
        let mut fronts = Vec::new();
        for (check, &loss) in losses.iter().enumerate() {
            if let Some(front) = rule.held_out_loss(state(frozen, 2 * (check + 1)), loss) {
                frozen = front;
            }
            fronts.push(frozen);
        }
        fronts
    }

    /// The whole-model plateau alone, a check every 2 steps.
    fn rule() -> Evidence {
        Evidence::new(
            EvidenceConfig::new()
                .with_every_steps(Some(2))
                .with_patience(2)
                .with_signal(None),
        )
    }

    #[test]
    fn a_plateau_before_learning_freezes_nothing() {
        // Flat at the start for long (a task whose lower layers must learn).
        let losses = [0.70, 0.69, 0.70, 0.69, 0.70, 0.69, 0.70, 0.70, 0.69, 0.70];
        assert!(run(&mut rule(), &losses).iter().all(|&f| f == 0));
    }

    #[test]
    fn steady_learning_freezes_nothing() {
        let losses: Vec<f64> = (0..20).map(|i| 0.7 * 0.93f64.powi(i)).collect();
        assert!(run(&mut rule(), &losses).iter().all(|&f| f == 0));
    }

    #[test]
    fn a_plateau_after_learning_freezes_half_the_active_layers_at_a_time() {
        let mut losses = vec![1.0, 0.5, 0.3, 0.2];
        losses.extend([0.2; 12]);
        let fronts = run(&mut rule(), &losses);
        // Two blocks of two to the first freeze, 6 (half of 12); then one
        // fresh block after each freeze: 9, 11, 12.
        assert_eq!(fronts[..6].iter().max(), Some(&0));
        assert_eq!(fronts[6..], [6, 6, 9, 9, 11, 11, 12, 12, 12, 12]);
    }

    #[test]
    fn after_a_freeze_the_loss_decides_again_once_it_is_still_falling() {
        // Frozen on a plateau at check 6; the loss then falls again: the
        // block after the freeze improves on the one before, no freeze.
        let mut losses = vec![1.0, 0.5, 0.3, 0.2, 0.2, 0.2, 0.2];
        losses.extend([0.15, 0.1, 0.05, 0.05, 0.05, 0.05]);
        let fronts = run(&mut rule(), &losses);
        assert_eq!(fronts[6..], [6, 6, 6, 6, 6, 9, 9]);
    }

    #[test]
    fn a_rise_after_a_freeze_thaws_it_and_the_rule_waits_longer() {
        let mut rule = rule();
        let losses = vec![1.0, 0.5, 0.3, 0.2, 0.2, 0.21, 0.2, 0.2];
        let fronts = run(&mut rule, &losses);
        assert_eq!(fronts.last(), Some(&6));
        // The loss jumps: thawed back to 0, then blocks of 4.
        let front = rule.held_out_loss(state(6, 18), 0.5);
        assert_eq!(front, Some(0));
        let mut frozen = 0;
        let mut moved = Vec::new();
        for check in 10..26 {
            if let Some(front) = rule.held_out_loss(state(frozen, 2 * check), 0.2) {
                frozen = front;
                moved.push(check);
            }
        }
        // Eight fresh losses (two blocks of four) before the next freeze.
        assert_eq!(moved.first(), Some(&17));
    }

    #[test]
    fn a_rise_the_plateau_test_would_not_see_thaws_nothing() {
        // Frozen on the plateau at 0.2 after an improvement of 0.8: the
        // loss's noise floor (1% of 0.2, three times) allows 0.206, but a
        // rise under 5% of the improvement (0.04) is no change.
        let mut rule = rule();
        let losses = [1.0, 0.5, 0.3, 0.2, 0.2, 0.2, 0.2];
        assert_eq!(run(&mut rule, &losses).last(), Some(&6));
        assert!(0.23 > 0.2 + rule.config.rise_tolerance * 0.2 * NOISE_FLOOR);
        assert_eq!(rule.held_out_loss(state(6, 16), 0.23), None);
        // Past it: thawed.
        assert_eq!(rule.held_out_loss(state(6, 18), 0.25), Some(0));
    }

    #[test]
    fn the_state_survives_a_checkpoint() {
        let mut a = rule();
        let losses = [1.0, 0.5, 0.3, 0.2, 0.2, 0.2];
        run(&mut a, &losses);
        let mut b = rule();
        b.load_state(a.save_state().unwrap());
        let (x, y) = (
            a.held_out_loss(state(0, 14), 0.2),
            b.held_out_loss(state(0, 14), 0.2),
        );
        assert_eq!(x, y);
        assert_eq!(x, Some(6));
        assert_eq!(a.save_state(), b.save_state());
    }

    #[test]
    fn the_checks_name_the_field() {
        let bad = EvidenceConfig::new().with_plateau_below(1.5);
        assert_eq!(bad.validate().unwrap_err().field, "plateau_below");
        let alpha = EvidenceConfig::new()
            .with_alpha(0.0)
            .validate()
            .unwrap_err();
        assert_eq!(
            (alpha.field, alpha.accepted),
            ("alpha", "a number in (0, 1]")
        );
        let every = EvidenceConfig::new().with_every_steps(Some(1));
        assert_eq!(every.validate().unwrap_err().field, "every_steps");
        let bound = EvidenceConfig::new().with_signal_below(1.0);
        assert_eq!(bound.validate().unwrap_err().field, "signal_below");
        let patience = EvidenceConfig {
            patience: 0,
            ..EvidenceConfig::new()
        };
        assert_eq!(
            patience.validate(),
            Err(PolicyConfigError {
                field: "patience",
                value: "0".to_string(),
                accepted: "at least 1",
            })
        );
        let rise = EvidenceConfig::new().with_rise_tolerance(f64::NAN);
        assert_eq!(rise.validate().unwrap_err().field, "rise_tolerance");
        assert!(EvidenceConfig::new().validate().is_ok());
    }

    #[test]
    fn checks_follow_the_epoch_length_unless_set() {
        let mut rule = Evidence::new(EvidenceConfig::new());
        assert_eq!(rule.held_out_every(), Some(FALLBACK_EVERY_STEPS));
        rule.epoch_steps(31);
        assert_eq!(rule.held_out_every(), Some(8));
        rule.epoch_steps(4);
        assert_eq!(rule.held_out_every(), Some(2));
        let mut fixed = Evidence::new(EvidenceConfig::new().with_every_steps(Some(5)));
        fixed.epoch_steps(100);
        assert_eq!(fixed.held_out_every(), Some(5));
    }

    /// Per-layer evidence: `layers` layers, the first `dead` of which get
    /// gradients of pure noise (`+-1` alternating: every pair cancels) and
    /// the rest a steady direction; checks of 2 steps, the held-out loss
    /// `loss(check)`. The fronts after each check.
    fn per_layer(
        dead: usize,
        layers: usize,
        checks: usize,
        loss: impl Fn(usize) -> f64,
    ) -> Vec<usize> {
        let config = EvidenceConfig::new().with_every_steps(Some(2));
        let mut rule = Evidence::new(config.with_signal(Some(LayerSignal::EnergyShare)));
        let mut frozen = 0;
        let mut fronts = Vec::new();
        let mut step = 0;
        for check in 0..checks {
            let mut sums = vec![0.0f64; layers];
            for _ in 0..2 {
                step += 1;
                let sign = if step % 2 == 0 { 1.0 } else { -1.0 };
                let norms: Vec<Option<GradNorm>> = (0..layers)
                    .map(|l| {
                        (l >= frozen).then(|| {
                            let g = if l < dead { sign } else { 1.0 };
                            sums[l] += g;
                            GradNorm {
                                l1: g.abs(),
                                l2: g.abs(),
                            }
                        })
                    })
                    .collect();
                let s = FreezeState {
                    frozen_layers: frozen,
                    num_layers: layers,
                    epoch: 0,
                    step,
                };
                assert_eq!(rule.after_step(s, &norms), None);
            }
            let s = FreezeState {
                frozen_layers: frozen,
                num_layers: layers,
                epoch: 0,
                step,
            };
            let sum_norms: Vec<Option<GradNorm>> = (0..layers)
                .map(|l| {
                    (l >= frozen).then(|| GradNorm {
                        l1: sums[l].abs(),
                        l2: sums[l].abs(),
                    })
                })
                .collect();
            rule.check_gradient_sums(s, &sum_norms);
            if let Some(front) = rule.held_out_loss(s, loss(check)) {
                frozen = front;
            }
            fronts.push(frozen);
        }
        fronts
    }

    #[test]
    fn layers_whose_gradient_is_noise_freeze_within_two_checks_of_learning() {
        // The loss has learned at the first check after the first: the two
        // noisy bottom layers freeze at the second check.
        let fronts = per_layer(2, 6, 6, |check| 1.0 / (1.0 + check as f64));
        assert_eq!(fronts[0], 0);
        assert_eq!(fronts[1], 2);
        assert_eq!(fronts.last(), Some(&2));
    }

    #[test]
    fn layers_that_carry_the_signal_stay_while_the_loss_falls() {
        let fronts = per_layer(0, 6, 12, |check| 0.9f64.powi(check as i32));
        assert!(fronts.iter().all(|&f| f == 0), "{fronts:?}");
    }

    #[test]
    fn nothing_freezes_before_the_loss_has_learned() {
        // Noisy gradients in every layer, but a flat loss: a plateau at the
        // start, not convergence.
        let fronts = per_layer(6, 6, 8, |_| 0.7);
        assert!(fronts.iter().all(|&f| f == 0), "{fronts:?}");
    }

    /// Loss share: `layers` layers, the first `dead` of which gain nothing
    /// (a zero gradient) while the others gain 1 a step each, the rest of
    /// the model (a head) `head`; checks every 4 steps, the held-out loss
    /// `loss(check)`. The fronts after each check.
    fn loss_share(
        (dead, layers, head): (usize, usize, f64),
        checks: usize,
        loss: impl Fn(usize) -> f64,
    ) -> Vec<usize> {
        let mut rule = Evidence::new(EvidenceConfig::new().with_every_steps(Some(4)));
        assert!(rule.needs_update_gains() && !rule.needs_gradient_sums());
        let mut frozen = 0;
        let mut fronts = Vec::new();
        let mut step = 0;
        for check in 0..checks {
            for _ in 0..4 {
                step += 1;
                let s = FreezeState {
                    frozen_layers: frozen,
                    num_layers: layers,
                    epoch: 0,
                    step,
                };
                let gains: Vec<Option<f64>> = (0..layers)
                    .map(|l| (l >= frozen).then_some(if l < dead { 0.0 } else { 1.0 }))
                    .collect();
                let total = gains.iter().flatten().sum::<f64>() + head;
                rule.update_gains(s, &gains, Some(total));
                assert_eq!(rule.after_step(s, &[]), None);
            }
            let s = FreezeState {
                frozen_layers: frozen,
                num_layers: layers,
                epoch: 0,
                step,
            };
            if let Some(front) = rule.held_out_loss(s, loss(check)) {
                frozen = front;
            }
            fronts.push(frozen);
        }
        fronts
    }

    #[test]
    fn layers_without_gradient_freeze_within_two_checks_on_the_loss_share() {
        // The 3 live layers keep a third of the decrease each.
        let fronts = loss_share((2, 5, 0.0), 6, |check| 1.0 / (1.0 + check as f64));
        assert_eq!(fronts[..2], [0, 2]);
        assert_eq!(fronts.last(), Some(&2));
    }

    #[test]
    fn a_total_gain_under_zero_freezes_nothing_while_the_held_out_loss_falls() {
        // The moves read as losses (the curvature noisy moves climbed),
        // clearly: no layer is read, and the falling loss is no plateau.
        let fronts = loss_share((0, 3, -10.0), 12, |check| 0.9f64.powi(check as i32));
        assert!(fronts.iter().all(|&f| f == 0), "{fronts:?}");
    }

    #[test]
    fn layers_that_share_the_decrease_stay_while_the_loss_falls() {
        // Each layer has 1 / 3.2 of the decrease, over the bound of 1/4.
        let fronts = loss_share((0, 3, 0.2), 12, |check| 0.9f64.powi(check as i32));
        assert!(fronts.iter().all(|&f| f == 0), "{fronts:?}");
    }

    #[test]
    fn the_per_layer_state_survives_a_checkpoint() {
        let config = || {
            EvidenceConfig::new()
                .with_every_steps(Some(2))
                .with_signal(Some(LayerSignal::EnergyShare))
        };
        let mut a = Evidence::new(config());
        let g = Some(GradNorm { l1: 1.0, l2: 1.0 });
        let s = FreezeState {
            frozen_layers: 0,
            num_layers: 2,
            epoch: 0,
            step: 1,
        };
        a.after_step(s, &[g, g]);
        a.after_step(s, &[g, g]);
        a.check_gradient_sums(
            s,
            &[
                Some(GradNorm { l1: 0.0, l2: 0.0 }),
                Some(GradNorm { l1: 2.0, l2: 2.0 }),
            ],
        );
        a.held_out_loss(s, 1.0);
        a.after_step(s, &[g, g]);
        let mut b = Evidence::new(config());
        b.load_state(a.save_state().unwrap());
        assert_eq!(a.save_state(), b.save_state());
        assert_eq!(b.state.quiet_checks, [1, 0]);
    }
}
