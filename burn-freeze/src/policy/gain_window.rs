//! Per-layer update gains over a sliding window of steps: each bottom block's share of the
//! loss's first-order decrease (loss-change allocation; see
//! [`FreezeFront::last_update_gains`](crate::FreezeFront::last_update_gains)), with its
//! uncertainty.
//!
//! One step's gain is the dot product of one batch's gradient with one move: noisy. The window
//! keeps each step's gains, so a share is read with its standard error (the ratio estimator's,
//! over the window's steps), and a block has stopped gaining only when the share's upper
//! confidence bound is under the rule's bound. A window whose total gain is not clearly
//! positive says nothing of a layer ([`GainReading::NoGain`] is told apart for the log only:
//! a gain read at the end of noisy moves counts the curvature they climbed against it).

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use super::FreezeState;

/// Standard errors between an estimate and the bound it is tested
/// against (a one-sided test at about 97.7% under normal noise).
const Z: f64 = 2.0;

/// Steps a window needs before it says anything (a standard error from
/// fewer is itself too noisy).
pub(crate) const MIN_STEPS: usize = 4;

/// One step's gains.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct GainStep {
    /// Per layer (`None`: frozen, or not read).
    layers: Vec<Option<f64>>,
    /// Every trainable unit's together.
    total: f64,
}

/// What a window's gains say.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum GainReading {
    /// Fewer than [`MIN_STEPS`] steps brought a gain.
    Unread,
    /// The model's total gain over the window is neither clearly positive
    /// nor clearly not: no evidence either way.
    Uncertain,
    /// The model as a whole clearly did not gain over the window.
    NoGain,
    /// For each bottom block of the active layers, from one layer up: its
    /// share of the window's decrease and that share's upper confidence
    /// bound.
    Shares(Vec<(f64, f64)>),
}

/// The last steps' update gains, per layer and in all.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub(crate) struct GainWindow {
    steps: VecDeque<GainStep>,
}

/// Mean and standard error of the mean of `values` (at least 2).
fn mean_and_error(values: impl Iterator<Item = f64> + Clone) -> (f64, f64) {
    let n = values.clone().count() as f64;
    let mean = values.clone().sum::<f64>() / n;
    let var = values.map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0);
    (mean, (var / n).sqrt())
}

impl GainWindow {
    /// Adds one step's gains (`None` total: none read, as for the first
    /// step after a repartition), keeping the last `steps` steps.
    pub(crate) fn add_step(&mut self, layers: &[Option<f64>], total: Option<f64>, steps: usize) {
        let Some(total) = total.filter(|t| t.is_finite()) else {
            return;
        };
        let layers = layers.iter().map(|g| g.filter(|g| g.is_finite())).collect();
        self.steps.push_back(GainStep { layers, total });
        while self.steps.len() > steps.max(MIN_STEPS) {
            self.steps.pop_front();
        }
    }

    /// What the window says of each bottom block of `state`'s active
    /// layers.
    ///
    /// Where the model's total gain is within its noise, the reading is
    /// [`GainReading::Uncertain`], unless `bound_uncertain`: then each
    /// block's gain is read against the most the model plausibly gained,
    /// the total's upper confidence bound (a block whose own upper bound
    /// is a small share of that gains little, whatever the model does).
    pub(crate) fn read(&self, state: FreezeState, bound_uncertain: bool) -> GainReading {
        let n = self.steps.len();
        if n < MIN_STEPS {
            return GainReading::Unread;
        }
        let totals = self.steps.iter().map(|s| s.total);
        let (mean, error) = mean_and_error(totals.clone());
        if mean + Z * error <= 0.0 {
            return GainReading::NoGain;
        }
        if mean - Z * error <= 0.0 {
            if !bound_uncertain {
                return GainReading::Uncertain;
            }
            // Each block's mean gain a step and its upper bound, over the
            // most the model plausibly gained a step.
            let scale = mean + Z * error;
            return GainReading::Shares(self.per_block(state, |blocks| {
                let (mean, error) = mean_and_error(blocks.iter().copied());
                (mean / scale, (mean + Z * error) / scale)
            }));
        }
        let sum_total: f64 = totals.sum();
        GainReading::Shares(self.per_block(state, |blocks| {
            let share = blocks.iter().sum::<f64>() / sum_total;
            let residual: f64 = blocks
                .iter()
                .zip(&self.steps)
                .map(|(b, s)| (b - share * s.total).powi(2))
                .sum();
            let error = (residual * n as f64 / (n as f64 - 1.0)).sqrt() / sum_total;
            (share, share + Z * error)
        }))
    }

    /// `read` of each bottom block of `state`'s active layers, from one
    /// layer up: it gets the block's gain at each step of the window.
    fn per_block(
        &self,
        state: FreezeState,
        read: impl Fn(&[f64]) -> (f64, f64),
    ) -> Vec<(f64, f64)> {
        let mut blocks = vec![0.0; self.steps.len()];
        (state.frozen_layers..state.num_layers)
            .map(|layer| {
                for (block, step) in blocks.iter_mut().zip(&self.steps) {
                    *block += step.layers.get(layer).copied().flatten().unwrap_or(0.0);
                }
                read(&blocks)
            })
            .collect()
    }

    /// Forgets every step (after the front moved: the allocation among
    /// the layers left is another).
    pub(crate) fn clear(&mut self) {
        self.steps.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(frozen: usize, layers: usize) -> FreezeState {
        FreezeState {
            frozen_layers: frozen,
            num_layers: layers,
            epoch: 0,
            step: 1,
        }
    }

    fn shares(reading: GainReading) -> Vec<(f64, f64)> {
        match reading {
            GainReading::Shares(shares) => shares,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn steady_gains_share_the_decrease_from_the_front_up() {
        let mut window = GainWindow::default();
        for _ in 0..4 {
            window.add_step(&[Some(0.0), Some(1.0), Some(3.0)], Some(10.0), 8);
        }
        let read = shares(window.read(state(0, 3), false));
        let expected = [0.0, 0.1, 0.4];
        for ((share, upper), want) in read.iter().zip(expected) {
            assert!((share - want).abs() < 1e-12 && (upper - want).abs() < 1e-12);
        }
        // From a front of 1: layer 1, then layers 1 and 2.
        let read = shares(window.read(state(1, 3), false));
        assert!((read[0].0 - 0.1).abs() < 1e-12 && (read[1].0 - 0.4).abs() < 1e-12);
    }

    #[test]
    fn noisy_gains_widen_the_bound() {
        let mut window = GainWindow::default();
        for step in 0..8 {
            let sign = if step % 2 == 0 { 1.0 } else { -1.0 };
            window.add_step(&[Some(sign * 5.0), Some(1.0)], Some(10.0 + sign), 8);
        }
        let read = shares(window.read(state(0, 2), false));
        // Its mean share is near 0, but the noise keeps the bound high.
        assert!(read[0].0.abs() < 0.05, "{read:?}");
        assert!(read[0].1 > 0.3, "{read:?}");
    }

    #[test]
    fn a_window_says_no_gain_only_when_it_is_clear() {
        let mut window = GainWindow::default();
        assert_eq!(window.read(state(0, 2), false), GainReading::Unread);
        for total in [1.0, -1.5, 0.5, -1.0] {
            window.add_step(&[Some(0.0), Some(0.0)], Some(total), 8);
        }
        assert_eq!(window.read(state(0, 2), false), GainReading::Uncertain);
        window.clear();
        for total in [-1.0, -1.2, -0.9, -1.1] {
            window.add_step(&[Some(0.0), Some(0.0)], Some(total), 8);
        }
        assert_eq!(window.read(state(0, 2), false), GainReading::NoGain);
        // A step without a reading adds nothing; the window slides.
        window.add_step(&[None, None], None, 4);
        for _ in 0..4 {
            window.add_step(&[Some(1.0), Some(1.0)], Some(4.0), 4);
        }
        assert!((shares(window.read(state(0, 2), false))[0].0 - 0.25).abs() < 1e-12);
    }

    #[test]
    fn an_uncertain_total_bounds_each_block_by_its_upper_bound() {
        // The model's gain is within its noise; layer 0 gains nothing a
        // step (a little noise), layer 1 carries the rest.
        let mut window = GainWindow::default();
        for (step, total) in [1.0, -1.5, 0.5, -1.0, 1.2, -0.8].into_iter().enumerate() {
            let wobble = if step % 2 == 0 { 0.01 } else { -0.01 };
            window.add_step(&[Some(wobble), Some(total - wobble)], Some(total), 8);
        }
        assert_eq!(window.read(state(0, 2), false), GainReading::Uncertain);
        let read = shares(window.read(state(0, 2), true));
        // Layer 0's bound is a small share of the most the model gained;
        // layers 0 and 1 together are the whole of it.
        assert!(read[0].1 < 0.05, "{read:?}");
        assert!((read[1].1 - 1.0).abs() < 1e-9, "{read:?}");
    }
}
