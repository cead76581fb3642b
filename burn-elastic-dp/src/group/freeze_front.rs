//! The group's freeze front: every replica frozen alike.

use burn_freeze::{FreezeFront, GradNorm, StackOptimizer, StackTypes};

use super::ReplicaGroup;
use crate::error::ElasticError;

impl<S, O> FreezeFront for ReplicaGroup<S, O>
where
    S: StackTypes,
    O: StackOptimizer<S>,
{
    type Error = ElasticError;

    fn num_units(&self) -> usize {
        ReplicaGroup::num_units(self)
    }

    fn front(&self) -> usize {
        ReplicaGroup::front(self)
    }

    fn freeze_to(&mut self, front: usize) -> Result<(), ElasticError> {
        ReplicaGroup::freeze_to(self, front)
    }

    fn unfreeze_to(&mut self, front: usize) -> Result<(), ElasticError> {
        ReplicaGroup::unfreeze_to(self, front)
    }

    /// Replica 0's: after the all-reduce every replica stepped with the same
    /// gradients (none once a step lost every replica).
    fn last_gradient_norms(&self) -> Vec<Option<GradNorm>> {
        match self.replicas.first() {
            Some(replica) => replica.last_gradient_norms(),
            None => vec![None; self.num_units()],
        }
    }

    /// On every replica, each stage its own units' sums: they all add the
    /// same all-reduced gradients, so any replica's sums are the group's,
    /// whichever replicas a failure leaves; a new replica copies replica
    /// 0's ([`resize`](ReplicaGroup::resize)).
    fn set_gradient_sums(&mut self, keep: bool) {
        for replica in &mut self.replicas {
            replica.set_gradient_sums(keep);
        }
    }

    /// Replica 0's (every replica holds the same; none once a step lost
    /// every replica).
    fn gradient_sum_norms(&self) -> Vec<Option<GradNorm>> {
        match self.replicas.first() {
            Some(replica) => replica.gradient_sum_norms(),
            None => vec![None; self.num_units()],
        }
    }

    fn reset_gradient_sums(&mut self) {
        for replica in &mut self.replicas {
            replica.reset_gradient_sums();
        }
    }

    /// On every replica (each stage its own snapshot); replica 0's gains
    /// are the group's, as its norms are.
    fn set_update_gains(&mut self, from: Option<usize>) {
        for replica in &mut self.replicas {
            replica.set_update_gains(from);
        }
    }

    /// Replica 0's: every replica moved alike and stepped with the same
    /// all-reduced gradients (none once a step lost every replica).
    fn last_update_gains(&self) -> Vec<Option<f64>> {
        match self.replicas.first() {
            Some(replica) => replica.last_update_gains(),
            None => vec![None; self.num_units()],
        }
    }
}
