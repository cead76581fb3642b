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
//! The group resizes at a step boundary ([`ReplicaGroup::resize`]): a new
//! replica is a copy of a live one, optimizer state included.
//!
//! Gradients are all-reduced per tensor or in buckets ([`AllReduce`]).
//!
//! A group can span several processes, on one machine or several
//! ([`NodeConfig`]): the processes of one MPI job (`mpirun`,
//! cargo feature `mpi`, `Mpi`); each holds its own replicas, and the
//! processes all-reduce their gradients through MPI.
//!
//! A replica stuck in its own computation is left behind once the step's
//! bound passes, and the group goes on with the others.
//!
//! On top of the group, [`Trainer`] is PipeTransformer
//! itself: AutoFreeze moves the freeze front, AutoPipe re-plans the
//! pipeline into fewer stages, AutoDP adds replicas on the freed devices,
//! AutoCache serves the frozen prefix, every sample is trained once per
//! epoch, failed replicas are recovered from and runs checkpointed and
//! resumed; one [`TrainerConfig`] says what runs. The module [`plan`]
//! predicts, before any training, what such a run does each epoch and how
//! long it takes.
//!
//! The root's names, by concept:
//! - **The group**: [`ReplicaGroup`], [`ReplicaConfig`], [`GroupReport`],
//!   [`AllReduce`], [`ElasticError`]; its freeze front and AutoCache are
//!   burn-freeze's traits (`FreezeFront`, `CacheHolder`).
//! - **Across processes**: [`NodeConfig`], [`ExchangePhases`], `Mpi` and
//!   `MPI_BUCKET_VALUES` (cargo feature `mpi`), [`launcher`].
//! - **Data**: [`ElasticSampler`], [`BatchPolicy`]; stopping:
//!   [`StopSignal`], [`STOPPED_EXIT_CODE`].
//! - **PipeTransformer**: [`Trainer`], [`TrainerConfig`], [`TrainerError`],
//!   [`EpochReport`], [`Transition`], [`StepFlow`], [`StepProgress`],
//!   [`Parts`], [`FreezeRule`], [`LayerSpec`], [`CostModel`],
//!   [`MemoryConfig`], [`CheckpointConfig`]; its bounds: [`TrainerTypes`],
//!   [`TrainerTypesOf`], [`TrainerBackend`], [`TrainerInput`],
//!   [`CacheableStack`].
//! - **Modules**: [`plan`], [`shape`], `burn_train` (cargo feature
//!   `burn-train`), [`fault`].
//!
//! [`Pipeline`]: burn_pipe::Pipeline
#![cfg_attr(docsrs, feature(doc_cfg))]

mod collective;
mod error;
pub mod fault;
mod group;
mod nodes;
mod pipetransformer;
mod sampler;
mod spawn;
mod stop;

pub use nodes::launcher;
#[cfg(feature = "burn-train")]
pub use pipetransformer::burn_train;
pub use pipetransformer::{plan, shape};

pub use collective::AllReduce;
pub use error::ElasticError;
pub use group::config::ReplicaConfig;
pub use group::{GroupReport, ReplicaGroup};
#[cfg(feature = "mpi")]
pub use nodes::mpi::{BUCKET_VALUES as MPI_BUCKET_VALUES, Mpi};
pub use nodes::{ExchangePhases, NodeConfig};
pub use pipetransformer::trainer::{
    CacheableStack, CheckpointConfig, CostModel, EpochReport, FreezeRule, LayerSpec, MemoryConfig,
    Parts, StepFlow, StepProgress, Trainer, TrainerBackend, TrainerConfig, TrainerError,
    TrainerInput, TrainerTypes, TrainerTypesOf, Transition,
};
pub use sampler::{BatchPolicy, ElasticSampler};
pub use stop::{STOPPED_EXIT_CODE, StopSignal};
