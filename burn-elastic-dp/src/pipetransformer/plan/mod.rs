//! A planner and simulator for PipeTransformer ([`plan`]): before any training, each epoch's F, K,
//! R, M and stages, and its time (compute, bubble, all-reduce, transitions), against the baseline.

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
