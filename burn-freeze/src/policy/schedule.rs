//! A fixed freeze schedule: the front per epoch, given or from the alpha closed form.

use super::alpha::{alpha_front, check_alpha};
use super::{FreezePolicy, FreezeState};
use crate::PolicyConfigError;

/// Freezes a fixed number of layers in each epoch.
///
/// ```
/// use burn_freeze::{FixedSchedule, FreezePolicy, FreezeState};
///
/// let mut schedule = FixedSchedule::alpha(12, 0.5);
/// let mut state = FreezeState { frozen_layers: 0, num_layers: 12, epoch: 0, step: 0 };
/// let mut fronts = vec![0];
/// for epoch in 1..5 {
///     state.frozen_layers = schedule.after_epoch(state).unwrap_or(state.frozen_layers);
///     state.epoch = epoch;
///     fronts.push(state.frozen_layers);
/// }
/// assert_eq!(fronts, [0, 6, 9, 11, 12]);
/// ```
#[derive(Debug, Clone, PartialEq)]
pub enum FixedSchedule {
    /// `fronts[T]` layers frozen in epoch `T`; the last entry holds
    /// afterwards. An entry below the one before thaws layers.
    Fronts(Vec<usize>),
    /// The alpha closed form ([`alpha_front`]) for a model of `layers` layers.
    Alpha {
        /// Layers in the model.
        layers: usize,
        /// Fraction of the remaining layers frozen per epoch.
        alpha: f64,
    },
}

impl FixedSchedule {
    /// The alpha closed form for `layers` layers.
    pub fn alpha(layers: usize, alpha: f64) -> Self {
        Self::Alpha { layers, alpha }
    }

    /// Checks the schedule's values: an [`Alpha`](Self::Alpha)'s alpha in
    /// (0, 1] (a list of fronts is any list: an entry beyond the model is
    /// clamped to it).
    ///
    /// ```
    /// use burn_freeze::FixedSchedule;
    ///
    /// assert!(FixedSchedule::alpha(12, 0.5).validate().is_ok());
    /// assert_eq!(FixedSchedule::alpha(12, 1.5).validate().unwrap_err().field, "alpha");
    /// ```
    pub fn validate(&self) -> Result<(), PolicyConfigError> {
        match self {
            Self::Fronts(_) => Ok(()),
            Self::Alpha { alpha, .. } => check_alpha(*alpha),
        }
    }

    /// Layers frozen in epoch `epoch`.
    pub fn front(&self, epoch: usize) -> usize {
        match self {
            Self::Fronts(fronts) => fronts.get(epoch).or(fronts.last()).copied().unwrap_or(0),
            Self::Alpha { layers, alpha } => alpha_front(*layers, *alpha, epoch),
        }
    }
}

impl FreezePolicy for FixedSchedule {
    /// The next epoch's entry. [`Fronts`](Self::Fronts) may go down (the
    /// front thaws); [`Alpha`](Self::Alpha) never returns a front below the
    /// current one (an alpha outside (0, 1) could), so it only freezes.
    fn after_epoch(&mut self, state: FreezeState) -> Option<usize> {
        let front = self.front(state.epoch + 1);
        match self {
            Self::Fronts(_) => Some(front),
            Self::Alpha { .. } => Some(front.max(state.frozen_layers)),
        }
    }
}
