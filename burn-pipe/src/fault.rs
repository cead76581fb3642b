//! burn-pipe's fault points (see [`burn_freeze::fault`]): where a reliability
//! test may make a pipeline fail. Each fires as an error (or, on a stage's
//! worker thread, a panic) that names the place; without burn-freeze's
//! `fault-injection` feature no point does anything.
//!
//! ```
//! use burn_freeze::fault;
//!
//! // Nothing armed: every point passes.
//! assert!(fault::check(burn_pipe::fault::FORWARD, Some(1), Some(0)).is_ok());
//! assert_eq!(burn_pipe::fault::STAGE_THREAD.name(), "stage thread start");
//! ```

use burn_freeze::fault::Phase;

/// A stage's forward pass of a micro-batch (stage and micro-batch given).
pub const FORWARD: Phase = Phase::new("forward");
/// A stage's backward pass of a micro-batch (stage and micro-batch given).
pub const BACKWARD: Phase = Phase::new("backward");
/// A pipeline's optimizer step, before any stage steps.
pub const STEP: Phase = Phase::new("optimizer step");
/// Moving units between stages ([`Pipeline::repartition`](crate::Pipeline::repartition)).
pub const REPARTITION: Phase = Phase::new("repartition");
/// Building a copy of a pipeline for a new replica
/// ([`Pipeline::replicate`](crate::Pipeline::replicate)).
pub const REPLICATE: Phase = Phase::new("replica spawn");
/// Starting a stage's worker thread (stage given): an error fails as the
/// operating system's refusal to start it would.
pub const STAGE_THREAD: Phase = Phase::new("stage thread start");

/// Synchronising the device while profiling a unit's times
/// ([`profile_units`](crate::profile_units)) or measuring its memory
/// ([`measure_unit_memory`](crate::measure_unit_memory)) (unit given, as
/// the stage): an error fails as a failing device's sync would.
pub const DEVICE_SYNC: Phase = Phase::new("device sync");

/// Every point of this crate.
pub const ALL: [Phase; 7] = [
    FORWARD,
    BACKWARD,
    STEP,
    REPARTITION,
    REPLICATE,
    STAGE_THREAD,
    DEVICE_SYNC,
];
