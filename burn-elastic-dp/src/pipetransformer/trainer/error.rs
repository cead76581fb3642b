//! Errors of the PipeTransformer trainer.

use std::path::{Path, PathBuf};

use crate::error::ElasticError;

/// What went wrong configuring or running a [`Trainer`](super::Trainer).
#[derive(Debug, thiserror::Error)]
pub enum TrainerError {
    /// A configuration value outside its range.
    #[error("{field} = {value} is not accepted: expected {accepted}")]
    InvalidConfig {
        /// The field (path in [`TrainerConfig`](super::TrainerConfig)).
        field: &'static str,
        /// The value given.
        value: String,
        /// The accepted range.
        accepted: &'static str,
    },
    /// A value met while running, not in the configuration, outside its
    /// range: a learning-rate schedule's rate that is not a finite number
    /// of at least 0 (the step is refused and changes nothing), or a
    /// micro-batch time table that does not fit the model or that the
    /// processes of a group measured differently.
    #[error("{what} = {value} is not accepted at run time: expected {accepted}")]
    InvalidRunValue {
        /// What gave the value (`learning-rate schedule`,
        /// `micro_batch_times`).
        what: &'static str,
        /// The value met, and where (a step, say).
        value: String,
        /// The accepted range.
        accepted: &'static str,
    },
    /// A freeze rule's setting outside its range, as the rule's own check
    /// in burn-freeze reports it ([`FreezeRule::validate`](crate::FreezeRule::validate)).
    /// The message is the one of [`InvalidConfig`](Self::InvalidConfig),
    /// the field named by its path: `freeze.rule.patience = 0 is not
    /// accepted: expected at least 1`.
    #[error("{path}.{error}")]
    InvalidFreezeRule {
        /// Where the rule's settings sit in
        /// [`TrainerConfig`](super::TrainerConfig): `freeze` (the rule's
        /// own fields) or `freeze.rule` (an [`EvidenceConfig`](burn_freeze::EvidenceConfig)).
        path: &'static str,
        /// The rule's error: the field, the value and the accepted range.
        error: burn_freeze::PolicyConfigError,
    },
    /// A global batch too small for a shape the run can reach.
    #[error(
        "a global batch of {batch} cannot give {replicas} replicas {micro_batches} micro-batches each (K = {stages}): raise the batch or lower micro_batches"
    )]
    BatchTooSmall {
        /// Samples per step at that shape.
        batch: usize,
        /// Stages at that shape.
        stages: usize,
        /// Replicas at that shape.
        replicas: usize,
        /// Micro-batches per replica at that shape.
        micro_batches: usize,
    },
    /// No pipeline over the devices fits the per-device memory budget.
    #[error(
        "{} needs {needed} bytes (parameters, gradients, optimizer state and activations) but a device holds {budget} (MemoryConfig::device_bytes, train's --device-memory): raise the budget, lower the batch or add devices (tried up to {stages} stages)",
        if *alone { format!("unit {unit} alone") } else { format!("the stage starting at unit {unit}") }
    )]
    DoesNotFit {
        /// The unit (or the first unit of the stage) that does not fit.
        unit: usize,
        /// Whether the unit does not fit a device even alone.
        alone: bool,
        /// Bytes it needs.
        needed: u64,
        /// Bytes a device holds.
        budget: u64,
        /// The most stages tried.
        stages: usize,
    },
    /// The configured starting pipeline has a stage over the budget.
    #[error(
        "stage {stage} of the {stages}-stage start needs {needed} bytes but a device holds {budget} (MemoryConfig::device_bytes, train's --device-memory): more stages, a smaller batch, or leave the stages to memory-aware AutoPipe"
    )]
    StageDoesNotFit {
        /// The stage.
        stage: usize,
        /// Stages at the start.
        stages: usize,
        /// Bytes it needs.
        needed: u64,
        /// Bytes a device holds.
        budget: u64,
    },
    /// More stages asked for than the model has units.
    #[error("{stages} stages asked for a model of {units} units: at most one stage per unit")]
    TooManyStages {
        /// Stages asked for.
        stages: usize,
        /// Units of the model.
        units: usize,
    },
    /// A dataset with too few samples.
    #[error("the dataset has {len} samples; a step needs at least {needed}")]
    DatasetTooSmall {
        /// Samples in the dataset.
        len: usize,
        /// Samples one step needs.
        needed: usize,
    },
    /// The dataset changed length between epochs.
    #[error(
        "the dataset had {before} samples and now has {now}: give the same dataset every epoch"
    )]
    DatasetChanged {
        /// Length at the first epoch.
        before: usize,
        /// Length now.
        now: usize,
    },
    /// The dataset did not return an item it said it has.
    #[error("the dataset has no item {index} (its length is {len})")]
    MissingItem {
        /// The index asked for.
        index: usize,
        /// The dataset's length.
        len: usize,
    },
    /// The output directory or a log file could not be written.
    #[error("cannot write {path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// No checkpoint to resume from verified.
    #[error("no valid checkpoint in {dir}{}", if rejected.is_empty() { String::new() } else { format!(" (rejected: {})", rejected.join("; ")) })]
    NoCheckpoint {
        /// The checkpoint directory.
        dir: PathBuf,
        /// Each checkpoint rejected, with the reason.
        rejected: Vec<String>,
    },
    /// A checkpoint could not be encoded or decoded.
    #[error("checkpoint: {0}")]
    Checkpoint(String),
    /// The run was asked to stop (its [`StopSignal`](crate::StopSignal):
    /// a SIGTERM, say, on this process or, across processes, on any): it
    /// stopped at a step boundary, every process after the same step, and
    /// wrote a checkpoint there when checkpoints are configured. Resume
    /// with [`Trainer::resume`](crate::Trainer::resume); a binary exits
    /// with [`STOPPED_EXIT_CODE`](crate::STOPPED_EXIT_CODE).
    #[error("stopped as asked after step {steps}{}", match checkpoint { Some(path) => format!(" (checkpoint {})", path.display()), None => " (no checkpoint configured)".to_string() })]
    Stopped {
        /// Optimizer steps taken.
        steps: usize,
        /// The checkpoint written, if checkpoints are configured.
        checkpoint: Option<PathBuf>,
    },
    /// The processes of a group cannot resume together: no checkpoint
    /// step is held, verified, by every one of them.
    #[error("cannot resume across processes: {0}")]
    ResumeDisagrees(String),
    /// The replica group (or a pipeline in it) refused or failed.
    #[error(transparent)]
    Elastic(#[from] ElasticError),
    /// A pipeline refused or failed (one the caller drives, with `?`, in a
    /// function that returns a `TrainerError`; the trainer's own pipelines
    /// fail through [`ElasticError::Replica`], which names the replica).
    #[error(transparent)]
    Pipe(#[from] burn_pipe::PipeError),
    /// The freeze policy's layer map does not fit the stack.
    #[error(transparent)]
    Freeze(#[from] burn_freeze::FreezeError),
    /// The AutoCache could not be made (an unusable spill directory).
    #[error(transparent)]
    Cache(#[from] burn_freeze::CacheError),
}

/// [`TrainerError::Io`] on `path`, for `map_err`.
pub(super) fn io(path: &Path) -> impl FnOnce(std::io::Error) -> TrainerError + '_ {
    move |source| TrainerError::Io {
        path: path.to_path_buf(),
        source,
    }
}

impl From<crate::pipetransformer::shape::StartError> for TrainerError {
    fn from(error: crate::pipetransformer::shape::StartError) -> Self {
        match error {
            crate::pipetransformer::shape::StartError::NoFit(no) => TrainerError::DoesNotFit {
                unit: no.unit,
                alone: no.alone,
                needed: no.needed,
                budget: no.budget,
                stages: no.stages,
            },
            crate::pipetransformer::shape::StartError::StageOver(over) => {
                TrainerError::StageDoesNotFit {
                    stage: over.stage,
                    stages: over.stages,
                    needed: over.needed,
                    budget: over.budget,
                }
            }
        }
    }
}

/// A value outside `accepted`.
pub(super) fn invalid(
    field: &'static str,
    value: impl ToString,
    accepted: &'static str,
) -> TrainerError {
    TrainerError::InvalidConfig {
        field,
        value: value.to_string(),
        accepted,
    }
}
