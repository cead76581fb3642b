//! The trainer's recovery policy (with `recover_replicas` on): which failed steps it goes on from,
//! and how.

use burn_freeze::{StackOptimizer, StackTypes};

use super::error::TrainerError;
use crate::error::ElasticError;
use crate::group::ReplicaGroup;

/// How a failed pass is recovered from.
enum Recovery {
    /// The named replica leaves the group; the survivors redo the step.
    Remove(usize),
    /// The group already left its stuck replicas behind; the survivors redo
    /// the step.
    Redo,
}

/// After a failed forward and backward pass of `group`: `Ok` when the
/// survivors are to run the same batch again (the failed replica removed,
/// when recovery is `on`), the error otherwise. A failed pass changed
/// nothing, so the same batch can run again.
pub(super) fn recover_pass<S: StackTypes, O: StackOptimizer<S>>(
    group: &mut ReplicaGroup<S, O>,
    on: bool,
    error: ElasticError,
) -> Result<(), TrainerError> {
    match recoverable(group, on, &error) {
        Some(Recovery::Remove(replica)) => {
            tracing::warn!(%error, replica, "a replica failed; the group shrinks to the survivors and redoes the step");
            group.remove_replica(replica)?;
        }
        Some(Recovery::Redo) => {
            let left = group.num_replicas();
            tracing::warn!(%error, left, "replicas were left behind; the survivors redo the step");
        }
        None => return Err(error.into()),
    }
    Ok(())
}

/// Applies `group`'s gradients with learning rate `lr`. Replicas whose
/// optimizer step failed while the others' succeeded leave the group, when
/// recovery is `on`: the others applied it, so the step counts, and is not
/// run again.
pub(super) fn optimizer_step<S: StackTypes, O: StackOptimizer<S>>(
    group: &mut ReplicaGroup<S, O>,
    on: bool,
    lr: f64,
) -> Result<(), TrainerError> {
    match group.step(lr) {
        Ok(()) => Ok(()),
        Err(ElasticError::PartialStep { failed, source }) if on && !group.spans_processes() => {
            tracing::warn!(error = %source, ?failed, "replicas failed their optimizer step; they leave the group");
            for &replica in failed.iter().rev() {
                group.remove_replica(replica)?;
            }
            Ok(())
        }
        Err(error) => Err(error.into()),
    }
}

/// How the trainer goes on after a failed pass, when recovery is on:
/// the replica the error names leaves and the survivors redo the step (a
/// failure of that replica's own, not a non-finite loss, which the same
/// batch would give again, and another replica left), or the survivors
/// of a step that left stuck replicas behind redo it. Never in a group
/// across processes: it cannot shrink, and the step fails with its own
/// error.
fn recoverable<S: StackTypes, O: StackOptimizer<S>>(
    group: &ReplicaGroup<S, O>,
    on: bool,
    error: &ElasticError,
) -> Option<Recovery> {
    if !on || group.num_replicas() == 0 || group.spans_processes() {
        return None;
    }
    match error {
        ElasticError::Replica {
            source: burn_pipe::PipeError::NonFinite { .. },
            ..
        } => None,
        ElasticError::Replica { replica, .. } | ElasticError::ReplicaPanicked { replica, .. }
            if group.num_replicas() >= 2 =>
        {
            Some(Recovery::Remove(*replica))
        }
        ElasticError::Timeout { lost, .. } if !lost.is_empty() => Some(Recovery::Redo),
        _ => None,
    }
}
