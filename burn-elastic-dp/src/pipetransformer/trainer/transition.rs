//! AutoPipe and AutoDP applied to the group: the shape it runs, and the moves that take it to
//! another (repartitioned in place, or through one replica when R or K changes).

use burn::prelude::*;
use burn_freeze::{StackOptimizer, StackTypes};

use super::error::TrainerError;
use crate::error::ElasticError;
use crate::group::ReplicaGroup;
use crate::pipetransformer::shape::PipelineShape;

/// The shape `group` runs: units per stage (replica 0's; every replica has
/// the same), replicas. A group that lost every replica has no stage.
pub(super) fn shape_of<S: StackTypes, O: StackOptimizer<S>>(
    group: &ReplicaGroup<S, O>,
) -> PipelineShape {
    let replicas = group.num_replicas();
    let balance = match replicas {
        0 => Vec::new(),
        _ => group.replica(0).balance(),
    };
    PipelineShape { balance, replicas }
}

/// Device lists of a shape: replica `r` on the next `K` devices.
pub(super) fn device_lists<D: Clone>(devices: &[D], shape: &PipelineShape) -> Vec<Vec<D>> {
    let k = shape.stages();
    (0..shape.replicas)
        .map(|r| devices[r * k..(r + 1) * k].to_vec())
        .collect()
}

/// Moves `group` (over `devices`) to `target`: repartitioned in place when
/// K and R stay, else through one replica; whether R changed.
pub(super) fn move_to<S: StackTypes, O: StackOptimizer<S>>(
    group: &mut ReplicaGroup<S, O>,
    devices: &[Device<S::Backend>],
    target: &PipelineShape,
) -> Result<bool, TrainerError> {
    let current = shape_of(group);
    if target.stages() == current.stages() && target.replicas == current.replicas {
        if *target != current {
            group.repartition(&target.balance, device_lists(devices, target))?;
        }
        return Ok(false);
    }
    through_one(group, devices, target, |_| Ok(()))?;
    Ok(target.replicas != current.replicas)
}

/// Moves `group` to `after`: down to replica 0, `on_one` applied to it,
/// replica 0 repartitioned, then copied to the new replicas (weights,
/// parameter ids, front, optimizer state). A group across processes whose
/// replica count stays is not taken down to one (its ranks would exchange
/// their counts twice for nothing): `on_one` is applied to the whole group
/// and every replica repartitioned. Across processes every rank makes the
/// same move at the same step (AutoDP in lockstep).
pub(super) fn through_one<S: StackTypes, O: StackOptimizer<S>>(
    group: &mut ReplicaGroup<S, O>,
    devices: &[Device<S::Backend>],
    after: &PipelineShape,
    on_one: impl FnOnce(&mut ReplicaGroup<S, O>) -> Result<(), ElasticError>,
) -> Result<(), TrainerError> {
    let current = shape_of(group);
    if group.spans_processes() && after.replicas == current.replicas {
        on_one(group)?;
        group.repartition(&after.balance, device_lists(devices, after))?;
        return Ok(());
    }
    if current.replicas > 1 {
        group.resize(device_lists(devices, &current.with_replicas(1)))?;
    }
    on_one(group)?;
    group.repartition(
        &after.balance,
        device_lists(devices, &after.with_replicas(1)),
    )?;
    if after.replicas > 1 {
        group.resize(device_lists(devices, after))?;
    }
    Ok(())
}
