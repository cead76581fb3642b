//! burn-elastic-dp's fault points (see [`burn_freeze::fault`]; burn-pipe's
//! are [`burn_pipe::fault`]): where a reliability test may make a replica
//! group fail. Each fires as an error that names the replica (an all-reduce
//! fault, on a replica's stage worker, may panic instead); without
//! burn-freeze's `fault-injection` feature no point does anything.
//!
//! ```
//! use burn_freeze::fault;
//!
//! // Nothing armed: every point passes.
//! assert!(fault::check(burn_elastic_dp::fault::ALL_REDUCE, Some(1), None).is_ok());
//! assert_eq!(burn_elastic_dp::fault::REPLICA_THREAD.name(), "replica thread start");
//! ```

use burn_freeze::fault::Phase;

/// A replica's all-reduce of a stage's gradients (the stage given).
pub const ALL_REDUCE: Phase = Phase::new("all-reduce");
/// Starting a replica's thread for its share of a step or for its optimizer
/// step (the replica given): an error fails as the operating system's
/// refusal to start it would.
pub const REPLICA_THREAD: Phase = Phase::new("replica thread start");
/// Starting the thread that registers a replica's peer with the collective
/// (the replica given).
pub const REGISTER_THREAD: Phase = Phase::new("registration thread start");

/// Every point of this crate.
pub const ALL: [Phase; 3] = [ALL_REDUCE, REPLICA_THREAD, REGISTER_THREAD];
