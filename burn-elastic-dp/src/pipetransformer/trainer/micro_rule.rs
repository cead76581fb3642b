//! What the trainer knows of micro-batch times, and the count it chose.

use burn_pipe::{MicroBatchChoice, MicroBatchTimes};

/// What the trainer knows of micro-batch times, and what it chose.
#[derive(Debug)]
pub(super) struct MicroBatchRule {
    /// Unit times at several micro-batch sizes: measured on the first batch
    /// under profiled costs, or given ([`Trainer::set_micro_batch_times`](super::Trainer::set_micro_batch_times)).
    pub(super) times: Option<MicroBatchTimes>,
    /// Whether M is still to be chosen before the next step (a new or
    /// resumed trainer).
    pub(super) pending: bool,
    /// The choice the group runs with, if M was chosen.
    pub(super) choice: Option<MicroBatchChoice>,
}

impl Default for MicroBatchRule {
    fn default() -> Self {
        Self {
            times: None,
            pending: true,
            choice: None,
        }
    }
}
