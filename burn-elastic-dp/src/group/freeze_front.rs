//! The group's freeze front: every replica frozen alike.

use burn_freeze::{
    FreezeFront, GradNorm, StackOptimizer, StackTypes, check_freeze, check_unfreeze,
};
use burn_pipe::Pipeline;

use super::ReplicaGroup;
use crate::error::ElasticError;

impl<S, O> ReplicaGroup<S, O>
where
    S: StackTypes,
    O: StackOptimizer<S>,
{
    /// Replica 0's per-unit readings (every replica holds the same after
    /// the all-reduce); none once a step lost every replica.
    fn first_replicas<T: Clone>(
        &self,
        read: impl Fn(&Pipeline<S, O>) -> Vec<Option<T>>,
    ) -> Vec<Option<T>> {
        match self.replicas.first() {
            Some(replica) => read(replica),
            None => vec![None; self.num_units()],
        }
    }
}

impl<S, O> FreezeFront for ReplicaGroup<S, O>
where
    S: StackTypes,
    O: StackOptimizer<S>,
{
    type Error = ElasticError;

    /// Number of units of the model.
    fn num_units(&self) -> usize {
        self.replicas
            .first()
            .map_or_else(|| self.outline.balance.iter().sum(), Pipeline::num_units)
    }

    /// The freeze front, the same on every replica (once a step lost every
    /// replica, as they had it then).
    fn front(&self) -> usize {
        self.replicas
            .first()
            .map_or(self.outline.front, Pipeline::front)
    }

    /// Freezes units `0..front` on every replica (see
    /// [`Pipeline::freeze_to`](burn_pipe::Pipeline#method.freeze_to)). Fails, changing nothing, on a front below
    /// the current one or beyond the stack, or with gradients pending.
    fn freeze_to(&mut self, front: usize) -> Result<(), ElasticError> {
        self.alive()?;
        check_freeze(front, self.front(), self.num_units())?;
        for (replica, pipeline) in self.replicas.iter_mut().enumerate() {
            pipeline
                .freeze_to(front)
                .map_err(|source| ElasticError::Replica { replica, source })?;
        }
        Ok(())
    }

    /// Thaws units `front..front()` on every replica alike (see
    /// [`Pipeline::unfreeze_to`](burn_pipe::Pipeline#method.unfreeze_to)): each unit goes back to the autodiff
    /// backend on the stage that holds it, with a fresh optimizer state and
    /// no gradient sum, and the group's AutoCache drops every entry above
    /// `front`. Across processes every rank thaws at the same step (the
    /// decision comes from the policy, identical on every rank).
    ///
    /// Fails, changing nothing, on a front above the current one, with
    /// gradients pending on any replica, or on a group that lost every
    /// replica.
    ///
    /// ```
    /// use burn::backend::{Autodiff, Flex};
    /// use burn::nn::{Linear, LinearConfig};
    /// use burn::optim::SgdConfig;
    /// use burn::prelude::*;
    /// use burn_elastic_dp::ReplicaConfig;
    /// use burn_freeze::{FreezeFront, LayerStack};
    ///
    /// #[derive(Module, Debug)]
    /// pub struct Dense<B: Backend> { linear: Linear<B> }
    /// impl<B: Backend> Dense<B> {
    ///     pub fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> { self.linear.forward(x) }
    /// }
    /// burn_freeze::unit!(Dense<B>: Tensor<B, 2> => Tensor<B, 2>);
    ///
    /// type B = Autodiff<Flex>;
    /// let device = Default::default();
    /// let dense = |i, o| Dense::<B> { linear: LinearConfig::new(i, o).init(&device) };
    /// let stack = LayerStack::new(dense(4, 8), vec![dense(8, 8)], dense(8, 3));
    /// let mut group = ReplicaConfig::new().init(stack, vec![vec![device]; 2], || SgdConfig::new().init())?;
    /// group.freeze_to(2)?;
    /// group.unfreeze_to(1)?; // unit 1 trains again on both replicas
    /// assert_eq!((group.front(), group.replica(1).front()), (1, 1));
    /// assert!(group.unfreeze_to(2).is_err()); // above the front: nothing changes
    /// # Ok::<(), burn_elastic_dp::ElasticError>(())
    /// ```
    fn unfreeze_to(&mut self, front: usize) -> Result<(), ElasticError> {
        self.alive()?;
        check_unfreeze(front, self.front())?;
        let pending = self
            .replicas
            .iter()
            .position(|p| (0..p.num_stages()).any(|stage| p.gradients(stage).is_some()));
        if let Some(replica) = pending {
            return Err(ElasticError::Replica {
                replica,
                source: burn_pipe::PipeError::GradientsPending("unfreeze_to"),
            });
        }
        for (replica, pipeline) in self.replicas.iter_mut().enumerate() {
            pipeline
                .unfreeze_to(front)
                .map_err(|source| ElasticError::Replica { replica, source })?;
        }
        Ok(())
    }

    /// Replica 0's: after the all-reduce every replica stepped with the same
    /// gradients (none once a step lost every replica).
    fn last_gradient_norms(&self) -> Vec<Option<GradNorm>> {
        self.first_replicas(Pipeline::last_gradient_norms)
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
        self.first_replicas(Pipeline::gradient_sum_norms)
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

    fn restart_update_gains(&mut self) {
        for replica in &mut self.replicas {
            replica.restart_update_gains();
        }
    }

    /// Replica 0's: every replica moved alike and stepped with the same
    /// all-reduced gradients (none once a step lost every replica).
    fn last_update_gains(&self) -> Vec<Option<f64>> {
        self.first_replicas(Pipeline::last_update_gains)
    }
}
