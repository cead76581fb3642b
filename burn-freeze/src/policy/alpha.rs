//! The alpha bound, written once: its accepted range, the most one decision
//! freezes, and its closed form over epochs.

use crate::PolicyConfigError;

/// The range every rule accepts for alpha, the share of the active layers
/// one decision may freeze.
const ALPHA_RANGE: &str = "a number in (0, 1]";

/// Checks an alpha: in (0, 1].
pub(crate) fn check_alpha(alpha: f64) -> Result<(), PolicyConfigError> {
    if alpha > 0.0 && alpha <= 1.0 {
        Ok(())
    } else {
        Err(PolicyConfigError::new("alpha", alpha, ALPHA_RANGE))
    }
}

/// The alpha bound of one decision: the most layers it may freeze from
/// `frozen` of `layers`, `alpha` of the active layers rounded up, at least
/// one (none when no layer is active).
pub(crate) fn alpha_most(alpha: f64, frozen: usize, layers: usize) -> usize {
    let active = layers.saturating_sub(frozen);
    if active == 0 {
        return 0;
    }
    ceil_tolerant(alpha * active as f64).clamp(1, active)
}

/// `ceil(x)` that ignores floating-point noise just above an integer.
fn ceil_tolerant(x: f64) -> usize {
    (x - 1e-9).ceil().max(0.0) as usize
}

/// The alpha bound's closed form: `ceil(L * (1 - (1 - alpha)^T))` layers frozen
/// in epoch `T`.
///
/// ```
/// use burn_freeze::alpha_front;
///
/// let fronts: Vec<usize> = (0..10).map(|t| alpha_front(12, 1.0 / 3.0, t)).collect();
/// assert_eq!(fronts, [0, 4, 7, 9, 10, 11, 11, 12, 12, 12]);
/// ```
pub fn alpha_front(layers: usize, alpha: f64, epoch: usize) -> usize {
    let frozen = layers as f64 * (1.0 - (1.0 - alpha).powi(epoch as i32));
    ceil_tolerant(frozen).min(layers)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bound_freezes_alpha_of_the_active_layers_at_least_one() {
        assert_eq!(alpha_most(0.5, 0, 12), 6);
        assert_eq!(alpha_most(1.0 / 3.0, 4, 12), 3);
        assert_eq!(alpha_most(0.01, 10, 12), 1);
        assert_eq!(alpha_most(1.0, 3, 12), 9);
        assert_eq!(alpha_most(0.5, 12, 12), 0);
    }

    #[test]
    fn alpha_is_checked_once() {
        assert!(check_alpha(1.0).is_ok());
        assert!(check_alpha(0.5).is_ok());
        for bad in [0.0, -0.1, 1.5, f64::NAN] {
            let error = check_alpha(bad).unwrap_err();
            assert_eq!((error.field, error.accepted), ("alpha", ALPHA_RANGE));
        }
    }
}
