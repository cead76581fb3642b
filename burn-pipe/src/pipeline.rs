//! The public face of burn-pipe: a layer stack trained as a pipeline of stages.

use std::thread;

use burn::optim::{GradientsAccumulator, Optimizer};
use burn::prelude::*;
use burn_freeze::{
    Activation, AutodiffActivation, Cacheable, Flow, FreezeFront, GradNorm, InnerBackendOf,
    InnerFlow, InnerHidden, InnerInput, InnerOutput, LayerStack, ParamStates, StackCache,
    StackTypes, StatePool, TrainableUnits, UnitRange, check_freeze, check_sample_ids,
    flow_to_device, optimizer_for, pool_optimizer_state, serve_prefix,
};

use crate::config::PipelineConfig;
use crate::error::PipeError;
use crate::microbatch::micro_batch_sizes;
use crate::pass::run_pass;
use crate::placement::{Stage, place, validate};
use crate::report::StepReport;

/// A [`LayerStack`] trained as a pipeline of stages, each a contiguous range of
/// units ([`UnitRange`]) on its own device and worker thread, with its own
/// optimizer.
///
/// A step splits the mini-batch into micro-batches, streams them through the
/// stages under the configured [`Schedule`](crate::Schedule), and accumulates
/// each stage's parameter gradients; [`step`](Pipeline::step) then applies
/// every stage's optimizer with one learning rate. The gradients equal those of
/// plain training on the whole batch when the loss is a mean over samples.
///
/// Your own model, pipelined: its units, the [`unit!`](burn_freeze::unit)
/// lines, and a [`PipelineConfig`]:
///
/// ```
/// use burn::backend::{Autodiff, Flex};
/// use burn::nn::loss::CrossEntropyLossConfig;
/// use burn::nn::{Linear, LinearConfig};
/// use burn::optim::AdamConfig;
/// use burn::prelude::*;
/// use burn_freeze::LayerStack;
/// use burn_pipe::PipelineConfig;
///
/// // The model: any Burn modules, each with one forward for every backend.
/// #[derive(Module, Debug)]
/// pub struct Block<B: Backend> { linear: Linear<B> }
/// impl<B: Backend> Block<B> {
///     pub fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> { x.clone() + self.linear.forward(x).tanh() }
/// }
/// #[derive(Module, Debug)]
/// pub struct Head<B: Backend> { linear: Linear<B> }
/// impl<B: Backend> Head<B> {
///     pub fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> { self.linear.forward(x) }
/// }
///
/// // Pipelining it:
/// burn_freeze::unit!(Block<B>: Tensor<B, 2> => Tensor<B, 2>);
/// burn_freeze::unit!(Head<B>: Tensor<B, 2> => Tensor<B, 2>);
/// type B = Autodiff<Flex>;
/// let device = Default::default();
/// let block = || Block::<B> { linear: LinearConfig::new(8, 8).init(&device) };
/// let head = Head { linear: LinearConfig::new(8, 3).init(&device) };
/// let stack = LayerStack::new(block(), (0..4).map(|_| block()).collect(), head);
/// let mut pipeline = PipelineConfig::new()
///     .with_micro_batches(Some(4))
///     .init(stack, vec![device; 3], || AdamConfig::new().init())?;
/// let loss = CrossEntropyLossConfig::new().init(&device);
/// let x = Tensor::<B, 2>::ones([16, 8], &device);
/// let y = Tensor::<B, 1, Int>::zeros([16], &device);
/// let report = pipeline.train_step(x, y, |logits, y| loss.forward(logits, y), 1e-3)?;
/// assert_eq!(pipeline.balance().len(), 3);
/// assert_eq!(report.micro_batches, 4);
/// # Ok::<(), burn_pipe::PipeError>(())
/// ```
///
/// A function generic over the stack and the optimizer carries one bound
/// for each:
///
/// ```
/// use burn::optim::Optimizer;
/// use burn_freeze::{StackTypes, TrainableUnits};
/// use burn_pipe::Pipeline;
///
/// fn describe<S: StackTypes, O: Optimizer<TrainableUnits<S>, S::Backend>>(p: &Pipeline<S, O>) -> String {
///     format!("K={} {:?}, front {}", p.num_stages(), p.balance(), p.front())
/// }
/// ```
pub struct Pipeline<S: StackTypes, O> {
    stages: Vec<Stage<S, O>>,
    /// Units `0..front` are frozen.
    front: usize,
    config: PipelineConfig,
    make_optimizer: std::sync::Arc<dyn Fn() -> O + Send + Sync>,
    /// Per-unit gradient norms of the last optimizer step.
    norms: Vec<Option<GradNorm>>,
    /// AutoCache for stage 0's frozen units.
    cache: Option<StackCache<S>>,
}

/// A whole batch as a flow, with its size.
fn flow_batch<S: StackTypes>(flow: InnerFlow<S>) -> (InnerFlow<S>, usize) {
    let batch = match &flow {
        Flow::Input(x) => x.batch_size(),
        Flow::Hidden(x) => x.batch_size(),
        Flow::Output(x) => x.batch_size(),
    };
    (flow, batch)
}

/// A flow split into micro-batches of `sizes`.
fn split_flow<S: StackTypes>(flow: InnerFlow<S>, sizes: &[usize]) -> Vec<InnerFlow<S>> {
    match flow {
        Flow::Input(x) => x.split_batch(sizes).into_iter().map(Flow::Input).collect(),
        Flow::Hidden(x) => x.split_batch(sizes).into_iter().map(Flow::Hidden).collect(),
        Flow::Output(x) => x.split_batch(sizes).into_iter().map(Flow::Output).collect(),
    }
}

impl<S, O> Pipeline<S, O>
where
    S: StackTypes,
    O: Optimizer<TrainableUnits<S>, S::Backend>,
{
    /// Builds a pipeline of `balance.len()` stages, stage `s` holding the next
    /// `balance[s]` units and living on `devices[s]`, each with an optimizer
    /// made by `make_optimizer` (the `balance` of `config` is not used; see
    /// [`PipelineConfig::init`] to balance automatically).
    ///
    /// Fails, before touching any unit, when the balance has no stage, more
    /// stages than units, an empty stage or the wrong total; when there is not
    /// exactly one device per stage; or when the config asks for 0
    /// micro-batches or a zero timeout.
    pub fn new(
        stack: LayerStack<S>,
        balance: &[usize],
        devices: Vec<Device<S::Backend>>,
        config: PipelineConfig,
        make_optimizer: impl Fn() -> O + Send + Sync + 'static,
    ) -> Result<Self, PipeError> {
        crate::quiet::quiet_worker_panics();
        let units = stack.num_units();
        validate(balance, units, devices.len(), &config)?;
        let stages = place(stack, balance, 0, devices, |_| make_optimizer());
        Ok(Self {
            stages,
            front: 0,
            config,
            make_optimizer: std::sync::Arc::new(make_optimizer),
            norms: vec![None; units],
            cache: None,
        })
    }

    /// Number of stages.
    pub fn num_stages(&self) -> usize {
        self.stages.len()
    }

    /// Units per stage.
    pub fn balance(&self) -> Vec<usize> {
        self.stages.iter().map(|s| s.range.len()).collect()
    }

    /// Number of units, frozen or not.
    pub fn num_units(&self) -> usize {
        self.stages.last().map_or(0, |s| s.range.end)
    }

    /// The freeze front: units `0..front()` are frozen.
    pub fn front(&self) -> usize {
        self.front
    }

    /// The configuration.
    pub fn config(&self) -> &PipelineConfig {
        &self.config
    }

    /// The device of each stage.
    pub fn devices(&self) -> Vec<Device<S::Backend>> {
        self.stages.iter().map(|s| s.device.clone()).collect()
    }

    /// The units of stage `stage`, frozen and trainable.
    ///
    /// # Panics
    /// When `stage >= num_stages()`.
    pub fn stage(&self, stage: usize) -> &UnitRange<S> {
        self.stages[stage].units()
    }

    /// Gradients stage `stage` accumulated since the last optimizer step, if any.
    pub fn gradients(&self, stage: usize) -> Option<&burn::optim::GradientsParams> {
        self.stages[stage].pending.as_ref()
    }

    /// Replaces each stage's accumulated gradients by `f(stage, gradients)`
    /// (stages without gradients are skipped), e.g. to all-reduce them across
    /// data-parallel replicas before [`step`](Pipeline::step). On the first
    /// error the remaining stages keep their gradients and the failing
    /// stage's are dropped.
    pub fn map_gradients<E>(
        &mut self,
        mut f: impl FnMut(
            usize,
            burn::optim::GradientsParams,
        ) -> Result<burn::optim::GradientsParams, E>,
    ) -> Result<(), E> {
        for (index, stage) in self.stages.iter_mut().enumerate() {
            if let Some(grads) = stage.pending.take() {
                stage.pending = Some(f(index, grads)?);
            }
        }
        Ok(())
    }

    /// Drops accumulated gradients without applying them.
    pub fn clear_gradients(&mut self) {
        for stage in &mut self.stages {
            stage.pending = None;
        }
    }

    /// Runs the forward and backward passes of one mini-batch through the
    /// pipeline and adds each stage's parameter gradients to its accumulated
    /// gradients (so several calls before [`step`](Pipeline::step) accumulate).
    ///
    /// `loss` maps the last unit's output for a micro-batch and that
    /// micro-batch's targets to the *mean* loss over its samples; the pipeline
    /// weights each micro-batch by its share of the batch, so the gradients are
    /// those of the mean loss over the whole batch.
    ///
    /// On error (every unit frozen, a stage panicked or failed, a wait
    /// exceeded the configured timeout, bad batch sizes) every worker has
    /// stopped, no gradient of this pass is kept, and the weights are
    /// unchanged.
    pub fn forward_backward<T, LossFn>(
        &mut self,
        input: S::Input,
        targets: T,
        loss: LossFn,
    ) -> Result<StepReport, PipeError>
    where
        T: Activation<S::Backend>,
        LossFn: Fn(S::Output, T) -> Tensor<S::Backend, 1> + Sync,
    {
        self.check_sizes(input.batch_size(), targets.batch_size())?;
        let flows = flow_batch::<S>(Flow::Input(input.inner()));
        self.run(flows, 0, targets, loss)
    }

    /// [`forward_backward`](Pipeline::forward_backward) with the frozen
    /// units of stage 0 served by the attached AutoCache
    /// ([`serve_prefix`](burn_freeze::serve_prefix)): `ids[i]` names sample
    /// `i` of the batch, the same id for the same sample in every epoch.
    /// The cache holds the output of the frozen units on stage 0 (at most
    /// every unit but the last); frozen units on later stages run as usual.
    /// Gradients and loss equal `forward_backward`'s. Without a cache, or
    /// with no frozen unit on stage 0, this is `forward_backward`.
    ///
    /// Fails, changing nothing, when `ids` does not name the batch (count or
    /// duplicates) or a sample comes back with another shape, and as
    /// `forward_backward` does.
    pub fn forward_backward_cached<T, LossFn>(
        &mut self,
        ids: &[u64],
        input: S::Input,
        targets: T,
        loss: LossFn,
    ) -> Result<StepReport, PipeError>
    where
        T: Activation<S::Backend>,
        LossFn: Fn(S::Output, T) -> Tensor<S::Backend, 1> + Sync,
        InnerInput<S>: Cacheable<InnerBackendOf<S>>,
        InnerHidden<S>: Cacheable<InnerBackendOf<S>>,
    {
        self.check_sizes(input.batch_size(), targets.batch_size())?;
        check_sample_ids(ids, input.batch_size())?;
        let first = &self.stages[0];
        let cached = first.units().frozen().units().end.min(self.num_units() - 1);
        let Some(cache) = self.cache.as_mut().filter(|_| cached > 0) else {
            let flows = flow_batch::<S>(Flow::Input(input.inner()));
            return self.run(flows, 0, targets, loss);
        };
        let input = input.inner().to_device(&first.device);
        let hidden = serve_prefix(cache, first.units().frozen(), ids, input, cached)?;
        self.forward_backward_from(cached, hidden, targets, loss)
    }

    /// [`forward_backward`](Pipeline::forward_backward) for a batch that
    /// enters the pipeline at unit `entry` as `hidden`, the output of units
    /// `0..entry` computed elsewhere (served from a cache shared by several
    /// pipelines, say): those units do not run. Gradients and loss equal
    /// `forward_backward`'s on the input that gave `hidden`.
    ///
    /// Fails, before any work, when units `0..entry` are not frozen units of
    /// stage 0 or `entry` is 0, and as `forward_backward` does.
    pub fn forward_backward_from<T, LossFn>(
        &mut self,
        entry: usize,
        hidden: InnerHidden<S>,
        targets: T,
        loss: LossFn,
    ) -> Result<StepReport, PipeError>
    where
        T: Activation<S::Backend>,
        LossFn: Fn(S::Output, T) -> Tensor<S::Backend, 1> + Sync,
    {
        let frozen_on_first = self.stages[0].units().frozen().units().end;
        if entry == 0 || entry > frozen_on_first.min(self.num_units() - 1) {
            return Err(PipeError::BadEntry {
                entry,
                frozen_on_first,
            });
        }
        self.check_sizes(hidden.batch_size(), targets.batch_size())?;
        let flows = flow_batch::<S>(Flow::Hidden(hidden));
        self.run(flows, entry, targets, loss)
    }

    /// Something to train, as many targets as samples, enough samples for
    /// the micro-batches.
    fn check_sizes(&self, batch: usize, targets: usize) -> Result<(), PipeError> {
        if self.front == self.num_units() {
            return Err(PipeError::NothingToTrain {
                units: self.num_units(),
            });
        }
        if targets != batch {
            return Err(PipeError::TargetsMismatch {
                input: batch,
                targets,
            });
        }
        micro_batch_sizes(batch, self.config.micro_batches_for(self.stages.len()))?;
        Ok(())
    }

    /// One pass over `flows` (the whole batch, entering stage 0 at unit
    /// `entry`) split into micro-batches.
    fn run<T, LossFn>(
        &mut self,
        flows: (InnerFlow<S>, usize),
        entry: usize,
        targets: T,
        loss: LossFn,
    ) -> Result<StepReport, PipeError>
    where
        T: Activation<S::Backend>,
        LossFn: Fn(S::Output, T) -> Tensor<S::Backend, 1> + Sync,
    {
        let (flow, batch) = flows;
        let micro_batches = self.config.micro_batches_for(self.stages.len());
        let sizes = micro_batch_sizes(batch, micro_batches)?;
        let inputs = split_flow::<S>(flow, &sizes);
        let targets: Vec<(T, f32)> = targets
            .split_batch(&sizes)
            .into_iter()
            .zip(&sizes)
            .map(|(t, &n)| (t, n as f32 / batch as f32))
            .collect();

        let (results, wall) = run_pass(
            &mut self.stages,
            self.front,
            &self.config,
            inputs,
            entry,
            targets,
            &loss,
        );
        let mut reports = Vec::with_capacity(results.len());
        let mut errors = Vec::new();
        for result in results {
            match result {
                Ok(report) => reports.push(report),
                Err(error) => errors.push(error),
            }
        }
        if let Some(error) = PipeError::root_cause(errors) {
            tracing::warn!(%error, "pipelined pass failed; no gradient kept");
            return Err(error);
        }
        let loss: f32 = reports.iter().map(|r| r.loss).sum();
        if !loss.is_finite() {
            let stage = self.stages.len() - 1;
            tracing::warn!(stage, loss, "non-finite loss: no gradient kept");
            return Err(PipeError::NonFinite {
                what: "loss",
                stage,
                unit: None,
            });
        }

        let mut report = StepReport {
            loss: 0.0,
            micro_batches,
            wall,
            busy: Vec::with_capacity(reports.len()),
            peak_saved: Vec::with_capacity(reports.len()),
            messages: 0,
        };
        for (stage, stage_report) in self.stages.iter_mut().zip(reports) {
            report.loss += stage_report.loss;
            report.busy.push(stage_report.busy);
            report.peak_saved.push(stage_report.peak_saved);
            report.messages += stage_report.messages;
            stage.pending = Some(match stage.pending.take() {
                None => stage_report.grads,
                Some(pending) => {
                    let module = stage.units().trainable();
                    let mut accumulator = GradientsAccumulator::new();
                    accumulator.accumulate(module, pending);
                    accumulator.accumulate(module, stage_report.grads);
                    accumulator.grads()
                }
            });
        }
        Ok(report)
    }

    /// Applies every stage's optimizer to its accumulated gradients with
    /// learning rate `lr` (one schedule drives all stages), then clears them,
    /// recording each unit's gradient norm for
    /// [`last_gradient_norms`](FreezeFront::last_gradient_norms). A stage
    /// without gradients (nothing trainable) is left as it is.
    ///
    /// A gradient that is not finite (NaN or infinite) refuses the step:
    /// no stage steps, the gradients are dropped, weights and optimizer
    /// state stay as they were, and the error names the stage and unit.
    pub fn step(&mut self, lr: f64) -> Result<(), PipeError> {
        if let Err(injected) =
            burn_freeze::fault::check(burn_freeze::fault::Phase::Step, None, None)
        {
            self.clear_gradients();
            return Err(injected.into());
        }
        // Every stage's per-unit norms first (one device read per stage), so
        // that a non-finite gradient anywhere stops every stage.
        let norms: Vec<Vec<Option<GradNorm>>> = thread::scope(|scope| {
            let handles: Vec<_> = self
                .stages
                .iter_mut()
                .map(|stage| {
                    scope.spawn(move || match &stage.pending {
                        None => vec![None; stage.range.len()],
                        Some(grads) => stage.units().unit_gradient_norms(grads),
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("reading gradient norms does not panic"))
                .collect()
        });
        let bad = norms.iter().enumerate().find_map(|(stage, units)| {
            units.iter().enumerate().find_map(|(i, norm)| {
                norm.filter(|n| !(n.l1.is_finite() && n.l2.is_finite()))
                    .map(|_| (stage, self.stages[stage].range.start + i))
            })
        });
        if let Some((stage, unit)) = bad {
            self.clear_gradients();
            tracing::warn!(stage, unit, "non-finite gradient: the step is refused");
            return Err(PipeError::NonFinite {
                what: "gradient",
                stage,
                unit: Some(unit),
            });
        }
        thread::scope(|scope| {
            for stage in &mut self.stages {
                scope.spawn(move || {
                    let Some(grads) = stage.pending.take() else {
                        return;
                    };
                    let units = stage.units.as_mut().expect("units present");
                    let optimizer = &mut stage.optimizer;
                    units.map_trainable(|module| optimizer.step(lr, module, grads));
                });
            }
        });
        self.norms = norms.into_iter().flatten().collect();
        Ok(())
    }

    /// [`forward_backward`](Pipeline::forward_backward) then [`step`](Pipeline::step).
    pub fn train_step<T, LossFn>(
        &mut self,
        input: S::Input,
        targets: T,
        loss: LossFn,
        lr: f64,
    ) -> Result<StepReport, PipeError>
    where
        T: Activation<S::Backend>,
        LossFn: Fn(S::Output, T) -> Tensor<S::Backend, 1> + Sync,
    {
        let report = self.forward_backward(input, targets, loss)?;
        self.step(lr)?;
        Ok(report)
    }

    /// The model's output for `input`, for evaluation: every unit runs on the
    /// inner backend (no graph, dropout off), stage after stage on the
    /// calling thread, the activation moving to each stage's device.
    pub fn forward_inner(&self, input: InnerInput<S>) -> InnerOutput<S> {
        let mut flow = Flow::Input(input);
        for stage in &self.stages {
            let moved =
                flow_to_device::<burn_freeze::InnerBackendOf<S>, _, _, _>(flow, &stage.device);
            flow = stage.units().forward_inner(moved);
        }
        match flow {
            Flow::Output(output) => output,
            other => unreachable!(
                "the last stage returns the model output, not {}",
                other.kind()
            ),
        }
    }

    /// Moves units between stages: afterwards stage `s` holds `balance[s]`
    /// units on `devices[s]`, each unit with its weights and its optimizer
    /// state. Training continues exactly as if the pipeline had always had
    /// this shape.
    ///
    /// Optimizer state is keyed by parameter id (true of every Burn optimizer
    /// through `OptimizerAdaptor`), so each unit's state follows it.
    ///
    /// Fails, changing nothing, on a bad balance or device list, or when
    /// gradients are pending.
    pub fn repartition(
        &mut self,
        balance: &[usize],
        devices: Vec<Device<S::Backend>>,
    ) -> Result<(), PipeError>
    where
        O::Record: ParamStates,
    {
        if self.stages.iter().any(|s| s.pending.is_some()) {
            return Err(PipeError::GradientsPending("repartition"));
        }
        burn_freeze::fault::check(burn_freeze::fault::Phase::Repartition, None, None)?;
        validate(balance, self.num_units(), devices.len(), &self.config)?;
        let mut pool = StatePool::<O, TrainableUnits<S>, S::Backend>::new();
        let mut ranges = Vec::with_capacity(self.stages.len());
        for stage in self.stages.drain(..) {
            pool_optimizer_state(&stage.optimizer, &mut pool);
            ranges.push(stage.units.expect("units present"));
        }
        let stack = UnitRange::join(ranges).expect("the stages cover the stack in order");
        let make = &self.make_optimizer;
        self.stages = place(stack, balance, self.front, devices, |trainable| {
            optimizer_for(make(), trainable, &mut pool)
        });
        tracing::debug!(?balance, "pipeline repartitioned");
        Ok(())
    }

    /// Freezes units `0..front`: they move to the inner backend on the stage
    /// that holds them, run forward only, and lose their optimizer state. The
    /// front only moves up, to at most every unit
    /// ([`check_freeze`](burn_freeze::check_freeze), the rule
    /// [`FreezableStack`](burn_freeze::FreezableStack) follows too); with
    /// every unit frozen a training step fails with
    /// [`PipeError::NothingToTrain`].
    ///
    /// Fails, changing nothing, when `front` is below the current front or
    /// beyond the stack, or when gradients are pending.
    pub fn freeze_to(&mut self, front: usize) -> Result<(), PipeError>
    where
        O::Record: ParamStates,
    {
        if self.stages.iter().any(|s| s.pending.is_some()) {
            return Err(PipeError::GradientsPending("freeze_to"));
        }
        check_freeze(front, self.front, self.num_units())?;
        for stage in &mut self.stages {
            if stage.units_mut().freeze_to(front) == 0 {
                continue;
            }
            let mut pool = StatePool::<O, TrainableUnits<S>, S::Backend>::new();
            pool_optimizer_state(&stage.optimizer, &mut pool);
            let fresh = (self.make_optimizer)();
            let trainable = stage.units().trainable();
            stage.optimizer = optimizer_for(fresh, trainable, &mut pool);
        }
        tracing::debug!(
            from = self.front,
            to = front,
            "pipeline freeze front moved up"
        );
        self.front = front;
        Ok(())
    }

    /// Every stage's optimizer state as one record keyed by parameter id,
    /// to save in a checkpoint (Burn's recorders serialise it).
    pub fn optimizer_record(&self) -> O::Record
    where
        O::Record: ParamStates,
    {
        let mut pool = StatePool::<O, TrainableUnits<S>, S::Backend>::new();
        for stage in &self.stages {
            pool_optimizer_state(&stage.optimizer, &mut pool);
        }
        O::Record::from_states(pool.into_iter().collect())
    }

    /// Loads a record of [`optimizer_record`](Self::optimizer_record): each
    /// stage takes the states of its trainable units' parameters (by id);
    /// the others are dropped.
    pub fn load_optimizer_record(&mut self, record: O::Record)
    where
        O::Record: ParamStates,
    {
        let mut pool: StatePool<O, TrainableUnits<S>, S::Backend> =
            record.into_states().into_iter().collect();
        for stage in &mut self.stages {
            let fresh = (self.make_optimizer)();
            stage.optimizer = optimizer_for(fresh, stage.units().trainable(), &mut pool);
        }
    }

    /// Attaches an AutoCache for
    /// [`forward_backward_cached`](Pipeline::forward_backward_cached),
    /// replacing (and returning) any attached before.
    pub fn attach_cache(&mut self, cache: StackCache<S>) -> Option<StackCache<S>> {
        self.cache.replace(cache)
    }

    /// The attached cache.
    pub fn cache(&self) -> Option<&StackCache<S>> {
        self.cache.as_ref()
    }

    /// Detaches the cache (dropping it removes its spill files).
    pub fn detach_cache(&mut self) -> Option<StackCache<S>> {
        self.cache.take()
    }

    /// A copy of this pipeline on `devices` (one per stage): the same units
    /// (weights and parameter ids), freeze front, balance, optimizer state
    /// and configuration, as fresh parameter leaves on the new devices; the
    /// copy has no cache and no gradient. This is how a data-parallel group
    /// adds a replica.
    ///
    /// Fails, changing nothing, when gradients are pending or there is not
    /// one device per stage.
    pub fn replicate(&self, devices: Vec<Device<S::Backend>>) -> Result<Self, PipeError> {
        if self.stages.iter().any(|s| s.pending.is_some()) {
            return Err(PipeError::GradientsPending("replicate"));
        }
        burn_freeze::fault::check(burn_freeze::fault::Phase::Spawn, None, None)?;
        if devices.len() != self.stages.len() {
            return Err(PipeError::DeviceCount {
                devices: devices.len(),
                stages: self.stages.len(),
            });
        }
        let stages = self
            .stages
            .iter()
            .zip(devices)
            .map(|(stage, device)| Stage {
                units: Some(stage.units().clone().fork(&device)),
                optimizer: stage.optimizer.clone(),
                device,
                range: stage.range.clone(),
                pending: None,
            })
            .collect();
        Ok(Self {
            stages,
            front: self.front,
            config: self.config.clone(),
            make_optimizer: self.make_optimizer.clone(),
            norms: self.norms.clone(),
            cache: None,
        })
    }

    /// A copy of the whole model as a layer stack, every unit on the
    /// autodiff backend on its stage's device, to evaluate or save it while
    /// training goes on (Burn tensors share storage, so no weight is copied).
    pub fn to_layer_stack(&self) -> LayerStack<S> {
        UnitRange::join(self.stages.iter().map(|s| s.units().clone()).collect())
            .expect("the stages cover the stack in order")
    }

    /// Takes the pipeline apart into its layer stack (units stay on their
    /// stages' devices; frozen units train again).
    pub fn into_layer_stack(self) -> LayerStack<S> {
        UnitRange::join(
            self.stages
                .into_iter()
                .map(|s| s.units.expect("units present"))
                .collect(),
        )
        .expect("the stages cover the stack in order")
    }
}

impl<S, O> FreezeFront for Pipeline<S, O>
where
    S: StackTypes,
    O: Optimizer<TrainableUnits<S>, S::Backend>,
    O::Record: ParamStates,
{
    type Error = PipeError;

    fn num_units(&self) -> usize {
        Pipeline::num_units(self)
    }

    fn front(&self) -> usize {
        self.front
    }

    fn freeze_to(&mut self, front: usize) -> Result<(), PipeError> {
        Pipeline::freeze_to(self, front)
    }

    fn last_gradient_norms(&self) -> Vec<Option<GradNorm>> {
        let front = self.front;
        self.norms
            .iter()
            .enumerate()
            .map(|(unit, norm)| norm.filter(|_| unit >= front))
            .collect()
    }
}
