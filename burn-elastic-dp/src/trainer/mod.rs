//! The PipeTransformer loop: AutoFreeze, AutoPipe, AutoDP and AutoCache
//! driving one training run of a user's layer stack, dataset and optimizer.
//!
//! Files: `config.rs` (the one `Config` and its checks), `shape.rs` (AutoPipe
//! and AutoDP's decision), `log.rs` (transition and epoch records, JSON
//! lines), `error.rs`; the loop is here.

mod checkpoint;
mod config;
mod error;
mod log;

use std::sync::Arc;
use std::time::{Duration, Instant};

use burn::data::dataloader::batcher::Batcher;
use burn::data::dataset::Dataset;
use burn::module::Module;
use burn::optim::Optimizer;
use burn::prelude::*;
use burn::record::{BinBytesRecorder, FullPrecisionSettings, Recorder};
use burn_freeze::{
    Activation, ActivationCache, AutoFreeze, Cacheable, Differentiable, FreezePolicy,
    InnerBackendOf, InnerHidden, InnerInput, InnerOutput, LayerStack, ParamStates, StackTypes,
    TrainableUnits,
};
use burn_pipe::{UnitCosts, profile_units};

pub use checkpoint::CheckpointConfig;
pub use config::{CostModel, FreezeRule, LayerSpec, Parts, TrainerConfig};
pub use error::TrainerError;
pub use log::{EpochReport, Transition};

use crate::error::ElasticError;
use crate::group::ReplicaGroup;
use crate::sampler::ElasticSampler;
use crate::shape::{Reshaping, Shape, initial_shape, reshape};
use log::JsonLog;

/// What [`Trainer::fit_epoch_observed`] reports after each step.
#[derive(Debug, Clone, Copy)]
pub struct StepInfo {
    /// Samples in the step.
    pub samples: usize,
    /// Samples trained on so far this epoch (this step's included).
    pub epoch_samples: usize,
    /// The step's mean loss.
    pub loss: f32,
}

/// PipeTransformer's trainer: a layer stack trained as R replicas of a
/// K-stage pipeline over D devices, in which AutoFreeze moves the freeze
/// front from the gradient statistics the steps already computed, AutoPipe
/// re-plans the active units into the fewest stages that fit, AutoDP runs
/// `D / K` replicas (copying weights and optimizer state to new ones), and
/// AutoCache serves the frozen prefix. Each part can be switched off
/// ([`Parts`]). Built by [`TrainerConfig::init`].
///
/// Each epoch ([`fit_epoch`](Self::fit_epoch)) sees every sample of the
/// dataset exactly once, whatever R does within it. Decision points: after
/// every step (the policy reads that step's gradient norms) and at the end
/// of every epoch; when the front moves, the shape follows at once, and one
/// [`Transition`] is logged.
///
/// ```
/// use burn::backend::{Autodiff, Flex};
/// use burn::data::dataloader::batcher::Batcher;
/// use burn::data::dataset::InMemDataset;
/// use burn::nn::loss::CrossEntropyLossConfig;
/// use burn::nn::{Linear, LinearConfig};
/// use burn::optim::AdamConfig;
/// use burn::prelude::*;
/// use burn_elastic_dp::{BatchPolicy, CostModel, FreezeRule, ReplicaConfig, TrainerConfig};
/// use burn_freeze::LayerStack;
/// use burn_pipe::PipelineConfig;
///
/// #[derive(Module, Debug)]
/// pub struct Dense<B: Backend> { linear: Linear<B> }
/// impl<B: Backend> Dense<B> {
///     pub fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> { self.linear.forward(x).tanh() }
/// }
/// burn_freeze::unit!(Dense<B>: Tensor<B, 2> => Tensor<B, 2>);
///
/// type B = Autodiff<Flex>;
/// #[derive(Clone)]
/// struct Points;
/// impl Batcher<B, ([f32; 4], i64), (Tensor<B, 2>, Tensor<B, 1, Int>)> for Points {
///     fn batch(&self, items: Vec<([f32; 4], i64)>, device: &Device<B>) -> (Tensor<B, 2>, Tensor<B, 1, Int>) {
///         let x = items.iter().map(|(x, _)| Tensor::<B, 1>::from_floats(*x, device)).collect();
///         let y = items.iter().map(|(_, y)| *y).collect::<Vec<_>>();
///         (Tensor::stack(x, 0), Tensor::from_ints(y.as_slice(), device))
///     }
/// }
///
/// let device = Default::default();
/// let dense = |i, o| Dense::<B> { linear: LinearConfig::new(i, o).init(&device) };
/// let stack = LayerStack::new(dense(4, 8), (0..4).map(|_| dense(8, 8)).collect(), dense(8, 2));
/// let data = InMemDataset::new((0..32).map(|i| ([i as f32 / 32.0, 0.5, -0.5, 1.0], i % 2)).collect());
/// let mut trainer = TrainerConfig::new()
///     .with_freeze(FreezeRule::Fronts { layers: vec![0, 3] })
///     .with_batch(BatchPolicy::FixedGlobal { batch: 8 })
///     .with_costs(CostModel::Parameters { frozen_factor: 1.0 / 3.0 })
///     .with_replicas(ReplicaConfig::new().with_pipeline(PipelineConfig::new().with_micro_batches(Some(2))))
///     .init(stack, vec![device; 2], || AdamConfig::new().init())?;
/// let loss = CrossEntropyLossConfig::new().init(&device);
/// // Owned (moved in): every replica runs on a thread of its own.
/// let loss = move |logits, y| loss.forward(logits, y);
/// for _ in 0..2 {
///     let report = trainer.fit_epoch(&data, &Points, loss.clone())?;
///     assert_eq!(report.samples, 32);
/// }
/// assert_eq!(trainer.front(), 3); // frozen after epoch 0
/// # Ok::<(), burn_elastic_dp::TrainerError>(())
/// ```
pub struct Trainer<S: StackTypes, O> {
    group: ReplicaGroup<S, O>,
    costs: UnitCosts,
    /// Whether the costs still wait for the first batch's profile.
    profile_pending: bool,
    shape: Shape,
    initial_largest: f64,
    /// Replicas at the start (the learning rate's reference).
    base_replicas: usize,
    config: TrainerConfig,
    devices: Vec<Device<S::Backend>>,
    auto: AutoFreeze<Box<dyn FreezePolicy + Send>>,
    sampler: Option<ElasticSampler>,
    epoch: usize,
    steps: usize,
    /// Whether an epoch is under way (started, not finished).
    mid_epoch: bool,
    log: Option<JsonLog>,
}

impl<S, O> Trainer<S, O>
where
    S: StackTypes,
    O: Optimizer<TrainableUnits<S>, S::Backend> + 'static,
    O::Record: ParamStates,
{
    /// See [`TrainerConfig::init`]; `resuming` appends to the output
    /// directory's logs instead of starting them afresh.
    fn new(
        stack: LayerStack<S>,
        devices: Vec<Device<S::Backend>>,
        config: TrainerConfig,
        make_optimizer: impl Fn() -> O + Clone + Send + Sync + 'static,
        resuming: bool,
    ) -> Result<Self, TrainerError> {
        config.check(devices.len())?;
        let units = stack.num_units();
        let stages = config.stages.unwrap_or(devices.len());
        if stages > units {
            return Err(TrainerError::TooManyStages { stages, units });
        }
        let map = config.layer_map(units)?;
        let policy = config.policy(map.num_layers());
        let log = match &config.output_dir {
            Some(dir) => Some(JsonLog::create(dir, resuming)?),
            None => None,
        };
        // Parameter counts until the first batch is profiled.
        let (frozen_factor, profile_pending) = match config.costs {
            CostModel::Parameters { frozen_factor } => (frozen_factor, false),
            CostModel::Profiled { .. } => (1.0 / 3.0, true),
        };
        let costs = UnitCosts::from_params(&stack.unit_params(), frozen_factor);
        let replicas = config.replicas_for(stages, stages, devices.len());
        let (shape, initial_largest) = initial_shape(&costs, stages, replicas);
        let mut group = config
            .replicas
            .clone()
            .with_pipeline(
                config
                    .replicas
                    .pipeline
                    .clone()
                    .with_balance(Some(shape.balance.clone())),
            )
            .init(stack, device_lists(&devices, &shape), make_optimizer)?;
        if config.parts.cache && config.parts.freeze {
            group.attach_cache(ActivationCache::new(config.cache.clone())?);
        }
        tracing::info!(
            K = shape.stages(),
            R = shape.replicas,
            M = config.replicas.pipeline.micro_batches_for(shape.stages()),
            balance = ?shape.balance,
            "PipeTransformer run starts"
        );
        Ok(Self {
            group,
            costs,
            profile_pending,
            shape,
            initial_largest,
            base_replicas: replicas,
            devices,
            auto: AutoFreeze::new(policy, map),
            sampler: None,
            epoch: 0,
            steps: 0,
            mid_epoch: false,
            log,
            config,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &TrainerConfig {
        &self.config
    }

    /// The freeze front (frozen units).
    pub fn front(&self) -> usize {
        self.group.front()
    }

    /// Frozen layers (the policy's F).
    pub fn frozen_layers(&self) -> usize {
        self.auto.frozen_layers()
    }

    /// The current shape: units per stage, replicas.
    pub fn shape(&self) -> &Shape {
        &self.shape
    }

    /// AutoPipe's unit costs (profiled on the first batch when so
    /// configured).
    pub fn unit_costs(&self) -> &UnitCosts {
        &self.costs
    }

    /// The learning rate of the next step: the configured one, scaled
    /// linearly with the replica count under
    /// [`BatchPolicy::PerReplica`](crate::BatchPolicy::PerReplica).
    pub fn learning_rate(&self) -> f64 {
        match self.sampler.as_ref() {
            Some(sampler) => {
                sampler.learning_rate(self.config.lr, self.base_replicas, self.shape.replicas)
            }
            None => self.config.lr,
        }
    }

    /// The replica group.
    pub fn group(&self) -> &ReplicaGroup<S, O> {
        &self.group
    }

    /// Micro-batches per replica with `stages` stages.
    fn micro_batches(&self, stages: usize) -> usize {
        self.config.replicas.pipeline.micro_batches_for(stages)
    }

    /// The model's output for evaluation (no graph; dropout off).
    pub fn forward_inner(&self, input: InnerInput<S>) -> InnerOutput<S> {
        self.group.forward_inner(input)
    }

    /// A copy of the whole model (frozen units too), to evaluate or save.
    pub fn to_layer_stack(&self) -> LayerStack<S> {
        self.group.to_layer_stack()
    }

    /// The trained model; the trainer ends.
    pub fn into_layer_stack(self) -> LayerStack<S> {
        self.group.into_layer_stack()
    }

    /// Replaces the parameter-count costs by each unit's time measured on
    /// `input` (a copy of the model on the first device), and rebalances the
    /// starting pipeline on them.
    fn profile(&mut self, input: &S::Input, repeats: usize) -> Result<(), TrainerError>
    where
        S::Output: Differentiable<S::Backend>,
    {
        let stack = self.group.to_layer_stack();
        let profile = profile_units(&stack, input.clone(), &self.devices[0], repeats);
        self.costs = UnitCosts::from_profile(&profile);
        let (shape, initial_largest) =
            initial_shape(&self.costs, self.shape.stages(), self.shape.replicas);
        if shape != self.shape {
            self.group
                .repartition(&shape.balance, device_lists(&self.devices, &shape))?;
        }
        tracing::info!(balance = ?shape.balance, "unit costs profiled; pipeline balanced on them");
        self.shape = shape;
        self.initial_largest = initial_largest;
        self.profile_pending = false;
        Ok(())
    }

    /// Moves the group to `after`: down to replica 0, `on_one` applied to
    /// it, replica 0 repartitioned, then copied to the new replicas (weights,
    /// parameter ids, front, optimizer state).
    fn reshape_through_one(
        &mut self,
        after: &Shape,
        on_one: impl FnOnce(&mut ReplicaGroup<S, O>) -> Result<(), ElasticError>,
    ) -> Result<(), TrainerError> {
        if self.shape.replicas > 1 {
            self.group
                .resize(device_lists(&self.devices, &self.shape.with_replicas(1)))?;
        }
        on_one(&mut self.group)?;
        self.group.repartition(
            &after.balance,
            device_lists(&self.devices, &after.with_replicas(1)),
        )?;
        if after.replicas > 1 {
            self.group.resize(device_lists(&self.devices, after))?;
        }
        self.shape = after.clone();
        Ok(())
    }

    /// AutoPipe and AutoDP after the front moved: the new shape, applied.
    fn transition(&mut self, front_before: usize) -> Result<Transition, TrainerError> {
        let start = Instant::now();
        let devices = self.devices.len();
        let parts = self.config.parts;
        let front = self.group.front();
        let rules = Reshaping::for_parts(parts, devices, self.initial_largest);
        let before = self.shape.clone();
        let after = reshape(&self.costs, front, &before, &rules);
        if after.stages() == before.stages() && after.replicas == before.replicas {
            if after != before {
                self.group
                    .repartition(&after.balance, device_lists(&self.devices, &before))?;
                self.shape = after.clone();
            }
        } else {
            self.reshape_through_one(&after, |_| Ok(()))?;
        }
        let record = Transition {
            epoch: self.epoch,
            step: self.steps,
            frozen_layers: self.auto.frozen_layers(),
            front: (front_before, front),
            stages: (before.stages(), after.stages()),
            replicas: (before.replicas, after.replicas),
            micro_batches: self.micro_batches(after.stages()),
            balance: after.balance,
            millis: start.elapsed().as_secs_f64() * 1e3,
        };
        record.log();
        if let Some(log) = self.log.as_mut() {
            log.transition(&record)?;
        }
        Ok(record)
    }

    /// Trains one epoch over `dataset`: every sample once, in batches that
    /// `batcher` makes on the first device, the global batch following the
    /// configured [`BatchPolicy`](crate::BatchPolicy) and the replica count
    /// of each step. `loss` maps a micro-batch's output and targets to the
    /// mean loss over its samples. Returns the epoch's figures (also written
    /// to `epochs.jsonl` in the output directory).
    ///
    /// Fails on a dataset too small for a step or whose length changed
    /// since the first epoch, and when a step or a transition fails (the
    /// error names the replica, stage and micro-batch); a failed step
    /// changes no weight.
    pub fn fit_epoch<I, D, Bt, T, LossFn>(
        &mut self,
        dataset: &D,
        batcher: &Bt,
        loss: LossFn,
    ) -> Result<EpochReport, TrainerError>
    where
        D: Dataset<I>,
        Bt: Batcher<S::Backend, I, (S::Input, T)>,
        T: Activation<S::Backend> + Send + 'static,
        LossFn: Fn(S::Output, T) -> Tensor<S::Backend, 1> + Send + Sync + 'static,
        InnerInput<S>: Cacheable<InnerBackendOf<S>>,
        InnerHidden<S>: Cacheable<InnerBackendOf<S>>,
        S::Output: Differentiable<S::Backend>,
    {
        self.fit_epoch_observed(dataset, batcher, loss, |_| {})
    }

    /// [`fit_epoch`](Self::fit_epoch), calling `on_step` after every step
    /// (for a progress bar, say).
    pub fn fit_epoch_observed<I, D, Bt, T, LossFn>(
        &mut self,
        dataset: &D,
        batcher: &Bt,
        loss: LossFn,
        mut on_step: impl FnMut(&StepInfo),
    ) -> Result<EpochReport, TrainerError>
    where
        D: Dataset<I>,
        Bt: Batcher<S::Backend, I, (S::Input, T)>,
        T: Activation<S::Backend> + Send + 'static,
        LossFn: Fn(S::Output, T) -> Tensor<S::Backend, 1> + Send + Sync + 'static,
        InnerInput<S>: Cacheable<InnerBackendOf<S>>,
        InnerHidden<S>: Cacheable<InnerBackendOf<S>>,
        S::Output: Differentiable<S::Backend>,
    {
        let started = Instant::now();
        // Every step's replica threads share the one loss function.
        let loss = Arc::new(loss);
        let len = dataset.len();
        if self.sampler.is_none() {
            self.sampler = Some(ElasticSampler::new(
                len,
                self.config.batch,
                self.config.seed,
            )?);
        }
        self.begin_epoch(len)?;
        let cache_before = self.cache_counts();
        let mut transitions = Vec::new();
        let mut transition_time = Duration::ZERO;
        let mut all_reduce = Duration::ZERO;
        let mut bubble = 0f64;
        let (mut steps, mut samples, mut loss_sum) = (0usize, 0usize, 0f64);
        loop {
            let (replicas, stages) = (self.shape.replicas, self.shape.stages());
            let min_batch = replicas * self.micro_batches(stages);
            let sampler = self.sampler.as_mut().expect("sampler made above");
            let Some(indices) = sampler.next_batch_min(replicas, min_batch) else {
                break;
            };
            if indices.len() < min_batch {
                return Err(TrainerError::DatasetTooSmall {
                    len,
                    needed: min_batch,
                });
            }
            let first_device = self.devices[0].clone();
            let fetch = || -> Result<(S::Input, T), TrainerError> {
                let mut items = Vec::with_capacity(indices.len());
                for &index in &indices {
                    items.push(
                        dataset
                            .get(index)
                            .ok_or(TrainerError::MissingItem { index, len })?,
                    );
                }
                Ok(batcher.batch(items, &first_device))
            };
            let (mut input, mut targets) = fetch()?;
            if self.profile_pending
                && let CostModel::Profiled { repeats } = self.config.costs
            {
                self.profile(&input, repeats)?;
            }
            let lr = self.learning_rate();
            let parts = self.config.parts;
            let report = loop {
                let group = &mut self.group;
                let attempt = if parts.cache && parts.freeze && group.front() > 0 {
                    let ids: Vec<u64> = indices.iter().map(|&i| i as u64).collect();
                    group.forward_backward_cached(&ids, input, targets, shared(&loss))
                } else {
                    group.forward_backward(input, targets, shared(&loss))
                };
                match attempt {
                    Ok(report) => break report,
                    Err(error) => {
                        // Replicas left behind by the step (stuck in their
                        // own computation) are out of the group already.
                        self.shape.replicas = self.group.num_replicas();
                        match self.recoverable(&error) {
                            Some(Recovery::Remove(replica)) => {
                                tracing::warn!(%error, replica, "a replica failed; the group shrinks to the survivors and redoes the step");
                                self.group.remove_replica(replica)?;
                                self.shape.replicas = self.group.num_replicas();
                            }
                            Some(Recovery::Redo) => {
                                tracing::warn!(%error, left = self.shape.replicas, "replicas were left behind; the survivors redo the step");
                            }
                            None => return Err(error.into()),
                        }
                        // Nothing of the step was applied: the survivors run
                        // the same batch again.
                        (input, targets) = fetch()?;
                    }
                }
            };
            let group = &mut self.group;
            match group.step(lr) {
                Ok(()) => {}
                Err(ElasticError::PartialStep { failed, source })
                    if self.config.recover_replicas =>
                {
                    // The others applied the update: the failed replicas
                    // leave, and the step is not run again.
                    tracing::warn!(error = %source, ?failed, "replicas failed their optimizer step; they leave the group");
                    for &replica in failed.iter().rev() {
                        self.group.remove_replica(replica)?;
                    }
                    self.shape.replicas = self.group.num_replicas();
                }
                Err(error) => return Err(error.into()),
            }
            let group = &mut self.group;
            steps += 1;
            self.steps += 1;
            self.mid_epoch = true;
            samples += indices.len();
            loss_sum += f64::from(report.loss) * indices.len() as f64;
            all_reduce += report.all_reduce.iter().copied().max().unwrap_or_default();
            bubble += bubble_seconds(&report.replicas);
            on_step(&StepInfo {
                samples: indices.len(),
                epoch_samples: samples,
                loss: report.loss,
            });
            let mut moved = false;
            if parts.freeze {
                let front = group.front();
                if self.auto.after_step(group)?.is_some() {
                    let record = self.transition(front)?;
                    transition_time += Duration::from_secs_f64(record.millis / 1e3);
                    transitions.push(record);
                    moved = true;
                }
            }
            // The epoch's last step is saved by the epoch's end, at once.
            let epoch_left = self.sampler.as_ref().is_some_and(|s| s.remaining() > 0);
            if let Some(checkpoint) = &self.config.checkpoint
                && epoch_left
                && (moved || self.steps.is_multiple_of(checkpoint.every_steps))
            {
                self.save_checkpoint()?;
            }
        }
        if self.config.parts.freeze {
            let front = self.group.front();
            if self.auto.after_epoch(&mut self.group)?.is_some() {
                let record = self.transition(front)?;
                transition_time += Duration::from_secs_f64(record.millis / 1e3);
                transitions.push(record);
            }
        }
        let cache_after = self.cache_counts();
        let seconds = started.elapsed().as_secs_f64();
        let shape = self.shape.clone();
        let report = EpochReport {
            epoch: self.epoch,
            steps,
            samples,
            loss: loss_sum / samples.max(1) as f64,
            seconds,
            samples_per_second: samples as f64 / seconds,
            transition_seconds: transition_time.as_secs_f64(),
            all_reduce_seconds: all_reduce.as_secs_f64() / steps.max(1) as f64,
            bubble_seconds: bubble,
            frozen_layers: self.auto.frozen_layers(),
            front: self.front(),
            stages: shape.stages(),
            replicas: shape.replicas,
            micro_batches: self.micro_batches(shape.stages()),
            balance: shape.balance,
            transitions,
            cache_hits: cache_after.0 - cache_before.0,
            cache_misses: cache_after.1 - cache_before.1,
        };
        if let Some(log) = self.log.as_mut() {
            log.epoch(&report)?;
        }
        self.epoch += 1;
        self.mid_epoch = false;
        if self.config.checkpoint.is_some() {
            self.save_checkpoint()?;
        }
        Ok(report)
    }

    /// How the trainer goes on after a failed step, when recovery is on:
    /// the replica the error names leaves and the survivors redo the step (a
    /// failure of that replica's own, not a non-finite loss, which the same
    /// batch would give again, and another replica left), or the survivors
    /// of a step that left stuck replicas behind redo it.
    fn recoverable(&self, error: &ElasticError) -> Option<Recovery> {
        if !self.config.recover_replicas || self.group.num_replicas() == 0 {
            return None;
        }
        match error {
            ElasticError::Replica {
                source: burn_pipe::PipeError::NonFinite { .. },
                ..
            } => None,
            ElasticError::Replica { replica, .. }
            | ElasticError::ReplicaPanicked { replica, .. }
                if self.group.num_replicas() >= 2 =>
            {
                Some(Recovery::Remove(*replica))
            }
            ElasticError::Timeout { lost, .. } if !lost.is_empty() => Some(Recovery::Redo),
            _ => None,
        }
    }

    /// Epochs finished.
    pub fn epoch(&self) -> usize {
        self.epoch
    }

    /// Optimizer steps taken.
    pub fn steps(&self) -> usize {
        self.steps
    }

    /// Writes a checkpoint of the run into the configured directory (see
    /// [`CheckpointConfig`]; the trainer also does so every `every_steps`
    /// steps, after each transition and at each epoch's end): weights,
    /// optimizer state, freeze front and policy statistics, pipeline shape
    /// and costs, replica count, the sampler's place in the epoch and the
    /// step and epoch counters. Returns its directory, or `None` without a
    /// checkpoint configuration.
    ///
    /// Not saved: the AutoCache's entries (a resumed run recomputes them,
    /// exactly) and the backend's random state (Burn has no API for it: a
    /// model with dropout resumes with other dropout masks).
    pub fn save_checkpoint(&self) -> Result<Option<std::path::PathBuf>, TrainerError> {
        let Some(config) = &self.config.checkpoint else {
            return Ok(None);
        };
        let recorder = BinBytesRecorder::<FullPrecisionSettings>::default();
        let model = self.group.to_layer_stack().into_parts().into_record();
        let model = recorder
            .record(model, ())
            .map_err(|e| TrainerError::Checkpoint(format!("the weights: {e}")))?;
        let optimizer = recorder
            .record(self.group.optimizer_record(), ())
            .map_err(|e| TrainerError::Checkpoint(format!("the optimizer state: {e}")))?;
        let (freeze, policy) = self.auto.save_state();
        let state = checkpoint::RunState {
            format: 0,
            steps: self.steps,
            epoch: self.epoch,
            mid_epoch: self.mid_epoch,
            sampler: self.sampler.as_ref().map(|s| {
                let (epoch, cursor) = s.position();
                (epoch, cursor, s.len())
            }),
            freeze,
            policy,
            front: self.group.front(),
            shape: self.shape.clone(),
            costs: self.costs.clone(),
            initial_largest: self.initial_largest,
            base_replicas: self.base_replicas,
            profile_pending: self.profile_pending,
            files: Vec::new(),
        };
        let path = checkpoint::write(config, state, &model, &optimizer)?;
        tracing::debug!(checkpoint = %path.display(), steps = self.steps, "checkpoint written");
        Ok(Some(path))
    }

    /// Resumes a run from the newest checkpoint in `config.checkpoint`'s
    /// directory that verifies (a truncated or corrupted one is rejected,
    /// with the reason logged, and the one before it used). `stack` gives
    /// the architecture (its weights are replaced by the checkpoint's);
    /// `devices` and `make_optimizer` as for [`TrainerConfig::init`]. The
    /// run then goes on exactly where the checkpoint was taken: the same
    /// losses, step for step, as a run never stopped (for a model without
    /// dropout). Returns the trainer and the checkpoint used.
    pub fn resume(
        stack: LayerStack<S>,
        devices: Vec<Device<S::Backend>>,
        config: TrainerConfig,
        make_optimizer: impl Fn() -> O + Clone + Send + Sync + 'static,
    ) -> Result<(Self, std::path::PathBuf), TrainerError>
    where
        O::Record: Clone,
    {
        let Some(checkpoint) = &config.checkpoint else {
            return Err(TrainerError::InvalidConfig {
                field: "checkpoint",
                value: "None".into(),
                accepted: "a checkpoint directory to resume from",
            });
        };
        let loaded = checkpoint::read_latest(&checkpoint.dir)?;
        let state = loaded.state;
        let recorder = BinBytesRecorder::<FullPrecisionSettings>::default();
        let device = devices.first().cloned().unwrap_or_default();
        let record = recorder.load(loaded.model, &device).map_err(|e| {
            TrainerError::Checkpoint(format!("{}: the weights: {e}", loaded.path.display()))
        })?;
        let (first, middle, last) = stack.into_parts().load_record(record);
        let stack = LayerStack::from_parts(first, middle, last);
        let optimizer: O::Record = recorder.load(loaded.optimizer, &device).map_err(|e| {
            TrainerError::Checkpoint(format!(
                "{}: the optimizer state: {e}",
                loaded.path.display()
            ))
        })?;
        let mut trainer = Self::new(stack, devices, config, make_optimizer, true)?;
        // The saved front and shape, then the saved optimizer state in
        // every replica.
        trainer.reshape_through_one(&state.shape, |group| {
            if state.front > 0 {
                group.freeze_to(state.front)?;
            }
            Ok(())
        })?;
        trainer.group.load_optimizer_record(optimizer);
        trainer.costs = state.costs;
        trainer.initial_largest = state.initial_largest;
        trainer.base_replicas = state.base_replicas;
        trainer.profile_pending = state.profile_pending;
        trainer.auto.load_state(state.freeze, state.policy);
        if let Some((epoch, cursor, len)) = state.sampler {
            let mut sampler = ElasticSampler::new(len, trainer.config.batch, trainer.config.seed)?;
            sampler.seek(epoch, cursor)?;
            trainer.sampler = Some(sampler);
        }
        trainer.epoch = state.epoch;
        trainer.steps = state.steps;
        trainer.mid_epoch = state.mid_epoch;
        tracing::info!(
            checkpoint = %loaded.path.display(),
            steps = state.steps,
            epoch = state.epoch,
            "run resumed"
        );
        Ok((trainer, loaded.path))
    }

    /// Checks the dataset and starts the sampler's epoch.
    fn begin_epoch(&mut self, len: usize) -> Result<(), TrainerError> {
        let (replicas, stages) = (self.shape.replicas, self.shape.stages());
        let needed = replicas * self.micro_batches(stages);
        if len < needed {
            return Err(TrainerError::DatasetTooSmall { len, needed });
        }
        let sampler = self.sampler.as_mut().expect("sampler made");
        if sampler.len() != len {
            return Err(TrainerError::DatasetChanged {
                before: sampler.len(),
                now: len,
            });
        }
        // An epoch that stopped part-way (an error, or a checkpoint taken
        // inside it) goes on where it stopped.
        if !self.mid_epoch && (self.epoch > 0 || sampler.remaining() != len) {
            sampler.start_epoch();
        }
        Ok(())
    }

    /// Cache hits (full and partial) and misses so far.
    fn cache_counts(&self) -> (u64, u64) {
        self.group.cache().map_or((0, 0), |c| {
            let s = c.stats();
            (s.hits + s.partial_hits, s.misses)
        })
    }
}

/// Seconds of a step's pipelined passes lost to bubbles: each replica's
/// wall time times its bubble fraction, averaged over the replicas.
fn bubble_seconds(replicas: &[burn_pipe::StepReport]) -> f64 {
    let lost: f64 = replicas
        .iter()
        .map(|r| r.wall.as_secs_f64() * r.bubble_fraction())
        .sum();
    lost / replicas.len().max(1) as f64
}

/// Device lists of a shape: replica `r` on the next `K` devices.
fn device_lists<D: Clone>(devices: &[D], shape: &Shape) -> Vec<Vec<D>> {
    let k = shape.stages();
    (0..shape.replicas)
        .map(|r| devices[r * k..(r + 1) * k].to_vec())
        .collect()
}

/// A loss function for one step's replica threads: a handle on `loss`.
fn shared<O, T, R, L>(loss: &Arc<L>) -> impl Fn(O, T) -> R + Send + Sync + 'static
where
    L: Fn(O, T) -> R + Send + Sync + 'static,
{
    let loss = Arc::clone(loss);
    move |output, targets| loss(output, targets)
}

/// How a failed step is recovered from (see `Trainer::recoverable`).
enum Recovery {
    /// The named replica leaves the group; the survivors redo the step.
    Remove(usize),
    /// The group already left its stuck replicas behind; the survivors redo
    /// the step.
    Redo,
}
