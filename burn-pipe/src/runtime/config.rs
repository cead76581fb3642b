//! How a pipeline runs: stages, schedule, micro-batches, and the bound on
//! every wait.

use burn::config::Config;

use crate::balance::micro_count::count::default_micro_batches;
use crate::runtime::error::PipeError;
use crate::runtime::schedule::Schedule;

/// Configuration of a [`Pipeline`](crate::Pipeline); [`init`](PipelineConfig::init) builds one.
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
    /// Micro-batches per mini-batch. `Some(m)` always holds, at every
    /// number of stages. `None`: the paper's choice for the number of stages
    /// ([`default_micro_batches`](crate::default_micro_batches)), here and
    /// wherever costs are not measured (a planner, or a trainer with
    /// parameter-count costs); a trainer with profiled costs may instead
    /// choose M for each shape from unit times
    /// measured at several micro-batch sizes
    /// ([`choose_micro_batches`](crate::choose_micro_batches)) and sets it
    /// with [`Pipeline::set_micro_batches`](crate::Pipeline::set_micro_batches).
    #[config(default = "None")]
    pub micro_batches: Option<usize>,
    /// Units per stage; `None` balances the stages by parameter count with
    /// the exact partitioner ([`balance_exact`](crate::balance_exact)), one
    /// stage per device.
    #[config(default = "None")]
    pub balance: Option<Vec<usize>>,
    /// Longest a stage waits for a neighbour's activation or gradient before
    /// the step fails, in milliseconds (at least 1).
    #[config(default = 120_000)]
    pub timeout_ms: u64,
}

impl PipelineConfig {
    /// The micro-batch count used with `stages` stages.
    pub fn micro_batches_for(&self, stages: usize) -> usize {
        self.micro_batches
            .unwrap_or_else(|| default_micro_batches(stages))
    }

    /// Checks the fields that hold whatever the stack and devices: at least
    /// one micro-batch (when given) and a timeout of at least 1 ms. Every
    /// pipeline's configuration passes it (building one, and each change).
    ///
    /// ```
    /// use burn_pipe::{PipeError, PipelineConfig};
    ///
    /// assert!(PipelineConfig::new().validate().is_ok());
    /// let none = PipelineConfig::new().with_micro_batches(Some(0));
    /// assert!(matches!(none.validate(), Err(PipeError::NoMicroBatches)));
    /// let never = PipelineConfig::new().with_timeout_ms(0);
    /// assert!(matches!(never.validate(), Err(PipeError::NoTimeout)));
    /// ```
    pub fn validate(&self) -> Result<(), PipeError> {
        if self.micro_batches == Some(0) {
            return Err(PipeError::NoMicroBatches);
        }
        if self.timeout_ms == 0 {
            return Err(PipeError::NoTimeout);
        }
        Ok(())
    }
}
