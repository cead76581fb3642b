//! Balancing (AutoPipe): what each unit costs ([`UnitCosts`], from
//! parameter counts or [`profile_units`]), the partition into stages
//! ([`balance_exact`], the paper's [`balance_greedy`], pipeline
//! [`compress`]ion) and each stage's memory ([`UnitMemory`], checked against
//! a per-device budget). The micro-batch count is [`crate::micro`]'s.
//!
//! ```
//! use burn_pipe::balance::{balance_exact, largest_stage};
//!
//! let costs = [1.0, 1.0, 1.0, 1.0, 2.0, 2.0];
//! let balance = balance_exact(&costs, 3);
//! assert_eq!(balance, vec![3, 2, 1]);
//! assert_eq!(largest_stage(&costs, &balance), 3.0);
//! ```

pub(crate) mod costs;
pub(crate) mod memory;
pub(crate) mod micro_count;
pub(crate) mod partition;
pub(crate) mod profile;

pub use costs::{UnitCosts, UnitProfile, UnitState, unit_param_costs};
pub use memory::{
    HeapCounter, MemoryQuery, StageMemory, UnitMemory, float_bytes, measure_unit_memory,
};
pub use partition::{balance_exact, balance_greedy, compress, largest_stage};
pub use profile::profile_units;

use burn::tensor::Device;
use burn::tensor::backend::Backend;

use crate::PipeError;

/// Synchronises `device` while `during` unit `unit` (profiling, measuring):
/// a failing device, or a fault injected at
/// [`DEVICE_SYNC`](crate::fault::DEVICE_SYNC), is a
/// [`PipeError::DeviceSync`] naming the unit.
pub(crate) fn sync_device<B: Backend>(
    device: &Device<B>,
    during: &'static str,
    unit: usize,
) -> Result<(), PipeError> {
    let failed = |reason: String| PipeError::DeviceSync {
        during,
        unit,
        reason,
    };
    burn_freeze::fault::check(crate::fault::DEVICE_SYNC, Some(unit), None)
        .map_err(|injected| failed(injected.to_string()))?;
    B::sync(device).map_err(|error| failed(format!("{error:?}")))
}
