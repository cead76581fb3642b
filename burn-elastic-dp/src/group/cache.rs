//! The AutoCache shared by every replica: attached to the group, it serves stage 0's frozen prefix
//! once per batch, on the calling thread, before the batch is shared between the replicas.

use std::time::Instant;

use burn_freeze::plumbing::{check_sample_ids, serve_prefix};
use burn_freeze::{
    Activation, AutodiffActivation, Cacheable, InnerBackendOf, InnerHidden, InnerInput, StackCache,
    StackOptimizer, StackTypes,
};
use burn_pipe::MicroBatchLoss;

use super::share::Shard;
use super::{GroupReport, ReplicaGroup};
use crate::error::ElasticError;

impl<S, O> ReplicaGroup<S, O>
where
    S: StackTypes,
    O: StackOptimizer<S>,
{
    /// Attaches an AutoCache for the frozen prefix, shared by every replica
    /// (served once per batch on the calling thread, before the batch is
    /// split); returns the one it replaces.
    pub fn attach_cache(&mut self, cache: StackCache<S>) -> Option<StackCache<S>> {
        self.cache.replace(cache)
    }

    /// The attached AutoCache.
    pub fn cache(&self) -> Option<&StackCache<S>> {
        self.cache.as_ref()
    }

    /// Detaches the AutoCache.
    pub fn detach_cache(&mut self) -> Option<StackCache<S>> {
        self.cache.take()
    }

    /// [`forward_backward`](Self::forward_backward) with the frozen units of
    /// stage 0 served by the attached AutoCache
    /// ([`serve_prefix`](burn_freeze::plumbing::serve_prefix), on replica 0's first
    /// device, for the whole batch): `ids[i]` names sample `i`, the same id
    /// for the same sample in every epoch. Every replica's pipeline then
    /// starts after those units ([`Pipeline::forward_backward_from`](burn_pipe::Pipeline::forward_backward_from)), so no
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
        // The field, not `live()`: the cache is borrowed beside it.
        let replica = self.replicas.first().ok_or(ElasticError::GroupLost)?;
        check_sample_ids(ids, input.batch_size())?;
        let first = replica.stage(0);
        let cached = first.frozen().units().end.min(replica.num_units() - 1);
        let device = replica.devices()[0].clone();
        let Some(cache) = self.cache.as_mut().filter(|_| cached > 0) else {
            return self.run_shards(Shard::Input(input), targets, loss, start);
        };
        let input = input.inner().to_device(&device);
        let hidden = serve_prefix(cache, first.frozen(), ids, input, cached)?;
        self.run_shards(Shard::Hidden(cached, hidden), targets, loss, start)
    }
}
