//! Fine-tuning with a [`Method`] (plain Burn or PipeTransformer's trainer),
//! the accuracy on held-out samples after each epoch.

use burn::data::dataloader::batcher::Batcher;
use burn::data::dataset::Dataset;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::optim::adaptor::OptimizerAdaptor;
use burn::optim::{Adam, AdamConfig};
use burn::prelude::*;
use burn_elastic_dp::{
    BatchPolicy, EpochReport, StepProgress, Trainer, TrainerConfig, TrainerError, TrainerTypesOf,
};
use burn_freeze::{
    AutodiffActivation, Cacheable, InnerBackendOf, InnerHidden, InnerInput, LayerStack, StackTypes,
    TrainableUnits,
};

use super::plain::{HeldOut, plain};
use super::{EpochRecord, JobError, JobSpec, Method, Observer, RunRecord};
use crate::backend::{self, Inner, Train};
use crate::task::accuracy;

/// The trainer of the job: Adam, as plain Burn's.
type JobTrainer<S> = Trainer<
    TrainerTypesOf<S, OptimizerAdaptor<Adam, TrainableUnits<S>, Train>, Tensor<Train, 1, Int>>,
>;

impl JobSpec {
    /// Fine-tunes `stack` on `data` (every sample once per epoch), the
    /// accuracy measured on `held_out` after each epoch. `validation`, where
    /// the task has samples outside both, is the freeze rule's validation
    /// batch: a trainer whose configuration leaves the held-out count open
    /// scores its rule there instead of carving training samples.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn finetune_data<S, I, D, Bt>(
        &self,
        stack: LayerStack<S>,
        name: &str,
        method: &Method,
        data: &D,
        batcher: &Bt,
        held_out: (S::Input, Tensor<Train, 1, Int>),
        validation: Option<(S::Input, Tensor<Train, 1, Int>)>,
        observer: &mut impl Observer,
    ) -> Result<(RunRecord, LayerStack<S>), JobError>
    where
        S: StackTypes<Backend = Train, Output = Tensor<Train, 2>>,
        D: Dataset<I>,
        Bt: Batcher<Train, I, (S::Input, Tensor<Train, 1, Int>)>,
        InnerInput<S>: Cacheable<InnerBackendOf<S>>,
        InnerHidden<S>: Cacheable<InnerBackendOf<S>>,
    {
        let (held_x, held_y) = held_out;
        let evaluate = |logits: Tensor<Inner, 2>| accuracy(logits, held_y.clone().inner());
        let held_out: HeldOut<'_, S> = (&held_x, &evaluate);
        match method {
            Method::Plain => {
                let (stack, record) = plain(
                    stack,
                    name,
                    self,
                    self.epochs,
                    data,
                    batcher,
                    Some(held_out),
                    observer,
                );
                Ok((record, stack))
            }
            Method::Trainer { config, devices } | Method::Resume { config, devices } => {
                let resume = matches!(method, Method::Resume { .. });
                let trainer = self.trainer(stack, config, *devices, resume, validation)?;
                let fit = |trainer: &mut JobTrainer<S>, on_step: &mut dyn FnMut(&StepProgress)| {
                    trainer.fit_epoch_observed(data, batcher, on_step)
                };
                self.train(trainer, name, data.len(), fit, held_out, observer)
            }
        }
    }

    /// The trainer over `devices` devices with `config` (its batch, lr and
    /// seed the spec's), fresh or resumed from the newest valid checkpoint;
    /// `validation` feeds the freeze rule where `config` leaves the held-out
    /// count open (it then carves nothing).
    fn trainer<S>(
        &self,
        stack: LayerStack<S>,
        config: &TrainerConfig,
        devices: usize,
        resume: bool,
        validation: Option<(S::Input, Tensor<Train, 1, Int>)>,
    ) -> Result<JobTrainer<S>, JobError>
    where
        S: StackTypes<Backend = Train, Output = Tensor<Train, 2>>,
        InnerInput<S>: Cacheable<InnerBackendOf<S>>,
        InnerHidden<S>: Cacheable<InnerBackendOf<S>>,
    {
        let devices: Vec<_> = (0..devices).map(backend::device).collect();
        let validation = validation.filter(|_| config.held_out.is_none());
        let config = config
            .clone()
            .with_batch(BatchPolicy::FixedGlobal { batch: self.batch })
            .with_lr(self.lr)
            .with_seed(self.seed);
        let config = match validation {
            Some(_) => config.with_held_out(Some(0)),
            None => config,
        };
        let adam = || AdamConfig::new().init();
        let loss_fn = CrossEntropyLossConfig::new().init(&backend::device(0));
        let loss = move |logits, labels| loss_fn.forward(logits, labels);
        let mut trainer = if resume {
            let (trainer, path) = Trainer::resume(stack, devices, config, adam, loss)?;
            tracing::info!(checkpoint = %path.display(), "resuming fine-tuning");
            trainer
        } else {
            config.init(stack, devices, adam, loss)?
        };
        // SIGTERM: a checkpoint at the next step boundary (every rank after
        // the same step), then `TrainerError::Stopped`.
        trainer.set_stop_signal(crate::stop_signal());
        if let Some((input, targets)) = validation {
            trainer.set_validation(input, targets)?;
        }
        Ok(trainer)
    }

    /// Trains with `trainer` until the spec's epochs are done (a resumed run
    /// starts where its checkpoint was), an epoch of `samples` samples by
    /// `fit`, the accuracy on `held_out` after each epoch.
    fn train<S: StackTypes<Backend = Train, Output = Tensor<Train, 2>>>(
        &self,
        mut trainer: JobTrainer<S>,
        name: &str,
        samples: usize,
        mut fit: impl FnMut(
            &mut JobTrainer<S>,
            &mut dyn FnMut(&StepProgress),
        ) -> Result<EpochReport, TrainerError>,
        (held_x, evaluate): HeldOut<'_, S>,
        observer: &mut impl Observer,
    ) -> Result<(RunRecord, LayerStack<S>), JobError> {
        observer.start(name, self.epochs, samples);
        let mut epochs = Vec::with_capacity(self.epochs);
        while trainer.epoch() < self.epochs {
            let report = fit(&mut trainer, &mut |step| {
                observer.step(step.samples, step.loss)
            })?;
            let accuracy = evaluate(trainer.forward_inner(held_x.clone().inner())?);
            let record = EpochRecord { report, accuracy };
            observer.epoch(&record);
            epochs.push(record);
        }
        Ok((RunRecord::new(name, epochs), trainer.into_layer_stack()?))
    }
}
