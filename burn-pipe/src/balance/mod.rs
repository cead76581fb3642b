//! Balancing (AutoPipe): unit costs and profiles, the partition into stages,
//! the micro-batch count, and each stage's memory.

pub(crate) mod costs;
pub(crate) mod memory;
pub(crate) mod micro;
pub(crate) mod partition;
pub(crate) mod profile;

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
