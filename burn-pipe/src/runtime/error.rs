//! Errors of pipeline construction and of pipelined steps.

use std::time::Duration;

/// What went wrong building or running a pipeline.
#[derive(Debug, thiserror::Error)]
pub enum PipeError {
    /// No stages asked for.
    #[error("a pipeline needs at least one stage, got 0")]
    NoStages,
    /// More stages than units.
    #[error("{stages} stages for a stack of {units} units: every stage needs at least one unit")]
    TooManyStages {
        /// Stages asked for.
        stages: usize,
        /// Units in the stack.
        units: usize,
    },
    /// A balance that does not cover the stack exactly, or has an empty stage.
    #[error("balance {balance:?} does not split {units} units into non-empty stages")]
    BadBalance {
        /// Units per stage, as given.
        balance: Vec<usize>,
        /// Units in the stack.
        units: usize,
    },
    /// Not one device per stage.
    #[error("{devices} devices given for {stages} stages: give exactly one device per stage")]
    DeviceCount {
        /// Devices given.
        devices: usize,
        /// Stages.
        stages: usize,
    },
    /// A zero bound on waits: every wait would fail at once.
    #[error("timeout_ms must be at least 1, got 0")]
    NoTimeout,
    /// Zero micro-batches asked for.
    #[error("micro_batches must be at least 1, got 0")]
    NoMicroBatches,
    /// A mini-batch with fewer samples than micro-batches.
    #[error("a batch of {batch} samples cannot be split into {micro_batches} micro-batches")]
    BatchTooSmall {
        /// Samples in the batch.
        batch: usize,
        /// Micro-batches asked for.
        micro_batches: usize,
    },
    /// Input and targets of different batch sizes.
    #[error("the input has {input} samples but the targets have {targets}")]
    TargetsMismatch {
        /// Samples in the input.
        input: usize,
        /// Samples in the targets.
        targets: usize,
    },
    /// A stage panicked or failed while running a micro-batch.
    #[error("stage {stage} failed in the {phase} pass of micro-batch {micro_batch}: {message}")]
    StageFailed {
        /// The failing stage.
        stage: usize,
        /// The micro-batch it was working on.
        micro_batch: usize,
        /// `"forward"` or `"backward"`.
        phase: &'static str,
        /// The panic message or error.
        message: String,
    },
    /// A stage waited longer than the configured bound for a neighbour.
    #[error(
        "stage {stage} waited more than {waited:?} for the {phase} message of micro-batch {micro_batch} from stage {from}"
    )]
    Timeout {
        /// The waiting stage.
        stage: usize,
        /// The stage it waited for.
        from: usize,
        /// The micro-batch it waited for.
        micro_batch: usize,
        /// `"forward"` or `"backward"`.
        phase: &'static str,
        /// How long it waited.
        waited: Duration,
    },
    /// A neighbour stopped before sending what this stage needed (it failed:
    /// its own error says why).
    #[error(
        "stage {stage} lost stage {from} while waiting for the {phase} message of micro-batch {micro_batch}"
    )]
    NeighbourGone {
        /// The waiting stage.
        stage: usize,
        /// The stage that stopped.
        from: usize,
        /// The micro-batch it waited for.
        micro_batch: usize,
        /// `"forward"` or `"backward"`.
        phase: &'static str,
    },
    /// A freeze-front request that does not fit (see
    /// [`check_freeze`](burn_freeze::check_freeze)), or a freeze policy's
    /// layer map that does not fit the pipeline.
    #[error(transparent)]
    Freeze(#[from] burn_freeze::FreezeError),
    /// The AutoCache could not serve the frozen prefix (sample ids that do
    /// not match the batch, or a sample that came back with another shape).
    #[error(transparent)]
    Cache(#[from] burn_freeze::CacheError),
    /// A batch entering past unit 0 (a [`BatchStart::Hidden`](burn_freeze::plumbing::BatchStart::Hidden)
    /// batch of [`Pipeline::forward_backward`](crate::Pipeline::forward_backward))
    /// must enter after frozen units of stage 0, before the last unit.
    #[error(
        "a batch cannot enter the pipeline at unit {entry}: it must enter after 1 to {frozen_on_first} frozen units of stage 0 (and before the last unit)"
    )]
    BadEntry {
        /// The unit asked for.
        entry: usize,
        /// Frozen units on stage 0.
        frozen_on_first: usize,
    },
    /// A flow that the unit it enters at does not take: unit 0 takes the
    /// model's input, a later unit a hidden activation.
    #[error("{given} cannot enter the pipeline at unit {entry}, which takes the {takes}")]
    FlowMismatch {
        /// The unit it was to enter at.
        entry: usize,
        /// What the flow holds.
        given: &'static str,
        /// What the unit takes.
        takes: &'static str,
    },
    /// A loss or gradient that is NaN or infinite: the step was refused
    /// (no gradient kept, weights and optimizer state unchanged).
    #[error("non-finite {what} at stage {stage}{}: the step is refused, nothing changed", unit.map_or(String::new(), |u| format!(", unit {u}")))]
    NonFinite {
        /// `"loss"` or `"gradient"`.
        what: &'static str,
        /// The stage (the last one for a loss).
        stage: usize,
        /// The unit whose gradient is not finite.
        unit: Option<usize>,
    },
    /// A stage's thread could not be started (the operating system refused
    /// it): the call stopped before any stage ran, and nothing changed but
    /// what the call's own documentation says (a refused step drops its
    /// gradients).
    #[error("stage {stage}: could not start its {what} thread: {message}")]
    Spawn {
        /// The stage.
        stage: usize,
        /// `"stage"` (a pass's worker) or `"step"` (an optimizer step's).
        what: &'static str,
        /// The operating system's error.
        message: String,
    },
    /// A stage's optimizer step (or the gradient norms read before it)
    /// panicked: every stage was put back as it was before the step (its
    /// weights, optimizer state and gradient sums) and the gradients were
    /// dropped.
    #[error(
        "stage {stage}'s optimizer step panicked: {message}; every stage was put back as it was and the gradients were dropped"
    )]
    StepPanicked {
        /// The stage (the first in stage order, when several panicked).
        stage: usize,
        /// The panic message.
        message: String,
    },
    /// A stage's output does not depend on its input, so no gradient can
    /// flow back to the stages before it: the model's units must use their
    /// input (no gradient of the pass is kept).
    #[error(
        "stage {stage}'s output does not depend on its input (backward pass of micro-batch {micro_batch}): no gradient reaches the stages before it; every unit must use its input"
    )]
    OutputIgnoresInput {
        /// The stage.
        stage: usize,
        /// The micro-batch.
        micro_batch: usize,
    },
    /// The device failed to synchronise while a unit was profiled
    /// ([`profile_units`](crate::profile_units)) or its memory measured
    /// ([`measure_unit_memory`](crate::measure_unit_memory)); nothing was
    /// changed.
    #[error("device sync failed while {during} unit {unit}: {reason}")]
    DeviceSync {
        /// What was under way: `profiling` or `measuring the memory of`.
        during: &'static str,
        /// The unit being run.
        unit: usize,
        /// The backend's error (or the injected fault's).
        reason: String,
    },
    /// A fault injected by a reliability test (`burn_freeze::fault`).
    #[error("{0}")]
    Injected(String),
    /// Every unit is frozen: a training step has nothing to train.
    #[error("every one of the {units} units is frozen: there is nothing to train")]
    NothingToTrain {
        /// Units in the stack.
        units: usize,
    },
    /// Gradients of an earlier step wait for an optimizer step.
    #[error(
        "{0}: call `step` (or `clear_gradients`) first, gradients of an earlier pass are pending"
    )]
    GradientsPending(&'static str),
    /// The [`StageGradients`](crate::StageGradients) hook refused a stage's
    /// gradients (a data-parallel exchange that failed, say): no gradient
    /// of the pass is kept.
    #[error("stage {stage}'s gradients could not be handed on: {message}")]
    GradientHook {
        /// The stage.
        stage: usize,
        /// The hook's reason.
        message: String,
    },
}

/// The message of a caught panic (`&str` or `String` payloads; other
/// payloads are described as such).
///
/// ```
/// let panic = std::panic::catch_unwind(|| panic!("stage {} broke", 2)).unwrap_err();
/// assert_eq!(burn_pipe::plumbing::panic_message(panic.as_ref()), "stage 2 broke");
/// ```
pub fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(message) = panic.downcast_ref::<&str>() {
        (*message).to_string()
    } else if let Some(message) = panic.downcast_ref::<String>() {
        message.clone()
    } else {
        "panic with a non-string payload".to_string()
    }
}

impl PipeError {
    /// The error that explains the others, from the errors of one pass in
    /// stage order: a stage that failed by itself first; then a stage that
    /// timed out waiting for a stage that was not itself waiting (timeouts
    /// cascade upstream, and the stalled stage is the one at the end of the
    /// chain); then any timeout; then a lost neighbour; last, a gradient
    /// hook that gave up (it waits on the others).
    pub(crate) fn root_cause(mut errors: Vec<PipeError>) -> Option<PipeError> {
        let waiting: Vec<usize> = errors
            .iter()
            .filter_map(|e| match e {
                PipeError::Timeout { stage, .. } => Some(*stage),
                _ => None,
            })
            .collect();
        let rank = |e: &PipeError| match e {
            PipeError::Timeout { from, .. } if !waiting.contains(from) => 1,
            PipeError::Timeout { .. } => 2,
            PipeError::NeighbourGone { .. } => 3,
            PipeError::GradientHook { .. } => 4,
            _ => 0,
        };
        let best = (0..errors.len()).min_by_key(|&i| (rank(&errors[i]), i))?;
        Some(errors.swap_remove(best))
    }
}

impl From<burn_freeze::fault::Injected> for PipeError {
    fn from(injected: burn_freeze::fault::Injected) -> Self {
        PipeError::Injected(injected.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timeout(stage: usize, from: usize) -> PipeError {
        PipeError::Timeout {
            stage,
            from,
            micro_batch: 0,
            phase: "forward",
            waited: Duration::from_millis(1),
        }
    }

    #[test]
    fn the_stalled_stage_is_found_at_the_end_of_a_timeout_chain() {
        // Stage 2 stalls: 3 and 1 wait on it, 0 waits on 1.
        let errors = vec![timeout(0, 1), timeout(1, 2), timeout(3, 2)];
        assert!(matches!(
            PipeError::root_cause(errors),
            Some(PipeError::Timeout {
                stage: 1,
                from: 2,
                ..
            })
        ));
    }

    #[test]
    fn a_failed_stage_explains_everything_else() {
        let gone = PipeError::NeighbourGone {
            stage: 0,
            from: 1,
            micro_batch: 0,
            phase: "backward",
        };
        let failed = PipeError::StageFailed {
            stage: 1,
            micro_batch: 0,
            phase: "forward",
            message: "boom".into(),
        };
        let errors = vec![gone, timeout(2, 1), failed];
        assert!(matches!(
            PipeError::root_cause(errors),
            Some(PipeError::StageFailed { stage: 1, .. })
        ));
        assert!(PipeError::root_cause(Vec::new()).is_none());
    }
}
