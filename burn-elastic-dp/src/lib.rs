//! Elastic data parallelism over Burn pipelines: AutoDP's replicas.
//!
//! A [`ReplicaGroup`] runs R replicas of a `burn-pipe` [`Pipeline`]
//! (`burn_pipe::Pipeline`), each on its own devices and thread; after each
//! replica's forward and backward pass on its shard of the batch the
//! gradients are all-reduced through burn-collective (Burn's own collective
//! engine), so the replicas step together and stay identical. The group has a
//! freeze front (`burn_freeze::FreezeFront`), so a freeze policy drives it as
//! it drives one pipeline. Every wait is bounded: a replica that fails or
//! stalls ends the step with an error naming it, and the collective is reset
//! so that no other replica stays blocked.
//!
//! Files, one concern each: `config.rs` (the configuration and `init`),
//! `group.rs` (the replicas and their threads), `collective.rs` (the
//! burn-collective glue: forming, all-reducing, dissolving and resetting a
//! group with bounded waits), `node.rs` (groups across processes), `sampler.rs` (every sample once per epoch
//! whatever the replica count), `error.rs`.
//!
//! The group resizes at a step boundary ([`ReplicaGroup::resize`]): a new
//! replica is a copy of a live one, optimizer state included.
//!
//! Gradients are all-reduced per tensor or in buckets ([`AllReduce`]).
//!
//! A group can span several processes, on one machine or several
//! ([`NodeConfig`], `node.rs`): each process holds its own replicas, and the
//! processes exchange their gradients over TCP through rank 0.
//!
//! Still to come (see the issue "burn-elastic-dp"): bounding a replica that
//! stalls in its own computation, and the PipeTransformer trainer on top.
//!
//! [`Pipeline`]: burn_pipe::Pipeline

mod collective;
mod config;
mod error;
mod group;
mod node;
pub mod plan;
mod sampler;
pub mod shape;
pub mod trainer;

pub use config::{AllReduce, ReplicaConfig};
pub use error::ElasticError;
pub use group::{GroupReport, ReplicaGroup};
pub use node::NodeConfig;
pub use sampler::{BatchPolicy, ElasticSampler};
pub use trainer::{
    CheckpointConfig, CostModel, EpochReport, FreezeRule, LayerSpec, Parts, StepInfo, Trainer,
    TrainerConfig, TrainerError, Transition,
};
