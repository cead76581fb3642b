//! Building blocks for crates that run a layer stack's units themselves:
//! `burn-pipe`'s stages and `burn-elastic-dp`'s replicas (and tests that
//! check them).
//!
//! Training a model does not need any of this: [`FreezableStack`],
//! `burn_pipe::Pipeline` and `burn_elastic_dp::Trainer` use it for you. It is
//! what a [`UnitRange`] consumes and returns ([`Flow`]), how a stage gets
//! fresh parameter leaves ([`fresh_leaves`]), how optimizer state follows
//! units that move or freeze ([`StatePool`], [`optimizer_for`]), and how a
//! first stage serves its frozen prefix from the AutoCache
//! ([`serve_prefix`]), and how the gradients of an epoch are summed per
//! parameter ([`GradientSums`]).
//!
//! [`FreezableStack`]: crate::FreezableStack
//! [`UnitRange`]: crate::UnitRange

pub use crate::cache::{check_sample_ids, serve_prefix};
pub use crate::flow::{
    Flow, InnerFlow, TrainFlow, flow_from_inner, flow_into_inner, flow_to_device,
};
pub use crate::grad_sums::GradientSums;
pub use crate::leaves::fresh_leaves;
pub use crate::optim_state::{
    StatePool, optimizer_for, pool_optimizer_state, retain_optimizer_state,
};
