//! The group's other processes, when it spans several ([`OtherNodes`]): every call into
//! `crate::nodes` stands here, the group's and the trainer's (its checkpoints' agreement, the
//! job's rank and size).

use std::sync::Arc;
use std::time::{Duration, Instant};

use burn::module::AutodiffModule;
use burn::optim::GradientsParams;
use burn::tensor::backend::AutodiffBackend;

use super::config::ReplicaConfig;
use crate::error::ElasticError;
use crate::nodes::shards::{Shards, shards};
use crate::nodes::{self, ExchangePhases, NodeLink, StepHeader};

/// This process's link to the group's other processes; none when every
/// replica is in this process. A replica's share of a step and the deadline
/// collector ask this one value whether there are other processes, how the
/// batch is shared with them, how to sum gradients with them and how to
/// release their waits.
#[derive(Debug, Clone)]
pub(crate) struct OtherNodes(Option<Arc<NodeLink>>);

impl OtherNodes {
    /// This process's rank in the MPI job when the job has several
    /// processes; `None` otherwise (and without the `mpi` feature).
    pub fn job_rank() -> Option<usize> {
        nodes::job_rank()
    }

    /// Processes in the MPI job when it has several; `None` otherwise.
    pub fn job_size() -> Option<usize> {
        nodes::job_size()
    }

    /// Joins the other processes `config.nodes` names, waiting at most the
    /// configuration's bound; none without a node configuration or with one
    /// process. `replicas`: this process's.
    pub fn join(config: &ReplicaConfig, replicas: usize) -> Result<Self, ElasticError> {
        let link = nodes::join(
            config.nodes.as_ref(),
            replicas,
            Duration::from_millis(config.timeout_ms),
        )?;
        Ok(Self(link))
    }

    /// Whether the group spans other processes.
    pub fn exist(&self) -> bool {
        self.0.is_some()
    }

    /// One shard of a batch of `batch` samples per replica of the whole
    /// group, `header.local` of them in this process; with other processes
    /// the step begins there too (the headers exchanged and checked), by
    /// `deadline`.
    pub fn shards(
        &self,
        header: StepHeader,
        batch: usize,
        deadline: Instant,
    ) -> Result<Shards, ElasticError> {
        let local = header.local;
        match self.0.as_deref() {
            Some(link) => {
                let counts = link.begin_step(header, deadline)?;
                shards(Some((link.rank(), &counts)), batch, local)
            }
            None => shards(None, batch, local),
        }
    }

    /// Processes of the group (1 without other processes).
    pub fn processes(&self) -> usize {
        self.0.as_ref().map_or(1, |link| link.size())
    }

    /// Every process's replica count as last exchanged (`[local]` without
    /// other processes).
    pub fn counts(&self, local: usize) -> Vec<usize> {
        self.0
            .as_ref()
            .map_or_else(|| vec![local], |link| link.replicas())
    }

    /// The phases of the last step's exchanges of gradients with the other
    /// processes; none without other processes.
    pub fn phases(&self) -> Option<ExchangePhases> {
        self.0.as_ref().map(|link| link.phases())
    }

    /// Whether a process asked to stop in the last step's header.
    pub fn stop_seen(&self) -> bool {
        self.0.as_ref().is_some_and(|link| link.stop_seen())
    }

    /// Tells the other processes this process now runs `local` replicas
    /// (every process at the same step boundary), by `deadline`.
    pub fn set_local(&self, local: usize, deadline: Instant) -> Result<(), ElasticError> {
        match &self.0 {
            Some(link) => link.set_local(local, deadline),
            None => Ok(()),
        }
    }

    /// Every process's `record` (records of one length), ranks in order, by
    /// `deadline`; `None` without other processes.
    pub fn gather(
        &self,
        record: Vec<i64>,
        deadline: Instant,
    ) -> Result<Option<Vec<Vec<i64>>>, ElasticError> {
        match &self.0 {
            Some(link) => link.gather(record, deadline).map(Some),
            None => Ok(None),
        }
    }

    /// The element-wise maximum of `values` over every process (`values`
    /// without other processes), by `deadline`.
    pub fn max(&self, values: Vec<f64>, deadline: Instant) -> Result<Vec<f64>, ElasticError> {
        match &self.0 {
            Some(link) => link.max(values, deadline),
            None => Ok(values),
        }
    }

    /// The sum with the other processes of `grads` (this process's sum of
    /// the gradients of `module`'s parameters), for local replica
    /// `replica` on stage `stage`, waiting until `deadline` at the most;
    /// `grads` as they are without other processes.
    pub fn all_reduce<AB, M>(
        &self,
        replica: usize,
        stage: usize,
        module: &M,
        grads: GradientsParams,
        deadline: Instant,
    ) -> Result<GradientsParams, ElasticError>
    where
        AB: AutodiffBackend,
        M: AutodiffModule<AB>,
    {
        match &self.0 {
            Some(link) => {
                nodes::all_reduce_gradients::<AB, M>(link, replica, stage, module, grads, deadline)
            }
            None => Ok(grads),
        }
    }

    /// The error naming the step and the processes an exchange is waiting
    /// for now, if one is under way.
    pub fn waiting_on(&self) -> Option<ElasticError> {
        self.0.as_ref().and_then(|link| link.waiting_on())
    }

    /// Releases every wait on the other processes, here and there (the link
    /// stays failed); nothing without other processes.
    pub fn abort(&self) {
        if let Some(link) = &self.0 {
            link.abort();
        }
    }
}
