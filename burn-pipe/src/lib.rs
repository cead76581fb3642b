//! Pipeline-parallel training of Burn layer stacks.
//!
//! A [`LayerStack`](burn_freeze::LayerStack) (from `burn-freeze`) is cut into
//! stages of contiguous units; each stage runs on its own device and worker
//! thread, and crossbeam channels carry activations forward and gradients
//! back. A mini-batch is split into micro-batches that stream through the
//! stages under a [`Schedule`]: GPipe's fill-drain or 1F1B. Gradients equal
//! those of plain training, and each stage steps its own optimizer.
//!
//! AutoPipe lives in [`partition`]: the exact partitioner
//! ([`balance_exact`]), the paper's greedy rule for comparison, freeze-aware
//! costs, pipeline compression ([`compress`]) and the default micro-batch
//! count; [`profile_units`] measures per-unit forward and backward time on
//! the real backend.
//!
//! Files, one concern each: `schedule.rs` (the order of passes),
//! `microbatch.rs` (splitting), `stage.rs` (a stage's units), `worker.rs`
//! (one stage's thread), `pipeline.rs` (the public API), `partition.rs`,
//! `profile.rs`.

mod config;
mod error;
mod microbatch;
pub mod partition;
mod pipeline;
mod profile;
mod schedule;
mod stage;
mod worker;

pub use config::{PipelineConfig, Schedule};
pub use error::PipeError;
pub use microbatch::micro_batch_sizes;
pub use partition::{
    balance_exact, balance_greedy, compress, default_micro_batches, freeze_aware_costs,
    largest_stage, unit_param_costs,
};
pub use pipeline::{Pipeline, StepReport};
pub use profile::{UnitProfile, profile_units};
pub use schedule::{Op, peak_in_flight, stage_ops};
pub use stage::StageModule;
