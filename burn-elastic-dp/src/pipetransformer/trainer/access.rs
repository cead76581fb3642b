//! What a trainer shows of itself (its configuration, front, shape, measurements, rate, group,
//! counts and model) and what a user sets on it (schedule, validation batch, micro-batch times,
//! stop signal); its checkpoints are `checkpoint/`'s.

use burn::lr_scheduler::LrScheduler;
use burn_freeze::{Activation, InnerInput, InnerOutput, LayerStack};
use burn_pipe::balance::StageMemory;
use burn_pipe::micro::{MicroBatchChoice, MicroBatchTimes};
use burn_pipe::{UnitCosts, UnitMemory};

use super::bounds::{TrainerBackend, TrainerInput, TrainerTypes};
use super::lr_source::{Closure, LrSource, Scheduler};
use super::transition::shape_of;
use super::{Trainer, TrainerConfig};
use crate::group::ReplicaGroup;
use crate::pipetransformer::shape::{PipelineShape, ShapeRule};
use crate::{StopSignal, TrainerError};
use burn_freeze::FreezeFront;

/// The shape, the measurements and the epoch's state.
impl<TT: TrainerTypes> Trainer<TT> {
    /// The current shape, as the group runs it: units per stage (replica
    /// 0's; every replica has the same), replicas. A group that lost every
    /// replica has no stage.
    pub fn shape(&self) -> PipelineShape {
        shape_of(&self.group)
    }

    /// Whether an epoch is under way: started, not finished (it stopped
    /// part-way, by its observer, an error, or a checkpoint taken inside
    /// it); the next [`fit_epoch`](Self::fit_epoch) goes on with it.
    pub fn epoch_in_progress(&self) -> bool {
        self.cursor.mid_epoch()
    }

    /// The units' memory figures: parameter bytes, and the activation bytes
    /// per sample measured on the first batch (0 until then, or where the
    /// heap is not counted).
    pub fn unit_memory(&self) -> &UnitMemory {
        self.measured.rule().memory()
    }

    /// The estimate of what each stage of the current shape holds (see
    /// [`UnitMemory::stages`]), at the current front.
    pub fn stage_memory(&self) -> Vec<StageMemory> {
        let balance = self.shape().balance;
        self.measured.rule().stage_memory(&balance, self.front())
    }

    /// The micro-batch count the group runs with and how it was chosen:
    /// `None` while the paper's rule or a configured count holds (no table
    /// of micro-batch times, or `micro_batches` set in the configuration).
    pub fn micro_batch_choice(&self) -> Option<&MicroBatchChoice> {
        self.measured.micro_batch_choice()
    }

    /// The shape rule the run decides its shapes and micro-batch counts
    /// by, on what it measured: costs, memory, micro-batch times (see
    /// [`ShapeRule`]).
    pub fn shape_rule(&self) -> &ShapeRule {
        self.measured.rule()
    }
}

/// What a user sets on a trainer: the schedule, the validation batch, the
/// micro-batch times, the stop signal; and its checkpoints.
impl<TT: TrainerTypes> Trainer<TT> {
    /// Steps the learning rate with a burn-train scheduler (any
    /// [`LrScheduler`]: `burn::lr_scheduler::cosine`, `linear`, `noam`,
    /// ...), asked once per optimizer step in place of
    /// [`TrainerConfig::lr`](super::TrainerConfig::lr), and saved in the
    /// checkpoints. After [`Trainer::resume`], set the same kind of
    /// scheduler again: it continues from the checkpoint's state. Under
    /// [`BatchPolicy::PerReplica`](crate::BatchPolicy::PerReplica) the
    /// scheduled rate is scaled with the replicas, as the configured one is.
    ///
    /// Fails when a checkpoint's state does not load into `scheduler` (a
    /// scheduler of another kind).
    ///
    /// ```
    /// # use burn::backend::{Autodiff, Flex};
    /// # use burn::data::dataset::InMemDataset;
    /// # use burn::optim::SgdConfig;
    /// # use burn::prelude::*;
    /// # use burn_elastic_dp::{BatchPolicy, Parts, TrainerConfig};
    /// # use burn_freeze::LayerStack;
    /// # type B = Autodiff<Flex>;
    /// # #[derive(Module, Debug)]
    /// # pub struct Dense<B: Backend> { linear: burn::nn::Linear<B> }
    /// # impl<B: Backend> Dense<B> { pub fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> { self.linear.forward(x) } }
    /// # burn_freeze::unit!(Dense<B>: Tensor<B, 2> => Tensor<B, 2>);
    /// # #[derive(Clone)] struct Rows;
    /// # impl burn::data::dataloader::batcher::Batcher<B, f32, (Tensor<B, 2>, Tensor<B, 2>)> for Rows {
    /// #     fn batch(&self, items: Vec<f32>, device: &Device<B>) -> (Tensor<B, 2>, Tensor<B, 2>) {
    /// #         let x = Tensor::<B, 1>::from_floats(items.as_slice(), device).reshape([items.len(), 1]);
    /// #         (x.clone(), x)
    /// #     }
    /// # }
    /// # let device = Default::default();
    /// # let dense = || Dense::<B> { linear: burn::nn::LinearConfig::new(1, 1).init(&device) };
    /// # let stack = LayerStack::new(dense(), vec![dense()], dense());
    /// use burn::lr_scheduler::cosine::CosineAnnealingLrSchedulerConfig;
    ///
    /// let mut trainer = TrainerConfig::new()
    ///     .with_parts(Parts::new().with_freeze(false))
    ///     .with_batch(BatchPolicy::FixedGlobal { batch: 4 })
    ///     .init(stack, vec![device], || SgdConfig::new().init(), |y: Tensor<B, 2>, t: Tensor<B, 2>| (y - t).powi_scalar(2).mean())?;
    /// trainer.set_lr_scheduler(CosineAnnealingLrSchedulerConfig::new(0.1, 4).init().unwrap())?;
    /// trainer.fit_epoch(&InMemDataset::new(vec![0.5f32; 16]), &Rows)?;
    /// assert_eq!(trainer.steps(), 4);
    /// assert!(trainer.learning_rate() < 0.1); // annealed
    /// # Ok::<(), burn_elastic_dp::TrainerError>(())
    /// ```
    pub fn set_lr_scheduler<L: LrScheduler + 'static>(
        &mut self,
        scheduler: L,
    ) -> Result<(), TrainerError> {
        (self.rate).set_source(Box::new(Scheduler::<L, TrainerBackend<TT>>::new(scheduler)))
    }

    /// Steps the learning rate with a closure of the optimizer step
    /// (counted from 0 over the whole run, resumed runs included), in place
    /// of [`TrainerConfig::lr`](super::TrainerConfig::lr); a rate below 0
    /// or not finite fails the step. A warm-up, say:
    /// `trainer.set_lr_fn(|step| 1e-3 * ((step + 1) as f64 / 100.0).min(1.0))`.
    pub fn set_lr_fn(&mut self, schedule: impl FnMut(usize) -> f64 + Send + 'static) {
        // A closure has no state to restore: setting it cannot fail.
        let _ = self.rate.set_source(Box::new(Closure(schedule)));
    }

    /// Sets a crate-internal source (the burn-train strategy's learner).
    #[cfg_attr(not(feature = "burn-train"), allow(dead_code))]
    pub(crate) fn set_lr_source(&mut self, source: Box<dyn LrSource>) -> Result<(), TrainerError> {
        self.rate.set_source(source)
    }

    /// Scores the freeze rule's held-out loss on `input` and `targets`, a
    /// batch of the user's validation set, instead of samples carved out of
    /// the training data: every training sample is then trained on. Give
    /// [`TrainerConfig::held_out`](crate::TrainerConfig::held_out) `Some(0)` so that nothing is carved; a
    /// configuration that carves is refused (the carve is a function of the
    /// configuration, so that a resumed run carves the same). The batch
    /// moves to the first device and is scored there, forward only; on a
    /// resumed run, set it again. Across processes each rank scores its own
    /// batch and the largest loss counts, so give every rank the same one.
    ///
    /// ```
    /// use burn::backend::{Autodiff, Flex};
    /// use burn::nn::loss::CrossEntropyLossConfig;
    /// use burn::nn::{Linear, LinearConfig};
    /// use burn::optim::AdamConfig;
    /// use burn::prelude::*;
    /// use burn_elastic_dp::TrainerConfig;
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
    /// let stack = || LayerStack::new(dense(4, 8), (0..2).map(|_| dense(8, 8)).collect(), dense(8, 2));
    /// let cross_entropy = CrossEntropyLossConfig::new().init(&device);
    /// let loss = move |logits, y| cross_entropy.forward(logits, y);
    /// let validation = || (Tensor::<B, 2>::ones([6, 4], &device), Tensor::<B, 1, Int>::zeros([6], &device));
    ///
    /// // The default configuration carves held-out samples: refused. (One
    /// // trainer on these devices at a time: it is dropped before the next.)
    /// let mut trainer = TrainerConfig::new()
    ///     .init(stack(), vec![device; 2], || AdamConfig::new().init(), loss.clone())?;
    /// let (x, y) = validation();
    /// assert!(trainer.set_validation(x, y).is_err());
    /// drop(trainer);
    ///
    /// // Nothing carved: the validation batch feeds the freeze rule.
    /// let mut trainer = TrainerConfig::new()
    ///     .with_held_out(Some(0))
    ///     .init(stack(), vec![device; 2], || AdamConfig::new().init(), loss)?;
    /// let (x, y) = validation();
    /// trainer.set_validation(x, y)?;
    /// # Ok::<(), burn_elastic_dp::TrainerError>(())
    /// ```
    pub fn set_validation(
        &mut self,
        input: TrainerInput<TT>,
        targets: TT::Targets,
    ) -> Result<(), TrainerError> {
        let device = &self.devices[0];
        (self.held_out).set_validation(input.to_device(device), targets.to_device(device))
    }

    /// Gives the unit times at several micro-batch sizes from which M is
    /// chosen (times measured elsewhere, or a synthetic table for a
    /// what-if), instead of measuring them on the first batch, and chooses
    /// M for the current shape at once; every later shape is chosen from
    /// it too, whatever the cost model. A configured `micro_batches` still
    /// holds. The table is checkpointed: a resumed run chooses from it.
    ///
    /// Fails, changing nothing, when the table does not time every unit of
    /// the model.
    pub fn set_micro_batch_times(
        &mut self,
        times: MicroBatchTimes,
    ) -> Result<Option<&MicroBatchChoice>, TrainerError> {
        (self.measured).set_micro_batch_times(times, &mut self.group)
    }

    /// Watches `signal`: once it is raised (by a SIGTERM handler, say:
    /// [`StopSignal::on_termination`]), the epoch under way stops after its
    /// current step, a checkpoint is written (when configured) and the call
    /// returns [`TrainerError::Stopped`]. Across processes the request
    /// travels in the next step's header, so every process stops after that
    /// same step and writes its checkpoint there, whichever process was
    /// signalled.
    ///
    /// ```
    /// # use burn_elastic_dp::StopSignal;
    /// let signal = StopSignal::new();
    /// // trainer.set_stop_signal(signal.clone()); ... signal.raise();
    /// # signal.raise();
    /// # assert!(signal.raised());
    /// ```
    pub fn set_stop_signal(&mut self, signal: StopSignal) {
        self.group.set_stop_signal(signal);
    }
}

impl<TT: TrainerTypes> Trainer<TT> {
    /// The configuration.
    pub fn config(&self) -> &TrainerConfig {
        &self.config
    }

    /// The freeze front (frozen units; once a step lost every replica, the
    /// front they had).
    pub fn front(&self) -> usize {
        self.group.front()
    }

    /// Frozen layers (the policy's F).
    pub fn frozen_layers(&self) -> usize {
        self.auto.frozen_layers()
    }

    /// AutoPipe's unit costs (profiled on the first batch when so
    /// configured, unless the run is one stage throughout: then parameter
    /// counts, which decide nothing there).
    pub fn unit_costs(&self) -> &UnitCosts {
        self.measured.rule().costs()
    }

    /// The learning rate of the last step (before the first, the
    /// configured one): [`TrainerConfig::lr`] or the schedule's rate (see
    /// [`set_lr_scheduler`](Self::set_lr_scheduler)), scaled linearly with
    /// the current replica count under
    /// [`BatchPolicy::PerReplica`](crate::BatchPolicy::PerReplica).
    pub fn learning_rate(&self) -> f64 {
        (self.rate).current(self.cursor.sampler(), self.group.total_replicas())
    }

    /// The replica group.
    pub fn group(&self) -> &ReplicaGroup<TT::Stack, TT::Optimizer> {
        &self.group
    }

    /// Epochs finished.
    pub fn epoch(&self) -> usize {
        self.cursor.epoch()
    }

    /// Optimizer steps taken.
    pub fn steps(&self) -> usize {
        self.cursor.steps()
    }

    /// The model's output for evaluation (no graph; dropout off). Fails
    /// with [`ElasticError::GroupLost`](crate::ElasticError::GroupLost) once
    /// a step lost every replica.
    pub fn forward_inner(
        &self,
        input: InnerInput<TT::Stack>,
    ) -> Result<InnerOutput<TT::Stack>, TrainerError> {
        Ok(self.group.forward_inner(input)?)
    }

    /// A copy of the whole model (frozen units too), to evaluate or save.
    /// Fails with [`ElasticError::GroupLost`](crate::ElasticError::GroupLost)
    /// once a step lost every replica (resume from a checkpoint).
    pub fn to_layer_stack(&self) -> Result<LayerStack<TT::Stack>, TrainerError> {
        Ok(self.group.to_layer_stack()?)
    }

    /// The trained model; the trainer ends. Fails with
    /// [`ElasticError::GroupLost`](crate::ElasticError::GroupLost) once a
    /// step lost every replica.
    pub fn into_layer_stack(self) -> Result<LayerStack<TT::Stack>, TrainerError> {
        Ok(self.group.into_layer_stack()?)
    }
}
