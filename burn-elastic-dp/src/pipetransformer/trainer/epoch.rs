//! One epoch's figures as its steps add up, and the [`EpochReport`] they
//! make at its end.

use std::time::{Duration, Instant};

use super::log::{EpochReport, Transition};
use crate::group::GroupReport;
use crate::pipetransformer::shape::PipelineShape;

/// How far an epoch has come, told to
/// [`Trainer::fit_epoch_observed`](super::Trainer::fit_epoch_observed)'s observer after each step.
#[derive(Debug, Clone, Copy)]
pub struct StepProgress {
    /// Samples in the step.
    pub samples: usize,
    /// Samples trained on so far this epoch (this step's included).
    pub epoch_samples: usize,
    /// The step's mean loss.
    pub loss: f32,
    /// The step's learning rate (see [`Trainer::learning_rate`](super::Trainer::learning_rate)).
    pub learning_rate: f64,
    /// Optimizer steps taken in the run (this one included).
    pub steps: usize,
    /// Pipeline stages (K) the step ran with.
    pub stages: usize,
    /// Replicas (R) it ran with, in every process of the group.
    pub replicas: usize,
    /// Micro-batches per replica (M) it ran with.
    pub micro_batches: usize,
}

/// The running figures of the epoch under way.
pub(super) struct EpochTally {
    started: Instant,
    /// Cache hits and misses when the epoch began.
    cache_before: (u64, u64),
    steps: usize,
    samples: usize,
    /// Sum over the steps of the mean loss times the step's samples.
    loss_sum: f64,
    /// Per step, the slowest replica's all-reduce time, summed.
    all_reduce: Duration,
    bubble: f64,
    transitions: Vec<Transition>,
    /// The shape the epoch's last step ran with.
    ran_with: PipelineShape,
    /// The whole group's replicas at its last step (every process's).
    ran_total: usize,
    /// The micro-batch count its last step ran with.
    ran_micro_batches: Option<usize>,
    /// Time its steps spent measuring before they trained.
    profiling: Duration,
    /// The freeze rule's evidence and decisions (see `rule_seconds`).
    rule: Duration,
}

/// What the epoch's end adds to its tally: the freeze state after it and
/// the cache's counters.
pub(super) struct EpochEnd {
    pub epoch: usize,
    pub frozen_layers: usize,
    pub front: usize,
    /// Micro-batches per replica at the shape the epoch ran with, for an
    /// epoch whose steps reported none (otherwise its last step's count).
    pub micro_batches: usize,
    /// Cache hits and misses now.
    pub cache_after: (u64, u64),
}

impl EpochTally {
    /// An epoch starting now at `shape` (`total` replicas in every
    /// process), the cache having counted
    /// `cache_before` hits and misses.
    pub(super) fn start(cache_before: (u64, u64), shape: PipelineShape, total: usize) -> Self {
        Self {
            ran_total: total,
            started: Instant::now(),
            cache_before,
            steps: 0,
            samples: 0,
            loss_sum: 0.0,
            all_reduce: Duration::ZERO,
            bubble: 0.0,
            transitions: Vec::new(),
            ran_with: shape,
            ran_micro_batches: None,
            profiling: Duration::ZERO,
            rule: Duration::ZERO,
        }
    }

    /// Adds time the freeze rule spent (its evidence and decisions).
    pub(super) fn rule(&mut self, spent: Duration) {
        self.rule += spent;
    }

    /// Adds time a step spent measuring (activations, unit costs,
    /// micro-batch times) before it trained.
    pub(super) fn profiling(&mut self, spent: Duration) {
        self.profiling += spent;
    }

    /// Adds a step of `samples` samples that ran with `shape` (`total`
    /// replicas in every process) at learning rate `lr`, the run's
    /// `steps`-th; what the epoch's observer is told of it.
    pub(super) fn step(
        &mut self,
        samples: usize,
        report: &GroupReport,
        shape: PipelineShape,
        total: usize,
        (lr, steps): (f64, usize),
    ) -> StepProgress {
        self.ran_total = total;
        self.steps += 1;
        self.samples += samples;
        self.loss_sum += f64::from(report.loss) * samples as f64;
        self.all_reduce += report.all_reduce.iter().copied().max().unwrap_or_default();
        self.bubble += report.bubble_seconds;
        // R of the whole group (every process's replicas).
        let (stages, replicas) = (shape.stages(), total);
        self.ran_with = shape;
        let micro_batches = report.replicas.first().map(|r| r.micro_batches);
        self.ran_micro_batches = micro_batches.or(self.ran_micro_batches);
        let micro_batches = self.ran_micro_batches.unwrap_or(1);
        StepProgress {
            samples,
            epoch_samples: self.samples,
            loss: report.loss,
            learning_rate: lr,
            steps,
            stages,
            replicas,
            micro_batches,
        }
    }

    /// Adds a transition made during the epoch or at its end.
    pub(super) fn add_transition(&mut self, record: Transition) {
        self.transitions.push(record);
    }

    /// The shape the epoch's last step ran with.

    /// The epoch's figures.
    pub(super) fn report(self, end: EpochEnd) -> EpochReport {
        let seconds = self.started.elapsed().as_secs_f64();
        let transition_millis: f64 = self.transitions.iter().map(|t| t.millis).sum();
        EpochReport {
            epoch: end.epoch,
            steps: self.steps,
            samples: self.samples,
            loss: self.loss_sum / self.samples.max(1) as f64,
            seconds,
            samples_per_second: self.samples as f64 / seconds,
            transition_seconds: transition_millis / 1e3,
            profiling_seconds: self.profiling.as_secs_f64(),
            rule_seconds: self.rule.as_secs_f64(),
            all_reduce_seconds: self.all_reduce.as_secs_f64() / self.steps.max(1) as f64,
            bubble_seconds: self.bubble,
            frozen_layers: end.frozen_layers,
            front: end.front,
            stages: self.ran_with.stages(),
            replicas: self.ran_with.replicas,
            total_replicas: self.ran_total,
            micro_batches: self.ran_micro_batches.unwrap_or(end.micro_batches),
            balance: self.ran_with.balance,
            transitions: self.transitions,
            cache_hits: end.cache_after.0 - self.cache_before.0,
            cache_misses: end.cache_after.1 - self.cache_before.1,
        }
    }
}
