//! A planner and simulator for PipeTransformer: before any training, what
//! it will do each epoch (frozen layers F, stages K, replicas R,
//! micro-batches M, stage boundaries) and how long each epoch takes, split
//! into compute, bubble, all-reduce and transitions, against the baseline
//! (pipeline plus data parallel, nothing frozen).
//!
//! It uses the rules the real code uses: burn-freeze's alpha schedule and
//! layer map, burn-pipe's partitioner (`freeze_aware_costs`, `compress`,
//! `balance_exact`, `default_micro_batches`) and schedule (`stage_ops`), and
//! the replica group's all-reduce (per tensor or bucketed, burn-collective's
//! ring, tree and centralized strategies, locally then across nodes).
//!
//! Files, one concern each: `costs.rs` (what a model costs, per unit),
//! `sim.rs` (a discrete-event simulation of one pipeline step),
//! `collective_model.rs` (all-reduce costs), `planner.rs` (the epochs),
//! `error.rs`.

mod collective_model;
mod costs;
mod error;
mod planner;
mod sim;

pub use collective_model::{
    Link, ReduceGroup, all_reduce_cost, buckets, centralized_all_reduce, centralized_reduce,
    ring_all_reduce, tree_all_reduce, tree_reduce,
};
pub use costs::{MeasuredPass, ModelCosts, UnitCost};
pub use error::PlanError;
pub use planner::{
    ClusterConfig, CostBasis, EpochPlan, EpochTime, Plan, PlanConfig, TransitionCost, plan,
};
pub use sim::{
    OpSpan, PipelineSim, PipelineTrace, ReduceTiming, StageWork, StepTime, parallelism_at, shares,
    step_time,
};
