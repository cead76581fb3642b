//! What a plan predicts: each epoch's shape and seconds, and the baseline's.

use serde::{Deserialize, Serialize};

use crate::pipetransformer::plan::step::StepTime;

/// One epoch's seconds, split.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct EpochTime {
    /// The steps: compute, bubble and exposed all-reduce.
    pub steps: StepTime,
    /// Rebuilding pipelines and the replica group before the epoch.
    pub transition: f64,
}

impl EpochTime {
    /// The whole epoch.
    pub fn total(&self) -> f64 {
        self.steps.total() + self.transition
    }
}

/// What PipeTransformer does in one epoch, and how long it takes: the
/// shape the trainer trains that epoch with (its [`Transition`]'s `after`
/// at the end of the epoch before), and the simulated time.
///
/// [`Transition`]: crate::Transition
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EpochPlan {
    /// The epoch.
    pub epoch: usize,
    /// Layers frozen (F).
    pub frozen_layers: usize,
    /// Units frozen (the freeze front).
    pub front: usize,
    /// Whether the frozen prefix's output comes from the cache.
    pub cached: bool,
    /// Stages per pipeline (K).
    pub stages: usize,
    /// Units per stage, first to last.
    pub balance: Vec<usize>,
    /// Pipeline replicas (R).
    pub replicas: usize,
    /// Micro-batches per step (M).
    pub micro_batches: usize,
    /// Samples per replica per step.
    pub replica_batch: usize,
    /// Steps in the epoch.
    pub steps: usize,
    /// One step, split.
    pub step: StepTime,
    /// The simulated pipeline's bubble fraction.
    pub bubble_fraction: f64,
    /// The epoch, split.
    pub time: EpochTime,
}

/// A whole run and the baseline's (pipeline plus data parallel, nothing
/// frozen, no cache, same devices and epochs).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    /// PipeTransformer, epoch by epoch.
    pub epochs: Vec<EpochPlan>,
    /// The baseline, epoch by epoch.
    pub baseline: Vec<EpochPlan>,
    /// Whether each shape's M was chosen from measured micro-batch times
    /// ([`PlanConfig::micro_batch_times`](super::PlanConfig::micro_batch_times));
    /// `false`: the configured count, or the paper's count for K assumed.
    #[serde(default)]
    pub micro_batches_measured: bool,
}

impl Plan {
    /// Seconds of the whole PipeTransformer run.
    pub fn total(&self) -> f64 {
        self.epochs.iter().map(|e| e.time.total()).sum()
    }

    /// Seconds of the whole baseline run.
    pub fn baseline_total(&self) -> f64 {
        self.baseline.iter().map(|e| e.time.total()).sum()
    }

    /// Baseline time over PipeTransformer time.
    pub fn speedup(&self) -> f64 {
        self.baseline_total() / self.total()
    }

    /// The run's seconds summed by kind.
    pub fn breakdown(&self) -> EpochTime {
        sum_times(&self.epochs)
    }

    /// The baseline's seconds summed by kind.
    pub fn baseline_breakdown(&self) -> EpochTime {
        sum_times(&self.baseline)
    }
}

fn sum_times(epochs: &[EpochPlan]) -> EpochTime {
    epochs
        .iter()
        .fold(EpochTime::default(), |acc, e| EpochTime {
            steps: acc.steps.plus(&e.time.steps),
            transition: acc.transition + e.time.transition,
        })
}
