//! What a pipelined pass measured.

use std::time::Duration;

/// What one pipelined forward-backward pass measured.
#[derive(Debug, Clone, PartialEq)]
pub struct StepReport {
    /// Mean loss over the mini-batch (micro-batch losses weighted by size).
    pub loss: f32,
    /// Micro-batches the mini-batch was split into.
    pub micro_batches: usize,
    /// Wall-clock time of the pass.
    pub wall: Duration,
    /// Per stage, time spent computing rather than waiting.
    pub busy: Vec<Duration>,
    /// Per stage, the most micro-batches whose activations it held at once.
    pub peak_saved: Vec<usize>,
    /// Activations and gradients sent between stages.
    pub messages: usize,
}

impl StepReport {
    /// Share of stage-time spent idle: `1 - sum(busy) / (stages * wall)`.
    /// GPipe's theory for equal stages is `(K - 1) / (M + K - 1)`.
    ///
    /// ```
    /// use std::time::Duration;
    /// let report = burn_pipe::StepReport {
    ///     loss: 0.0,
    ///     micro_batches: 1,
    ///     wall: Duration::from_secs(2),
    ///     busy: vec![Duration::from_secs(1), Duration::from_secs(1)],
    ///     peak_saved: vec![1, 1],
    ///     messages: 2,
    /// };
    /// assert_eq!(report.bubble_fraction(), 0.5);
    /// ```
    pub fn bubble_fraction(&self) -> f64 {
        let busy: f64 = self.busy.iter().map(Duration::as_secs_f64).sum();
        let capacity = self.busy.len() as f64 * self.wall.as_secs_f64();
        if capacity == 0.0 {
            0.0
        } else {
            (1.0 - busy / capacity).max(0.0)
        }
    }
}
