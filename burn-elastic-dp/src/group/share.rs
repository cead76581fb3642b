//! A replica's share of a data-parallel step, on its own thread: its pipeline's pass on its shard,
//! then the sum of its gradients with the other replicas'; a panic is caught as the replica's.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::time::Instant;

use burn_freeze::{Activation, InnerHidden, StackOptimizer, StackTypes, TrainableUnits};
use burn_pipe::{MicroBatchLoss, Pipeline, panic_message};
use crossbeam_channel::Sender;

use super::deadline::{Progress, ShareResult};
use super::nodes::OtherNodes;
use crate::collective;
use crate::collective::AllReduce;
use crate::error::ElasticError;

/// One replica's part of a batch: model inputs, or hidden activations that
/// enter every replica's pipeline at a unit (a frozen prefix served from the
/// group's cache).
pub(super) enum Shard<S: StackTypes> {
    Input(S::Input),
    Hidden(usize, InnerHidden<S>),
}

impl<S: StackTypes> Shard<S> {
    /// Samples in it.
    pub fn batch_size(&self) -> usize {
        match self {
            Shard::Input(input) => input.batch_size(),
            Shard::Hidden(_, hidden) => hidden.batch_size(),
        }
    }

    /// Splits it into parts of `sizes` samples, in order.
    pub fn split(self, sizes: &[usize]) -> Vec<Self> {
        match self {
            Shard::Input(input) => input
                .split_batch(sizes)
                .into_iter()
                .map(Shard::Input)
                .collect(),
            Shard::Hidden(entry, hidden) => hidden
                .split_batch(sizes)
                .into_iter()
                .map(|h| Shard::Hidden(entry, h))
                .collect(),
        }
    }
}

/// What a replica's share of a step needs besides its pipeline, shard and
/// targets.
pub(super) struct Share<L> {
    /// The replica (its index in this process).
    pub replica: usize,
    /// Replicas in this process.
    pub local: usize,
    /// The formation of the collective group (its peers).
    pub generation: usize,
    /// How gradients are all-reduced in this process.
    pub mode: AllReduce,
    /// The factor on the replica's mean loss: its share of the global batch,
    /// so that the sum over replicas of the gradients is the batch's.
    pub scale: f32,
    /// The other processes, if any.
    pub nodes: OtherNodes,
    /// The step's deadline, for the exchange with the other processes.
    pub deadline: Instant,
    /// The caller's loss, shared by every replica.
    pub loss: Arc<L>,
}

/// Replica `share.replica`'s share of a step, on its own thread: its pass
/// on `shard` with its loss scaled by its share of the batch, a word to the
/// coordinating thread over `tx` as it enters the all-reduce, then the sum
/// of its gradients with every other replica's; last, its pipeline and
/// result back over `tx`: the pass's report and the time the sum took
/// (waiting for the slowest replica included), or the error naming the
/// replica (a panic included).
pub(super) fn replica_share<S, O, T, L>(
    mut pipeline: Pipeline<S, O>,
    shard: Shard<S>,
    targets: T,
    share: Share<L>,
    tx: Sender<Progress<S, O>>,
) where
    S: StackTypes,
    O: StackOptimizer<S>,
    T: Activation<S::Backend>,
    L: MicroBatchLoss<S, T> + Send + 'static,
{
    let replica = share.replica;
    let run = || -> ShareResult {
        let scaled = |output, target| (*share.loss)(output, target).mul_scalar(share.scale);
        let report = match shard {
            Shard::Input(input) => pipeline.forward_backward(input, targets, scaled),
            Shard::Hidden(entry, hidden) => {
                pipeline.forward_backward_from(entry, hidden, targets, scaled)
            }
        }
        .map_err(|source| ElasticError::Replica { replica, source })?;
        let _ = tx.send(Progress::Arrived(replica));
        let reduce = Instant::now();
        if share.local > 1 || share.nodes.exist() {
            sum_gradients(&mut pipeline, &share)?;
        }
        Ok((report, reduce.elapsed()))
    };
    let result = catch_unwind(AssertUnwindSafe(run)).unwrap_or_else(|panic| {
        Err(ElasticError::ReplicaPanicked {
            replica,
            message: panic_message(panic.as_ref()),
        })
    });
    let _ = tx.send(Progress::Done(replica, Box::new(pipeline), result));
}

/// Replaces the gradients of every stage of `pipeline` by their sum over
/// the group: first between the replicas of this process, then between the
/// processes, if several.
fn sum_gradients<S, O, L>(
    pipeline: &mut Pipeline<S, O>,
    share: &Share<L>,
) -> Result<(), ElasticError>
where
    S: StackTypes,
    O: StackOptimizer<S>,
{
    let replica = share.replica;
    let modules: Vec<TrainableUnits<S>> = (0..pipeline.num_stages())
        .map(|s| pipeline.stage(s).trainable().clone())
        .collect();
    pipeline.map_gradients(|stage, grads| {
        burn_freeze::fault::check(burn_freeze::fault::Phase::AllReduce, Some(stage), None)
            .map_err(|e| ElasticError::Replica {
                replica,
                source: e.into(),
            })?;
        let grads = if share.local > 1 {
            let peer = collective::peer(share.generation, replica);
            collective::all_reduce::<S::Backend, _>(
                share.mode,
                peer,
                replica,
                stage,
                &modules[stage],
                grads,
            )?
        } else {
            grads
        };
        share.nodes.all_reduce::<S::Backend, _>(
            replica,
            stage,
            &modules[stage],
            grads,
            share.deadline,
        )
    })
}
