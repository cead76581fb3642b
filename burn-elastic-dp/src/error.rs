//! Errors of a replica group.

use std::time::Duration;

use burn_pipe::PipeError;

/// What went wrong building or running a replica group.
#[derive(Debug, thiserror::Error)]
pub enum ElasticError {
    /// No replica asked for.
    #[error("a replica group needs at least one replica, got 0")]
    NoReplicas,
    /// Replicas with different numbers of stages.
    #[error(
        "replica {replica} has {stages} devices, replica 0 has {expected}: every replica needs one device per stage, as many stages as the others"
    )]
    UnevenReplicas {
        /// The replica that differs.
        replica: usize,
        /// Its device count.
        stages: usize,
        /// Replica 0's device count.
        expected: usize,
    },
    /// Another number of device lists than replicas.
    #[error("{given} device lists given for {replicas} replicas: give one per replica")]
    ReplicaCount {
        /// Device lists given.
        given: usize,
        /// Replicas in the group.
        replicas: usize,
    },
    /// A zero bound on waits.
    #[error("timeout_ms must be at least 1, got 0")]
    NoTimeout,
    /// A replica that cannot be removed: out of range, or the last one.
    #[error(
        "cannot remove replica {replica} from a group of {replicas}: it must exist and not be the last"
    )]
    CannotRemove {
        /// The replica asked for.
        replica: usize,
        /// Replicas in the group.
        replicas: usize,
    },
    /// Buckets of 0 bytes.
    #[error("all_reduce bucket_bytes must be at least 1, got 0")]
    EmptyBucket,
    /// A batch with fewer samples than replicas.
    #[error("a batch of {batch} samples cannot be shared by {replicas} replicas")]
    BatchTooSmall {
        /// Samples in the batch.
        batch: usize,
        /// Replicas.
        replicas: usize,
    },
    /// Input and targets of different batch sizes.
    #[error("the input has {input} samples but the targets have {targets}")]
    TargetsMismatch {
        /// Samples in the input.
        input: usize,
        /// Samples in the targets.
        targets: usize,
    },
    /// A replica's pipeline refused a configuration or failed a step (its
    /// error names the stage and micro-batch).
    #[error("replica {replica}: {source}")]
    Replica {
        /// The failing replica.
        replica: usize,
        /// What its pipeline reported.
        source: PipeError,
    },
    /// A replica panicked outside its pipeline's stages.
    #[error("replica {replica} panicked: {message}")]
    ReplicaPanicked {
        /// The failing replica.
        replica: usize,
        /// The panic message.
        message: String,
    },
    /// burn-collective refused or failed an operation.
    #[error("replica {replica}: collective {operation} failed: {message}")]
    Collective {
        /// The replica whose call failed.
        replica: usize,
        /// `"register"` or `"all-reduce"` (of stage `n`'s gradients).
        operation: String,
        /// burn-collective's error.
        message: String,
    },
    /// Some replicas did not finish their share of a step in time; the
    /// collective was reset so that none stays blocked in an all-reduce.
    /// Replicas still computing a short grace after the deadline were left
    /// behind (`lost`): the group goes on without them.
    #[error(
        "replicas {missing:?} did not finish the step within {waited:?}{}",
        lost_note(lost)
    )]
    Timeout {
        /// Replicas still in their own forward and backward pass at the
        /// deadline (the others waited for them in the all-reduce); every
        /// unfinished replica when all had reached the all-reduce. Indices
        /// as they were in the step.
        missing: Vec<usize>,
        /// The bound.
        waited: Duration,
        /// Replicas (indices as they were in the step) that had not come back
        /// a short grace after the deadline: stuck in their own computation,
        /// they have left the group, whose other replicas keep their indices
        /// in order.
        lost: Vec<usize>,
    },
    /// A replica's thread could not be started (the operating system
    /// refused it): the call stopped before any replica's work began.
    #[error("replica {replica}: could not start its {what} thread: {message}")]
    Spawn {
        /// The replica.
        replica: usize,
        /// `"step"` (its share of a step), `"optimizer step"` or
        /// `"registration"` (its peer's registration with the collective).
        what: &'static str,
        /// The operating system's error.
        message: String,
    },
    /// A failed step left every replica behind (see
    /// [`Timeout`](Self::Timeout)): the group holds no model any more.
    #[error(
        "every replica of the group was lost in a failed step (stuck in its own computation); resume from a checkpoint"
    )]
    GroupLost,
    /// Another replica group holds this process's collective.
    #[error(
        "another replica group of this process holds burn-collective (one group per process); waited {waited:?}"
    )]
    GroupBusy {
        /// How long it waited.
        waited: Duration,
    },
    /// The sampler handed out an index the dataset does not have: it was
    /// made for a longer dataset ([`ElasticSampler::next_items`](crate::ElasticSampler::next_items)).
    #[error(
        "the dataset has no item {index} (it holds {len}): the sampler was made for a longer dataset; make it with the dataset's length"
    )]
    MissingItem {
        /// The index asked for.
        index: usize,
        /// The dataset's length.
        len: usize,
    },
    /// A node configuration that cannot work (see [`NodeConfig`](crate::NodeConfig)).
    #[error("nodes: {0}")]
    BadNodeConfig(String),
    /// Another process of the group failed, refused this one, or its
    /// connection broke.
    #[error("node {node}: {message}")]
    Node {
        /// The other process's rank (this process's own when it failed here).
        node: usize,
        /// What happened.
        message: String,
    },
    /// Processes of the group that did not join, or did not take their part
    /// in a step, within the bound.
    #[error("nodes {missing:?} did not answer within {waited:?}")]
    NodesMissing {
        /// Their ranks.
        missing: Vec<usize>,
        /// The bound.
        waited: Duration,
    },
    /// A cross-process all-reduce that did not complete within the bound:
    /// the step (counted since the group joined) and the ranks that had not
    /// arrived at it (empty: all had, the exchange itself was too slow). The
    /// link stays failed and the MPI job ends.
    #[error(
        "step {step}: the cross-process all-reduce did not complete within {waited:?}; ranks that did not arrive: {missing:?} (the MPI job ends; resume every process from its checkpoint)"
    )]
    NodesStalled {
        /// The step, counted from 1 since the group joined.
        step: u64,
        /// The ranks that did not arrive.
        missing: Vec<usize>,
        /// The bound.
        waited: Duration,
    },
    /// Removing a replica from a group that spans processes, or stepping
    /// one that lost a replica of this process in a failed step (it resizes
    /// only in lockstep, every process at the same step by the same rule).
    #[error(
        "a replica group across processes changes its replicas only in lockstep: removing one or going on without one left behind would need every process to agree (resume from a checkpoint)"
    )]
    NodesFixed,
    /// A sampler configuration that cannot work.
    #[error("sampler: {0}")]
    Sampler(String),
    /// Some replicas' optimizer steps failed while the others' applied: the
    /// failed ones are behind and must leave the group
    /// ([`ReplicaGroup::remove_replica`](crate::ReplicaGroup::remove_replica)).
    #[error("replicas {failed:?} failed their optimizer step while the others stepped: {source}")]
    PartialStep {
        /// The replicas that did not step.
        failed: Vec<usize>,
        /// The first failure.
        source: Box<ElasticError>,
    },
    /// A pipeline's error outside a replica group (a pipeline of the
    /// caller's own, say): `?` on a [`PipeError`] in a function returning
    /// `ElasticError` gives this. A replica's pipeline reports
    /// [`Replica`](Self::Replica) instead, naming the replica.
    #[error(transparent)]
    Pipeline(#[from] PipeError),
    /// A freeze-front request that does not fit.
    #[error(transparent)]
    Freeze(#[from] burn_freeze::FreezeError),
    /// The AutoCache could not serve the frozen prefix (sample ids that do
    /// not match the batch, or a sample that came back with another shape).
    #[error(transparent)]
    Cache(#[from] burn_freeze::CacheError),
}

/// What a [`ElasticError::Timeout`] message adds about lost replicas.
fn lost_note(lost: &[usize]) -> String {
    if lost.is_empty() {
        String::new()
    } else {
        format!(
            "; replicas {lost:?} were still computing after the deadline and have left the group"
        )
    }
}
