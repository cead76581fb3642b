//! Stopping a run when asked (a SIGTERM): at the next step boundary, after a checkpoint.

use super::Trainer;
use super::bounds::TrainerTypes;
use super::error::TrainerError;

impl<TT: TrainerTypes> Trainer<TT> {
    /// Watches `signal`: once it is raised (by a SIGTERM handler, say:
    /// [`StopSignal::on_termination`](crate::StopSignal::on_termination)),
    /// the epoch under way stops after its current step, a checkpoint is
    /// written (when configured) and the call returns
    /// [`TrainerError::Stopped`]. Across processes the request travels in
    /// the next step's header, so every process stops after that same step
    /// and writes its checkpoint there, whichever process was signalled.
    ///
    /// ```
    /// # use burn_elastic_dp::StopSignal;
    /// let signal = StopSignal::new();
    /// // trainer.set_stop_signal(signal.clone()); ... signal.raise();
    /// # signal.raise();
    /// # assert!(signal.raised());
    /// ```
    pub fn set_stop_signal(&mut self, signal: crate::StopSignal) {
        self.group.set_stop_signal(signal);
    }

    /// After a step: when a stop was asked for, the checkpoint here (every
    /// process after the same step) and [`TrainerError::Stopped`].
    pub(super) fn stop_if_requested(&mut self) -> Result<(), TrainerError> {
        if !self.group.stop_requested() {
            return Ok(());
        }
        let checkpoint = self.save_checkpoint()?;
        tracing::warn!(steps = self.steps, checkpoint = ?checkpoint, "stopped as asked");
        Err(TrainerError::Stopped {
            steps: self.steps,
            checkpoint,
        })
    }
}
