//! How a replica group runs.

use burn::collective::AllReduceStrategy;
use burn::config::Config;
use burn::optim::Optimizer;
use burn::tensor::Device;
use burn_freeze::{LayerStack, ParamStates, StackTypes, TrainableUnits};
use burn_pipe::PipelineConfig;

use crate::error::ElasticError;
use crate::group::ReplicaGroup;
use crate::node::NodeConfig;

/// How the replicas' gradients are all-reduced; both give the same mean.
#[derive(Config, Debug, Copy, PartialEq, Eq)]
pub enum AllReduce {
    /// One collective call per gradient tensor, in parameter-id order
    /// (burn-optim's `GradientsParams::all_reduce`).
    PerTensor,
    /// Gradients flattened into buckets of about `bucket_bytes` bytes, one
    /// collective call per bucket (as PyTorch DDP does).
    Bucketed {
        /// Bytes per bucket (at least 1).
        bucket_bytes: usize,
    },
}

/// Configuration of a [`ReplicaGroup`]; [`init`](ReplicaConfig::init) builds one.
///
/// ```
/// use burn_elastic_dp::ReplicaConfig;
///
/// let config = ReplicaConfig::new().with_timeout_ms(30_000);
/// assert_eq!(config.timeout_ms, 30_000);
/// ```
#[derive(Config, Debug)]
pub struct ReplicaConfig {
    /// How each replica's pipeline runs (schedule, micro-batches, balance,
    /// the bound on waits between its stages).
    #[config(default = "PipelineConfig::new()")]
    pub pipeline: PipelineConfig,
    /// Longest a step waits for every replica to finish its forward,
    /// backward and all-reduce, in milliseconds (at least 1). A replica that
    /// has not finished by then fails the step with a timeout naming it.
    #[config(default = 300_000)]
    pub timeout_ms: u64,
    /// How gradients are all-reduced: per tensor by default, the faster of
    /// the two in `bench elastic` on a MiniLM-sized model (see the README).
    #[config(default = "AllReduce::PerTensor")]
    pub all_reduce: AllReduce,
    /// burn-collective's algorithm between the replicas of this process:
    /// centralized (reduce on one device, then broadcast) by default, about
    /// twice as fast as its default tree on two CPU replicas in
    /// `bench elastic`.
    #[config(default = "AllReduceStrategy::Centralized")]
    pub strategy: AllReduceStrategy,
    /// The group spans several processes (on one machine or several): this
    /// process's place among them (see [`NodeConfig`]). `None` (the
    /// default): every replica is in this process.
    #[config(default = "None")]
    pub nodes: Option<NodeConfig>,
}

impl ReplicaConfig {
    /// Builds a group of `devices.len()` replicas of `stack`, replica `r`
    /// a pipeline on `devices[r]` (one device per stage, the same number of
    /// stages for every replica), each stage with an optimizer made by
    /// `make_optimizer`. Every replica starts from the same weights and
    /// parameter ids.
    ///
    /// Fails, before any replica is built, on no replica, replicas of
    /// different stage counts, a zero timeout, a bad node configuration, or a
    /// pipeline configuration that does not fit (see [`PipelineConfig::init`]).
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
        O: Optimizer<TrainableUnits<S>, S::Backend> + 'static,
        O::Record: ParamStates,
    {
        ReplicaGroup::new(stack, devices, self.clone(), make_optimizer)
    }
}
