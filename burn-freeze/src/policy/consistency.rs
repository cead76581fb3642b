//! Per-layer gradient consistency over a window of steps: how much of a layer's gradient is a
//! direction that persists from step to step (signal) rather than batch noise.
//!
//! A layer's gradient at step `t` is `g_t = mu + e_t`, the mean `mu` over the data plus the
//! batch's noise `e_t`. Over a block of `n` steps, with `S = sum_t g_t` and `E = sum_t ||g_t||^2`,
//! `E[||S||^2] = n^2 ||mu||^2 + n sigma^2` and `E[E] = n (||mu||^2 + sigma^2)`, so
//! `(||S||^2 - E) / (n (n - 1))` estimates `||mu||^2` and `E / n` estimates `||mu||^2 + sigma^2`.
//! Their ratio is the **signal share** of the layer's gradient, in [0, 1]: near 1 while every
//! batch pushes the layer the same way (it still descends), near 0 once the batches disagree
//! (the updates are noise: the layer has converged, to the noise of its batch). It is the
//! inverse of the layer's gradient noise scale (McCandlish et al. 2018) and, under plain SGD,
//! the square of APF's effective perturbation `||W(t) - W(t-n)|| / sum ||dW||` corrected for the
//! window's length. It is scale-free: the loss's units, the learning rate and the layer's size
//! cancel, so one bound serves every layer and task, and no layer is ranked against another.
//!
//! The sums `S` are kept by the freeze front ([`FreezeFront::gradient_sum_norms`]); a block ends
//! whenever they are read and reset (a check, an epoch's end, a checkpoint), and the estimates
//! of several blocks add up, so a window may hold blocks of any lengths.
//!
//! [`FreezeFront::gradient_sum_norms`]: crate::FreezeFront::gradient_sum_norms

use serde::{Deserialize, Serialize};

use super::GradNorm;

/// How a layer's gradient consistency is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum ConsistencyMeasure {
    /// The share of the gradient's energy (squared L2 norm) that persists
    /// across steps: `(||S||^2 - E) / ((n - 1) E)` per block, pooled. The
    /// default.
    EnergyShare,
    /// APF's per-parameter sign consistency: `||S||_1 / sum_t ||g_t||_1`,
    /// `1/sqrt(n)` for noise and 1 for a steady direction, mapped to [0, 1]
    /// by `(ratio sqrt(n) - 1) / (sqrt(n) - 1)` and averaged over blocks
    /// weighted by their steps.
    SignConsistency,
}

/// One layer's statistics: the block still open and the closed blocks.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub(crate) struct LayerWindow {
    /// Open block: `sum_t ||g_t||^2`, `sum_t ||g_t||_1` and its steps.
    open_sq: f64,
    open_l1: f64,
    open_steps: usize,
    /// Closed blocks: `sum (||S||^2 - E)`, `sum n (n - 1)`, `sum E`, `sum n`.
    excess: f64,
    pairs: f64,
    energy: f64,
    steps: f64,
    /// Closed blocks of at least 2 steps: `sum n * sign share`, `sum n`.
    sign_weighted: f64,
    sign_steps: f64,
}

impl LayerWindow {
    /// The layer's signal share over the closed blocks by `measure`;
    /// `None` until a block of at least 2 steps closed.
    pub(crate) fn share(&self, measure: ConsistencyMeasure) -> Option<f64> {
        match measure {
            ConsistencyMeasure::EnergyShare => {
                if self.pairs <= 0.0 {
                    return None;
                }
                if self.energy <= 0.0 {
                    // No gradient at all over the window: nothing to gain.
                    return Some(0.0);
                }
                let signal = self.excess / self.pairs;
                let total = self.energy / self.steps;
                Some((signal / total).clamp(0.0, 1.0))
            }
            ConsistencyMeasure::SignConsistency => {
                (self.sign_steps > 0.0).then(|| self.sign_weighted / self.sign_steps)
            }
        }
    }
}

/// Per-layer windows of gradient statistics (see the module's docs).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub(crate) struct GradientWindow {
    layers: Vec<LayerWindow>,
}

impl GradientWindow {
    fn layer(&mut self, index: usize) -> &mut LayerWindow {
        if self.layers.len() <= index {
            self.layers.resize(index + 1, LayerWindow::default());
        }
        &mut self.layers[index]
    }

    /// Adds one step's per-layer gradient norms (`None`: frozen, or no
    /// gradient) to the open block.
    pub(crate) fn add_step(&mut self, norms: &[Option<GradNorm>]) {
        for (index, norm) in norms.iter().enumerate() {
            if let Some(norm) = norm
                && norm.l2.is_finite()
                && norm.l1.is_finite()
            {
                let layer = self.layer(index);
                layer.open_sq += norm.l2 * norm.l2;
                layer.open_l1 += norm.l1;
                layer.open_steps += 1;
            }
        }
    }

    /// Closes the open block with the norms of each layer's gradients
    /// summed over it (`None`: no sum; the block is dropped for that
    /// layer, as its sum restarted or the layer froze).
    pub(crate) fn close_block(&mut self, sums: &[Option<GradNorm>]) {
        let layers = self.layers.len().max(sums.len());
        for index in 0..layers {
            let sum = sums.get(index).copied().flatten();
            let layer = self.layer(index);
            let n = layer.open_steps as f64;
            if let Some(sum) = sum
                && layer.open_steps >= 1
                && sum.l2.is_finite()
                && sum.l1.is_finite()
            {
                layer.excess += sum.l2 * sum.l2 - layer.open_sq;
                layer.pairs += n * (n - 1.0);
                layer.energy += layer.open_sq;
                layer.steps += n;
                if layer.open_steps >= 2 {
                    let root = n.sqrt();
                    let share = if layer.open_l1 > 0.0 {
                        let ratio = sum.l1 / layer.open_l1;
                        ((ratio * root - 1.0) / (root - 1.0)).clamp(0.0, 1.0)
                    } else {
                        0.0
                    };
                    layer.sign_weighted += n * share;
                    layer.sign_steps += n;
                }
            }
            layer.open_sq = 0.0;
            layer.open_l1 = 0.0;
            layer.open_steps = 0;
        }
    }

    /// Each layer's signal share over the closed blocks (`None`: no block
    /// of 2 steps yet), for `layers` layers.
    pub(crate) fn shares(&self, layers: usize, measure: ConsistencyMeasure) -> Vec<Option<f64>> {
        (0..layers)
            .map(|index| self.layers.get(index).and_then(|l| l.share(measure)))
            .collect()
    }

    /// Forgets the closed blocks (the open one goes on): the next window.
    pub(crate) fn start_window(&mut self) {
        for layer in &mut self.layers {
            *layer = LayerWindow {
                open_sq: layer.open_sq,
                open_l1: layer.open_l1,
                open_steps: layer.open_steps,
                ..LayerWindow::default()
            };
        }
    }

    /// Whether no layer has a closed block of at least 2 steps.
    pub(crate) fn is_empty(&self) -> bool {
        self.layers.iter().all(|l| l.pairs <= 0.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn norm(v: &[f64]) -> GradNorm {
        GradNorm {
            l1: v.iter().map(|x| x.abs()).sum(),
            l2: v.iter().map(|x| x * x).sum::<f64>().sqrt(),
        }
    }

    /// Feeds vectors `grads` per step for one layer, closing after each
    /// `block` steps.
    fn window(grads: &[Vec<f64>], block: usize) -> GradientWindow {
        let mut window = GradientWindow::default();
        let mut sum = vec![0.0; grads[0].len()];
        for (step, g) in grads.iter().enumerate() {
            window.add_step(&[Some(norm(g))]);
            for (s, x) in sum.iter_mut().zip(g) {
                *s += x;
            }
            if (step + 1) % block == 0 {
                window.close_block(&[Some(norm(&sum))]);
                sum.iter_mut().for_each(|s| *s = 0.0);
            }
        }
        window
    }

    /// A deterministic +-1 pattern of `dim` values per step (no two steps
    /// alike, balanced signs).
    fn noise(step: usize, dim: usize) -> Vec<f64> {
        (0..dim)
            .map(|i| {
                // splitmix64 of the (step, value) pair.
                let mut z = ((step as u64) << 32 | i as u64).wrapping_add(0x9E37_79B9_7F4A_7C15);
                z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
                z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
                z ^= z >> 31;
                if z & 1 == 0 { 1.0 } else { -1.0 }
            })
            .collect()
    }

    #[test]
    fn a_steady_direction_has_share_one() {
        let grads: Vec<Vec<f64>> = (0..8).map(|_| vec![0.5, -1.0, 2.0]).collect();
        let window = window(&grads, 4);
        for measure in [
            ConsistencyMeasure::EnergyShare,
            ConsistencyMeasure::SignConsistency,
        ] {
            let share = window.shares(1, measure)[0].unwrap();
            assert!((share - 1.0).abs() < 1e-9, "{measure:?}: {share}");
        }
    }

    #[test]
    fn noise_has_a_share_near_zero_and_signal_in_noise_in_between() {
        let dim = 4096;
        let pure: Vec<Vec<f64>> = (0..16).map(|t| noise(t, dim)).collect();
        let pure = window(&pure, 4);
        for measure in [
            ConsistencyMeasure::EnergyShare,
            ConsistencyMeasure::SignConsistency,
        ] {
            let share = pure.shares(1, measure)[0].unwrap();
            assert!(share < 0.05, "{measure:?}: {share}");
        }
        // Mean 1 per value under noise of 1 per value: half the energy.
        let mixed: Vec<Vec<f64>> = (0..16)
            .map(|t| noise(t, dim).into_iter().map(|e| e + 1.0).collect())
            .collect();
        let share = window(&mixed, 4).shares(1, ConsistencyMeasure::EnergyShare)[0].unwrap();
        assert!((share - 0.5).abs() < 0.05, "{share}");
    }

    #[test]
    fn blocks_of_any_length_pool_and_a_new_window_forgets() {
        let grads: Vec<Vec<f64>> = (0..12).map(|t| noise(t, 2048)).collect();
        let in_fours = window(&grads, 4).shares(1, ConsistencyMeasure::EnergyShare)[0].unwrap();
        let in_threes = window(&grads, 3).shares(1, ConsistencyMeasure::EnergyShare)[0].unwrap();
        assert!(in_fours < 0.05 && in_threes < 0.05);
        let mut w = window(&grads, 4);
        assert!(!w.is_empty());
        w.start_window();
        assert!(w.is_empty());
        assert_eq!(w.shares(1, ConsistencyMeasure::EnergyShare), [None]);
    }

    #[test]
    fn a_layer_without_a_sum_drops_its_block() {
        let mut w = GradientWindow::default();
        let g = norm(&[1.0, 1.0]);
        w.add_step(&[Some(g), Some(g)]);
        w.add_step(&[Some(g), Some(g)]);
        w.close_block(&[Some(norm(&[2.0, 2.0])), None]);
        let shares = w.shares(2, ConsistencyMeasure::EnergyShare);
        assert!((shares[0].unwrap() - 1.0).abs() < 1e-9);
        assert_eq!(shares[1], None);
    }
}
