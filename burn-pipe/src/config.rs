//! How a pipeline runs: schedule, micro-batches, and the bound on every wait.

use burn::config::Config;

/// Order in which each stage runs the forward and backward passes of its
/// micro-batches. Both give the same gradients.
#[derive(Config, Debug, Copy, PartialEq, Eq)]
pub enum Schedule {
    /// Fill-drain (GPipe): every forward pass, then every backward pass.
    /// Stage `s` holds the activations of all `M` micro-batches at its peak.
    GPipe,
    /// One-forward-one-backward (PipeDream-Flush): after a warm-up of
    /// `K - s - 1` forward passes, stage `s` alternates forward and backward,
    /// so it never holds more than `K - s` micro-batches of activations.
    OneFOneB,
}

/// Configuration of a [`Pipeline`](crate::Pipeline).
///
/// ```
/// use burn_pipe::{PipelineConfig, Schedule};
///
/// let config = PipelineConfig::new()
///     .with_schedule(Schedule::GPipe)
///     .with_micro_batches(Some(8));
/// assert_eq!(config.micro_batches_for(4), 8);
/// assert_eq!(PipelineConfig::new().micro_batches_for(4), 16);
/// ```
#[derive(Config, Debug)]
pub struct PipelineConfig {
    /// Forward/backward order.
    #[config(default = "Schedule::OneFOneB")]
    pub schedule: Schedule,
    /// Micro-batches per mini-batch; `None` picks the paper's choice for the
    /// number of stages (see [`default_micro_batches`](crate::default_micro_batches)).
    #[config(default = "None")]
    pub micro_batches: Option<usize>,
    /// Longest a stage waits for a neighbour's activation or gradient before
    /// the step fails, in milliseconds.
    #[config(default = 120_000)]
    pub timeout_ms: u64,
}

impl PipelineConfig {
    /// The micro-batch count used with `stages` stages.
    pub fn micro_batches_for(&self, stages: usize) -> usize {
        self.micro_batches
            .unwrap_or_else(|| crate::partition::default_micro_batches(stages))
    }
}
