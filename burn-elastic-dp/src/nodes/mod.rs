//! Groups across OS processes: one replica group per process (a *node*) of an MPI job
//! (`mpirun -np N ...`), joined into one data-parallel group ([`NodeConfig`]).

use std::sync::Arc;
use std::time::Duration;

use burn::config::Config;

use crate::error::ElasticError;
pub use phases::ExchangePhases;

pub mod launcher;
#[cfg(feature = "mpi")]
pub(crate) mod mpi;
mod phases;
// Used by the MPI link only; tested without it.
#[cfg_attr(not(feature = "mpi"), allow(dead_code))]
pub(crate) mod rows;
pub(crate) mod shards;

#[cfg(feature = "mpi")]
pub(crate) use crate::nodes::mpi::{NodeLink, StepHeader, all_reduce_gradients};

/// This process's place in a group that spans the processes of an MPI job
/// (on one machine or several); set as
/// [`ReplicaConfig::nodes`](crate::ReplicaConfig::nodes). Rank, number of
/// processes and every rank's replica count come from MPI (see
/// [`Mpi`](crate::Mpi), cargo feature `mpi`).
///
/// Inside a process the replicas all-reduce through burn-collective;
/// between processes, each process's first replica (its *leader*)
/// all-reduces the process's summed gradients (every replica's loss is
/// scaled by its share of the global batch) with the other processes'
/// through MPI, so every replica of every process steps with the same
/// bits. There is no address or port to configure. Without the feature,
/// asking for a group across processes is an error
/// ([`ElasticError::BadNodeConfig`]).
///
/// Sharding: every process is given the *same global batch* at every step
/// (a sampler with the same seed gives it everywhere); the batch is split
/// into one shard per replica of the whole group, and the process of rank
/// `n` runs the shards of its replicas, after those of ranks `0..n`.
///
/// Every wait is bounded: joining by the join timeout, every exchange of a
/// step by the step's deadline; a rank that does not arrive in time fails
/// the step on every rank that did, naming the step and the missing ranks,
/// and the job then ends (`MPI_Abort`): a link that failed stays failed,
/// every process starts again (from its checkpoints).
///
/// Why not burn-collective's own multi-node mode (a global orchestrator and
/// nodes): in burn-collective 0.21 a node's second global all-reduce never
/// returns (its sync service never forgets the peers of the first one), and a
/// lost peer panics inside its runtime instead of returning an error; the
/// crate was removed from Burn after 0.21.
///
/// ```
/// use burn_elastic_dp::NodeConfig;
///
/// assert!(NodeConfig::new().validate().is_ok());
/// let bad = NodeConfig::new().with_join_timeout_ms(Some(0));
/// assert_eq!(bad.validate().unwrap_err().to_string(),
///     "nodes: join_timeout_ms must be at least 1, got 0");
/// ```
#[derive(Config, Debug, PartialEq)]
pub struct NodeConfig {
    /// Longest to wait for every process to join, in milliseconds (at least
    /// 1); the group's `timeout_ms` by default.
    #[config(default = "None")]
    pub join_timeout_ms: Option<u64>,
}

/// What a group across processes needs when built without MPI.
#[cfg(not(feature = "mpi"))]
pub(crate) const NEEDS_MPI: &str = "a group across processes needs burn-elastic-dp's cargo feature `mpi` \
     (and OpenMPI: apt-get install -y libopenmpi-dev openmpi-bin libclang-dev), run under mpirun";

impl NodeConfig {
    /// Checks the configuration; the error says which field and what is accepted.
    pub fn validate(&self) -> Result<(), ElasticError> {
        if self.join_timeout_ms == Some(0) {
            return Err(ElasticError::BadNodeConfig(
                "join_timeout_ms must be at least 1, got 0".into(),
            ));
        }
        Ok(())
    }
}

/// Validates `config` and joins the other processes of the MPI job within
/// its join timeout (`timeout` by default), `timeout` bounding each step's
/// exchanges: `None` without a node configuration or in a job of one process.
pub(crate) fn join(
    config: Option<&NodeConfig>,
    local: usize,
    timeout: Duration,
) -> Result<Option<Arc<NodeLink>>, ElasticError> {
    let Some(config) = config else {
        return Ok(None);
    };
    config.validate()?;
    let join_timeout = config
        .join_timeout_ms
        .map_or(timeout, Duration::from_millis);
    #[cfg(feature = "mpi")]
    return crate::nodes::mpi::join(local, timeout, join_timeout);
    #[cfg(not(feature = "mpi"))]
    {
        let _ = (local, join_timeout);
        Err(ElasticError::BadNodeConfig(NEEDS_MPI.into()))
    }
}

/// This process's rank in the MPI job when the job has several processes
/// (MPI initialised); `None` otherwise, and always without the feature.
pub(crate) fn job_rank() -> Option<usize> {
    #[cfg(feature = "mpi")]
    return crate::nodes::mpi::job_rank();
    #[cfg(not(feature = "mpi"))]
    None
}

/// Processes in the MPI job when it has several (MPI initialised); `None`
/// otherwise, and always without the feature.
pub(crate) fn job_size() -> Option<usize> {
    #[cfg(feature = "mpi")]
    return crate::nodes::mpi::job_size();
    #[cfg(not(feature = "mpi"))]
    None
}

/// What a rank says of itself at the start of every step (without the
/// feature only this process's own, never exchanged).
#[cfg(not(feature = "mpi"))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct StepHeader {
    pub local: usize,
    pub shape: u64,
    pub stop: bool,
}

/// Without MPI no link can exist: the type has no value.
#[cfg(not(feature = "mpi"))]
#[derive(Debug)]
pub(crate) enum NodeLink {}

#[cfg(not(feature = "mpi"))]
impl NodeLink {
    pub fn abort(&self) {
        match *self {}
    }

    pub fn waiting_on(&self) -> Option<ElasticError> {
        match *self {}
    }

    pub fn begin_step(
        &self,
        _header: StepHeader,
        _deadline: std::time::Instant,
    ) -> Result<Vec<usize>, ElasticError> {
        match *self {}
    }

    pub fn rank(&self) -> usize {
        match *self {}
    }

    pub fn size(&self) -> usize {
        match *self {}
    }

    pub fn replicas(&self) -> Vec<usize> {
        match *self {}
    }

    pub fn stop_seen(&self) -> bool {
        match *self {}
    }

    pub fn phases(&self) -> ExchangePhases {
        match *self {}
    }

    pub fn set_local(
        &self,
        _local: usize,
        _deadline: std::time::Instant,
    ) -> Result<(), ElasticError> {
        match *self {}
    }

    pub fn gather(
        &self,
        _record: Vec<i64>,
        _deadline: std::time::Instant,
    ) -> Result<Vec<Vec<i64>>, ElasticError> {
        match *self {}
    }

    pub fn max(
        &self,
        _values: Vec<f64>,
        _deadline: std::time::Instant,
    ) -> Result<Vec<f64>, ElasticError> {
        match *self {}
    }
}

#[cfg(not(feature = "mpi"))]
pub(crate) fn all_reduce_gradients<AB, M>(
    link: &NodeLink,
    _replica: usize,
    _stage: usize,
    _module: &M,
    _grads: burn::optim::GradientsParams,
    _deadline: std::time::Instant,
) -> Result<burn::optim::GradientsParams, ElasticError>
where
    AB: burn::tensor::backend::AutodiffBackend,
    M: burn::module::AutodiffModule<AB>,
{
    match *link {}
}

#[cfg(all(test, not(feature = "mpi")))]
mod tests {
    use super::*;

    #[test]
    fn a_group_across_processes_without_the_mpi_feature_is_a_clear_error() {
        let error = join(Some(&NodeConfig::new()), 1, Duration::from_secs(1)).unwrap_err();
        assert!(error.to_string().contains("cargo feature `mpi`"), "{error}");
        assert!(join(None, 1, Duration::from_secs(1)).unwrap().is_none());
    }
}
