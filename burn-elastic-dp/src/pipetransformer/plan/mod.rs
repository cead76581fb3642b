//! A planner and simulator for PipeTransformer: before any training, what
//! it will do each epoch (frozen layers F, stages K, replicas R,
//! micro-batches M, stage boundaries) and how long each epoch takes, split
//! into compute, bubble, all-reduce and transitions, against the baseline
//! (pipeline plus data parallel, nothing frozen).
//!
//! It uses the rules the real code uses, in the trainer's vocabulary
//! ([`FreezeRule`](crate::FreezeRule), [`Parts`](crate::Parts),
//! [`LayerSpec`](crate::LayerSpec), [`CostModel`](crate::CostModel)):
//! burn-freeze's freeze schedule and layer map, the trainer's shape rule
//! ([`crate::pipetransformer::shape`]: [`initial_shape`](crate::pipetransformer::shape::initial_shape),
//! [`reshape`](crate::pipetransformer::shape::reshape)) on burn-pipe's one cost rule
//! ([`burn_pipe::UnitCosts`]), burn-pipe's micro-batch count and schedule
//! (`stage_ops`), and the replica group's all-reduce (per tensor or
//! bucketed, burn-collective's ring, tree and centralized strategies,
//! locally then across nodes).

mod collective_model;
mod config;
mod error;
mod model;
mod outcome;
mod planner;
mod sim;
mod step;
#[cfg(test)]
mod tests;
mod transition;

pub use collective_model::{
    Link, ReduceGroup, all_reduce_cost, buckets, centralized_all_reduce, centralized_reduce,
    ring_all_reduce, tree_all_reduce, tree_reduce,
};
pub use config::{ClusterConfig, PlanConfig, ReduceTiming, TransitionCost};
pub use error::PlanError;
pub use model::{MeasuredPass, ModelSpec, UnitSpec};
pub use outcome::{EpochPlan, EpochTime, Plan};
pub use planner::plan;
pub use sim::{OpSpan, PipelineSim, PipelineTrace, StageWork, parallelism_at, shares};
pub use step::{StepTime, step_time};
