//! What a transition between two epochs costs: rebuilding pipelines with new boundaries, re-forming
//! the replica group, copying the model to new replicas.

use crate::pipetransformer::plan::config::PlanConfig;
use crate::pipetransformer::plan::model::ModelSpec;
use crate::pipetransformer::plan::outcome::EpochPlan;
use crate::pipetransformer::shape::PipelineShape;

/// Seconds between two epochs: a pipeline rebuild when the boundaries move,
/// plus a group rebuild and copies of the weights and optimizer state to
/// the new replicas when the replica count grows.
pub(crate) fn transition_cost(
    config: &PlanConfig,
    model: &ModelSpec,
    previous: &EpochPlan,
    shape: &PipelineShape,
    front: usize,
) -> f64 {
    let (stages, replicas) = (shape.stages(), shape.replicas);
    let t = &config.transitions;
    let mut cost = 0.0;
    if previous.stages != stages || previous.balance != shape.balance {
        cost += t.pipeline_rebuild;
    }
    if previous.replicas != replicas {
        cost += t.group_rebuild;
        if replicas > previous.replicas {
            let weights: usize = model.units.iter().map(|u| u.param_bytes()).sum();
            let active: usize = model.units[front..].iter().map(|u| u.param_bytes()).sum();
            let bytes = weights as f64 + t.optimizer_state_factor * active as f64;
            // New replicas copy from a live one of their own node (every
            // node grows in lockstep), in parallel.
            cost += config.cluster.intra.transfer(bytes);
        }
    }
    cost
}
