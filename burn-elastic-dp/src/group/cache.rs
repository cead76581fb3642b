//! The AutoCache shared by every replica: held by the first replica's pipeline (its one owner), it
//! serves stage 0's frozen prefix once per batch, on the calling thread, before the batch is
//! shared between the replicas.

use std::time::Instant;

use burn_freeze::plumbing::BatchStart;
use burn_freeze::{
    Activation, CacheHolder, Cacheable, InnerBackendOf, InnerHidden, InnerInput, StackCache,
    StackOptimizer, StackTypes,
};
use burn_pipe::MicroBatchLoss;

use super::share::Shard;
use super::{GroupReport, ReplicaGroup};
use crate::error::ElasticError;

/// The AutoCache shared by every replica: the first replica's pipeline
/// holds it and serves it once per batch on the calling thread, before the
/// batch is split (it follows the first replica through every resize); a
/// group that lost every replica holds none, and gives an attached cache
/// back.
impl<S: StackTypes, O> CacheHolder for ReplicaGroup<S, O> {
    type Stack = S;

    fn cache_slot(&mut self) -> Option<&mut Option<StackCache<S>>> {
        self.replicas.first_mut()?.cache_slot()
    }

    fn cache(&self) -> Option<&StackCache<S>> {
        self.replicas.first()?.cache()
    }
}

impl<S, O> ReplicaGroup<S, O>
where
    S: StackTypes,
    O: StackOptimizer<S>,
{
    /// [`forward_backward`](Self::forward_backward) with the frozen units of
    /// stage 0 served by the attached AutoCache
    /// ([`Pipeline::serve_prefix`](burn_pipe::Pipeline::serve_prefix), on replica 0's first
    /// device, for the whole batch): `ids[i]` names sample `i`, the same id
    /// for the same sample in every epoch. Every replica's pipeline then
    /// starts after those units (a [`BatchStart::Hidden`] batch of
    /// [`Pipeline::forward_backward`](burn_pipe::Pipeline::forward_backward)), so no
    /// frozen unit runs for a cached sample. Gradients and loss equal
    /// `forward_backward`'s. Without a cache, or with no frozen unit on stage
    /// 0, this is `forward_backward`.
    ///
    /// Fails, changing nothing, when `ids` does not name the batch or a
    /// sample comes back with another shape, and as `forward_backward` does.
    pub fn forward_backward_cached<T, LossFn>(
        &mut self,
        ids: &[u64],
        input: S::Input,
        targets: T,
        loss: LossFn,
    ) -> Result<GroupReport, ElasticError>
    where
        InnerInput<S>: Cacheable<InnerBackendOf<S>>,
        InnerHidden<S>: Cacheable<InnerBackendOf<S>>,
        T: Activation<S::Backend> + Send + 'static,
        LossFn: MicroBatchLoss<S, T> + Send + 'static,
    {
        let start = Instant::now();
        let first = self.replicas.first_mut().ok_or(ElasticError::GroupLost)?;
        let shard = match first.serve_prefix(ids, input)? {
            BatchStart::Input(input) => Shard::Input(input),
            BatchStart::Hidden { entry, hidden } => Shard::Hidden(entry, hidden),
        };
        self.run_shards(shard, targets, loss, start)
    }
}
