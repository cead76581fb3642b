//! The paper's loop, PipeTransformer: the [`Trainer`](crate::Trainer) joining AutoFreeze,
//! AutoPipe, AutoDP and AutoCache, the shape rule it applies, and the planner that predicts it.

#[cfg(feature = "burn-train")]
pub mod burn_train;
pub mod plan;
pub mod shape;
pub(crate) mod trainer;
