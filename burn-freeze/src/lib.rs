//! Freeze a prefix of a Burn model with no autodiff graph.
//!
//! This crate is the lowest layer of the PipeTransformer workspace and defines
//! its one shared abstraction, the **layer-stack contract**: a model is an
//! ordered list of partition units ([`Unit`]) held in a [`LayerStack`], with
//! one hidden activation type between them ([`Activation`]). The first unit
//! may take another input type and the last may return another output type;
//! the compiler checks the chain, and [`StackTypes`] bundles the types so
//! generic code carries one bound. Crates built on it partition such stacks
//! into pipeline stages and replicate the pipelines; this one knows none of
//! them.
//!
//! A unit runs on the autodiff backend while it trains and on the inner
//! backend once frozen ([`Unit::forward_inner`]), so a frozen prefix records
//! no graph at all. [`unit!`] and [`unit_enum!`] write the [`Unit`] impls;
//! an activation of several tensors is a tuple of them, or a struct given to
//! [`activation!`].
//!
//! On top of the contract:
//! - **Frozen execution** ([`UnitRange`]): a contiguous range of units, its
//!   frozen prefix on the inner backend ([`FrozenUnits`]) and its trainable
//!   rest as one module for one optimizer ([`TrainableUnits`]). It is the one
//!   implementation: [`FreezableStack`] holds one range, every pipeline
//!   stage built on this crate holds one. [`check_freeze`] is the one rule for what may be
//!   frozen ([`check_unfreeze`] for what may thaw) and
//!   [`plumbing::optimizer_for`] the one helper that keeps the optimizer
//!   state of the units that still train.
//! - **The freeze front** ([`FreezeFront`]): implemented by
//!   [`FreezableStack`] here and by what crates built on it train (a
//!   pipeline, say), so one policy drives any of them.
//! - **AutoFreeze** ([`FreezePolicy`], [`AutoFreeze`]): the default rule,
//!   [`Evidence`] (the bottom block of layers freezes once its own evidence,
//!   its share of the loss's decrease by default ([`LayerSignal`]), says
//!   training no longer gains from updating it; a held-out loss guards
//!   it), the paper's rule ([`AlphaArgmin`]), the gradient-change rule
//!   ([`ChangeRate`]) and fixed schedules ([`FixedSchedule`]), fed per-layer
//!   statistics read from the gradients the step already computed
//!   ([`LayerMap`], [`GradNorm`], [`FreezeFront::last_update_gains`]).
//! - **AutoCache** ([`ActivationCache`]): per-sample frozen-prefix outputs in
//!   memory and spilled to disk, served by [`plumbing::serve_cached`] (used
//!   by [`FreezableStack::forward_cached`] and by a pipeline's first stage).
//!
//! What a model's training code does not need stays apart: the building
//! blocks that crates which run units themselves use ([`plumbing`]), the
//! fault-injection registry of the reliability tests ([`fault`], live only
//! with the `fault-injection` cargo feature; each crate names its own fault
//! points), and what
//! the workspace's tests share (`testing`, with the `testing` cargo feature).
//!
//! The root's names, by concept:
//! - **The layer-stack contract**: [`Unit`] (written by [`unit!`] and
//!   [`unit_enum!`]), [`InnerOf`], [`LayerStack`], [`IntoLayerStack`],
//!   [`StackOf`], [`TypesOf`], [`StackTypes`], [`StackMarker`], the inner
//!   types ([`InnerBackendOf`], [`InnerInput`], [`InnerFirst`],
//!   [`InnerMiddle`], [`InnerLast`], [`InnerHidden`], [`InnerOutput`]) and
//!   [`TrainableUnits`]; activations: [`Activation`], [`AutodiffActivation`],
//!   [`Differentiable`], [`ActivationPart`] (with [`activation!`]).
//! - **Frozen execution**: [`UnitRange`], [`FrozenUnits`], [`FreezableStack`],
//!   [`check_freeze`], [`check_unfreeze`]; optimizer state:
//!   [`StackOptimizer`], [`ParamStates`]; errors: [`FreezeError`],
//!   [`StackError`].
//! - **The freeze front and the cache, one trait each for every level**
//!   (stack, pipeline, group): [`FreezeFront`], [`CacheHolder`].
//! - **AutoFreeze**: [`AutoFreeze`], [`FreezePolicy`], [`FreezeState`],
//!   [`PolicyState`]; the rules, the default first: [`Evidence`]
//!   ([`EvidenceConfig`], [`LayerSignal`]), [`AlphaArgmin`]
//!   ([`AlphaArgminConfig`], [`ArgminStatistic`], [`alpha_front`]),
//!   [`ChangeRate`] ([`ChangeRateConfig`], [`ChangeRateReading`]),
//!   [`FixedSchedule`]; statistics: [`LayerMap`], [`GradNorm`].
//! - **AutoCache**: [`ActivationCache`], [`StackCache`], [`CacheConfig`],
//!   [`CacheStats`], [`Cacheable`], [`CachePart`], [`CacheError`].
//! - **Modules**: [`plumbing`], [`fault`], `testing`.
//!
//! Burn initialises parameters lazily: two clones of a module whose weights
//! were never read get different random weights. Read them (a forward pass or
//! `Module::visit`) before cloning a model you want to compare.

mod activation;
mod cache;
mod composite;
mod error;
mod flow;
mod freezable;
mod freeze_front;
mod frozen;
mod grad_sums;
mod leaves;
mod optim_state;
mod policy;
mod range;
mod stack;
mod types;
mod unit;
mod update_gain;

pub mod fault;
pub mod plumbing;
#[cfg(feature = "testing")]
pub mod testing;

pub use activation::{Activation, AutodiffActivation, Differentiable};
pub use cache::{ActivationCache, CacheConfig, CacheHolder, CacheStats, Cacheable, StackCache};
pub use composite::{ActivationPart, CachePart};
pub use error::{CacheError, FreezeError, PolicyConfigError, StackError};
pub use freezable::FreezableStack;
pub use freeze_front::FreezeFront;
pub use frozen::FrozenUnits;
pub use optim_state::{ParamStates, StackOptimizer};
pub use policy::{
    AlphaArgmin, AlphaArgminConfig, ArgminStatistic, AutoFreeze, ChangeRate, ChangeRateConfig,
    ChangeRateReading, Evidence, EvidenceConfig, FixedSchedule, FreezePolicy, FreezeState,
    GradNorm, LayerMap, LayerSignal, PolicyState, alpha_front,
};
pub use range::{UnitRange, check_freeze, check_unfreeze};
pub use stack::{IntoLayerStack, LayerStack, StackOf, TypesOf};
pub use types::{
    InnerBackendOf, InnerFirst, InnerHidden, InnerInput, InnerLast, InnerMiddle, InnerOutput,
    StackMarker, StackTypes, TrainableUnits,
};
pub use unit::{InnerOf, Unit};

#[doc(hidden)]
pub mod __private {
    pub use crate::composite::{sum_seeds, take_cache_parts};
    pub use burn::tensor::backend::{AutodiffBackend, Backend};
    pub use burn::tensor::{Tensor, TensorData};
}
