//! A group of data-parallel replicas of one pipeline, each driven by its own
//! thread, whose gradients are all-reduced through burn-collective before
//! every replica steps. A step never waits past its bound: a replica stuck
//! in its own computation is left behind and the group goes on without it.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use burn::optim::Optimizer;
use burn::prelude::*;
use burn_freeze::{
    Activation, AutodiffActivation, Cacheable, FreezeFront, GradNorm, InnerBackendOf, InnerHidden,
    InnerInput, InnerOutput, LayerStack, ParamStates, StackCache, StackTypes, TrainableUnits,
    check_freeze, check_sample_ids, serve_prefix,
};
use burn_pipe::{Pipeline, StepReport, panic_message};

use crate::collective::{self, GroupToken};
use crate::config::{AllReduce, ReplicaConfig};
use crate::error::ElasticError;
use crate::node::{self, NodeLink};

/// What a replica thread tells the coordinating thread.
enum Progress<S: StackTypes, O> {
    /// The replica finished its pass and entered the all-reduce.
    Arrived(usize),
    /// The replica's share of the step ended: its pipeline comes back.
    Done(
        usize,
        Box<Pipeline<S, O>>,
        Result<(StepReport, Duration), ElasticError>,
    ),
}

/// `error` of a step that lost the replicas `lost`: a replica it names
/// (one that came back) gets its index among the survivors.
fn renumber(error: ElasticError, lost: &[usize]) -> ElasticError {
    let shift = |replica: usize| replica - lost.iter().filter(|&&l| l < replica).count();
    match error {
        ElasticError::Replica { replica, source } => ElasticError::Replica {
            replica: shift(replica),
            source,
        },
        ElasticError::ReplicaPanicked { replica, message } => ElasticError::ReplicaPanicked {
            replica: shift(replica),
            message,
        },
        other => other,
    }
}

/// One replica's share of a batch: model inputs, or hidden activations that
/// enter every replica's pipeline at a unit (a frozen prefix served from the
/// group's cache).
enum Shard<S: StackTypes> {
    Input(S::Input),
    Hidden(usize, InnerHidden<S>),
}

/// What one data-parallel step measured.
#[derive(Debug, Clone)]
pub struct GroupReport {
    /// Mean loss over the whole batch (every replica's shard weighted by its size).
    pub loss: f32,
    /// Samples each replica ran.
    pub shards: Vec<usize>,
    /// Each replica's pipelined pass.
    pub replicas: Vec<StepReport>,
    /// Per replica, time spent in the all-reduce of its gradients (waiting
    /// for the slowest replica included).
    pub all_reduce: Vec<Duration>,
    /// Wall-clock time of the step.
    pub wall: Duration,
}

/// R replicas of a [`Pipeline`], each on its own devices (logical devices
/// on CPU) and driven by its own thread. After each replica's forward and
/// backward pass on its shard of the batch, the gradients are all-reduced
/// (summed, each replica's loss weighted by its share of the batch) through burn-collective, so every replica
/// then steps with the gradients of the whole batch and the replicas stay
/// identical.
///
/// The group has a freeze front ([`FreezeFront`]): freezing and
/// repartitioning act on every replica at once, so `AutoFreeze` drives a
/// group as it drives one pipeline.
///
/// burn-collective holds one group per process: a second group waits for
/// the first to be dropped (at most the configured timeout).
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
    /// AutoCache for the frozen prefix, shared by every replica.
    cache: Option<StackCache<S>>,
    /// The other processes of the group, when it spans several (`node.rs`).
    node: Option<Arc<NodeLink>>,
    _token: GroupToken,
}

/// Checks that every replica's device list has one device per stage.
fn check_stages<D>(devices: &[Vec<D>], stages: usize) -> Result<(), ElasticError> {
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
    O: Optimizer<TrainableUnits<S>, S::Backend> + 'static,
    O::Record: ParamStates,
{
    /// See [`ReplicaConfig::init`].
    pub fn new(
        stack: LayerStack<S>,
        devices: Vec<Vec<Device<S::Backend>>>,
        config: ReplicaConfig,
        make_optimizer: impl Fn() -> O + Clone + Send + Sync + 'static,
    ) -> Result<Self, ElasticError> {
        let Some(first) = devices.first() else {
            return Err(ElasticError::NoReplicas);
        };
        check_stages(&devices, first.len())?;
        if config.timeout_ms == 0 {
            return Err(ElasticError::NoTimeout);
        }
        if config.all_reduce == (AllReduce::Bucketed { bucket_bytes: 0 }) {
            return Err(ElasticError::EmptyBucket);
        }
        if let Some(nodes) = &config.nodes {
            nodes.validate()?;
        }
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
        let node = node::join(
            config.nodes.as_ref(),
            replicas.len(),
            Duration::from_millis(config.timeout_ms),
        )?;
        Ok(Self {
            replicas,
            config,
            formed: false,
            generation: 0,
            cache: None,
            node,
            _token: token,
        })
    }

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

    /// Fails once a step lost every replica.
    fn alive(&self) -> Result<(), ElasticError> {
        if self.replicas.is_empty() {
            Err(ElasticError::GroupLost)
        } else {
            Ok(())
        }
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
        LossFn: Fn(S::Output, T) -> Tensor<S::Backend, 1> + Send + Sync + 'static,
    {
        let start = Instant::now();
        let batch = input.batch_size();
        self.run_shards(Shard::Input(input), batch, targets, loss, start)
    }

    /// Attaches an AutoCache for the frozen prefix, shared by every replica
    /// (served once per batch on the calling thread, before the batch is
    /// split); returns the one it replaces.
    pub fn attach_cache(&mut self, cache: StackCache<S>) -> Option<StackCache<S>> {
        self.cache.replace(cache)
    }

    /// The attached AutoCache.
    pub fn cache(&self) -> Option<&StackCache<S>> {
        self.cache.as_ref()
    }

    /// Detaches the AutoCache.
    pub fn detach_cache(&mut self) -> Option<StackCache<S>> {
        self.cache.take()
    }

    /// [`forward_backward`](Self::forward_backward) with the frozen units of
    /// stage 0 served by the attached AutoCache
    /// ([`serve_prefix`](burn_freeze::serve_prefix), on replica 0's first
    /// device, for the whole batch): `ids[i]` names sample `i`, the same id
    /// for the same sample in every epoch. Every replica's pipeline then
    /// starts after those units ([`Pipeline::forward_backward_from`]), so no
    /// frozen unit runs for a cached sample. Gradients and loss equal
    /// `forward_backward`'s. Without a cache, or with no frozen unit on stage
    /// 0, this is `forward_backward`.
    ///
    /// Fails, changing nothing, when `ids` does not name the batch or a
    /// sample comes back with another shape, and as `forward_backward` does.
    pub fn forward_backward_cached<T, LossFn>(
        &mut self,
        ids: &[u64],
        input: S::Input,
        targets: T,
        loss: LossFn,
    ) -> Result<GroupReport, ElasticError>
    where
        T: Activation<S::Backend> + Send + 'static,
        LossFn: Fn(S::Output, T) -> Tensor<S::Backend, 1> + Send + Sync + 'static,
        InnerInput<S>: Cacheable<InnerBackendOf<S>>,
        InnerHidden<S>: Cacheable<InnerBackendOf<S>>,
    {
        let start = Instant::now();
        let batch = input.batch_size();
        self.alive()?;
        check_sample_ids(ids, batch)?;
        let first = self.replicas[0].stage(0);
        let cached = first.frozen().units().end.min(self.num_units() - 1);
        let Some(cache) = self.cache.as_mut().filter(|_| cached > 0) else {
            return self.run_shards(Shard::Input(input), batch, targets, loss, start);
        };
        let device = self.replicas[0].devices()[0].clone();
        let input = input.inner().to_device(&device);
        let hidden = serve_prefix(cache, first.frozen(), ids, input, cached)?;
        self.run_shards(Shard::Hidden(cached, hidden), batch, targets, loss, start)
    }

    /// Splits `batch` samples into one shard per replica and runs them.
    fn run_shards<T, LossFn>(
        &mut self,
        input: Shard<S>,
        batch: usize,
        targets: T,
        loss: LossFn,
        start: Instant,
    ) -> Result<GroupReport, ElasticError>
    where
        T: Activation<S::Backend> + Send + 'static,
        LossFn: Fn(S::Output, T) -> Tensor<S::Backend, 1> + Send + Sync + 'static,
    {
        self.alive()?;
        let loss = Arc::new(loss);
        if targets.batch_size() != batch {
            return Err(ElasticError::TargetsMismatch {
                input: batch,
                targets: targets.batch_size(),
            });
        }
        let count = self.replicas.len();
        // One shard per replica of the whole group; this process's part.
        let plan = node::shards(self.node.as_deref(), batch, count)?;
        let shards = plan.mine();
        self.form()?;
        let inputs: Vec<Shard<S>> = match input {
            Shard::Input(input) => plan
                .take(input.split_batch(&plan.all))
                .into_iter()
                .map(Shard::Input)
                .collect(),
            Shard::Hidden(entry, hidden) => plan
                .take(hidden.split_batch(&plan.all))
                .into_iter()
                .map(|h| Shard::Hidden(entry, h))
                .collect(),
        };
        let targets = plan.take(targets.split_batch(&plan.all));
        let timeout = self.timeout();
        let link_deadline = start + timeout;
        let mode = self.config.all_reduce;
        let generation = self.generation;
        let (tx, rx) = crossbeam_channel::unbounded::<Progress<S, O>>();
        let mut results: Vec<Option<Result<(StepReport, Duration), ElasticError>>> =
            (0..count).map(|_| None).collect();
        // Replicas that reached the all-reduce (their pass is done).
        let mut arrived = vec![false; count];
        // Replicas still in their own pass when the deadline passed (or, if
        // all had arrived, every replica: the all-reduce itself stalled).
        let mut missing: Option<Vec<usize>> = None;
        // The process an exchange between processes waited for at the deadline.
        let mut missing_node: Option<ElasticError> = None;
        // Each replica's pipeline moves to a thread of its own for the
        // step and comes back with its result: a replica stuck in its own
        // computation is then left behind at the deadline (the group goes on
        // with the others) instead of blocking the step until it returns.
        // The threads start first, so that failing to start one loses no
        // pipeline (the others, given no work, end at once).
        let mut starts = Vec::with_capacity(count);
        for replica in 0..count {
            let (start, work) = crossbeam_channel::bounded::<Box<dyn FnOnce() + Send>>(1);
            thread::Builder::new()
                .name(format!("burn-elastic-dp replica {replica}"))
                .spawn(move || {
                    if let Ok(work) = work.recv() {
                        work();
                    }
                })
                .map_err(|error| ElasticError::Spawn {
                    replica,
                    message: error.to_string(),
                })?;
            starts.push(start);
        }
        let pipelines = std::mem::take(&mut self.replicas);
        let mut returned: Vec<Option<Pipeline<S, O>>> = (0..count).map(|_| None).collect();
        for (replica, (((mut pipeline, input), targets), start)) in pipelines
            .into_iter()
            .zip(inputs)
            .zip(targets)
            .zip(starts)
            .enumerate()
        {
            let (tx, loss, link) = (tx.clone(), Arc::clone(&loss), self.node.clone());
            // The replica's mean loss, scaled by its share of the batch so
            // that the sum over replicas of the gradients is the whole
            // batch's gradient.
            let scale = plan.scale(replica);
            let work = move || {
                let run = |pipeline: &mut Pipeline<S, O>| -> Result<(StepReport, Duration), ElasticError> {
                    let scaled = |output, target| loss(output, target).mul_scalar(scale);
                    let report = match input {
                        Shard::Input(input) => pipeline.forward_backward(input, targets, scaled),
                        Shard::Hidden(entry, hidden) => {
                            pipeline.forward_backward_from(entry, hidden, targets, scaled)
                        }
                    }
                    .map_err(|source| ElasticError::Replica { replica, source })?;
                    let _ = tx.send(Progress::Arrived(replica));
                    let reduce = Instant::now();
                    if count > 1 || link.is_some() {
                        let modules: Vec<TrainableUnits<S>> = (0..pipeline.num_stages())
                            .map(|s| pipeline.stage(s).trainable().clone())
                            .collect();
                        pipeline.map_gradients(|stage, grads| {
                            burn_freeze::fault::check(
                                burn_freeze::fault::Phase::AllReduce,
                                Some(stage),
                                None,
                            )
                            .map_err(|e| ElasticError::Replica {
                                replica,
                                source: e.into(),
                            })?;
                            let peer = collective::peer(generation, replica);
                            let grads = match mode {
                                _ if count == 1 => grads,
                                AllReduce::PerTensor => collective::all_reduce_sum::<
                                    InnerBackendOf<S>,
                                >(
                                    peer, replica, stage, grads
                                )?,
                                AllReduce::Bucketed { bucket_bytes } => {
                                    collective::all_reduce_sum_bucketed::<S::Backend, _>(
                                        peer,
                                        replica,
                                        stage,
                                        &modules[stage],
                                        grads,
                                        bucket_bytes,
                                    )?
                                }
                            };
                            // Then between the processes, if several.
                            match &link {
                                Some(link) => node::all_reduce_gradients::<S::Backend, _>(
                                    link,
                                    replica,
                                    &modules[stage],
                                    grads,
                                    link_deadline,
                                ),
                                None => Ok(grads),
                            }
                        })?;
                    }
                    Ok((report, reduce.elapsed()))
                };
                let result =
                    catch_unwind(AssertUnwindSafe(|| run(&mut pipeline))).unwrap_or_else(|panic| {
                        Err(ElasticError::ReplicaPanicked {
                            replica,
                            message: panic_message(panic.as_ref()),
                        })
                    });
                let _ = tx.send(Progress::Done(replica, Box::new(pipeline), result));
            };
            start
                .send(Box::new(work))
                .expect("a replica thread waits for its work");
        }
        drop(tx);
        // Wait for every replica within the bound; on the first failure or
        // at the deadline, reset the collective so that replicas blocked in
        // an all-reduce return, and wait a short grace for them: a replica
        // not back by then is still in its own computation, and is lost.
        let deadline = Instant::now() + timeout;
        let grace = (timeout / 10).clamp(Duration::from_millis(20), Duration::from_secs(1));
        let mut reset = false;
        // When the deadline passed: from then on, only a short grace.
        let mut timed_out: Option<Instant> = None;
        while returned.iter().any(Option::is_none) {
            let bound = timed_out.map_or(deadline, |at| at + grace);
            match rx.recv_deadline(bound) {
                Ok(Progress::Arrived(replica)) => arrived[replica] = true,
                Ok(Progress::Done(replica, pipeline, result)) => {
                    arrived[replica] = true;
                    if result.is_err() && !reset && (count > 1 || self.node.is_some()) {
                        collective::reset::<InnerBackendOf<S>>();
                        if let Some(link) = &self.node {
                            link.abort();
                        }
                        reset = true;
                    }
                    returned[replica] = Some(*pipeline);
                    results[replica] = Some(result);
                }
                Err(_) if timed_out.is_none() => {
                    timed_out = Some(Instant::now());
                    if !reset {
                        let late: Vec<usize> = (0..count).filter(|&r| !arrived[r]).collect();
                        let all_arrived = late.is_empty();
                        missing = Some(if all_arrived {
                            (0..count).filter(|&r| results[r].is_none()).collect()
                        } else {
                            late
                        });
                        if let Some(link) = &self.node {
                            missing_node = link.waiting_on().filter(|_| all_arrived);
                            link.abort();
                        }
                        collective::reset::<InnerBackendOf<S>>();
                        reset = true;
                    }
                }
                Err(_) => break,
            }
        }
        // Replicas not back by now are still in their own computation: the
        // group goes on without them (their threads end on their own; the
        // collective's next generation does not know their peers).
        let lost: Vec<usize> = (0..count).filter(|&r| returned[r].is_none()).collect();
        self.replicas = returned.into_iter().flatten().collect();
        if !lost.is_empty() {
            tracing::warn!(
                ?lost,
                left = self.replicas.len(),
                "replicas still computing after the step's deadline were left behind"
            );
        }
        let mut reports = Vec::with_capacity(count);
        let mut all_reduce = Vec::with_capacity(count);
        let mut failure: Option<ElasticError> = None;
        for result in results.into_iter().flatten() {
            match result {
                Ok((report, reduce)) => {
                    reports.push(report);
                    all_reduce.push(reduce);
                }
                // A replica's own failure explains the others' collective errors.
                Err(
                    error @ (ElasticError::Replica { .. } | ElasticError::ReplicaPanicked { .. }),
                ) => {
                    if !matches!(
                        failure,
                        Some(ElasticError::Replica { .. } | ElasticError::ReplicaPanicked { .. })
                    ) {
                        failure = Some(error);
                    }
                }
                Err(error) => {
                    failure.get_or_insert(error);
                }
            }
        }
        if let Some(error) = missing_node {
            failure = Some(error);
        } else if let Some(missing) = missing
            && !matches!(
                failure,
                Some(ElasticError::Replica { .. } | ElasticError::ReplicaPanicked { .. })
            )
        {
            failure = Some(ElasticError::Timeout {
                missing,
                waited: timeout,
                lost: lost.clone(),
            });
        }
        if let Some(error) = failure {
            let error = renumber(error, &lost);
            tracing::warn!(%error, "data-parallel step failed; no gradient kept");
            self.abandon_step();
            return Err(error);
        }
        let loss = plan.loss(reports.iter().map(|r| r.loss));
        Ok(GroupReport {
            loss,
            shards,
            replicas: reports,
            all_reduce,
            wall: start.elapsed(),
        })
    }

    /// Applies every replica's optimizers to its (all-reduced) gradients
    /// with learning rate `lr`, the replicas in parallel.
    ///
    /// A non-finite gradient refuses the step on every replica (they hold
    /// the same all-reduced gradients): nothing changes, and the error names
    /// the replica, stage and unit.
    pub fn step(&mut self, lr: f64) -> Result<(), ElasticError> {
        self.alive()?;
        let results: Vec<Result<(), burn_pipe::PipeError>> = thread::scope(|scope| {
            let handles: Vec<_> = self
                .replicas
                .iter_mut()
                .map(|replica| scope.spawn(move || replica.step(lr)))
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("an optimizer step does not panic"))
                .collect()
        });
        let count = results.len();
        let mut failed: Vec<(usize, burn_pipe::PipeError)> = results
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
        let (replica, source) = failed.swap_remove(0);
        let error = ElasticError::Replica { replica, source };
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
        LossFn: Fn(S::Output, T) -> Tensor<S::Backend, 1> + Send + Sync + 'static,
    {
        let report = self.forward_backward(input, targets, loss)?;
        self.step(lr)?;
        Ok(report)
    }

    /// Resizes the group at a step boundary to `devices.len()` replicas,
    /// replica `r` on `devices[r]` (one device per stage, as now). A replica
    /// whose devices stay keeps running; a new one (or one moving) is a copy
    /// of replica 0 ([`Pipeline::replicate`]): its weights, parameter ids,
    /// freeze front, balance and optimizer state. Replicas beyond the new
    /// size are dropped. The collective group is dissolved (every peer
    /// finishes) and registers again with the new size at the next step.
    ///
    /// Fails, changing nothing, with no replica, a replica without one
    /// device per stage, or gradients pending.
    pub fn resize(&mut self, devices: Vec<Vec<Device<S::Backend>>>) -> Result<(), ElasticError> {
        self.alive()?;
        if self.node.is_some() {
            return Err(ElasticError::NodesFixed);
        }
        if devices.is_empty() {
            return Err(ElasticError::NoReplicas);
        }
        check_stages(&devices, self.replicas[0].num_stages())?;
        // Build every new replica before changing anything.
        let mut copies = Vec::new();
        for (replica, devices) in devices.iter().enumerate() {
            let stays = self
                .replicas
                .get(replica)
                .is_some_and(|current| &current.devices() == devices);
            if !stays {
                let copy = self.replicas[0]
                    .replicate(devices.clone())
                    .map_err(|source| ElasticError::Replica { replica: 0, source })?;
                copies.push((replica, copy));
            }
        }
        if self.formed {
            collective::dissolve::<InnerBackendOf<S>>(self.generation, self.replicas.len());
            self.formed = false;
        }
        let from = self.replicas.len();
        self.replicas.truncate(devices.len());
        for (replica, copy) in copies {
            if replica < self.replicas.len() {
                self.replicas[replica] = copy;
            } else {
                self.replicas.push(copy);
            }
        }
        tracing::debug!(from, to = self.replicas.len(), "replica group resized");
        Ok(())
    }

    /// Takes replica `replica` out of the group (e.g. one whose step failed)
    /// and returns it; the survivors keep their weights and optimizer state,
    /// and the collective group registers again with the new size at the
    /// next step. After a failed step nothing was applied, so running the
    /// same batch again on the survivors loses no sample and applies no
    /// update twice.
    ///
    /// Fails, changing nothing, when `replica` is out of range or is the
    /// last one.
    pub fn remove_replica(&mut self, replica: usize) -> Result<Pipeline<S, O>, ElasticError> {
        if self.node.is_some() {
            return Err(ElasticError::NodesFixed);
        }
        if replica >= self.replicas.len() || self.replicas.len() == 1 {
            return Err(ElasticError::CannotRemove {
                replica,
                replicas: self.replicas.len(),
            });
        }
        if self.formed {
            collective::dissolve::<InnerBackendOf<S>>(self.generation, self.replicas.len());
            self.formed = false;
        }
        tracing::info!(
            replica,
            left = self.replicas.len() - 1,
            "replica removed from the group"
        );
        Ok(self.replicas.remove(replica))
    }

    /// Moves every replica's units between its stages (see
    /// [`Pipeline::repartition`]): replica `r` gets `balance` on
    /// `devices[r]`. Fails, changing nothing, on a bad balance or device
    /// list.
    pub fn repartition(
        &mut self,
        balance: &[usize],
        devices: Vec<Vec<Device<S::Backend>>>,
    ) -> Result<(), ElasticError> {
        self.alive()?;
        if devices.len() != self.replicas.len() {
            return Err(ElasticError::ReplicaCount {
                given: devices.len(),
                replicas: self.replicas.len(),
            });
        }
        // Every replica has the same units and configuration, so a balance
        // replica 0 accepts is accepted by all: no replica changes when
        // another would refuse.
        check_stages(&devices, balance.len())?;
        let stage0_moves = self
            .replicas
            .iter()
            .zip(&devices)
            .any(|(r, d)| r.devices()[0] != d[0]);
        for (replica, (pipeline, devices)) in self.replicas.iter_mut().zip(devices).enumerate() {
            pipeline
                .repartition(balance, devices)
                .map_err(|source| ElasticError::Replica { replica, source })?;
        }
        if stage0_moves && self.formed {
            collective::dissolve::<InnerBackendOf<S>>(self.generation, self.replicas.len());
            self.formed = false;
        }
        Ok(())
    }

    /// Freezes units `0..front` on every replica (see
    /// [`Pipeline::freeze_to`]). Fails, changing nothing, on a front below
    /// the current one or beyond the stack, or with gradients pending.
    pub fn freeze_to(&mut self, front: usize) -> Result<(), ElasticError> {
        self.alive()?;
        check_freeze(front, self.front(), self.num_units())?;
        for (replica, pipeline) in self.replicas.iter_mut().enumerate() {
            pipeline
                .freeze_to(front)
                .map_err(|source| ElasticError::Replica { replica, source })?;
        }
        Ok(())
    }

    /// Replica 0's optimizer state as one record (every replica holds the
    /// same), to save in a checkpoint.
    pub fn optimizer_record(&self) -> O::Record {
        self.replicas[0].optimizer_record()
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

    /// Number of units of the model.
    pub fn num_units(&self) -> usize {
        self.replicas[0].num_units()
    }

    /// The freeze front, the same on every replica.
    pub fn front(&self) -> usize {
        self.replicas[0].front()
    }

    /// The model's output for evaluation, through replica 0 (every replica
    /// holds the same weights).
    pub fn forward_inner(&self, input: InnerInput<S>) -> InnerOutput<S> {
        self.replicas[0].forward_inner(input)
    }

    /// A copy of the whole model (replica 0's), to evaluate or save it while
    /// training goes on.
    pub fn to_layer_stack(&self) -> LayerStack<S> {
        self.replicas[0].to_layer_stack()
    }

    /// The trained model (replica 0's); the group ends.
    pub fn into_layer_stack(mut self) -> LayerStack<S> {
        // Dissolve while every replica is counted: `Drop` would finish one
        // peer too few, and the next group of another size could not form.
        if self.formed {
            collective::dissolve::<InnerBackendOf<S>>(self.generation, self.replicas.len());
            self.formed = false;
        }
        self.replicas.swap_remove(0).into_layer_stack()
    }
}

impl<S, O> FreezeFront for ReplicaGroup<S, O>
where
    S: StackTypes,
    O: Optimizer<TrainableUnits<S>, S::Backend> + 'static,
    O::Record: ParamStates,
{
    type Error = ElasticError;

    fn num_units(&self) -> usize {
        ReplicaGroup::num_units(self)
    }

    fn front(&self) -> usize {
        ReplicaGroup::front(self)
    }

    fn freeze_to(&mut self, front: usize) -> Result<(), ElasticError> {
        ReplicaGroup::freeze_to(self, front)
    }

    /// Replica 0's: after the all-reduce every replica stepped with the same
    /// gradients.
    fn last_gradient_norms(&self) -> Vec<Option<GradNorm>> {
        self.replicas[0].last_gradient_norms()
    }
}

impl<S: StackTypes, O> Drop for ReplicaGroup<S, O> {
    fn drop(&mut self) {
        if self.formed {
            collective::dissolve::<InnerBackendOf<S>>(self.generation, self.replicas.len());
        }
    }
}
