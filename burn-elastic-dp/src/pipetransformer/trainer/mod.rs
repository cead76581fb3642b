//! The PipeTransformer loop: AutoFreeze, AutoPipe, AutoDP and AutoCache driving one training run of
//! a user's layer stack, dataset and optimizer.

mod access;
mod agree;
mod bounds;
mod build;
mod checkpoint;
mod config;
mod cursor;
mod epoch;
mod error;
mod flow;
mod held_out;
mod learning_rate;
mod log;
mod lr_source;
mod measure;
mod memory;
mod recovery;
mod rules;
mod transition;

use std::sync::Arc;

use burn::data::dataloader::batcher::Batcher;
use burn::data::dataset::Dataset;
use burn::prelude::*;
use burn_freeze::plumbing::InnerFlow;
use burn_freeze::{AutoFreeze, FreezePolicy};
use burn_pipe::MicroBatchLoss;

pub use bounds::{CacheableStack, TrainerBackend, TrainerInput, TrainerTypes, TrainerTypesOf};
pub use checkpoint::CheckpointConfig;
pub use config::TrainerConfig;
pub use epoch::StepProgress;
pub use error::TrainerError;
pub use flow::StepFlow;
pub use log::{EpochReport, Transition};
#[cfg(feature = "burn-train")]
pub(crate) use lr_source::LrSource;
pub use memory::MemoryConfig;
pub use rules::{CostModel, FreezeRule, LayerSpec, Parts};

use crate::error::ElasticError;
use crate::group::{GroupReport, ReplicaGroup};
use crate::pipetransformer::shape::ShapeRule;
use burn_freeze::CacheHolder;
use burn_freeze::FreezeFront;
use cursor::EpochCursor;
use epoch::{EpochEnd, EpochTally};
use held_out::HeldOut;
use learning_rate::LearningRate;
use log::JsonLog;
use measure::Measurements;
use transition::move_to;

/// The loss, shared by every replica's thread: a micro-batch's output and
/// targets to the mean loss over its samples.
pub(crate) type SharedLoss<S, T> = Arc<dyn MicroBatchLoss<S, T> + Send>;

/// PipeTransformer's trainer: a layer stack trained as R replicas of a
/// K-stage pipeline over D devices, in which AutoFreeze moves the freeze
/// front from the gradient statistics the steps already computed, AutoPipe
/// re-plans the active units into the fewest stages that fit, AutoDP runs
/// `D / K` replicas (copying weights and optimizer state to new ones), and
/// AutoCache serves the frozen prefix. Each part can be switched off
/// ([`Parts`]). Built by [`TrainerConfig::init`], which takes the loss, once.
/// `TT` bundles its types ([`TrainerTypes`]): a trainer of a stack of types
/// `S`, stepped by optimizers `O`, whose loss scores targets `T`, is a
/// `Trainer<TrainerTypesOf<S, O, T>>`.
///
/// Each epoch ([`fit_epoch`](Self::fit_epoch)) sees every sample of the
/// dataset exactly once, whatever R does within it. Decision points: after
/// every step (the policy reads that step's gradient norms) and at the end
/// of every epoch; when the front moves, the shape follows at once, and one
/// [`Transition`] is logged.
///
/// Across the ranks of an MPI job every rank runs this loop on its own
/// devices, in lockstep: the same batches, the same all-reduced gradients,
/// hence the same decisions at the same step; each step's header checks it
/// (see [`ReplicaGroup::resize`](crate::ReplicaGroup::resize)), and R in the
/// maths (the sampler's draw, the learning-rate scaling, the checks) is the
/// whole group's.
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
/// // Given once, owned: every replica runs on a thread of its own.
/// let cross_entropy = CrossEntropyLossConfig::new().init(&device);
/// let loss = move |logits, y| cross_entropy.forward(logits, y);
/// let mut trainer = TrainerConfig::new()
///     .with_freeze(FreezeRule::Fronts { layers: vec![0, 3] })
///     .with_stages(Some(2)) // the paper's start (without it: 1 stage, 2 replicas)
///     .with_batch(BatchPolicy::FixedGlobal { batch: 8 })
///     .with_costs(CostModel::Parameters { frozen_factor: 1.0 / 3.0 })
///     .with_replicas(ReplicaConfig::new().with_pipeline(PipelineConfig::new().with_micro_batches(Some(2))))
///     .init(stack, vec![device; 2], || AdamConfig::new().init(), loss)?;
/// for epoch in 0..2 {
///     let report = trainer.fit_epoch(&data, &Points)?;
///     assert_eq!(report.samples, 32);
///     // The shape the epoch ran with: 2 stages, then 1 stage on 2 replicas.
///     assert_eq!((report.stages, report.replicas), [(2, 1), (1, 2)][epoch]);
/// }
/// assert_eq!(trainer.front(), 3); // frozen after epoch 0
/// # Ok::<(), burn_elastic_dp::TrainerError>(())
/// ```
pub struct Trainer<TT: TrainerTypes> {
    group: ReplicaGroup<TT::Stack, TT::Optimizer>,
    loss: SharedLoss<TT::Stack, TT::Targets>,
    config: TrainerConfig,
    devices: Vec<Device<TrainerBackend<TT>>>,
    auto: AutoFreeze<Box<dyn FreezePolicy + Send>>,
    /// Costs, memory and the micro-batch rule (`measure.rs`).
    measured: Measurements,
    /// The learning rate (`learning_rate.rs`).
    rate: LearningRate,
    /// The sampler, the epoch and the steps (`cursor.rs`).
    cursor: EpochCursor,
    /// The freeze rule's held-out batch (`held_out.rs`).
    held_out: HeldOut<TrainerInput<TT>, TT::Targets, InnerFlow<TT::Stack>>,
    log: Option<JsonLog>,
}

/// Where AutoFreeze decides.
#[derive(Clone, Copy)]
enum DecisionPoint {
    AfterStep,
    EpochEnd,
}

impl<TT: TrainerTypes> Trainer<TT> {
    /// Trains one epoch over `dataset`: every sample once, in batches that
    /// `batcher` makes on the first device, the global batch following the
    /// configured [`BatchPolicy`](crate::BatchPolicy) and the replica count
    /// of each step, each scored by the trainer's loss. Returns the epoch's
    /// figures (also written to `epochs.jsonl` in the output directory).
    ///
    /// Fails on a dataset too small for a step or whose length changed
    /// since the first epoch, and when a step or a transition fails (the
    /// error names the replica, stage and micro-batch); a failed step
    /// changes no weight, and its batch is the first the epoch trains when
    /// it goes on (the next call), so that every sample is still trained
    /// once in the epoch.
    pub fn fit_epoch<I, D, Bt>(
        &mut self,
        dataset: &D,
        batcher: &Bt,
    ) -> Result<EpochReport, TrainerError>
    where
        TT::Stack: CacheableStack,
        D: Dataset<I>,
        Bt: Batcher<TrainerBackend<TT>, I, (TrainerInput<TT>, TT::Targets)>,
    {
        self.fit_epoch_observed(dataset, batcher, |_| {})
    }

    /// [`fit_epoch`](Self::fit_epoch), calling `on_step` after every step
    /// (for a progress bar, say). `on_step` returns `()` or a
    /// [`ControlFlow`](std::ops::ControlFlow) ([`StepFlow`]): on
    /// `Break(())` the epoch stops after that step (and its AutoFreeze
    /// decision), the report covering the steps this call ran, and the next
    /// call goes on where it stopped ([`epoch`](Self::epoch) counts the
    /// epoch only once it is finished).
    ///
    /// The loop: the epoch takes the next batch, trains it (the step, with
    /// its retry), then acts after the step (AutoFreeze's decision, and the
    /// transition it makes), and ends with the epoch's report.
    pub fn fit_epoch_observed<I, D, Bt, F: StepFlow>(
        &mut self,
        dataset: &D,
        batcher: &Bt,
        mut on_step: impl FnMut(&StepProgress) -> F,
    ) -> Result<EpochReport, TrainerError>
    where
        TT::Stack: CacheableStack,
        D: Dataset<I>,
        Bt: Batcher<TrainerBackend<TT>, I, (TrainerInput<TT>, TT::Targets)>,
    {
        let mut tally = EpochTally::start(
            self.cache_counts(),
            self.shape(),
            self.group.total_replicas(),
        );
        self.begin_epoch(dataset.len())?;
        loop {
            let replicas = self.group.total_replicas();
            let min_batch = ShapeRule::min_batch(replicas, self.group.micro_batches());
            let Some(drawn) = self.cursor.next_batch(replicas, min_batch)? else {
                break;
            };
            let report = match self.train_batch(dataset, batcher, &drawn.indices, &mut tally) {
                Ok(report) => report,
                Err(error) => {
                    self.cursor.put_back(drawn)?;
                    return Err(error);
                }
            };
            self.cursor.step_taken();
            let total = self.group.total_replicas();
            let (lr, steps) = (self.learning_rate(), self.cursor.steps());
            let progress = tally.step(
                drawn.indices.len(),
                &report,
                self.shape(),
                total,
                (lr, steps),
            );
            let flow = on_step(&progress);
            let moved = self.decide(DecisionPoint::AfterStep, &mut tally)?;
            let thawed = self.guard_after_step(dataset, batcher, &mut tally)?;
            self.checkpoint_after_step(moved || thawed)?;
            self.stop_if_requested()?;
            if flow.into_flow().is_break() && self.cursor.epoch_left() {
                let end = self.epoch_end();
                return Ok(tally.report(end));
            }
        }
        self.decide(DecisionPoint::EpochEnd, &mut tally)?;
        self.end_epoch(tally)
    }

    // The loop's parts follow, top-down: the epoch's start, the step, the
    // decision after it and the transition it makes, the epoch's report.

    /// Checks the group and the dataset and starts the sampler's epoch,
    /// unless one is under way (it stopped part-way: an error, or a
    /// checkpoint taken inside it), which goes on where it stopped.
    fn begin_epoch(&mut self, len: usize) -> Result<(), TrainerError> {
        let shape = self.shape();
        if shape.replicas == 0 {
            return Err(ElasticError::GroupLost.into());
        }
        let replicas = self.group.total_replicas();
        let needed = ShapeRule::min_batch(replicas, self.group.micro_batches());
        let (held_out, config) = (&self.held_out, &self.config);
        let started =
            (self.cursor).begin(len, needed, replicas, |len| held_out.sampler(config, len))?;
        if let Some(steps) = started {
            // Checks scaled to the run (a resumed epoch keeps the length its
            // start gave, saved with the rule's state).
            self.auto.begin_epoch(steps);
        }
        Ok(())
    }

    /// One step on the samples `indices`: before the first, what is to be
    /// measured (its time added to `tally`); the group's forward and
    /// backward pass (run again on the survivors when a replica failed and
    /// recovery is on), then the optimizer step.
    fn train_batch<I, D, Bt>(
        &mut self,
        dataset: &D,
        batcher: &Bt,
        indices: &[usize],
        tally: &mut EpochTally,
    ) -> Result<GroupReport, TrainerError>
    where
        TT::Stack: CacheableStack,
        D: Dataset<I>,
        Bt: Batcher<TrainerBackend<TT>, I, (TrainerInput<TT>, TT::Targets)>,
    {
        let device = self.devices[0].clone();
        let batch = || fetch(dataset, batcher, indices, &device);
        let (mut input, mut targets) = batch()?;
        let measuring = std::time::Instant::now();
        self.measure_if_pending(&input)?;
        tally.profiling(measuring.elapsed());
        let (step, replicas) = (self.cursor.steps(), self.group.total_replicas());
        let sampler = self.cursor.sampler();
        let lr = (self.rate).next(step, self.config.lr, sampler, replicas)?;
        let recover = self.config.recover_replicas;
        let report = loop {
            match self.forward_backward(indices, input, targets) {
                Ok(report) => break report,
                Err(error) => recovery::recover_pass(&mut self.group, recover, error)?,
            }
            // Nothing of the step was applied: the survivors run the same
            // batch again.
            (input, targets) = batch()?;
        };
        recovery::optimizer_step(&mut self.group, recover, lr)?;
        // The freeze rule's update gains, measured inside the step.
        tally.rule(self.group.last_evidence_time());
        Ok(report)
    }

    /// Before the first step (of a new or resumed trainer), where pending:
    /// the units' memory and times measured on `input`, the start decided
    /// again on them and the group moved to it (memory first: measured
    /// activations may deepen a one-stage start, which then needs the
    /// profiled costs); then the micro-batch count.
    fn measure_if_pending(&mut self, input: &TrainerInput<TT>) -> Result<(), TrainerError>
    where
        TT::Stack: CacheableStack,
    {
        let (config, devices) = (&self.config, &self.devices);
        if (self.measured).measure_first_batch(&self.group, config, devices, input)? {
            let start = self.measured.rule_mut().start()?;
            if move_to(&mut self.group, devices, &start)? {
                self.rate.rebase(self.group.total_replicas());
            }
            tracing::info!(balance = ?start.balance, "the start decided again on what was measured");
        }
        (self.measured).measure_micro_batches(&mut self.group, config, &devices[0], input)
    }

    /// The group's forward and backward pass on a batch, the frozen prefix
    /// served from the cache when the group holds one.
    fn forward_backward(
        &mut self,
        indices: &[usize],
        input: TrainerInput<TT>,
        targets: TT::Targets,
    ) -> Result<GroupReport, ElasticError>
    where
        TT::Stack: CacheableStack,
    {
        let loss = Arc::clone(&self.loss);
        let loss = move |output, targets| loss(output, targets);
        if self.group.cache().is_some() {
            let ids: Vec<u64> = indices.iter().map(|&i| i as u64).collect();
            self.group
                .forward_backward_cached(&ids, input, targets, loss)
        } else {
            self.group.forward_backward(input, targets, loss)
        }
    }

    /// AutoFreeze's decision at `point`, when it runs, and the transition
    /// that follows when the front moved (added to `tally`); whether it
    /// moved.
    fn decide(
        &mut self,
        point: DecisionPoint,
        tally: &mut EpochTally,
    ) -> Result<bool, TrainerError> {
        if !self.config.parts.freeze {
            return Ok(false);
        }
        let front = self.group.front();
        let deciding = std::time::Instant::now();
        match point {
            DecisionPoint::AfterStep => self.auto.after_step(&mut self.group)?,
            DecisionPoint::EpochEnd => self.auto.after_epoch(&mut self.group)?,
        };
        tally.rule(deciding.elapsed());
        self.follow_front(front, tally)
    }

    /// After a step, when the freeze rule asks for it: the held-out loss,
    /// fed to the rule, and the transition that follows when it moved the
    /// front (a thaw); whether it moved.
    fn guard_after_step<I, D, Bt>(
        &mut self,
        dataset: &D,
        batcher: &Bt,
        tally: &mut EpochTally,
    ) -> Result<bool, TrainerError>
    where
        TT::Stack: CacheableStack,
        D: Dataset<I>,
        Bt: Batcher<TrainerBackend<TT>, I, (TrainerInput<TT>, TT::Targets)>,
    {
        if !self.config.parts.freeze || !self.auto.wants_held_out_loss() {
            return Ok(false);
        }
        let checking = std::time::Instant::now();
        let carved = self.cursor.held_out();
        let Some((input, targets, prefix)) =
            (self.held_out).batch(dataset, batcher, carved, &self.devices[0])?
        else {
            return Ok(false);
        };
        let loss = held_out::held_out_loss(&self.group, &self.loss, prefix, input, targets)?;
        let front = self.group.front();
        self.auto.held_out_loss(&mut self.group, loss)?;
        tally.rule(checking.elapsed());
        self.follow_front(front, tally)
    }

    /// After a decision: when the front moved from `front_before` (up, or
    /// down: a thaw), the transition that follows, added to `tally`;
    /// whether it moved. The one test of "the front moved".
    fn follow_front(
        &mut self,
        front_before: usize,
        tally: &mut EpochTally,
    ) -> Result<bool, TrainerError> {
        if self.group.front() == front_before {
            return Ok(false);
        }
        if self.group.front() < front_before {
            // Thawed units train again: the held-out activation past them is stale.
            self.held_out.forget_prefix();
        }
        tally.add_transition(self.reshape_after_move(front_before)?);
        Ok(true)
    }

    /// AutoPipe and AutoDP after the front moved from `front_before` (up,
    /// or down: see [`ShapeRule::after_move`]): the new shape, applied,
    /// logged and returned as a [`Transition`].
    fn reshape_after_move(&mut self, front_before: usize) -> Result<Transition, TrainerError> {
        let start = std::time::Instant::now();
        let front = self.group.front();
        let before = self.shape();
        let total_before = self.group.total_replicas();
        let after = (self.measured.rule()).after_move((front_before, front), &before)?;
        move_to(&mut self.group, &self.devices, &after)?;
        self.measured.apply_micro_batches(&mut self.group)?;
        let record = Transition {
            epoch: self.cursor.epoch(),
            step: self.cursor.steps(),
            frozen_layers: self.auto.frozen_layers(),
            front: (front_before, front),
            stages: (before.stages(), after.stages()),
            replicas: (before.replicas, after.replicas),
            total_replicas: (total_before, self.group.total_replicas()),
            micro_batches: self.group.micro_batches(),
            micro_batch_choice: self.measured.micro_batch_choice().cloned(),
            balance: after.balance,
            millis: start.elapsed().as_secs_f64() * 1e3,
        };
        record.log();
        if let Some(log) = self.log.as_mut() {
            log.write_transition(&record)?;
        }
        Ok(record)
    }

    /// After a step that left some of the epoch to run: a checkpoint when
    /// the front `moved` or every `every_steps` steps (the epoch's last step
    /// is saved by the epoch's end, at once).
    fn checkpoint_after_step(&mut self, moved: bool) -> Result<(), TrainerError> {
        if let Some(checkpoint) = &self.config.checkpoint
            && self.cursor.epoch_left()
            && (moved || self.cursor.steps().is_multiple_of(checkpoint.every_steps))
        {
            self.save_checkpoint()?;
        }
        Ok(())
    }

    /// After a step: when a stop was asked for, the checkpoint here (every
    /// process after the same step) and [`TrainerError::Stopped`].
    fn stop_if_requested(&mut self) -> Result<(), TrainerError> {
        if !self.group.stop_requested() {
            return Ok(());
        }
        let checkpoint = self.save_checkpoint()?;
        let steps = self.cursor.steps();
        tracing::warn!(steps, checkpoint = ?checkpoint, "stopped as asked");
        Err(TrainerError::Stopped { steps, checkpoint })
    }

    /// What the epoch's end adds to `tally`.
    fn epoch_end(&self) -> EpochEnd {
        EpochEnd {
            epoch: self.cursor.epoch(),
            frozen_layers: self.auto.frozen_layers(),
            front: self.front(),
            micro_batches: self.group.micro_batches(),
            cache_after: self.cache_counts(),
        }
    }

    /// The epoch's report (logged), and the epoch closed (checkpointed).
    fn end_epoch(&mut self, tally: EpochTally) -> Result<EpochReport, TrainerError> {
        let end = self.epoch_end();
        let report = tally.report(end);
        if let Some(log) = self.log.as_mut() {
            log.write_epoch(&report)?;
        }
        self.cursor.end_epoch();
        self.save_checkpoint()?;
        Ok(report)
    }

    /// Cache hits (full and partial) and misses so far.
    fn cache_counts(&self) -> (u64, u64) {
        self.group.cache().map_or((0, 0), |c| {
            let s = c.stats();
            (s.hits + s.partial_hits, s.misses)
        })
    }
}

/// The items `indices` of `dataset`, batched by `batcher` on `device`.
fn fetch<I, D, Bt, B, Input, T>(
    dataset: &D,
    batcher: &Bt,
    indices: &[usize],
    device: &Device<B>,
) -> Result<(Input, T), TrainerError>
where
    B: Backend,
    D: Dataset<I>,
    Bt: Batcher<B, I, (Input, T)>,
{
    let len = dataset.len();
    let items = indices
        .iter()
        .map(|&index| {
            dataset
                .get(index)
                .ok_or(TrainerError::MissingItem { index, len })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(batcher.batch(items, device))
}
