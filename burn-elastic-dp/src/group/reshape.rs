//! The group's shape, changed at a step boundary: its replica count (resizing, removing a replica),
//! its stages (every replica's pipeline alike), its micro-batch count and its freeze front
//! (up and down).

use burn::prelude::*;
use burn_freeze::{InnerBackendOf, StackOptimizer, StackTypes};
use burn_pipe::Pipeline;

use super::ReplicaGroup;
use super::build::check_stages;
use crate::collective;
use crate::error::ElasticError;
use burn_freeze::CacheHolder;

impl<S, O> ReplicaGroup<S, O>
where
    S: StackTypes,
    O: StackOptimizer<S>,
{
    /// Resizes the group at a step boundary to `devices.len()` replicas,
    /// replica `r` on `devices[r]` (one device per stage, as now). A replica
    /// whose devices stay keeps running; a new one (or one moving) is a copy
    /// of replica 0 ([`Pipeline::replicate`]): its weights, parameter ids,
    /// freeze front, balance and optimizer state. Replicas beyond the new
    /// size are dropped. The collective group is dissolved (every peer
    /// finishes) and registers again with the new size at the next step.
    ///
    /// Across processes (AutoDP in lockstep), every process resizes at the
    /// same step boundary, each to its own count, and the counts are then
    /// exchanged (within the step's bound), so that the next batch is shared
    /// among every replica of every process.
    ///
    /// Fails, changing nothing, with no replica, a replica without one
    /// device per stage, or gradients pending.
    pub fn resize(&mut self, devices: Vec<Vec<Device<S::Backend>>>) -> Result<(), ElasticError> {
        self.alive()?;
        if devices.is_empty() {
            return Err(ElasticError::NoReplicas);
        }
        check_stages(&devices, self.replicas[0].num_stages())?;
        // Build every new replica before changing anything.
        let mut copies = Vec::new();
        for (replica, devices) in devices.iter().enumerate() {
            let stays = self
                .replicas
                .get(replica)
                .is_some_and(|current| &current.devices() == devices);
            if !stays {
                let copy = self.replicas[0]
                    .replicate(devices.clone())
                    .map_err(|source| ElasticError::Replica { replica: 0, source })?;
                copies.push((replica, copy));
            }
        }
        self.dissolve();
        let from = self.replicas.len();
        self.replicas.truncate(devices.len());
        for (replica, mut copy) in copies {
            if replica < self.replicas.len() {
                // The cache follows the first replica.
                if let Some(cache) = self.replicas[replica].detach_cache() {
                    copy.attach_cache(cache);
                }
                self.replicas[replica] = copy;
            } else {
                self.replicas.push(copy);
            }
        }
        tracing::debug!(from, to = self.replicas.len(), "replica group resized");
        self.nodes.set_local(
            self.replicas.len(),
            std::time::Instant::now() + self.timeout(),
        )
    }

    /// Takes replica `replica` out of the group (e.g. one whose step failed)
    /// and returns it; the survivors keep their weights and optimizer state,
    /// and the collective group registers again with the new size at the
    /// next step. After a failed step nothing was applied, so running the
    /// same batch again on the survivors loses no sample and applies no
    /// update twice.
    ///
    /// Fails, changing nothing, when `replica` is out of range or is the
    /// last one.
    pub fn remove_replica(&mut self, replica: usize) -> Result<Pipeline<S, O>, ElasticError> {
        if self.nodes.exist() {
            return Err(ElasticError::NodesFixed);
        }
        if replica >= self.replicas.len() || self.replicas.len() == 1 {
            return Err(ElasticError::CannotRemove {
                replica,
                replicas: self.replicas.len(),
            });
        }
        self.dissolve();
        tracing::info!(
            replica,
            left = self.replicas.len() - 1,
            "replica removed from the group"
        );
        let mut removed = self.replicas.remove(replica);
        // The cache follows the first replica.
        if let Some(cache) = removed.detach_cache() {
            self.replicas[0].attach_cache(cache);
        }
        Ok(removed)
    }

    /// Moves every replica's units between its stages (see
    /// [`Pipeline::repartition`]): replica `r` gets `balance` on
    /// `devices[r]`. Fails, changing nothing, on a bad balance or device
    /// list.
    pub fn repartition(
        &mut self,
        balance: &[usize],
        devices: Vec<Vec<Device<S::Backend>>>,
    ) -> Result<(), ElasticError> {
        self.alive()?;
        if devices.len() != self.replicas.len() {
            return Err(ElasticError::ReplicaCount {
                given: devices.len(),
                replicas: self.replicas.len(),
            });
        }
        // Every replica has the same units and configuration, so a balance
        // replica 0 accepts is accepted by all: no replica changes when
        // another would refuse.
        check_stages(&devices, balance.len())?;
        let stage0_moves = self
            .replicas
            .iter()
            .zip(&devices)
            .any(|(r, d)| r.devices().first() != d.first());
        for (replica, (pipeline, devices)) in self.replicas.iter_mut().zip(devices).enumerate() {
            pipeline
                .repartition(balance, devices)
                .map_err(|source| ElasticError::Replica { replica, source })?;
        }
        // The paper's count follows K when no count is set.
        self.refresh_micro_batches();
        if stage0_moves {
            self.dissolve();
        }
        Ok(())
    }

    /// Sets every replica's micro-batch count for the steps that follow
    /// (see [`Pipeline::set_micro_batches`]; `None`: the paper's count for
    /// the number of stages), new replicas included (they are copies of
    /// replica 0). The group's [`config`](Self::config) keeps the user's
    /// setting; [`micro_batches`](Self::micro_batches) tells the running
    /// count. Fails, changing nothing, on `Some(0)`.
    pub fn set_micro_batches(&mut self, micro_batches: Option<usize>) -> Result<(), ElasticError> {
        if micro_batches == Some(0) {
            return Err(ElasticError::Replica {
                replica: 0,
                source: burn_pipe::PipeError::NoMicroBatches,
            });
        }
        for (replica, pipeline) in self.replicas.iter_mut().enumerate() {
            pipeline
                .set_micro_batches(micro_batches)
                .map_err(|source| ElasticError::Replica { replica, source })?;
        }
        self.refresh_micro_batches();
        Ok(())
    }
}

impl<S: StackTypes, O> ReplicaGroup<S, O> {
    /// Dissolves the collective group, if registered (every peer
    /// finishes): the next step registers it again with the replicas then.
    pub(super) fn dissolve(&mut self) {
        if self.formed {
            collective::dissolve::<InnerBackendOf<S>>(self.generation, self.replicas.len());
            self.formed = false;
        }
    }
}
