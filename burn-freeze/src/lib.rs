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

mod activation;
mod error;
mod stack;
mod unit;

pub use activation::{Activation, AutodiffActivation, Differentiable};
pub use error::StackError;
pub use stack::{Hidden, IntoLayerStack, LayerStack, StackOf};
pub use unit::{InnerOf, Unit};
