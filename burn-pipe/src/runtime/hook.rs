//! What a stage's worker does with the stage's gradients the moment its last backward is done:
//! the hook a data-parallel group all-reduces them through while earlier stages still compute.

use burn::optim::GradientsParams;

/// Receives each stage's gradients of a pass on the stage's own worker
/// thread, as soon as the stage has finished the backward pass of its last
/// micro-batch: in a pipeline the last stage first, while the earlier stages
/// still compute. A data-parallel group sums them with the other replicas'
/// there, so that the exchange hides behind the backward still to run
/// ([`StepOptions::with_hook`](crate::StepOptions::with_hook)).
///
/// The hook is called once per stage and pass, every stage included (a
/// stage with nothing to train hands on empty gradients), from as many
/// threads at once as the pipeline has stages; the order in which stages
/// reach it is not fixed, so a hook that needs one (a collective across
/// processes) imposes it itself.
///
/// ```
/// use std::sync::Mutex;
/// use burn::optim::GradientsParams;
/// use burn_pipe::StageGradients;
///
/// /// Records which stages were handed on, and keeps their gradients.
/// struct Record(Mutex<Vec<usize>>);
///
/// impl StageGradients for Record {
///     fn stage_done(&self, stage: usize, grads: GradientsParams) -> Result<GradientsParams, String> {
///         self.0.lock().unwrap().push(stage);
///         Ok(grads)
///     }
/// }
///
/// let record = Record(Mutex::new(Vec::new()));
/// assert!(record.stage_done(1, GradientsParams::new()).is_ok());
/// record.all_computed(); // the default: nothing
/// assert_eq!(*record.0.lock().unwrap(), [1]);
/// ```
pub trait StageGradients: Sync {
    /// Stage `stage`'s gradients of the pass (the sum over its
    /// micro-batches); what it returns is what the pipeline keeps for the
    /// optimizer step. An error fails the pass as a failed stage does (no
    /// gradient of the pass is kept): [`PipeError::GradientHook`](crate::PipeError::GradientHook).
    fn stage_done(&self, stage: usize, grads: GradientsParams) -> Result<GradientsParams, String>;

    /// Every stage has finished its forward and backward passes (called
    /// once per pass, by the last stage to finish, before its
    /// [`stage_done`](Self::stage_done)): from here on the pass only waits
    /// on the hooks.
    fn all_computed(&self) {}

    /// Stage `stage` failed in its own passes: it will not reach
    /// [`stage_done`](Self::stage_done), and a hook waiting for it should
    /// give up.
    fn stage_failed(&self, stage: usize) {
        let _ = stage;
    }
}
