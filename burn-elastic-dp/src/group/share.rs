//! A replica's share of a data-parallel step, on its own thread: its pipeline's pass on its shard,
//! each stage's gradients summed with the other replicas' as the stage finishes; a panic is caught
//! as the replica's.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::spawn::panicked;
use burn_freeze::plumbing::{BatchStart, CachedStart};
use burn_freeze::{Activation, InnerHidden, StackOptimizer, StackTypes, TrainableUnits};
use burn_pipe::{MicroBatchLoss, PipeError, Pipeline, StepOptions};
use crossbeam_channel::Sender;

use super::deadline::{Progress, ShareResult};
use super::exchange::StageExchange;
use super::nodes::OtherNodes;
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

    /// Where a pipeline's pass over it starts.
    pub fn into_start(self) -> CachedStart<S> {
        match self {
            Shard::Input(input) => BatchStart::Input(input),
            Shard::Hidden(entry, hidden) => BatchStart::Hidden { entry, hidden },
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
/// on `shard` with its loss scaled by its share of the batch, each stage's
/// gradients summed with every other replica's as soon as that stage's
/// backward is done ([`StageExchange`]: the last stage first, while the
/// earlier ones still compute), a word to the coordinating thread over `tx`
/// once every stage has computed; last, its pipeline and result back over
/// `tx`: the pass's report and the time the pass waited on the exchanges
/// after computing (the exposed communication), or the error naming the
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
        let exchange = (share.local > 1 || share.nodes.exist()).then(|| {
            let modules: Vec<TrainableUnits<S>> = (0..pipeline.num_stages())
                .map(|s| pipeline.stage(s).trainable().clone())
                .collect();
            let arrived = tx.clone();
            StageExchange::<S, L>::new(&share, modules, move || {
                let _ = arrived.send(Progress::Arrived(replica));
            })
        });
        let options = match &exchange {
            Some(exchange) => StepOptions::new().with_hook(exchange),
            None => StepOptions::new(),
        };
        let report = pipeline.forward_backward(shard.into_start(), targets, scaled, options);
        let Some(exchange) = exchange else {
            let report = report.map_err(|source| ElasticError::Replica { replica, source })?;
            let _ = tx.send(Progress::Arrived(replica));
            let bubble = bubble_seconds(&report);
            return Ok((report, Duration::ZERO, bubble));
        };
        match report {
            Ok(report) => {
                let bubble = bubble_seconds(&report);
                Ok((report, exchange.exposed(), bubble))
            }
            // A hook that gave up: the exchange's own error says why.
            Err(source @ PipeError::GradientHook { .. }) => Err(exchange
                .take_error()
                .unwrap_or(ElasticError::Replica { replica, source })),
            Err(source) => Err(ElasticError::Replica { replica, source }),
        }
    };
    let result =
        catch_unwind(AssertUnwindSafe(run)).unwrap_or_else(|panic| Err(panicked(replica, panic)));
    let _ = tx.send(Progress::Done(replica, Box::new(pipeline), result));
}

/// Seconds of `report`'s pass lost to bubbles: its wall time times its
/// bubble fraction.
fn bubble_seconds(report: &burn_pipe::StepReport) -> f64 {
    report.wall.as_secs_f64() * report.bubble_fraction()
}
