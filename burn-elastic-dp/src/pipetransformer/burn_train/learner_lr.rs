//! The learner's LR scheduler as the trainer's learning-rate source.

use std::sync::{Arc, Mutex};

use burn::train::{Learner, LearningComponentsTypes};

use crate::pipetransformer::trainer::LrSource;

/// The learner, shared with the strategy, stepping its scheduler: one
/// `lr_step` per optimizer step, as burn-train's own loop does, so the
/// learner's scheduler (and burn-train's checkpoint of it) advances with
/// the run.
pub(super) struct LearnerLr<LC: LearningComponentsTypes>(pub(super) Arc<Mutex<Learner<LC>>>);

impl<LC: LearningComponentsTypes> LrSource for LearnerLr<LC>
where
    Learner<LC>: Send,
{
    fn next(&mut self, _step: usize) -> f64 {
        let mut learner = self.0.lock().unwrap_or_else(|p| p.into_inner());
        learner.lr_step();
        learner.lr_current()
    }

    /// burn-train's checkpointer saves the scheduler with the learner.
    fn save(&self) -> Result<Option<Vec<u8>>, String> {
        Ok(None)
    }

    fn load(&mut self, _bytes: Vec<u8>) -> Result<(), String> {
        Ok(())
    }
}
