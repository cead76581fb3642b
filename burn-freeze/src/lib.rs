//! Freeze a prefix of a Burn model with no autodiff graph.
//!
//! This crate is the lowest layer of the PipeTransformer workspace and defines
//! its one shared abstraction, the **layer-stack contract**: a model is an
//! ordered list of partition units ([`Unit`]) held in a [`LayerStack`], with
//! one hidden activation type between them ([`Activation`]). The first unit
//! may take another input type and the last may return another output type;
//! the compiler checks the chain. `burn-pipe` partitions such stacks into
//! pipeline stages and `burn-elastic-dp` replicates the pipelines.
//!
//! A unit runs on the autodiff backend while it trains and on the inner
//! backend once frozen ([`Unit::forward_inner`]), so a frozen prefix records
//! no graph at all.
//!
//! On top of the contract:
//! - **Frozen execution and the freeze front** ([`FreezableStack`]): units
//!   `0..front` held in inner-backend form, so they get no gradient, no
//!   optimizer state and no dropout; the front only moves up unless you
//!   explicitly unfreeze.
//! - **AutoFreeze** ([`FreezePolicy`], [`AutoFreeze`]): the paper's rule
//!   ([`AlphaArgmin`]), the gradient-change rule ([`ChangeRate`]) and fixed
//!   schedules ([`FixedSchedule`]), fed per-layer gradient norms read from the
//!   gradients the step already computed ([`LayerMap`], [`GradNorm`]).
//! - **AutoCache** ([`ActivationCache`]): per-sample frozen-prefix outputs in
//!   memory and spilled to disk, served by [`FreezableStack::forward_cached`].

mod activation;
mod cache;
mod error;
mod front;
mod frozen;
mod policy;
mod stack;
mod unit;

pub use activation::{Activation, AutodiffActivation, Differentiable};
pub use cache::{ActivationCache, CacheConfig, CacheKey, CacheStats, Cacheable};
pub use error::{CacheError, FreezeError, StackError};
pub use front::{ActiveUnits, FreezableStack, StackCache, retain_optimizer_state};
pub use frozen::FrozenUnits;
pub use policy::{
    AlphaArgmin, AlphaArgminConfig, AutoFreeze, ChangeRate, ChangeRateConfig, ChangeRateReading,
    FixedSchedule, FreezePolicy, FreezeState, GradNorm, LayerMap, alpha_front, change_rate_front,
    percentile, unit_grad_norm,
};
pub use stack::{Hidden, IntoLayerStack, LayerStack, StackOf};
pub use unit::{InnerOf, Unit};
