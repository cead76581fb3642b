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
//! Apart from the runtime, balancing decides the pipeline's shape (AutoPipe):
//! the exact partitioner ([`balance_exact`]), the paper's greedy rule for
//! comparison, freeze-aware costs ([`UnitCosts`]), pipeline compression
//! ([`compress`]) and the paper's micro-batch count
//! ([`default_micro_batches`]); [`profile_units`] measures per-unit forward
//! and backward time on the real backend, and [`profile_micro_batches`] at
//! several micro-batch sizes, from which [`choose_micro_batches`] picks the
//! micro-batch count with the fastest predicted step. [`UnitMemory`]
//! estimates each stage's bytes (parameters, gradients, optimizer state,
//! activations), which memory-aware AutoPipe checks against a per-device
//! budget.

mod balance;
pub mod fault;
mod runtime;

pub use balance::costs::{UnitCosts, UnitProfile, UnitState, unit_param_costs};
pub use balance::memory::{
    HeapCounter, MemoryQuery, StageMemory, UnitMemory, float_bytes, measure_unit_memory,
};
pub use balance::micro_count::count::{
    MicroBatchCandidate, MicroBatchChoice, MicroBatchQuery, choose_micro_batches,
    choose_micro_batches_where, default_micro_batches, micro_batch_candidates, predict_step,
};
pub use balance::micro_count::error::MicroSearchError;
pub use balance::micro_count::times::{MicroBatchTimes, micro_batch_profile_sizes};
pub use balance::partition::{balance_exact, balance_greedy, compress, largest_stage};
pub use balance::profile::{profile_micro_batches, profile_units};
pub use runtime::config::PipelineConfig;
pub use runtime::error::{PipeError, panic_message};
pub use runtime::hook::StageGradients;
pub use runtime::loss::MicroBatchLoss;
pub use runtime::pipeline::Pipeline;
pub use runtime::quiet::quiet_worker_panics;
pub use runtime::report::StepReport;
pub use runtime::schedule::{Op, Schedule, peak_in_flight, stage_ops};
pub use runtime::split::micro_batch_sizes;
