//! A group of data-parallel replicas of one pipeline ([`ReplicaGroup`]), each driven by its own
//! thread, whose gradients are all-reduced through burn-collective before every replica steps.

mod build;
mod cache;
pub(crate) mod config;
mod deadline;
mod exchange;
mod failure;
mod freeze_front;
pub(crate) mod nodes;
mod reshape;
mod share;
mod span;
mod step;

use std::thread;
use std::time::{Duration, Instant};

use burn::prelude::*;
use burn_freeze::plumbing::{InnerFlow, flow_batch_size, split_flow};
use burn_freeze::{
    Activation, InnerBackendOf, InnerInput, InnerOutput, LayerStack, StackOptimizer, StackTypes,
};
use burn_pipe::plumbing::EvaluationCopy;
use burn_pipe::{MicroBatchLoss, Pipeline, StepReport};

use crate::collective::{self, GroupToken};
use crate::error::ElasticError;
use crate::spawn::{ReplicaThread, panicked};
use crate::stop::StopSignal;
use config::ReplicaConfig;
use nodes::OtherNodes;
use share::Shard;

/// What one data-parallel step measured.
#[derive(Debug, Clone)]
pub struct GroupReport {
    /// Mean loss over the whole batch (every replica's shard weighted by its size).
    pub loss: f32,
    /// Samples each replica ran.
    pub shards: Vec<usize>,
    /// Each replica's pipelined pass.
    pub replicas: Vec<StepReport>,
    /// Per replica, the exposed communication: how long its pass waited on
    /// the all-reduce of its gradients after every stage had computed
    /// (waiting for the slowest replica included). Each stage's exchange
    /// starts as soon as that stage's backward is done, so the part that
    /// overlapped the earlier stages' backward is not counted here.
    pub all_reduce: Vec<Duration>,
    /// Seconds of the replicas' pipelined passes lost to bubbles: each
    /// replica's wall time times its bubble fraction
    /// ([`StepReport::bubble_fraction`]), averaged over the replicas.
    pub bubble_seconds: f64,
    /// Wall-clock time of the step.
    pub wall: Duration,
}

/// R replicas of a [`Pipeline`], each on its own devices (logical devices
/// on CPU) and driven by its own thread. During each replica's forward and
/// backward pass on its shard of the batch, each stage's gradients are
/// all-reduced (summed, each replica's loss weighted by its share of the
/// batch) through burn-collective, and between processes through MPI, as
/// soon as that stage has finished its backward (the last stage first,
/// while the earlier stages still compute), so every replica then steps
/// with the gradients of the whole batch and the replicas stay identical.
///
/// The group has a freeze front ([`FreezeFront`](burn_freeze::FreezeFront)): freezing and
/// repartitioning act on every replica at once, so `AutoFreeze` drives a
/// group as it drives one pipeline.
///
/// burn-collective holds one group per process: a second group waits for
/// the first to be dropped (at most the configured timeout).
///
/// A step never waits past its bound: a replica stuck in its own
/// computation is left behind and the group goes on without it.
///
/// ```
/// use burn::backend::{Autodiff, Flex};
/// use burn::nn::loss::CrossEntropyLossConfig;
/// use burn::nn::{Linear, LinearConfig};
/// use burn::optim::SgdConfig;
/// use burn::prelude::*;
/// use burn_elastic_dp::ReplicaConfig;
/// use burn_freeze::LayerStack;
///
/// #[derive(Module, Debug)]
/// pub struct Dense<B: Backend> { linear: Linear<B> }
/// impl<B: Backend> Dense<B> {
///     pub fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> { self.linear.forward(x).tanh() }
/// }
/// burn_freeze::unit!(Dense<B>: Tensor<B, 2> => Tensor<B, 2>);
///
/// type B = Autodiff<Flex>;
/// let device = Default::default();
/// let dense = |i, o| Dense::<B> { linear: LinearConfig::new(i, o).init(&device) };
/// let stack = LayerStack::new(dense(4, 8), vec![dense(8, 8)], dense(8, 3));
/// // 2 replicas of a 1-stage pipeline.
/// let mut group = ReplicaConfig::new().init(stack, vec![vec![device]; 2], || SgdConfig::new().init())?;
/// let loss = CrossEntropyLossConfig::new().init(&device);
/// let x = Tensor::<B, 2>::ones([6, 4], &device);
/// let y = Tensor::<B, 1, Int>::zeros([6], &device);
/// // Owned (moved in): every replica runs on a thread of its own.
/// let report = group.train_step(x, y, move |logits, y| loss.forward(logits, y), 0.1)?;
/// assert_eq!(report.shards, vec![3, 3]);
/// # Ok::<(), burn_elastic_dp::ElasticError>(())
/// ```
pub struct ReplicaGroup<S: StackTypes, O> {
    replicas: Vec<Pipeline<S, O>>,
    config: ReplicaConfig,
    /// Whether the collective group is registered for the current replicas.
    formed: bool,
    /// The current formation of the collective group: each formation (of
    /// any group of the process) has peer ids of its own.
    generation: usize,
    /// The other processes of the group, when it spans several (`node.rs`).
    nodes: OtherNodes,
    /// Raised to ask the run to stop at the next step boundary (a SIGTERM,
    /// say); across processes it travels in the step headers.
    stop: Option<StopSignal>,
    /// The replicas' shape when a step last handed them out: what the group
    /// still tells of its model once that step lost every replica.
    outline: Outline,
    /// The micro-batch count every replica runs: the group's one copy,
    /// refreshed whenever it is set or the stages change (see
    /// [`set_micro_batches`](Self::set_micro_batches)).
    micro_batches: usize,
    _token: GroupToken,
}

/// A model's shape as the group's replicas had it.
#[derive(Debug, Clone)]
struct Outline {
    /// The freeze front.
    front: usize,
    /// Units per stage.
    balance: Vec<usize>,
}

impl Outline {
    /// `pipeline`'s shape.
    fn of<S: StackTypes, O>(pipeline: &Pipeline<S, O>) -> Self
    where
        O: burn::optim::Optimizer<burn_freeze::TrainableUnits<S>, S::Backend>,
    {
        Self {
            front: pipeline.front(),
            balance: pipeline.balance(),
        }
    }
}

impl<S, O> ReplicaGroup<S, O>
where
    S: StackTypes,
    O: StackOptimizer<S>,
{
    /// Number of replicas.
    pub fn num_replicas(&self) -> usize {
        self.replicas.len()
    }

    /// Replica `replica`'s pipeline.
    ///
    /// # Panics
    /// When `replica >= num_replicas()`.
    pub fn replica(&self, replica: usize) -> &Pipeline<S, O> {
        &self.replicas[replica]
    }

    /// The configuration.
    pub fn config(&self) -> &ReplicaConfig {
        &self.config
    }

    /// Number of stages of every replica's pipeline (once a step lost every
    /// replica, as they had then).
    pub fn num_stages(&self) -> usize {
        self.replicas
            .first()
            .map_or(self.outline.balance.len(), Pipeline::num_stages)
    }

    /// Units per stage, the same on every replica (see [`Pipeline::balance`];
    /// once a step lost every replica, as they had then).
    pub fn balance(&self) -> Vec<usize> {
        self.replicas
            .first()
            .map_or_else(|| self.outline.balance.clone(), Pipeline::balance)
    }

    /// Micro-batches each replica's pipeline splits its shard into (once a
    /// step lost every replica, as they did then).
    pub fn micro_batches(&self) -> usize {
        self.micro_batches
    }

    /// Reads the micro-batch count back from the replicas after it or
    /// their stages changed (every replica runs the same).
    fn refresh_micro_batches(&mut self) {
        if let Some(first) = self.replicas.first() {
            self.micro_batches = first.micro_batches();
        }
    }

    /// Every replica's devices, one per stage: replica `r` on `devices()[r]`.
    pub fn devices(&self) -> Vec<Vec<Device<S::Backend>>> {
        self.replicas.iter().map(Pipeline::devices).collect()
    }

    /// Fails once a step lost every replica.
    fn alive(&self) -> Result<(), ElasticError> {
        self.live().map(|_| ())
    }

    /// Replica 0, or [`ElasticError::GroupLost`] once a step lost every
    /// replica.
    fn live(&self) -> Result<&Pipeline<S, O>, ElasticError> {
        self.replicas.first().ok_or(ElasticError::GroupLost)
    }

    fn timeout(&self) -> Duration {
        Duration::from_millis(self.config.timeout_ms)
    }

    /// Registers the collective group for the current replicas now, if it
    /// is not (otherwise the next step does it): every replica's peer
    /// registers, within the timeout.
    pub fn form(&mut self) -> Result<(), ElasticError> {
        self.alive()?;
        if self.formed || self.replicas.len() == 1 {
            return Ok(());
        }
        let devices: Vec<_> = self
            .replicas
            .iter()
            .map(|r| r.devices()[0].clone())
            .collect();
        self.generation = collective::next_generation();
        collective::form::<InnerBackendOf<S>>(
            self.generation,
            &devices,
            self.config.strategy,
            self.timeout(),
        )?;
        self.formed = true;
        Ok(())
    }

    /// After a failed step: no replica keeps gradients, and the group must
    /// register again (the step reset the collective when the failure or
    /// the deadline came, releasing every replica blocked in it).
    fn abandon_step(&mut self) {
        for replica in &mut self.replicas {
            replica.clear_gradients();
        }
        self.formed = false;
    }

    /// Runs one batch through every replica, each on its shard (as equal as
    /// possible, the larger ones first), and leaves every replica with the
    /// all-reduced gradients of the whole batch, ready for
    /// [`step`](Self::step).
    ///
    /// `loss` maps a micro-batch's output and targets to the *mean* loss over
    /// its samples, as for [`Pipeline::forward_backward`]; each replica's
    /// gradients are weighted by its share of the batch, so the result
    /// equals one pipeline's gradients on the whole batch.
    ///
    /// Each replica runs on a thread of its own, which takes its pipeline
    /// for the step; hence `loss` and `targets` are owned (`'static`).
    ///
    /// On error (a replica's stage panicked or failed, a replica did not
    /// finish within the timeout, the collective failed) no gradient of this
    /// step is kept, the weights are unchanged and the error names the
    /// replica (and, from its pipeline, the stage and micro-batch). The step
    /// can be run again. The call returns within the timeout and a short
    /// grace (a tenth of it, 20 ms to 1 s), whatever the replicas do: a
    /// replica still in its own computation by then (stuck in a layer, say)
    /// is left behind, and the group goes on with the others
    /// ([`ElasticError::Timeout`]'s `lost`; a replica the error names is
    /// then numbered among the survivors). When every replica is left
    /// behind the group holds no model: every later call fails with
    /// [`ElasticError::GroupLost`] (resume from a checkpoint).
    pub fn forward_backward<T, LossFn>(
        &mut self,
        input: S::Input,
        targets: T,
        loss: LossFn,
    ) -> Result<GroupReport, ElasticError>
    where
        T: Activation<S::Backend> + Send + 'static,
        LossFn: MicroBatchLoss<S, T> + Send + 'static,
    {
        self.run_shards(Shard::Input(input), targets, loss, Instant::now())
    }

    /// Applies every replica's optimizers to its (all-reduced) gradients
    /// with learning rate `lr`, the replicas in parallel.
    ///
    /// A non-finite gradient refuses the step on every replica (they hold
    /// the same all-reduced gradients): nothing changes, and the error names
    /// the replica, stage and unit. A stage's optimizer step that panics
    /// fails its replica's step, which is undone on that replica
    /// ([`PipeError::StepPanicked`](burn_pipe::PipeError::StepPanicked),
    /// named with the replica): when every replica failed, nothing changed;
    /// when some stepped, [`ElasticError::PartialStep`] names the others,
    /// which are now a step behind and must leave the group. No gradient is
    /// kept either way. A thread that cannot start refuses the step before
    /// any replica steps ([`ElasticError::Spawn`]).
    pub fn step(&mut self, lr: f64) -> Result<(), ElasticError> {
        self.alive()?;
        let results = match step_replicas(&mut self.replicas, lr) {
            Ok(results) => results,
            Err(error) => {
                for replica in &mut self.replicas {
                    replica.clear_gradients();
                }
                return Err(error);
            }
        };
        let count = results.len();
        let mut failed: Vec<(usize, ElasticError)> = results
            .into_iter()
            .enumerate()
            .filter_map(|(r, result)| result.err().map(|e| (r, e)))
            .collect();
        if failed.is_empty() {
            return Ok(());
        }
        // The collective is intact (no all-reduce ran): it stays registered,
        // so that removing a replica dissolves it properly.
        for replica in &mut self.replicas {
            replica.clear_gradients();
        }
        let all = failed.len() == count;
        let replicas: Vec<usize> = failed.iter().map(|(r, _)| *r).collect();
        let (_, error) = failed.swap_remove(0);
        if all {
            return Err(error);
        }
        // Some replicas stepped: they are ahead of the failed ones.
        Err(ElasticError::PartialStep {
            failed: replicas,
            source: Box::new(error),
        })
    }

    /// [`forward_backward`](Self::forward_backward) then [`step`](Self::step).
    pub fn train_step<T, LossFn>(
        &mut self,
        input: S::Input,
        targets: T,
        loss: LossFn,
        lr: f64,
    ) -> Result<GroupReport, ElasticError>
    where
        T: Activation<S::Backend> + Send + 'static,
        LossFn: MicroBatchLoss<S, T> + Send + 'static,
    {
        let report = self.forward_backward(input, targets, loss)?;
        self.step(lr)?;
        Ok(report)
    }

    /// Replica 0's optimizer state as one record (every replica holds the
    /// same), to save in a checkpoint. Fails with
    /// [`ElasticError::GroupLost`] once a step lost every replica.
    pub fn optimizer_record(&self) -> Result<O::Record, ElasticError> {
        Ok(self.live()?.optimizer_record())
    }

    /// Loads a record of [`optimizer_record`](Self::optimizer_record) into
    /// every replica.
    pub fn load_optimizer_record(&mut self, record: O::Record)
    where
        O::Record: Clone,
    {
        for replica in &mut self.replicas {
            replica.load_optimizer_record(record.clone());
        }
    }

    /// Time the last optimizer step spent measuring update gains and
    /// taking weight snapshots, on the slowest replica
    /// ([`Pipeline::last_evidence_time`]).
    pub fn last_evidence_time(&self) -> std::time::Duration {
        (self.replicas.iter())
            .map(Pipeline::last_evidence_time)
            .max()
            .unwrap_or_default()
    }

    /// The model's output for evaluation, through replica 0 (every replica
    /// holds the same weights). Fails with [`ElasticError::GroupLost`] once
    /// a step lost every replica.
    pub fn forward_inner(&self, input: InnerInput<S>) -> Result<InnerOutput<S>, ElasticError> {
        Ok(self.live()?.forward_inner(input))
    }

    /// [`EvaluationCopy::forward_inner_from`] shared among the replicas: the
    /// output of a batch that enters at unit `entry` (at most
    /// [`cached_prefix`](Self::cached_prefix)), its activation there kept
    /// by the caller. The batch is split among the replicas (every one
    /// holds the same weights), each part run on its replica's thread and
    /// devices, and the parts joined in order on replica 0's last device.
    /// Fails, as [`ElasticError::Replica`] or
    /// [`ReplicaPanicked`](ElasticError::ReplicaPanicked) naming the
    /// replica, when a part does.
    pub fn forward_inner_from(
        &self,
        flow: InnerFlow<S>,
        entry: usize,
    ) -> Result<InnerOutput<S>, ElasticError> {
        let first = self.live()?;
        let samples = flow_batch_size::<InnerBackendOf<S>, _, _, _>(&flow);
        let parts = self.replicas.len().min(samples);
        if parts <= 1 {
            return Ok(first.evaluation_copy().forward_inner_from(flow, entry)?);
        }
        let sizes = burn_pipe::micro::micro_batch_sizes(samples, parts)?;
        let flows = split_flow::<InnerBackendOf<S>, _, _, _>(flow, &sizes);
        let copies = (self.replicas[..parts].iter()).map(Pipeline::evaluation_copy);
        let outputs = forward_parts(copies.collect(), flows, entry)?;
        let device = first
            .devices()
            .last()
            .cloned()
            .ok_or(ElasticError::GroupLost)?;
        let outputs = outputs
            .into_iter()
            .map(|output| Activation::<InnerBackendOf<S>>::to_device(output, &device))
            .collect();
        Ok(Activation::<InnerBackendOf<S>>::cat_batch(outputs))
    }

    /// [`EvaluationCopy::forward_frozen_inner`] through replica 0: frozen units
    /// `from..to` of stage 0 run on `flow`.
    pub fn forward_frozen_inner(
        &self,
        flow: InnerFlow<S>,
        from: usize,
        to: usize,
    ) -> Result<InnerFlow<S>, ElasticError> {
        Ok((self.live()?.evaluation_copy()).forward_frozen_inner(flow, from, to)?)
    }

    /// The frozen units at the start of stage 0, the most a batch's kept
    /// activation may skip ([`Pipeline::cached_prefix`]); 0 once a step
    /// lost every replica.
    pub fn cached_prefix(&self) -> usize {
        self.replicas.first().map_or(0, Pipeline::cached_prefix)
    }

    /// A copy of the whole model (replica 0's), to evaluate or save it while
    /// training goes on. Fails with [`ElasticError::GroupLost`] once a step
    /// lost every replica (resume from a checkpoint).
    pub fn to_layer_stack(&self) -> Result<LayerStack<S>, ElasticError> {
        Ok(self.live()?.to_layer_stack())
    }

    /// The trained model (replica 0's); the group ends. Fails with
    /// [`ElasticError::GroupLost`] once a step lost every replica.
    pub fn into_layer_stack(mut self) -> Result<LayerStack<S>, ElasticError> {
        self.alive()?;
        // Dissolve while every replica is counted: `Drop` would finish one
        // peer too few, and the next group of another size could not form.
        self.dissolve();
        Ok(self.replicas.swap_remove(0).into_layer_stack())
    }
}

/// Every replica's optimizer step with learning rate `lr`, each on a thread
/// of its own, as [`ElasticError::Replica`] (or
/// [`ReplicaPanicked`](ElasticError::ReplicaPanicked)) on failure. The
/// threads start before any replica steps: one that cannot start fails the
/// call, no replica stepped.
fn step_replicas<S, O>(
    replicas: &mut [Pipeline<S, O>],
    lr: f64,
) -> Result<Vec<Result<(), ElasticError>>, ElasticError>
where
    S: StackTypes,
    O: StackOptimizer<S>,
{
    thread::scope(|scope| {
        let mut started = Vec::with_capacity(replicas.len());
        for replica in 0..replicas.len() {
            let (slot, work) = crossbeam_channel::bounded::<&mut Pipeline<S, O>>(1);
            let thread = ReplicaThread {
                phase: crate::fault::REPLICA_THREAD,
                replica,
                what: "optimizer step",
            };
            let handle = thread.spawn_scoped(scope, move || {
                // Bounded: the slot is filled, or dropped, as soon as every
                // replica's thread has started.
                work.recv().ok().map(|pipeline| pipeline.step(lr))
            })?;
            started.push((slot, handle));
        }
        let handles: Vec<_> = started
            .into_iter()
            .zip(replicas.iter_mut())
            .map(|((slot, handle), pipeline)| {
                // The thread waits for its slot to be filled or dropped.
                let _ = slot.send(pipeline);
                handle
            })
            .collect();
        Ok(handles
            .into_iter()
            .enumerate()
            .map(|(replica, handle)| match handle.join() {
                Ok(Some(result)) => {
                    result.map_err(|source| ElasticError::Replica { replica, source })
                }
                Ok(None) => Err(ElasticError::ReplicaPanicked {
                    replica,
                    message: "its step thread got no pipeline".into(),
                }),
                Err(panic) => Err(panicked(replica, panic)),
            })
            .collect())
    })
}

/// Part `r` of a batch entering at unit `entry`, run through replica `r`'s
/// copy on a thread of its own (evaluation, no graph): the outputs in order.
fn forward_parts<S: StackTypes>(
    replicas: Vec<EvaluationCopy<S>>,
    flows: Vec<InnerFlow<S>>,
    entry: usize,
) -> Result<Vec<InnerOutput<S>>, ElasticError> {
    thread::scope(|scope| {
        let mut handles = Vec::with_capacity(flows.len());
        for (replica, (copy, flow)) in replicas.into_iter().zip(flows).enumerate() {
            let thread = ReplicaThread {
                phase: crate::fault::REPLICA_THREAD,
                replica,
                what: "evaluation",
            };
            handles.push(thread.spawn_scoped(scope, move || copy.forward_inner_from(flow, entry))?);
        }
        handles
            .into_iter()
            .enumerate()
            .map(|(replica, handle)| match handle.join() {
                Ok(output) => output.map_err(|source| ElasticError::Replica { replica, source }),
                Err(panic) => Err(panicked(replica, panic)),
            })
            .collect()
    })
}

impl<S: StackTypes, O> Drop for ReplicaGroup<S, O> {
    fn drop(&mut self) {
        self.dissolve();
    }
}
