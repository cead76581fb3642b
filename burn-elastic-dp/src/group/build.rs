//! A group built from its configuration.

use burn::prelude::*;
use burn_freeze::{LayerStack, StackOptimizer, StackTypes};

use super::config::ReplicaConfig;
use super::nodes::OtherNodes;
use super::{Outline, ReplicaGroup};
use crate::collective::GroupToken;
use crate::error::ElasticError;
use std::time::Duration;

impl ReplicaConfig {
    /// Builds a group of `devices.len()` replicas of `stack`, replica `r`
    /// a pipeline on `devices[r]` (one device per stage, the same number of
    /// stages for every replica), each stage with an optimizer made by
    /// `make_optimizer`. Every replica starts from the same weights and
    /// parameter ids.
    ///
    /// Fails, before any replica is built, on no replica, replicas of
    /// different stage counts, a zero timeout, a bad node configuration, or a
    /// pipeline configuration that does not fit (see [`PipelineConfig::init`](burn_pipe::PipelineConfig::init)).
    ///
    /// With [`nodes`](Self::nodes), it first joins the other processes
    /// (waiting at most `timeout_ms` for them), and every step then expects
    /// the same global batch in every process (each runs its own replicas'
    /// shards of it).
    pub fn init<S, O>(
        &self,
        stack: LayerStack<S>,
        devices: Vec<Vec<Device<S::Backend>>>,
        make_optimizer: impl Fn() -> O + Clone + Send + Sync + 'static,
    ) -> Result<ReplicaGroup<S, O>, ElasticError>
    where
        S: StackTypes,
        O: StackOptimizer<S>,
    {
        ReplicaGroup::new(stack, devices, self.clone(), make_optimizer)
    }

    /// [`init`](Self::init) on a link to the other processes already joined
    /// (`None`: join as `init` does); the group tells them its replica
    /// count.
    pub(crate) fn init_joined<S, O>(
        &self,
        stack: LayerStack<S>,
        devices: Vec<Vec<Device<S::Backend>>>,
        make_optimizer: impl Fn() -> O + Clone + Send + Sync + 'static,
        nodes: Option<OtherNodes>,
    ) -> Result<ReplicaGroup<S, O>, ElasticError>
    where
        S: StackTypes,
        O: StackOptimizer<S>,
    {
        ReplicaGroup::build(stack, devices, self.clone(), make_optimizer, nodes)
    }
}

/// Checks that every replica's device list has one device per stage.
pub(super) fn check_stages<D>(devices: &[Vec<D>], stages: usize) -> Result<(), ElasticError> {
    match devices.iter().enumerate().find(|(_, d)| d.len() != stages) {
        Some((replica, other)) => Err(ElasticError::UnevenReplicas {
            replica,
            stages: other.len(),
            expected: stages,
        }),
        None => Ok(()),
    }
}

impl<S, O> ReplicaGroup<S, O>
where
    S: StackTypes,
    O: StackOptimizer<S>,
{
    /// See [`ReplicaConfig::init`].
    pub fn new(
        stack: LayerStack<S>,
        devices: Vec<Vec<Device<S::Backend>>>,
        config: ReplicaConfig,
        make_optimizer: impl Fn() -> O + Clone + Send + Sync + 'static,
    ) -> Result<Self, ElasticError> {
        Self::build(stack, devices, config, make_optimizer, None)
    }

    /// See [`ReplicaConfig::init_joined`].
    fn build(
        stack: LayerStack<S>,
        devices: Vec<Vec<Device<S::Backend>>>,
        config: ReplicaConfig,
        make_optimizer: impl Fn() -> O + Clone + Send + Sync + 'static,
        joined: Option<OtherNodes>,
    ) -> Result<Self, ElasticError> {
        let Some(first) = devices.first() else {
            return Err(ElasticError::NoReplicas);
        };
        check_stages(&devices, first.len())?;
        config.validate()?;
        let token = GroupToken::acquire(Duration::from_millis(config.timeout_ms))?;
        stack.materialize();
        let mut replicas = Vec::with_capacity(devices.len());
        for (replica, devices) in devices.into_iter().enumerate() {
            let pipeline = config
                .pipeline
                .init(stack.clone(), devices, make_optimizer.clone())
                .map_err(|source| ElasticError::Replica { replica, source })?;
            replicas.push(pipeline);
        }
        let nodes = match joined {
            Some(nodes) => {
                let timeout = Duration::from_millis(config.timeout_ms);
                nodes.set_local(replicas.len(), std::time::Instant::now() + timeout)?;
                nodes
            }
            None => OtherNodes::join(&config, replicas.len())?,
        };
        let outline = Outline::of(&replicas[0]);
        let micro_batches = replicas[0].micro_batches();
        Ok(Self {
            replicas,
            outline,
            micro_batches,
            config,
            formed: false,
            generation: 0,
            nodes,
            stop: None,
            _token: token,
        })
    }
}
