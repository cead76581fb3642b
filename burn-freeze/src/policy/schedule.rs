//! A fixed freeze schedule: the front per epoch, given or from the alpha closed form.

use super::{FreezePolicy, FreezeState, ceil_tolerant};

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
