//! Time to accuracy, MLPerf style: the training seconds until the held-out
//! accuracy first reaches a target, and the speed-up at equal accuracy.

use serde::{Deserialize, Serialize};

/// The target's margin below (b*)'s final mean accuracy, in points.
pub const TARGET_MARGIN_POINTS: f64 = 0.5;

/// Accuracies this close to the target count as reaching it (sums of
/// percentages are not exact).
const TOLERANCE: f64 = 1e-9;

/// The cumulative training seconds at the end of the first epoch whose
/// held-out accuracy reaches `target` (both in percent); `None` ("never")
/// where no epoch reaches it. `epochs`: per epoch, its training seconds
/// (evaluation excluded) and the accuracy after it.
///
/// ```
/// use pipetransformer_harness::bench::headline::suite::time_to_accuracy;
///
/// let epochs = [(10.0, 70.0), (12.0, 84.0), (11.0, 86.0)];
/// assert_eq!(time_to_accuracy(&epochs, 80.0), Some(22.0));
/// assert_eq!(time_to_accuracy(&epochs, 90.0), None);
/// ```
pub fn time_to_accuracy(epochs: &[(f64, f64)], target: f64) -> Option<f64> {
    let mut seconds = 0.0;
    for &(epoch_seconds, accuracy) in epochs {
        seconds += epoch_seconds;
        if accuracy >= target - TOLERANCE {
            return Some(seconds);
        }
    }
    None
}

/// The target of a task: (b*)'s final mean accuracy minus
/// [`TARGET_MARGIN_POINTS`], in percent.
pub fn target_of(strongest_final_mean: f64) -> f64 {
    strongest_final_mean - TARGET_MARGIN_POINTS
}

/// One configuration's time to accuracy over the seeds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TimeToAccuracy {
    /// The target, in percent.
    pub target_percent: f64,
    /// Per seed, in the order run: the seconds, or `None` (never reached).
    pub seconds: Vec<Option<f64>>,
    /// Seeds that reached the target.
    pub reached: usize,
    /// The mean over the seeds; `None` ("never") where a seed never
    /// reached the target.
    pub mean_seconds: Option<f64>,
}

impl TimeToAccuracy {
    /// Over `runs` (per seed, its epochs' seconds and accuracies in
    /// percent) against `target`.
    ///
    /// ```
    /// use pipetransformer_harness::bench::headline::suite::TimeToAccuracy;
    ///
    /// let runs = [vec![(10.0, 81.0), (10.0, 85.0)], vec![(8.0, 70.0), (8.0, 82.0)]];
    /// let tta = TimeToAccuracy::of(&runs, 80.0);
    /// assert_eq!(tta.seconds, [Some(10.0), Some(16.0)]);
    /// assert_eq!(tta.mean_seconds, Some(13.0));
    /// let never = TimeToAccuracy::of(&runs, 84.0);
    /// assert_eq!((never.reached, never.mean_seconds), (1, None));
    /// ```
    pub fn of(runs: &[Vec<(f64, f64)>], target: f64) -> Self {
        let seconds: Vec<Option<f64>> = runs
            .iter()
            .map(|epochs| time_to_accuracy(epochs, target))
            .collect();
        let reached = seconds.iter().flatten().count();
        let mean_seconds = (reached == seconds.len() && reached > 0)
            .then(|| seconds.iter().flatten().sum::<f64>() / reached as f64);
        Self {
            target_percent: target,
            seconds,
            reached,
            mean_seconds,
        }
    }

    /// The mean in seconds, or `never (k/n seeds reached)`.
    pub fn display(&self) -> String {
        match self.mean_seconds {
            Some(seconds) => format!("{seconds:.1}"),
            None => format!("never ({}/{})", self.reached, self.seconds.len()),
        }
    }
}

/// The speed-up at equal accuracy: (b*)'s mean time to accuracy over this
/// configuration's; `None` where either never reached the target.
pub fn speedup_at_equal_accuracy(strongest: &TimeToAccuracy, own: &TimeToAccuracy) -> Option<f64> {
    match (strongest.mean_seconds, own.mean_seconds) {
        (Some(strongest), Some(own)) if own > 0.0 => Some(strongest / own),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_epoch_at_the_target_counts_with_every_second_before_it() {
        let epochs = [(5.0, 60.0), (4.0, 79.5), (3.0, 81.0), (3.0, 70.0)];
        // 79.5 < 80: the third epoch reaches it, 5 + 4 + 3 seconds.
        assert_eq!(time_to_accuracy(&epochs, 80.0), Some(12.0));
        // Reached exactly at the first epoch.
        assert_eq!(time_to_accuracy(&epochs, 60.0), Some(5.0));
        // A later drop does not undo it; a higher target is never reached.
        assert_eq!(time_to_accuracy(&epochs, 81.0), Some(12.0));
        assert_eq!(time_to_accuracy(&epochs, 81.5), None);
        assert_eq!(time_to_accuracy(&[], 0.0), None);
    }

    #[test]
    fn a_target_rounded_below_an_accuracy_is_reached() {
        // 100 * 0.873 - 0.5 is not exactly 86.8 in floating point.
        let target = target_of(100.0 * 0.873);
        assert_eq!(time_to_accuracy(&[(1.0, 86.8)], target), Some(1.0));
    }

    #[test]
    fn one_seed_that_never_reaches_makes_the_mean_never_and_no_speedup() {
        let strongest = TimeToAccuracy::of(
            &[
                vec![(10.0, 80.0), (10.0, 90.0)],
                vec![(10.0, 89.0), (10.0, 90.0)],
            ],
            89.0,
        );
        assert_eq!(strongest.mean_seconds, Some(15.0));
        let fast = TimeToAccuracy::of(&[vec![(3.0, 89.5)], vec![(2.0, 80.0), (4.0, 89.0)]], 89.0);
        assert_eq!(fast.seconds, [Some(3.0), Some(6.0)]);
        assert_eq!(
            speedup_at_equal_accuracy(&strongest, &fast),
            Some(15.0 / 4.5)
        );
        let never = TimeToAccuracy::of(&[vec![(3.0, 89.5)], vec![(2.0, 80.0), (4.0, 88.0)]], 89.0);
        assert_eq!((never.reached, never.mean_seconds), (1, None));
        assert_eq!(never.display(), "never (1/2)");
        assert_eq!(speedup_at_equal_accuracy(&strongest, &never), None);
        assert_eq!(speedup_at_equal_accuracy(&never, &fast), None);
    }
}
