//! How long each phase of a step's exchanges with the other processes took.

use std::time::Duration;

/// How long the phases of this process's exchanges of gradients with the
/// other processes took in the last step, summed over the step's exchanges
/// (one per stage with gradients), as the process's leader replica saw them
/// ([`ReplicaGroup::exchange_phases`](crate::ReplicaGroup::exchange_phases)).
/// The phases run one after another; `total` is the whole exchange, from the
/// local gradients to the reduced ones back in their tensors (waits for the
/// MPI thread included), so `total` minus the phases is the hand-offs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ExchangePhases {
    /// Exchanges of gradients in the step.
    pub exchanges: usize,
    /// f32 values summed (every exchange's).
    pub values: usize,
    /// Of `values`, those not sent: the rows of an embedding table that no
    /// rank touched in the step (their sum is zero, as they are).
    pub skipped: usize,
    /// `MPI_Allreduce` calls that summed them (buckets of at most
    /// [`MPI_BUCKET_VALUES`](crate::MPI_BUCKET_VALUES)).
    pub buckets: usize,
    /// The local gradients into the exchange: the small ones copied side by
    /// side into the stage's arena, the large ones taken from their tensors
    /// (without a copy on the CPU backend).
    pub copy_out: Duration,
    /// The typed check that every rank is at the same exchange of the same
    /// kind and length (arrival messages and one small all-reduce); it
    /// absorbs the wait for the last rank to arrive.
    pub check: Duration,
    /// The buckets' `MPI_Allreduce` calls (with an embedding table's, the
    /// marking of its touched rows and their packing; with more than two
    /// ranks, the check that every rank holds the same bits).
    pub all_reduce: Duration,
    /// The sums back into gradient tensors (a copy for the small ones
    /// only).
    pub copy_back: Duration,
    /// The whole exchange.
    pub total: Duration,
}

impl ExchangePhases {
    /// Adds `other`'s figures to these.
    #[cfg_attr(not(feature = "mpi"), allow(dead_code))] // recorded by the MPI link
    pub(crate) fn add(&mut self, other: &ExchangePhases) {
        self.exchanges += other.exchanges;
        self.values += other.values;
        self.skipped += other.skipped;
        self.buckets += other.buckets;
        self.copy_out += other.copy_out;
        self.check += other.check;
        self.all_reduce += other.all_reduce;
        self.copy_back += other.copy_back;
        self.total += other.total;
    }
}
