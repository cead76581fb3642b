//! Freezing on evidence: a prefix freezes once the held-out loss has learned and stopped
//! improving, and a freeze after which that loss rises is thawed.

use burn::config::Config;

use super::{FreezePolicy, FreezeState, PolicyState, ceil_tolerant};

/// Settings of [`Evidence`].
#[derive(Config, Debug, PartialEq)]
pub struct EvidenceConfig {
    /// Steps between held-out losses (at least 1).
    #[config(default = 8)]
    pub every_steps: usize,
    /// Held-out losses per block (at least 1): the rule compares the mean
    /// of the last block with the mean of the block before it.
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
    /// noise above its level before a freeze thaws that freeze (at least 0).
    #[config(default = 3.0)]
    pub rise_tolerance: f64,
}

impl EvidenceConfig {
    /// Checks the values: on a value out of range, the field's name, the
    /// value and the accepted range.
    pub fn validate(&self) -> Result<(), (&'static str, String, &'static str)> {
        let fail =
            |field, value: &dyn std::fmt::Display, range| Err((field, value.to_string(), range));
        if self.every_steps == 0 {
            return fail("every_steps", &0, "at least 1");
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
        if !(self.alpha > 0.0 && self.alpha <= 1.0) {
            return fail("alpha", &self.alpha, "a number in (0, 1]");
        }
        if !(self.rise_tolerance.is_finite() && self.rise_tolerance >= 0.0) {
            return fail("rise_tolerance", &self.rise_tolerance, "a number >= 0");
        }
        Ok(())
    }
}

/// A freeze the guard watches: the fronts, and the loss's level and noise
/// before it.
#[derive(Debug, Clone, Copy, PartialEq)]
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

/// The default freeze rule: a prefix freezes only on evidence that training
/// has stopped gaining from it, and a freeze that the held-out loss says
/// was too early is thawed.
///
/// The evidence is a loss on samples never trained on, measured every
/// [`every_steps`](EvidenceConfig::every_steps) steps (a trainer reads the
/// user's validation batch, or carves samples out of the training data; a
/// run across processes gives every rank the same value):
///
/// - **Learned.** Nothing freezes until the loss has fallen below its first
///   value by [`learned_drop`](EvidenceConfig::learned_drop) of it. On a
///   task whose lower layers must learn first, the loss sits at its start
///   for a while: no rule that reads the gradients or a clock can tell that
///   plateau from convergence, this one does not try.
/// - **Stopped improving.** The mean of the last
///   [`patience`](EvidenceConfig::patience) losses is compared with the mean
///   of the ones before: an improvement under
///   [`plateau_below`](EvidenceConfig::plateau_below) of all the improvement
///   so far (scale-free: the loss's units, the learning rate and the task's
///   difficulty cancel) is a plateau, and the lowest
///   [`alpha`](EvidenceConfig::alpha) of the active layers freeze (the
///   paper's bound, at least one layer). The next decision waits for two
///   fresh blocks.
/// - **Guard.** For four blocks after a freeze, a loss above its trend
///   before the freeze (the last block's level, rising as it rose, never
///   falling) by more than [`rise_tolerance`](EvidenceConfig::rise_tolerance)
///   times the loss's noise (the spread of its steps over the two blocks
///   before, at least 1% of the level) thaws the freeze, and the rule then
///   waits blocks twice as long before it freezes again.
///
/// ```
/// use burn_freeze::{Evidence, EvidenceConfig, FreezePolicy, FreezeState};
///
/// let mut rule = Evidence::new(EvidenceConfig::new().with_every_steps(1).with_patience(2));
/// let mut state = FreezeState { frozen_layers: 0, num_layers: 4, epoch: 0, step: 0 };
/// let mut fronts = Vec::new();
/// // Learning fast, then flat.
/// for loss in [1.0, 0.8, 0.6, 0.4, 0.3, 0.3, 0.3, 0.3] {
///     state.step += 1;
///     if let Some(front) = rule.held_out_loss(state, loss) {
///         state.frozen_layers = front;
///         fronts.push((state.step, front));
///     }
/// }
/// assert_eq!(fronts, [(8, 2)]);
/// ```
#[derive(Debug, Clone)]
pub struct Evidence {
    config: EvidenceConfig,
    /// Held-out losses since the start, in order.
    losses: Vec<f64>,
    /// Index in `losses` of the first loss after the last move of the front.
    since_move: usize,
    /// Losses per block now (patience, doubled by each thaw).
    block: usize,
    watching: Option<Watch>,
}

impl Evidence {
    /// The rule with `config` (see [`EvidenceConfig::check`]; a count of 0
    /// is taken as 1).
    pub fn new(config: EvidenceConfig) -> Self {
        let config = EvidenceConfig {
            every_steps: config.every_steps.max(1),
            patience: config.patience.max(1),
            ..config
        };
        Self {
            block: config.patience,
            config,
            losses: Vec::new(),
            since_move: 0,
            watching: None,
        }
    }

    /// The settings.
    pub fn config(&self) -> &EvidenceConfig {
        &self.config
    }

    /// What the losses so far say.
    fn reading(&self) -> Reading {
        let block = self.block;
        let fresh = &self.losses[self.since_move..];
        if fresh.len() < 2 * block {
            return Reading::Gathering;
        }
        let first = self.losses[0];
        let best = self.losses.iter().copied().fold(f64::INFINITY, f64::min);
        let gained = first - best;
        if !(gained > self.config.learned_drop * first.abs()) {
            return Reading::NotLearned;
        }
        let last = mean(&fresh[fresh.len() - block..]);
        let before = mean(&fresh[fresh.len() - 2 * block..fresh.len() - block]);
        let progress = (before - last) / gained;
        if progress < self.config.plateau_below {
            Reading::Plateau(progress)
        } else {
            Reading::Improving(progress)
        }
    }

    /// Where the guard expects the loss after a freeze: the last block's
    /// mean, rising as fast as it rose from the block before (a loss that
    /// was falling is expected to stay level); and the loss's noise, the
    /// spread of its steps over both blocks, at least
    /// [`NOISE_FLOOR`] of the level.
    fn expectation(&self) -> (f64, f64, f64) {
        let block = self.block;
        let n = self.losses.len();
        let last = &self.losses[n.saturating_sub(block)..];
        let before = &self.losses[n.saturating_sub(2 * block)..n.saturating_sub(block)];
        let level = mean(last);
        let rise = if before.is_empty() {
            0.0
        } else {
            ((level - mean(before)) / block as f64).max(0.0)
        };
        let both = &self.losses[n.saturating_sub(2 * block)..];
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
        let watch = self.watching?;
        if state.frozen_layers != watch.to {
            // The front moved otherwise: nothing of this freeze to thaw.
            self.watching = None;
            return None;
        }
        let seen = watch.seen + 1;
        // Watched for four blocks: later changes are training's, not the
        // freeze's.
        self.watching = (seen < WATCH_BLOCKS * self.block).then_some(Watch { seen, ..watch });
        let expected = watch.level + watch.rise * (seen as f64 + (self.block as f64 - 1.0) / 2.0);
        let limit = expected + self.config.rise_tolerance * watch.noise;
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
        self.watching = None;
        self.block = self.block.saturating_mul(2);
        self.since_move = self.losses.len();
        Some(watch.from)
    }
}

fn mean(values: &[f64]) -> f64 {
    values.iter().sum::<f64>() / values.len().max(1) as f64
}

impl FreezePolicy for Evidence {
    fn held_out_every(&self) -> Option<usize> {
        Some(self.config.every_steps)
    }

    fn held_out_loss(&mut self, state: FreezeState, loss: f64) -> Option<usize> {
        if !loss.is_finite() {
            return None;
        }
        self.losses.push(loss);
        if let Some(front) = self.guard(state, loss) {
            return Some(front);
        }
        let reading = self.reading();
        tracing::debug!(
            step = state.step,
            loss,
            ?reading,
            frozen = state.frozen_layers,
            "Evidence"
        );
        let Reading::Plateau(progress) = reading else {
            return None;
        };
        let frozen = state.frozen_layers;
        let active = state.num_layers.saturating_sub(frozen);
        if active == 0 {
            return None;
        }
        let front = frozen + ceil_tolerant(self.config.alpha * active as f64).clamp(1, active);
        let (level, rise, noise) = self.expectation();
        tracing::info!(
            step = state.step,
            loss,
            progress,
            from = frozen,
            to = front,
            "Evidence: plateau; froze"
        );
        self.watching = Some(Watch {
            from: frozen,
            to: front,
            level,
            rise,
            noise,
            seen: 0,
        });
        self.since_move = self.losses.len();
        Some(front)
    }

    fn save_state(&self) -> Option<PolicyState> {
        let watch = self.watching.map_or(Vec::new(), |w| {
            [
                w.from as f64,
                w.to as f64,
                w.level,
                w.rise,
                w.noise,
                w.seen as f64,
            ]
            .map(Some)
            .to_vec()
        });
        Some(PolicyState {
            series: vec![
                self.losses.iter().copied().map(Some).collect(),
                watch,
                vec![Some(self.since_move as f64), Some(self.block as f64)],
            ],
            counter: self.losses.len(),
        })
    }

    fn load_state(&mut self, state: PolicyState) {
        let mut series = state.series.into_iter();
        let mut next = || -> Vec<f64> {
            series
                .next()
                .unwrap_or_default()
                .into_iter()
                .map(|x| x.unwrap_or(0.0))
                .collect()
        };
        self.losses = next();
        let watch = next();
        self.watching = (watch.len() == 6).then(|| Watch {
            from: watch[0] as usize,
            to: watch[1] as usize,
            level: watch[2],
            rise: watch[3],
            noise: watch[4],
            seen: watch[5] as usize,
        });
        let counts = next();
        self.since_move = counts
            .first()
            .map_or(0, |&c| c as usize)
            .min(self.losses.len());
        self.block = counts
            .get(1)
            .map_or(self.config.patience, |&c| (c as usize).max(1));
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

    /// Feeds `losses` one per step, applying every decision; the fronts.
    fn run(rule: &mut Evidence, losses: &[f64]) -> Vec<usize> {
        let mut frozen = 0;
        let mut fronts = Vec::new();
        for (step, &loss) in losses.iter().enumerate() {
            if let Some(front) = rule.held_out_loss(state(frozen, step + 1), loss) {
                frozen = front;
            }
            fronts.push(frozen);
        }
        fronts
    }

    fn rule() -> Evidence {
        Evidence::new(EvidenceConfig::new().with_every_steps(1).with_patience(2))
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
        // Two blocks of two after each move: 6 (half of 12), 9, 11.
        assert_eq!(fronts[..6].iter().max(), Some(&0));
        assert_eq!(fronts[6], 6);
        assert_eq!(fronts[10], 9);
        assert_eq!(fronts[14], 11);
        assert_eq!(fronts.last(), Some(&11));
    }

    #[test]
    fn a_rise_after_a_freeze_thaws_it_and_the_rule_waits_longer() {
        let mut rule = rule();
        let mut losses = vec![1.0, 0.5, 0.3, 0.2, 0.2, 0.21, 0.2, 0.2];
        let fronts = run(&mut rule, &losses);
        assert_eq!(fronts.last(), Some(&6));
        // The loss jumps: thawed back to 0, then blocks of 4.
        losses = vec![0.5];
        let mut frozen = 6;
        let front = rule.held_out_loss(state(frozen, 9), losses[0]);
        assert_eq!(front, Some(0));
        frozen = 0;
        let mut moved = Vec::new();
        for step in 10..26 {
            if let Some(front) = rule.held_out_loss(state(frozen, step), 0.2) {
                frozen = front;
                moved.push(step);
            }
        }
        // Eight fresh losses (two blocks of four) before the next freeze.
        assert_eq!(moved.first(), Some(&17));
    }

    #[test]
    fn the_state_survives_a_checkpoint() {
        let mut a = rule();
        let losses = [1.0, 0.5, 0.3, 0.2, 0.2, 0.2];
        run(&mut a, &losses);
        let mut b = rule();
        b.load_state(a.save_state().unwrap());
        let (x, y) = (
            a.held_out_loss(state(0, 7), 0.2),
            b.held_out_loss(state(0, 7), 0.2),
        );
        assert_eq!(x, y);
        assert_eq!(x, Some(6));
        assert_eq!(a.save_state(), b.save_state());
    }

    #[test]
    fn the_checks_name_the_field() {
        let bad = EvidenceConfig::new().with_plateau_below(1.5);
        assert_eq!(bad.validate().unwrap_err().0, "plateau_below");
        assert!(EvidenceConfig::new().with_alpha(0.0).validate().is_err());
        assert!(EvidenceConfig::new().validate().is_ok());
    }
}
