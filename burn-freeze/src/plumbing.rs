//! Building blocks for crates that run a layer stack's units themselves (a pipeline's stages,
//! data-parallel replicas, and tests that check them); training a model needs none of it.

pub use crate::cache::{BatchStart, CachedStart, cached_prefix, serve_cached};
pub use crate::flow::{
    Flow, InnerFlow, TrainFlow, flow_batch_size, flow_from_inner, flow_into_inner, flow_to_device,
    split_flow,
};
pub use crate::freeze_front::above_front;
pub use crate::grad_sums::GradientSums;
pub use crate::leaves::fresh_leaves;
pub use crate::optim_state::{
    StatePool, optimizer_for, pool_optimizer_state, retain_optimizer_state,
};
pub use crate::update_gain::{WeightSnapshot, set_gains_from};
