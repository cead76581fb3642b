//! The group across processes: its ranks, their replicas, the exchange's phases, the stop request
//! and agreement.

use burn_freeze::{StackOptimizer, StackTypes};

use super::ReplicaGroup;
use crate::error::ElasticError;
use crate::nodes::StepHeader;
use crate::stop::StopSignal;
use burn_freeze::FreezeFront;
use std::time::Instant;

impl<S, O> ReplicaGroup<S, O>
where
    S: StackTypes,
    O: StackOptimizer<S>,
{
    /// Whether the group spans other processes. Its replica count then
    /// changes only in lockstep ([`resize`](Self::resize) on every process
    /// at the same step boundary); a replica cannot be removed
    /// ([`ElasticError::NodesFixed`]).
    pub fn spans_processes(&self) -> bool {
        self.nodes.exist()
    }

    /// How long the phases of the last step's exchanges of gradients with
    /// the other processes took in this process (copy out, the consistency
    /// check, `MPI_Allreduce`, copy back); `None` when the group spans no
    /// other process.
    pub fn exchange_phases(&self) -> Option<crate::ExchangePhases> {
        self.nodes.phases()
    }

    /// Processes of the group: 1, or the ranks of the MPI job it spans.
    pub fn processes(&self) -> usize {
        self.nodes.processes()
    }

    /// Replicas of the whole group, in every process: this process's count
    /// without other processes. The global batch is shared among them.
    pub fn total_replicas(&self) -> usize {
        self.replica_counts().iter().sum()
    }

    /// Every process's replica count, by rank, as last exchanged
    /// (`[num_replicas()]` without other processes).
    pub fn replica_counts(&self) -> Vec<usize> {
        self.nodes.counts(self.replicas.len())
    }

    /// Watches `signal`: once it is raised, [`stop_requested`](Self::stop_requested)
    /// says so after the next step, on every process of the group.
    pub fn set_stop_signal(&mut self, signal: StopSignal) {
        self.stop = Some(signal);
    }

    /// Whether the run is asked to stop at this step boundary: this
    /// process's signal was raised (without other processes), or some
    /// process's signal was raised before the last step began (with them:
    /// it travels in the step headers, so every process stops after the
    /// same step).
    pub fn stop_requested(&self) -> bool {
        if self.nodes.exist() {
            self.nodes.stop_seen()
        } else {
            self.stop.as_ref().is_some_and(StopSignal::raised)
        }
    }

    /// The element-wise maximum of `values` over every process of the group
    /// (`values` without other processes), within the step's bound: how
    /// measurements (unit times, activation bytes) are agreed, so that every
    /// process decides on the same figures, those of the slowest. Every
    /// process must call it at the same point with as many values.
    ///
    /// The maximum (one small all-reduce) is exact and does not depend on the
    /// order of the ranks, so every process decides on the same figures (and
    /// so on the same balance, micro-batch count and start), and it balances
    /// for the slowest process.
    pub fn agree_max(&self, values: Vec<f64>) -> Result<Vec<f64>, ElasticError> {
        if values.iter().any(|v| !v.is_finite()) {
            return Err(ElasticError::Node {
                node: super::nodes::OtherNodes::job_rank().unwrap_or(0),
                message: "a measurement to agree on is not finite".into(),
            });
        }
        self.nodes.max(values, Instant::now() + self.timeout())
    }

    /// This process's header of the next step: its replicas, a hash of the
    /// shape they run (balance, front, micro-batches) and its stop request.
    pub(super) fn step_header(&self) -> StepHeader {
        use std::hash::{Hash, Hasher};
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        self.balance().hash(&mut hasher);
        self.front().hash(&mut hasher);
        self.micro_batches().hash(&mut hasher);
        StepHeader {
            local: self.replicas.len(),
            shape: hasher.finish(),
            stop: self.stop.as_ref().is_some_and(StopSignal::raised),
        }
    }
}
