//! Memory-aware AutoPipe's per-device budget ([`MemoryConfig`]); the shape rule
//! ([`ShapeRule`](crate::shape::ShapeRule)) checks every shape against it.

use burn::config::Config;

use super::error::{TrainerError, invalid};

/// What one device may hold, for memory-aware AutoPipe.
///
/// With [`TrainerConfig::stages`](crate::TrainerConfig::stages) left at `None` the pipeline starts at
/// the fewest stages (a divisor of the device count) whose every stage
/// fits `device_bytes`: without a budget every model fits one device, so
/// the run starts as pure data parallelism (K = 1, R = devices). Each
/// stage's estimate counts its units' parameters, gradients and optimizer
/// state and the activations of the micro-batches the schedule keeps in
/// flight; a frozen unit counts its parameters only. With a budget,
/// activations are measured on the first batch when the process counts its heap
/// ([`burn_pipe::balance::HeapCounter`] installed as the global allocator: CPU
/// backends); elsewhere they count as 0, and the budget should leave room
/// for them. Burn 0.21's backends do not report a device's capacity, so
/// the budget is given here (`train --device-memory BYTES`); on a CPU,
/// logical devices share one heap, and the budget is how a run (or a test)
/// makes a model not fit one device.
///
/// ```
/// use burn_elastic_dp::{MemoryConfig, TrainerConfig};
///
/// let config = TrainerConfig::new().with_memory(MemoryConfig::new().with_device_bytes(Some(8 << 30)));
/// assert!(config.validate(4).is_ok());
/// ```
#[derive(Config, Debug, PartialEq)]
pub struct MemoryConfig {
    /// Bytes one device may hold for its stage (at least 1); `None`:
    /// unlimited.
    #[config(default = "None")]
    pub device_bytes: Option<u64>,
    /// The optimizer's state per parameter, in copies of the parameters
    /// (Adam: 2, SGD with momentum: 1, plain SGD: 0); in [0, 16]. What
    /// the freeze rule's evidence keeps (a weight snapshot, gradient sums)
    /// is counted on top ([`TrainerConfig::with_evidence`](crate::TrainerConfig::with_evidence)).
    #[config(default = 2.0)]
    pub optimizer_slots: f64,
}

impl MemoryConfig {
    /// Checks the budget's values; the error names the field and its range.
    pub fn validate(&self) -> Result<(), TrainerError> {
        if self.device_bytes == Some(0) {
            return Err(invalid("memory.device_bytes", 0, "at least 1 byte"));
        }
        let slots = self.optimizer_slots;
        if !(slots.is_finite() && (0.0..=16.0).contains(&slots)) {
            return Err(invalid(
                "memory.optimizer_slots",
                slots,
                "[0, 16] copies of the parameters",
            ));
        }
        Ok(())
    }
}
