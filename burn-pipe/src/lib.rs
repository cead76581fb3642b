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
//! `burn_freeze::AutoFreeze` drives it with any freeze policy, and holds an
//! AutoCache ([`CacheHolder`](burn_freeze::CacheHolder)) for stage 0's
//! frozen units.
//!
//! The root holds what a user needs, by concept:
//! - **The pipeline**: [`Pipeline`], built from a [`PipelineConfig`]; one
//!   method trains a step, [`Pipeline::forward_backward`] (its options in
//!   [`StepOptions`]), then [`Pipeline::step`]
//!   ([`Pipeline::train_step`] does both), and reports a [`StepReport`] or a
//!   [`PipeError`]. The loss is a [`MicroBatchLoss`]; a [`StageGradients`]
//!   hook sees each stage's gradients as soon as they are done; the
//!   micro-batches run under a [`Schedule`].
//! - **Balancing (AutoPipe)**: what each unit costs ([`UnitCosts`], measured
//!   by [`profile_units`] as [`UnitProfile`]s), the exact partition
//!   ([`balance_exact`]), each stage's memory ([`UnitMemory`]) and the
//!   micro-batch count ([`default_micro_batches`], the paper's, or
//!   [`choose_micro_batches`], the fastest predicted).
//! - **By path**: the rest of balancing ([`balance`]: the greedy rule,
//!   compression, memory queries), of the micro-batch count ([`micro`]:
//!   profiles at several sizes, candidates, the split of a batch), the
//!   schedules' operations ([`schedule`]), what crates that run pipelines
//!   themselves share ([`plumbing`]) and the fault points of the
//!   reliability tests ([`fault`]).

pub mod balance;
pub mod fault;
mod runtime;

pub use balance::{UnitCosts, UnitMemory, UnitProfile, balance_exact, profile_units};
pub use micro::{choose_micro_batches, default_micro_batches};
pub use runtime::config::PipelineConfig;
pub use runtime::error::PipeError;
pub use runtime::hook::StageGradients;
pub use runtime::loss::MicroBatchLoss;
pub use runtime::options::StepOptions;
pub use runtime::pipeline::Pipeline;
pub use runtime::report::StepReport;
pub use runtime::schedule::Schedule;

pub mod micro {
    //! The micro-batch count M: the paper's per pipeline length
    //! ([`default_micro_batches`]), or the fastest predicted
    //! ([`choose_micro_batches`]) from unit times measured at several
    //! micro-batch sizes ([`profile_micro_batches`]); and how a batch splits
    //! into M micro-batches ([`micro_batch_sizes`]).
    //!
    //! ```
    //! use burn_pipe::micro::{default_micro_batches, micro_batch_sizes};
    //!
    //! assert_eq!(micro_batch_sizes(10, 4)?, vec![3, 3, 2, 2]);
    //! assert!(default_micro_batches(4) >= 4);
    //! # Ok::<(), burn_pipe::PipeError>(())
    //! ```

    pub use crate::balance::micro_count::count::{
        MicroBatchCandidate, MicroBatchChoice, MicroBatchQuery, SharedCores, choose_micro_batches,
        choose_micro_batches_where, default_micro_batches, micro_batch_candidates, predict_step,
    };
    pub use crate::balance::micro_count::error::MicroSearchError;
    pub use crate::balance::micro_count::times::{MicroBatchTimes, micro_batch_profile_sizes};
    pub use crate::balance::profile::profile_micro_batches;
    pub use crate::runtime::split::micro_batch_sizes;
}

pub mod schedule {
    //! The order of operations each stage runs under a [`Schedule`]:
    //! [`stage_ops`], and how many micro-batches a stage holds at most
    //! ([`peak_in_flight`]).
    //!
    //! ```
    //! use burn_pipe::Schedule;
    //! use burn_pipe::schedule::{Op, peak_in_flight, stage_ops};
    //!
    //! let ops = stage_ops(Schedule::GPipe, 0, 2, 3);
    //! assert_eq!(ops.first(), Some(&Op::Forward(0)));
    //! assert_eq!(peak_in_flight(&ops), 3); // GPipe holds every micro-batch
    //! ```

    pub use crate::runtime::schedule::{Op, Schedule, peak_in_flight, stage_ops};
}

pub mod plumbing {
    //! What crates that run pipelines on threads of their own share with
    //! this one (a data-parallel group's replica threads): a caught panic's
    //! message, quiet worker panics, and a pipeline's stages copied for
    //! evaluation on another thread.

    pub use crate::runtime::error::panic_message;
    pub use crate::runtime::evaluation::EvaluationCopy;
    pub use crate::runtime::quiet::quiet_worker_panics;
}
