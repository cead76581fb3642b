//! What the trainer records: one entry per transition and per epoch, logged
//! through `tracing` and written as JSON lines for plots.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use burn_pipe::micro::MicroBatchChoice;
use serde::{Deserialize, Serialize};

use super::error::{TrainerError, io};

/// One change of the run's shape: the front moved (AutoFreeze), and the
/// pipeline and replicas followed (AutoPipe, AutoDP).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Transition {
    /// Epoch in which it happened (0 first).
    pub epoch: usize,
    /// Optimizer steps taken before it, over the whole run.
    pub step: usize,
    /// Frozen layers (the policy's F) after it.
    pub frozen_layers: usize,
    /// Frozen units (the freeze front) before and after.
    pub front: (usize, usize),
    /// Pipeline stages (K) before and after.
    pub stages: (usize, usize),
    /// Replicas (R) of this process before and after.
    pub replicas: (usize, usize),
    /// Replicas of the whole group before and after: every process's (the
    /// same as `replicas` in a group of one process).
    #[serde(default)]
    pub total_replicas: (usize, usize),
    /// Micro-batches per replica (M) after it.
    pub micro_batches: usize,
    /// How M was chosen from measured micro-batch times (every candidate's
    /// predicted step), or `None` where the paper's rule or a configured
    /// count holds (see [`Trainer::micro_batch_choice`](super::Trainer::micro_batch_choice)).
    #[serde(default)]
    pub micro_batch_choice: Option<MicroBatchChoice>,
    /// Units per stage after it.
    pub balance: Vec<usize>,
    /// Wall-clock time of the transition (freezing, repartitioning,
    /// resizing), in milliseconds.
    pub millis: f64,
}

impl Transition {
    /// Whether the front moved down (a thaw): `front.1 < front.0`. The
    /// shape after a thaw is derived again from the start's, so K may grow
    /// and R fall.
    ///
    /// ```
    /// use burn_elastic_dp::Transition;
    ///
    /// let line = r#"{"epoch":3,"step":12,"frozen_layers":1,"front":[3,1],"stages":[1,2],
    ///     "replicas":[4,2],"micro_batches":2,"balance":[3,2],"millis":0.5}"#;
    /// let thaw: Transition = serde_json::from_str(line).unwrap();
    /// assert!(thaw.is_thaw());
    /// ```
    pub fn is_thaw(&self) -> bool {
        self.front.1 < self.front.0
    }

    /// Logs it (one line, through `tracing`).
    pub(crate) fn log(&self) {
        tracing::info!(
            epoch = self.epoch,
            step = self.step,
            F = self.frozen_layers,
            front = format!("{} -> {}", self.front.0, self.front.1),
            thaw = self.is_thaw(),
            K = format!("{} -> {}", self.stages.0, self.stages.1),
            R = format!("{} -> {}", self.replicas.0, self.replicas.1),
            R_total = format!("{} -> {}", self.total_replicas.0, self.total_replicas.1),
            M = self.micro_batches,
            M_by = if self.micro_batch_choice.is_some() { "measurement" } else { "rule" },
            predicted_ms = self
                .micro_batch_choice
                .as_ref()
                .map(|c| format!("{:.2}", c.predicted_step_s * 1e3)),
            balance = ?self.balance,
            ms = format!("{:.1}", self.millis),
            "transition"
        );
    }
}

/// One epoch's figures.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EpochReport {
    /// The epoch (0 first).
    pub epoch: usize,
    /// Optimizer steps in it.
    pub steps: usize,
    /// Samples trained on (every sample of the dataset, once).
    pub samples: usize,
    /// Mean training loss over its samples.
    pub loss: f64,
    /// Wall-clock seconds, transitions included.
    pub seconds: f64,
    /// Samples per second.
    pub samples_per_second: f64,
    /// Seconds spent in transitions.
    pub transition_seconds: f64,
    /// Seconds of `seconds` its steps spent measuring before they trained:
    /// activations (memory-aware AutoPipe), unit costs and micro-batch
    /// times ([`CostModel::Profiled`](crate::CostModel::Profiled)); in the
    /// first epoch of a run (or of a resumed run) only.
    #[serde(default)]
    pub profiling_seconds: f64,
    /// Seconds of `seconds` the freeze rule spent on its evidence and
    /// decisions: held-out passes, reading the per-layer statistics, and
    /// (measured inside the steps, the slowest replica's) the update gains
    /// and weight snapshots of [`LayerSignal::LossShare`](burn_freeze::LayerSignal).
    /// Transitions are in `transition_seconds`.
    #[serde(default)]
    pub rule_seconds: f64,
    /// Mean per step of the slowest replica's exposed all-reduce time (the
    /// wait on the exchange after its stages had computed; the part hidden
    /// behind the backward is not counted), in seconds.
    pub all_reduce_seconds: f64,
    /// Seconds of its steps lost to pipeline bubbles: per step, each
    /// replica's pass time times its bubble fraction (idle stage-time over
    /// stages x wall), averaged over the replicas, summed over the steps.
    #[serde(default)]
    pub bubble_seconds: f64,
    /// Frozen layers (F) at its end (after its decisions).
    pub frozen_layers: usize,
    /// Freeze front (units) at its end (after its decisions).
    pub front: usize,
    /// Pipeline stages (K) its last step ran with: the epoch's shape (a
    /// transition at its end is in `transitions`, with the shape that
    /// follows).
    pub stages: usize,
    /// Replicas (R) its last step ran with.
    pub replicas: usize,
    /// Replicas of the whole group it ran with, every process's (the same
    /// as `replicas` in a group of one process).
    #[serde(default)]
    pub total_replicas: usize,
    /// Micro-batches per replica (M) its last step ran with.
    pub micro_batches: usize,
    /// Units per stage its last step ran with.
    pub balance: Vec<usize>,
    /// Transitions during it and at its end, each with the shape before and
    /// after.
    pub transitions: Vec<Transition>,
    /// Samples whose frozen prefix came from the cache (fully or partly)
    /// and samples whose prefix ran, in this epoch.
    pub cache_hits: u64,
    /// See `cache_hits`.
    pub cache_misses: u64,
}

/// Appends JSON lines to files in the output directory.
#[derive(Debug)]
pub(crate) struct JsonLog {
    transitions: (PathBuf, File),
    epochs: (PathBuf, File),
}

fn open(path: PathBuf, append: bool) -> Result<(PathBuf, File), TrainerError> {
    let file = OpenOptions::new()
        .create(true)
        .truncate(!append)
        .append(append)
        .write(true)
        .open(&path)
        .map_err(io(&path))?;
    Ok((path, file))
}

fn append(target: &mut (PathBuf, File), record: &impl Serialize) -> Result<(), TrainerError> {
    let mut line = serde_json::to_string(record).expect("records serialise");
    line.push('\n');
    target.1.write_all(line.as_bytes()).map_err(io(&target.0))
}

impl JsonLog {
    /// Makes `dir` if missing and starts `transitions.jsonl` and
    /// `epochs.jsonl` in it, empty, or appends to them (a resumed run).
    pub(crate) fn create(dir: &Path, append: bool) -> Result<Self, TrainerError> {
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        Ok(Self {
            transitions: open(dir.join("transitions.jsonl"), append)?,
            epochs: open(dir.join("epochs.jsonl"), append)?,
        })
    }

    pub(crate) fn write_transition(&mut self, record: &Transition) -> Result<(), TrainerError> {
        append(&mut self.transitions, record)
    }

    pub(crate) fn write_epoch(&mut self, record: &EpochReport) -> Result<(), TrainerError> {
        append(&mut self.epochs, record)
    }
}
