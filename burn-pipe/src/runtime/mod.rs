//! The runtime: a pipeline, its configuration, the pass that streams
//! micro-batches through its stages, and the stage workers.

pub(crate) mod build;
pub(crate) mod config;
pub(crate) mod error;
pub(crate) mod evaluation;
pub(crate) mod forward_backward;
pub(crate) mod front;
pub(crate) mod hook;
pub(crate) mod loss;
pub(crate) mod options;
pub(crate) mod pass;
pub(crate) mod pipeline;
pub(crate) mod placement;
pub(crate) mod quiet;
pub(crate) mod report;
pub(crate) mod reshape;
pub(crate) mod schedule;
pub(crate) mod split;
pub(crate) mod stage_worker;
pub(crate) mod threads;
pub(crate) mod wiring;
