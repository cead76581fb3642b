//! What is wrong with a timing table or a micro-batch query.

/// What is wrong with a timing table or a query.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MicroSearchError {
    /// No micro-batch size measured.
    #[error("a timing table needs at least one micro-batch size, got none")]
    NoSizes,
    /// Sizes not strictly increasing from 1 up.
    #[error("micro-batch sizes {sizes:?} must be at least 1 and strictly increasing")]
    BadSizes {
        /// The sizes given.
        sizes: Vec<usize>,
    },
    /// A size's profile with another number of units than the first's.
    #[error(
        "the profile at micro-batch size {size} has {units} units, expected {expected} (at least 1)"
    )]
    UnitCount {
        /// The micro-batch size.
        size: usize,
        /// Units in its profile.
        units: usize,
        /// Units in the first size's profile.
        expected: usize,
    },
    /// Not one profile per size.
    #[error("{profiles} profiles given for {sizes} micro-batch sizes: give one per size")]
    ProfileCount {
        /// Profiles given.
        profiles: usize,
        /// Sizes given.
        sizes: usize,
    },
    /// More micro-batches than samples, or none.
    #[error("{micro_batches} micro-batches of a batch of {batch}: M must be 1 to {batch}")]
    MicroBatchCount {
        /// M asked for.
        micro_batches: usize,
        /// Samples per replica.
        batch: usize,
    },
    /// Profiling at a micro-batch size failed (the device did not
    /// synchronise: [`PipeError::DeviceSync`](crate::PipeError::DeviceSync)).
    #[error("profiling at micro-batch size {size} failed: {error}")]
    Profile {
        /// The micro-batch size.
        size: usize,
        /// The profile's error.
        error: String,
    },
    /// No candidate accepted.
    #[error(
        "none of the {searched} micro-batch counts searched is allowed: allow at least one of 1 to {searched}"
    )]
    NoCandidate {
        /// Candidates searched.
        searched: usize,
    },
    /// A size to profile beyond the samples at hand.
    #[error(
        "cannot profile micro-batches of {size} samples on a batch of {batch}: sizes must be 1 to {batch}"
    )]
    SizeTooLarge {
        /// The size asked for.
        size: usize,
        /// Samples in the batch.
        batch: usize,
    },
    /// No sample per replica.
    #[error("the batch per replica must be at least 1 sample, got 0")]
    NoSamples,
    /// A balance that does not cover the timed units with non-empty stages.
    #[error("balance {balance:?} does not split the {units} timed units into non-empty stages")]
    BadBalance {
        /// Units per stage, as given.
        balance: Vec<usize>,
        /// Units in the table.
        units: usize,
    },
    /// Not one state per unit.
    #[error("{states} unit states given for {units} timed units: give one per unit")]
    StateCount {
        /// States given.
        states: usize,
        /// Units in the table.
        units: usize,
    },
}
