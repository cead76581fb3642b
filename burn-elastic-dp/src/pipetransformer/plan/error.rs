//! Why a plan could not be made.

use crate::pipetransformer::trainer::TrainerError;

/// A planner input that does not fit.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PlanError {
    /// A value out of its range; the message names it and the range.
    #[error("{0}")]
    Invalid(String),
}

/// `Err(PlanError::Invalid)` with the formatted message unless `ok`.
pub(crate) fn check(ok: bool, message: impl FnOnce() -> String) -> Result<(), PlanError> {
    if ok {
        Ok(())
    } else {
        Err(PlanError::Invalid(message()))
    }
}

/// A value the trainer's own check refused, as the planner reports it.
pub(crate) fn refused(error: TrainerError) -> PlanError {
    PlanError::Invalid(error.to_string())
}
