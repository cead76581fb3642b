//! How a replica group runs.

use burn::collective::AllReduceStrategy;
use burn::config::Config;
use burn_pipe::PipelineConfig;

use crate::collective::AllReduce;
use crate::error::ElasticError;
use crate::nodes::NodeConfig;

/// Configuration of a [`ReplicaGroup`](crate::ReplicaGroup); [`init`](ReplicaConfig::init) builds one.
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
    /// Checks the group's values (and its pipeline's and node configuration's), before
    /// any replica is built; the error says which field and what is
    /// accepted. [`init`](Self::init) relies on it.
    ///
    /// ```
    /// use burn_elastic_dp::ReplicaConfig;
    ///
    /// assert!(ReplicaConfig::new().validate().is_ok());
    /// let error = ReplicaConfig::new().with_timeout_ms(0).validate().unwrap_err();
    /// assert_eq!(error.to_string(), "timeout_ms must be at least 1, got 0");
    /// ```
    pub fn validate(&self) -> Result<(), ElasticError> {
        self.pipeline.validate()?;
        if self.timeout_ms == 0 {
            return Err(ElasticError::NoTimeout);
        }
        if self.all_reduce == (AllReduce::Bucketed { bucket_bytes: 0 }) {
            return Err(ElasticError::EmptyBucket);
        }
        if let Some(nodes) = &self.nodes {
            nodes.validate()?;
        }
        Ok(())
    }
}
