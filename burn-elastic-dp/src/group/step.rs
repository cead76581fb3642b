//! A data-parallel step: the batch shared between the replicas, each share run on a thread of its
//! own, the results collected by the deadline, and the step's report or the error explaining it.

use std::sync::Arc;
use std::time::Instant;

use burn_freeze::{Activation, InnerBackendOf, StackOptimizer, StackTypes};
use burn_pipe::{MicroBatchLoss, Pipeline};
use crossbeam_channel::{Receiver, Sender};

use super::deadline::{self, Progress};
use super::share::{self, Shard, Share};
use super::{GroupReport, Outline, ReplicaGroup, failure};
use crate::error::ElasticError;
use crate::spawn::ReplicaThread;

/// Where a replica thread waits for its work.
type WorkSlot = Sender<Box<dyn FnOnce() + Send>>;

/// Starts one thread per replica, each waiting for its work. They start
/// before any pipeline moves, so that failing to start one loses no
/// pipeline (the others, given no work, end at once).
fn start_threads(count: usize) -> Result<Vec<WorkSlot>, ElasticError> {
    (0..count)
        .map(|replica| {
            let (slot, work) = crossbeam_channel::bounded::<Box<dyn FnOnce() + Send>>(1);
            let thread = ReplicaThread {
                phase: crate::fault::REPLICA_THREAD,
                replica,
                what: "step",
            };
            thread.spawn(move || {
                // Bounded: the slot is filled, or dropped, as soon as every
                // replica's thread has started.
                if let Ok(work) = work.recv() {
                    work();
                }
            })?;
            Ok(slot)
        })
        .collect()
}

impl<S, O> ReplicaGroup<S, O>
where
    S: StackTypes,
    O: StackOptimizer<S>,
{
    /// Splits `input` into one shard per replica and runs them (see
    /// [`forward_backward`](Self::forward_backward)); `start`: when the
    /// step began.
    pub(super) fn run_shards<T, L>(
        &mut self,
        input: Shard<S>,
        targets: T,
        loss: L,
        start: Instant,
    ) -> Result<GroupReport, ElasticError>
    where
        T: Activation<S::Backend> + Send + 'static,
        L: MicroBatchLoss<S, T> + Send + 'static,
    {
        self.alive()?;
        let batch = input.batch_size();
        if targets.batch_size() != batch {
            return Err(ElasticError::TargetsMismatch {
                input: batch,
                targets: targets.batch_size(),
            });
        }
        let count = self.replicas.len();
        let timeout = self.timeout();
        // One shard per replica of the whole group; this process's part.
        // With other processes the step begins there too: the ranks agree
        // on the step and the shape, and tell their replica counts.
        let header = self.step_header();
        let plan = self.nodes.shards(header, batch, start + timeout)?;
        let shards = plan.mine();
        self.form()?;
        let inputs = plan.take(input.split(&plan.all));
        let targets = plan.take(targets.split_batch(&plan.all));
        let scales = (0..count).map(|replica| plan.scale(replica)).collect();
        let rx = self.hand_out(inputs, targets, scales, loss, start + timeout)?;
        let collected =
            deadline::collect::<InnerBackendOf<S>, S, O>(rx, count, timeout, &self.nodes);
        let lost = self.take_back(collected.pipelines);
        match failure::outcome(collected.results, collected.overdue, timeout, &lost) {
            Ok((reports, all_reduce, bubble_seconds)) => Ok(GroupReport {
                loss: plan.loss(reports.iter().map(|r| r.loss)),
                shards,
                replicas: reports,
                all_reduce,
                bubble_seconds,
                wall: start.elapsed(),
            }),
            Err(error) => {
                tracing::warn!(%error, "data-parallel step failed; no gradient kept");
                self.abandon_step();
                Err(error)
            }
        }
    }

    /// Moves every replica's pipeline to a thread of its own with its
    /// shard, targets and loss `scales[r]`, and hands it its share of the
    /// step; the receiver hears from every replica. A pipeline comes back
    /// with its result: a replica stuck in its own computation is then left
    /// behind at the deadline (the group goes on with the others) instead
    /// of blocking the step until it returns.
    fn hand_out<T, L>(
        &mut self,
        inputs: Vec<Shard<S>>,
        targets: Vec<T>,
        scales: Vec<f32>,
        loss: L,
        deadline: Instant,
    ) -> Result<Receiver<Progress<S, O>>, ElasticError>
    where
        T: Activation<S::Backend> + Send + 'static,
        L: MicroBatchLoss<S, T> + Send + 'static,
    {
        let slots = start_threads(self.replicas.len())?;
        let (tx, rx) = crossbeam_channel::unbounded();
        let loss = Arc::new(loss);
        // What the group still tells of its model should this step lose
        // every replica.
        if let Some(first) = self.replicas.first() {
            self.outline = Outline::of(first);
        }
        let pipelines = std::mem::take(&mut self.replicas);
        let local = pipelines.len();
        for (replica, ((((pipeline, shard), targets), scale), slot)) in pipelines
            .into_iter()
            .zip(inputs)
            .zip(targets)
            .zip(scales)
            .zip(slots)
            .enumerate()
        {
            let share = Share {
                replica,
                local,
                generation: self.generation,
                mode: self.config.all_reduce,
                scale,
                nodes: self.nodes.clone(),
                deadline,
                loss: Arc::clone(&loss),
            };
            let tx = tx.clone();
            slot.send(Box::new(move || {
                share::replica_share(pipeline, shard, targets, share, tx)
            }))
            .expect("a replica thread waits for its work");
        }
        Ok(rx)
    }

    /// Takes back the pipelines that came back; returns the replicas left
    /// behind, still in their own computation: the group goes on without
    /// them (their threads end on their own; the collective's next
    /// generation does not know their peers).
    fn take_back(&mut self, pipelines: Vec<Option<Pipeline<S, O>>>) -> Vec<usize> {
        let lost: Vec<usize> = (0..pipelines.len())
            .filter(|&r| pipelines[r].is_none())
            .collect();
        self.replicas = pipelines.into_iter().flatten().collect();
        if !lost.is_empty() {
            tracing::warn!(
                ?lost,
                left = self.replicas.len(),
                "replicas still computing after the step's deadline were left behind"
            );
        }
        lost
    }
}
