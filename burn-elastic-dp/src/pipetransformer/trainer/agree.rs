//! Measurements agreed across the processes of a group: unit times, micro-batch times and
//! activation bytes replaced by their maximum over the processes before any decision reads them.

use std::time::Duration;

use burn_freeze::StackTypes;
use burn_pipe::micro::MicroBatchTimes;
use burn_pipe::{UnitMemory, UnitProfile};

use super::error::TrainerError;
use crate::group::ReplicaGroup;
use burn_freeze::StackOptimizer;

/// Nanoseconds as f64: exact below 2^53 ns (104 days).
fn nanos(duration: Duration) -> f64 {
    duration.as_nanos() as f64
}

fn duration(nanos: f64) -> Duration {
    Duration::from_nanos(nanos.max(0.0) as u64)
}

/// Each profile's forward and backward nanoseconds, in order.
fn flatten(profiles: &[UnitProfile]) -> Vec<f64> {
    profiles
        .iter()
        .flat_map(|p| [nanos(p.forward), nanos(p.backward)])
        .collect()
}

/// The profiles [`flatten`] gave.
fn unflatten(values: &[f64]) -> Vec<UnitProfile> {
    values
        .chunks_exact(2)
        .map(|p| UnitProfile {
            forward: duration(p[0]),
            backward: duration(p[1]),
        })
        .collect()
}

/// Each unit's forward and backward time, the slowest process's.
pub(super) fn unit_profiles<S, O>(
    group: &ReplicaGroup<S, O>,
    profile: Vec<UnitProfile>,
) -> Result<Vec<UnitProfile>, TrainerError>
where
    S: StackTypes,
    O: StackOptimizer<S>,
{
    if !group.spans_processes() {
        return Ok(profile);
    }
    Ok(unflatten(&group.agree_max(flatten(&profile))?))
}

/// Each unit's activation bytes per sample, the largest any process
/// measured (parameters are the same everywhere).
pub(super) fn unit_memory<S, O>(
    group: &ReplicaGroup<S, O>,
    mut memory: UnitMemory,
) -> Result<UnitMemory, TrainerError>
where
    S: StackTypes,
    O: StackOptimizer<S>,
{
    if !group.spans_processes() {
        return Ok(memory);
    }
    let values = memory.activations.iter().map(|&b| b as f64).collect();
    memory.activations = group
        .agree_max(values)?
        .into_iter()
        .map(|b| b as u64)
        .collect();
    Ok(memory)
}

/// The micro-batch times table, or `None` when some process could not
/// measure it (then every process keeps the paper's rule): first whether
/// every process has a table, then each entry, the slowest process's.
pub(super) fn micro_batch_times<S, O>(
    group: &ReplicaGroup<S, O>,
    times: Option<MicroBatchTimes>,
) -> Result<Option<MicroBatchTimes>, TrainerError>
where
    S: StackTypes,
    O: StackOptimizer<S>,
{
    if !group.spans_processes() {
        return Ok(times);
    }
    let missing = group.agree_max(vec![f64::from(u8::from(times.is_none()))])?;
    let Some(times) = times.filter(|_| missing[0] == 0.0) else {
        return Ok(None);
    };
    let sizes = times.sizes().to_vec();
    let values = times.profiles().concat();
    let max = group.agree_max(flatten(&values))?;
    let profiles = max.chunks_exact(2 * times.units()).map(unflatten).collect();
    let agreed =
        MicroBatchTimes::new(sizes, profiles).map_err(|error| TrainerError::InvalidRunValue {
            what: "micro_batch_times",
            value: error.to_string(),
            accepted: "a table every process measured alike",
        })?;
    Ok(Some(agreed))
}
