//! Pipeline-parallel training of Burn layer stacks.
//!
//! A [`LayerStack`](burn_freeze::LayerStack) (from `burn-freeze`) is cut into
//! stages of contiguous units (each a [`UnitRange`](burn_freeze::UnitRange));
//! each stage runs on its own device and worker thread, and crossbeam
//! channels carry activations forward and gradients back. A mini-batch is
//! split into micro-batches that stream through the stages under a
//! [`Schedule`]: GPipe's fill-drain or 1F1B. Gradients equal those of plain
//! training, and each stage steps its own optimizer. [`Pipeline`] has a
//! freeze front ([`FreezeFront`](burn_freeze::FreezeFront)), so
//! `burn_freeze::AutoFreeze` drives it with any freeze policy.
//!
//! AutoPipe lives in [`partition`]: the exact partitioner
//! ([`balance_exact`]), the paper's greedy rule for comparison, freeze-aware
//! costs ([`UnitCosts`]), pipeline compression ([`compress`]) and the default micro-batch
//! count; [`profile_units`] measures per-unit forward and backward time on
//! the real backend, and [`profile_micro_batches`] at several micro-batch
//! sizes, from which [`choose_micro_batches`] picks the micro-batch count
//! with the fastest predicted step. [`memory`] estimates each stage's bytes
//! (parameters, gradients, optimizer state, activations), which memory-aware AutoPipe
//! checks against a per-device budget.

mod config;
mod error;
mod forward_backward;
mod loss;
pub mod memory;
mod micro_search;
mod micro_times;
mod microbatch;
pub mod partition;
mod pass;
mod pipeline;
mod placement;
mod profile;
mod quiet;
mod report;
mod reshape;
mod schedule;
mod wiring;
mod worker;

pub use config::{PipelineConfig, Schedule};
pub use error::{PipeError, panic_message};
pub use loss::MicroBatchLoss;
pub use memory::{HeapCounter, MemoryQuery, StageMemory, UnitMemory, measure_unit_memory};
pub use micro_search::{
    MicroBatchCandidate, MicroBatchChoice, MicroBatchQuery, MicroSearchError, choose_micro_batches,
    choose_micro_batches_where, micro_batch_candidates, predict_step,
};
pub use micro_times::{MicroBatchTimes, micro_batch_profile_sizes};
pub use microbatch::micro_batch_sizes;
pub use partition::{
    UnitCosts, UnitState, balance_exact, balance_greedy, compress, default_micro_batches,
    largest_stage, unit_param_costs,
};
pub use pipeline::Pipeline;
pub use profile::{UnitProfile, profile_micro_batches, profile_units};
pub use report::StepReport;
pub use schedule::{Op, peak_in_flight, stage_ops};
