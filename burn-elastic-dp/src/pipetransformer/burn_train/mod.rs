//! PipeTransformer as a burn-train training strategy (cargo feature `burn-train`): a
//! `SupervisedTraining` program trains through [`PipeTransformerStrategy`] and keeps its `Learner`.

mod item;
mod learner_lr;

use std::sync::{Arc, Mutex};

use burn::data::dataloader::Progress;
use burn::data::dataloader::batcher::Batcher;
use burn::data::dataset::Dataset;
use burn::module::{AutodiffModule, Module};
use burn::prelude::*;
use burn::train::{
    EventProcessorTraining, InferenceStep, Learner, LearnerEvent, LearningComponentsTypes,
    SupervisedLearningStrategy, SupervisedTrainingEventProcessor, TrainLoader, TrainStep,
    TrainingComponents, TrainingItem, TrainingModel, ValidLoader,
};
use burn_freeze::{Activation, IntoLayerStack, LayerStack, StackOptimizer, StackTypes};
use burn_pipe::MicroBatchLoss;

pub use item::{FromTrainStep, StepInfo};

use crate::pipetransformer::trainer::{
    CacheableStack, SharedLoss, Trainer, TrainerConfig, TrainerError, TrainerTypesOf,
};
use item::Scored;
use learner_lr::LearnerLr;

/// The backend of a stack's types.
type BackendOf<S> = <S as StackTypes>::Backend;

/// PipeTransformer as a burn-train strategy for learners whose model splits
/// into a layer stack of types `S` ([`IntoLayerStack`] with `Types = S`;
/// name them with [`burn_freeze::TypesOf`], e.g. `TypesOf<Vit<B>>`), trained
/// on a `Dataset` of items `I` batched into the stack's input and targets
/// `T`, each pipeline stage stepped by an optimizer `O` from a factory.
///
/// Built with [`new`](Self::new), which checks the configuration for the
/// devices; plugged in with
/// `SupervisedTraining::with_training_strategy(TrainingStrategy::Custom(Arc::new(strategy)))`;
/// the program keeps its `Learner`, metrics, dashboard, checkpointer, early
/// stopping and interrupter.
///
/// The strategy runs the project's [`Trainer`] on the learner's model:
/// `fit` splits it into its layer stack ([`IntoLayerStack`]), trains each
/// epoch over the strategy's own `Dataset` and `Batcher` (the sampler's
/// exactly-once epochs and AutoCache's sample ids need them; burn-train's
/// training loader is not read), steps the learner's LR scheduler once per
/// optimizer step, reports each step as a training item
/// ([`FromTrainStep`]), writes the trained weights back into the learner,
/// validates with the model's `InferenceStep` over the validation loader,
/// then runs burn-train's checkpointer and early stopping. Resuming
/// (`SupervisedTraining::checkpoint(epoch)`) goes through the trainer's own
/// checkpoints ([`TrainerConfig::checkpoint`]), which hold the freeze
/// front, the shape and every stage's optimizer state.
///
/// A run that fails in mid-training (a step, a transition, a checkpoint)
/// stops burn-train's run through its interrupter with the error's text,
/// keeps the weights trained so far, and leaves the error for
/// [`take_error`](Self::take_error). The README's "burn-train" section and
/// `examples/examples/learner.rs` show a whole program.
pub struct PipeTransformerStrategy<S: StackTypes, I, O, T> {
    config: TrainerConfig,
    devices: Vec<Device<BackendOf<S>>>,
    dataset: Arc<dyn Dataset<I>>,
    batcher: Arc<dyn Batcher<BackendOf<S>, I, (<S as StackTypes>::Input, T)>>,
    make_optimizer: Arc<dyn Fn() -> O + Send + Sync>,
    loss: SharedLoss<S, T>,
    error: Mutex<Option<TrainerError>>,
}

impl<S, I, O, T> PipeTransformerStrategy<S, I, O, T>
where
    S: CacheableStack,
    O: StackOptimizer<S>,
    T: Activation<S::Backend> + Send + 'static,
    I: 'static,
{
    /// A strategy that trains with `config` over `devices`, on `dataset`
    /// batched by `batcher`, each stage stepped by an optimizer from
    /// `make_optimizer`, scored by `loss` (a micro-batch's output and
    /// targets to its mean loss). The learning rate is the learner's
    /// scheduler's, stepped once per optimizer step ([`TrainerConfig::lr`]
    /// is not used).
    ///
    /// Fails when `config` is refused for `devices.len()` devices (one line
    /// naming the value and the accepted range).
    pub fn new(
        config: TrainerConfig,
        devices: Vec<Device<BackendOf<S>>>,
        dataset: impl Dataset<I> + 'static,
        batcher: impl Batcher<BackendOf<S>, I, (<S as StackTypes>::Input, T)> + 'static,
        make_optimizer: impl Fn() -> O + Send + Sync + 'static,
        loss: impl MicroBatchLoss<S, T> + Send + 'static,
    ) -> Result<Self, TrainerError> {
        config.validate(devices.len())?;
        Ok(Self {
            config,
            devices,
            dataset: Arc::new(dataset),
            batcher: Arc::new(batcher),
            make_optimizer: Arc::new(make_optimizer),
            loss: Arc::new(loss),
            error: Mutex::new(None),
        })
    }

    /// The error that stopped the last run, if one did (taken: a second
    /// call gives `None`).
    pub fn take_error(&self) -> Option<TrainerError> {
        self.error
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take()
    }

    /// A trainer for `stack`: resumed from the trainer's newest checkpoint
    /// when burn-train resumes (`resume`) and checkpoints are configured,
    /// else fresh; its loss keeps what each micro-batch scored in `scored`.
    fn trainer(
        &self,
        stack: LayerStack<S>,
        resume: bool,
        scored: Scored<<S as StackTypes>::Output, T>,
    ) -> Result<Trainer<TrainerTypesOf<S, O, T>>, TrainerError>
    where
        O::Record: Clone,
    {
        let user_loss = Arc::clone(&self.loss);
        let loss = move |output: <S as StackTypes>::Output, targets: T| {
            scored.push(output.clone(), targets.clone());
            user_loss(output, targets)
        };
        let make = Arc::clone(&self.make_optimizer);
        let make_optimizer = move || make();
        let devices = self.devices.clone();
        if resume && self.config.checkpoint.is_some() {
            let config = self.config.clone();
            Trainer::resume(stack, devices, config, make_optimizer, loss).map(|(t, _)| t)
        } else {
            self.config.init(stack, devices, make_optimizer, loss)
        }
    }
}

impl<LC, S, I, O, T> SupervisedLearningStrategy<LC> for PipeTransformerStrategy<S, I, O, T>
where
    LC: LearningComponentsTypes,
    LC::TrainingModel: IntoLayerStack<Types = S>,
    S: CacheableStack,
    O: StackOptimizer<S>,
    O::Record: Clone,
    T: Activation<S::Backend> + Send + 'static,
    I: 'static,
    <LC::TrainingModel as TrainStep>::Output: FromTrainStep<S::Backend, S::Output, T>,
    Learner<LC>: Send + 'static,
{
    fn fit(
        &self,
        components: TrainingComponents<LC>,
        learner: Learner<LC>,
        _dataloader_train: TrainLoader<LC>,
        dataloader_valid: ValidLoader<LC>,
        starting_epoch: usize,
    ) -> (TrainingModel<LC>, SupervisedTrainingEventProcessor<LC>) {
        let mut run = Run {
            strategy: self,
            learner: Arc::new(Mutex::new(learner)),
            components,
            scored: Scored::default(),
        };
        if let Err(error) = run.epochs(&dataloader_valid, starting_epoch) {
            tracing::error!(%error, "PipeTransformer training stopped");
            run.components
                .interrupter
                .stop(Some(&format!("PipeTransformer: {error}")));
            *self.error.lock().unwrap_or_else(|p| p.into_inner()) = Some(error);
        }
        let model = run
            .learner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .model();
        (model, run.components.event_processor)
    }
}

/// One `fit`: the learner (shared with the trainer's learning-rate source),
/// burn-train's components and what the micro-batches scored.
struct Run<'a, LC: LearningComponentsTypes, S: StackTypes, I, O, T> {
    strategy: &'a PipeTransformerStrategy<S, I, O, T>,
    learner: Arc<Mutex<Learner<LC>>>,
    components: TrainingComponents<LC>,
    scored: Scored<S::Output, T>,
}

impl<LC, S, I, O, T> Run<'_, LC, S, I, O, T>
where
    LC: LearningComponentsTypes,
    LC::TrainingModel: IntoLayerStack<Types = S>,
    S: CacheableStack,
    O: StackOptimizer<S>,
    O::Record: Clone,
    T: Activation<S::Backend> + Send + 'static,
    I: 'static,
    <LC::TrainingModel as TrainStep>::Output: FromTrainStep<S::Backend, S::Output, T>,
    Learner<LC>: Send + 'static,
{
    /// Epochs `starting_epoch..=num_epochs` (burn-train counts from 1),
    /// until the interrupter or early stopping ends them.
    fn epochs(
        &mut self,
        valid: &ValidLoader<LC>,
        starting_epoch: usize,
    ) -> Result<(), TrainerError> {
        let stack = self.lock().model().into_layer_stack();
        let resume = starting_epoch > 1;
        let mut trainer = self.strategy.trainer(stack, resume, self.scored.clone())?;
        trainer.set_lr_source(Box::new(LearnerLr(Arc::clone(&self.learner))))?;
        let total = self.components.num_epochs;
        for epoch in starting_epoch..=total {
            let global = Progress {
                items_processed: epoch,
                items_total: total,
            };
            self.train_epoch(&mut trainer, &global)?;
            self.write_back(&trainer)?;
            if self.components.interrupter.should_stop() {
                let reason = self.components.interrupter.get_message();
                tracing::info!(
                    reason = reason.as_deref().unwrap_or("unknown"),
                    "training interrupted"
                );
                break;
            }
            self.validate(valid, &global);
            let learner = self.lock().clone();
            if let Some(checkpointer) = &mut self.components.checkpointer {
                checkpointer.checkpoint(&learner, epoch, &self.components.event_store);
            }
            if let Some(early) = &mut self.components.early_stopping
                && early.should_stop(epoch, &self.components.event_store)
            {
                tracing::info!(epoch, "early stopping");
                break;
            }
        }
        Ok(())
    }

    /// One epoch of the trainer, each step a training item; stopped after
    /// a step when the interrupter is set.
    fn train_epoch(
        &mut self,
        trainer: &mut Trainer<TrainerTypesOf<S, O, T>>,
        global: &Progress,
    ) -> Result<(), TrainerError> {
        let dataset = &self.strategy.dataset;
        let batcher = &*self.strategy.batcher;
        let len = dataset.len();
        let device = self.strategy.devices[0].clone();
        let started = std::time::Instant::now();
        let mut iteration = 0;
        let (interrupter, processor) = (
            self.components.interrupter.clone(),
            &mut self.components.event_processor,
        );
        let scored = &self.scored;
        let frozen_layers = trainer.frozen_layers();
        trainer.fit_epoch_observed(dataset, &BatcherRef(batcher), |step| {
            iteration += 1;
            let info = StepInfo {
                loss: step.loss,
                learning_rate: step.learning_rate,
                samples: step.samples,
                samples_per_second: step.epoch_samples as f64 / started.elapsed().as_secs_f64(),
                frozen_layers,
                stages: step.stages,
                replicas: step.replicas,
                micro_batches: step.micro_batches,
            };
            let parts = scored.take_step::<S::Backend>(step.samples);
            let item = FromTrainStep::from_train_step(&info, parts, &device);
            let progress = Progress {
                items_processed: step.epoch_samples,
                items_total: len,
            };
            processor.process_train(LearnerEvent::ProcessedItem(TrainingItem::new(
                item,
                progress,
                global.clone(),
                Some(iteration),
                Some(step.learning_rate),
            )));
            if interrupter.should_stop() {
                std::ops::ControlFlow::Break(())
            } else {
                std::ops::ControlFlow::Continue(())
            }
        })?;
        processor.process_train(LearnerEvent::EndEpoch(global.items_processed));
        Ok(())
    }

    /// The trainer's weights into the learner's model.
    fn write_back(&self, trainer: &Trainer<TrainerTypesOf<S, O, T>>) -> Result<(), TrainerError> {
        let stack = trainer
            .to_layer_stack()?
            .to_device(&self.strategy.devices[0]);
        let model = LC::TrainingModel::from_layer_stack(stack)
            .map_err(|e| TrainerError::Checkpoint(format!("the trained model: {e}")))?;
        // Fresh leaves (the stack's tensors went through `to_device`, which
        // autodiff records): the learner loads only leaf parameters.
        let model = LC::TrainingModel::from_inner(model.valid());
        self.lock().load_model(model.into_record());
        Ok(())
    }

    /// The learner's model, with no graph, over the validation loader.
    fn validate(&mut self, valid: &ValidLoader<LC>, global: &Progress) {
        let model = self.lock().model().valid();
        let processor = &mut self.components.event_processor;
        let mut iterator = valid.iter();
        let mut iteration = 0;
        while let Some(batch) = iterator.next() {
            iteration += 1;
            let item = model.step(batch);
            processor.process_valid(LearnerEvent::ProcessedItem(TrainingItem::new(
                item,
                iterator.progress(),
                global.clone(),
                Some(iteration),
                None,
            )));
            if self.components.interrupter.should_stop() {
                break;
            }
        }
        processor.process_valid(LearnerEvent::EndEpoch(global.items_processed));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Learner<LC>> {
        self.learner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The strategy's batcher, behind a reference, as a batcher.
struct BatcherRef<'a, B: Backend, I, O>(&'a dyn Batcher<B, I, O>);

impl<B: Backend, I, O> Batcher<B, I, O> for BatcherRef<'_, B, I, O> {
    fn batch(&self, items: Vec<I>, device: &B::Device) -> O {
        self.0.batch(items, device)
    }
}
