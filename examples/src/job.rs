//! The main job: a tiny transformer pretrained in the same run on a
//! generated task, then fine-tuned on a related one, plainly (Burn as a user
//! writes it) or with PipeTransformer's trainer. Freezing pays on pretrained
//! layers only, so the job pretrains first; every run starts from the same
//! pretrained weights, so runs compare.
//!
//! - ViT: pretrained to tell which of 8 horizontal bands of an image is
//!   bright, fine-tuned (fresh classifier) on 4 coarser bands of new images.
//! - BERT: pretrained on whether most tokens of a sequence come from the
//!   upper half of the vocabulary, fine-tuned on new sequences of the same
//!   rule (fresh classifier).

use std::path::Path;
use std::time::Instant;

use burn::data::dataloader::batcher::Batcher;
use burn::data::dataset::Dataset;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::optim::{AdamConfig, GradientsParams, Optimizer};
use burn::prelude::*;
use burn_elastic_dp::{
    BatchPolicy, ElasticSampler, EpochReport, StepProgress, Trainer, TrainerConfig, TrainerError,
};
use burn_freeze::{
    AutodiffActivation, Cacheable, InnerBackendOf, InnerHidden, InnerInput, IntoLayerStack,
    LayerStack, StackTypes, Unit,
};
use models::bert::{BertConfig, BertInput, BertPooling, BertTypes};
use models::pretrained::BertCheckpoint;
use models::sst::{SstBatch, SstBatcher, SstDataset, SstItem, SstSplit};
use models::synthetic::{BandImages, MajorityTokens};
use models::tokenizer::{Padding, WordPieceTokenizer};
use models::vit::{VitConfig, VitTypes};
use serde::{Deserialize, Serialize};

use crate::backend::{self, Inner, Train};
use crate::task::{TaskBatcher, accuracy, indices};

/// Which model and tasks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
pub enum ModelKind {
    /// Tiny ViT: 8 bright bands, then 4 coarser ones.
    Vit,
    /// Tiny BERT: majority of upper-half tokens.
    Bert,
}

/// The job's sizes; every run of one spec starts from the same weights.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JobSpec {
    /// Model and tasks.
    pub model: ModelKind,
    /// Transformer blocks.
    pub layers: usize,
    /// Width of the blocks (a multiple of 4 heads).
    pub hidden: usize,
    /// Pretraining epochs (plain training on the pretraining task).
    pub pretrain_epochs: usize,
    /// Fine-tuning samples per epoch.
    pub samples: usize,
    /// Held-out samples for the accuracy.
    pub eval_samples: usize,
    /// Samples per step (the global batch).
    pub batch: usize,
    /// Fine-tuning epochs.
    pub epochs: usize,
    /// Adam's learning rate.
    pub lr: f64,
    /// Seeds the weights, the data and the sample order.
    pub seed: u64,
}

/// How to fine-tune.
#[derive(Debug, Clone)]
pub enum Method {
    /// Burn as a user writes it: forward, backward, `GradientsParams`, one
    /// optimizer step, on one device; no crate of ours on the hot path.
    Plain,
    /// [`Method::Trainer`] resumed from the newest valid checkpoint in the
    /// config's checkpoint directory; it trains until `epochs` are done.
    Resume {
        /// As for `Trainer`; its `checkpoint` names the directory.
        config: TrainerConfig,
        /// Devices.
        devices: usize,
    },
    /// PipeTransformer's trainer over `devices` devices (logical on CPU).
    Trainer {
        /// The trainer's configuration (its batch, lr and seed are the spec's).
        config: TrainerConfig,
        /// Devices.
        devices: usize,
    },
}

/// The real path: a pretrained BERT checkpoint fine-tuned on SST-2.
#[derive(Debug, Clone)]
pub struct SstJob {
    /// Training sentences (a seeded subset when the spec asks for fewer).
    pub train: SstDataset,
    /// Held-out sentences (the dev split, or its first `eval_samples`).
    pub dev: SstDataset,
    /// Tokenizes sentences to a fixed length (a sample keeps its shape, as
    /// AutoCache needs).
    pub batcher: SstPairs,
}

/// [`SstBatcher`] giving the `(input, labels)` pairs the trainer takes.
#[derive(Debug, Clone)]
pub struct SstPairs(pub SstBatcher);

impl<B: Backend> Batcher<B, SstItem, (BertInput<B>, Tensor<B, 1, Int>)> for SstPairs {
    fn batch(&self, items: Vec<SstItem>, device: &B::Device) -> (BertInput<B>, Tensor<B, 1, Int>) {
        let batch: SstBatch<B> = self.0.batch(items, device);
        (batch.input, batch.labels)
    }
}

/// Accuracy of `model` on an SST-format file (PTB trees), in batches of 64.
pub fn sst_accuracy(model: &Pretrained, file: &Path, job: &SstJob) -> Result<f64, JobError> {
    let Pretrained::Bert(stack) = model else {
        return Err(JobError::Spec(
            "--eval-file needs a BERT fine-tuned on SST".into(),
        ));
    };
    let data = SstDataset::from_file(file)
        .map_err(|e| JobError::Data(format!("--eval-file {}: {e}", file.display())))?;
    if data.is_empty() {
        return Err(JobError::Data(format!(
            "--eval-file {}: no positive or negative sentence",
            file.display()
        )));
    }
    let device = backend::device(0);
    let model = burn_freeze::FreezableStack::new(stack.clone());
    let (mut right, mut total) = (0.0, 0usize);
    for chunk in data.items().chunks(64) {
        let (input, labels): (BertInput<Train>, Tensor<Train, 1, Int>) =
            job.batcher.batch(chunk.to_vec(), &device);
        let n = chunk.len();
        right += accuracy(model.forward_inner(input.inner()), labels.inner()) * n as f64;
        total += n;
    }
    Ok(right / total as f64)
}

/// One fine-tuning epoch.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EpochRecord {
    /// The epoch (0 first).
    pub epoch: usize,
    /// Mean training loss.
    pub loss: f64,
    /// Held-out accuracy after it, in [0, 1].
    pub accuracy: f64,
    /// Wall-clock seconds of its training (evaluation excluded).
    pub seconds: f64,
    /// Samples per second.
    pub samples_per_second: f64,
    /// Frozen layers at its end (F).
    pub frozen_layers: usize,
    /// Frozen units at its end.
    pub front: usize,
    /// Stages at its end (K).
    pub stages: usize,
    /// Replicas at its end (R).
    pub replicas: usize,
    /// Micro-batches per replica at its end (M).
    pub micro_batches: usize,
    /// Units per stage at its end.
    pub balance: Vec<usize>,
    /// Seconds spent in transitions.
    pub transition_seconds: f64,
    /// Mean all-reduce seconds per step.
    pub all_reduce_seconds: f64,
    /// Optimizer steps in it.
    #[serde(default)]
    pub steps: usize,
    /// Seconds lost to pipeline bubbles (see `EpochReport::bubble_seconds`).
    #[serde(default)]
    pub bubble_seconds: f64,
    /// Samples whose frozen prefix came from the cache (fully or partly).
    #[serde(default)]
    pub cache_hits: u64,
    /// Samples whose frozen prefix ran.
    #[serde(default)]
    pub cache_misses: u64,
}

impl EpochRecord {
    fn from_trainer(report: &EpochReport, accuracy: f64) -> Self {
        Self {
            epoch: report.epoch,
            loss: report.loss,
            accuracy,
            seconds: report.seconds,
            samples_per_second: report.samples_per_second,
            frozen_layers: report.frozen_layers,
            front: report.front,
            stages: report.stages,
            replicas: report.replicas,
            micro_batches: report.micro_batches,
            balance: report.balance.clone(),
            transition_seconds: report.transition_seconds,
            all_reduce_seconds: report.all_reduce_seconds,
            steps: report.steps,
            bubble_seconds: report.bubble_seconds,
            cache_hits: report.cache_hits,
            cache_misses: report.cache_misses,
        }
    }
}

/// A whole fine-tuning run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunRecord {
    /// What ran.
    pub name: String,
    /// Its epochs.
    pub epochs: Vec<EpochRecord>,
    /// Training seconds over all epochs (evaluation excluded).
    pub seconds: f64,
    /// Held-out accuracy at the end.
    pub accuracy: f64,
}

/// Why a job stopped.
#[derive(Debug, thiserror::Error)]
pub enum JobError {
    /// The trainer refused the configuration or failed.
    #[error(transparent)]
    Trainer(#[from] TrainerError),
    /// A size that cannot work.
    #[error("{0}")]
    Spec(String),
    /// Weights or data that cannot be read (the message names the flag
    /// and the path).
    #[error("{0}")]
    Data(String),
}

/// What watches a run: told after each step and each epoch.
pub trait Observer {
    /// A run starts: `epochs` of `samples` samples.
    fn start(&mut self, name: &str, epochs: usize, samples: usize) {
        let _ = (name, epochs, samples);
    }
    /// A step of `samples` samples ended with mean loss `loss`.
    fn step(&mut self, samples: usize, loss: f32) {
        let _ = (samples, loss);
    }
    /// An epoch ended.
    fn epoch(&mut self, record: &EpochRecord) {
        let _ = record;
    }
}

/// Watches nothing.
pub struct Silent;
impl Observer for Silent {}

/// A pretrained model, ready to fine-tune (fresh classifier).
#[derive(Debug, Clone)]
#[allow(clippy::large_enum_variant)] // one lives at a time
pub enum Pretrained {
    /// ViT's units.
    Vit(LayerStack<VitTypes<Train>>),
    /// BERT's units.
    Bert(LayerStack<BertTypes<Train>>),
}

impl Pretrained {
    /// Units of the model.
    pub fn num_units(&self) -> usize {
        match self {
            Self::Vit(stack) => stack.num_units(),
            Self::Bert(stack) => stack.num_units(),
        }
    }

    /// Parameters of the model.
    pub fn num_params(&self) -> usize {
        match self {
            Self::Vit(stack) => stack.unit_params().iter().sum(),
            Self::Bert(stack) => stack.unit_params().iter().sum(),
        }
    }
}

const PRETRAIN_CLASSES: usize = 8;
const FINETUNE_CLASSES: usize = 4;
/// Seeds of the tasks, mixed with the spec's.
const PRETRAIN_DATA: u64 = 0x5052_4554;
const FINETUNE_DATA: u64 = 0x4649_4E45;

impl JobSpec {
    /// Checks the sizes before any work.
    pub fn check(&self) -> Result<(), JobError> {
        let fail = |what: String| Err(JobError::Spec(what));
        if self.layers == 0 || self.layers > 48 {
            return fail(format!("layers must be 1 to 48, got {}", self.layers));
        }
        if self.hidden < 4 || !self.hidden.is_multiple_of(4) || self.hidden > 1024 {
            return fail(format!(
                "hidden must be a multiple of 4 (the heads) from 4 to 1024, got {}",
                self.hidden
            ));
        }
        if self.batch == 0 || self.samples < self.batch {
            return fail(format!(
                "the batch must be 1 to the sample count ({}), got {}",
                self.samples, self.batch
            ));
        }
        if self.eval_samples == 0 {
            return fail("eval samples must be at least 1".into());
        }
        if self.epochs == 0 {
            return fail("epochs must be at least 1".into());
        }
        if !(self.lr.is_finite() && self.lr > 0.0 && self.lr <= 1.0) {
            return fail(format!("lr must be in (0, 1], got {}", self.lr));
        }
        Ok(())
    }

    fn vit(&self, classes: usize) -> VitConfig {
        VitConfig::tiny(classes)
            .with_layers(self.layers)
            .with_hidden(self.hidden)
            .with_mlp_dim(2 * self.hidden)
    }

    fn bert(&self) -> BertConfig {
        BertConfig::tiny(2)
            .with_layers(self.layers)
            .with_hidden(self.hidden)
            .with_intermediate(2 * self.hidden)
    }

    fn tokens(&self, data: u64) -> MajorityTokens {
        MajorityTokens::new(64, 5, 15, self.seed ^ data)
    }

    /// Pretrains the model (plain training, `pretrain_epochs` epochs of
    /// `samples` samples) and gives it a fresh classifier for fine-tuning;
    /// the weights depend only on the spec.
    pub fn pretrain(&self, observer: &mut impl Observer) -> Pretrained {
        let device = backend::device(0);
        <Inner as Backend>::seed(&device, self.seed);
        match self.model {
            ModelKind::Vit => {
                let task = BandImages::new(PRETRAIN_CLASSES, 3, 16, self.seed ^ PRETRAIN_DATA);
                let stack = self
                    .vit(PRETRAIN_CLASSES)
                    .init::<Train>(&device)
                    .into_layer_stack();
                let stack = self.pretrain_stack(stack, &TaskBatcher(task), observer);
                let head = self
                    .vit(FINETUNE_CLASSES)
                    .init::<Train>(&device)
                    .into_layer_stack();
                let (first, middle, _) = stack.into_parts();
                Pretrained::Vit(LayerStack::from_parts(first, middle, head.into_parts().2))
            }
            ModelKind::Bert => {
                let task = self.tokens(PRETRAIN_DATA);
                let stack = self.bert().init::<Train>(&device).into_layer_stack();
                let stack = self.pretrain_stack(stack, &TaskBatcher(task), observer);
                let head = self.bert().init::<Train>(&device).into_layer_stack();
                let (first, middle, _) = stack.into_parts();
                Pretrained::Bert(LayerStack::from_parts(first, middle, head.into_parts().2))
            }
        }
    }

    fn pretrain_stack<S, Bt>(
        &self,
        stack: LayerStack<S>,
        batcher: &Bt,
        observer: &mut impl Observer,
    ) -> LayerStack<S>
    where
        S: StackTypes<Backend = Train, Output = Tensor<Train, 2>>,
        Bt: Batcher<Train, usize, (S::Input, Tensor<Train, 1, Int>)>,
    {
        if self.pretrain_epochs == 0 {
            return stack;
        }
        let (stack, _) = plain(
            stack,
            "pretraining",
            self,
            self.pretrain_epochs,
            &indices(self.samples),
            batcher,
            None,
            observer,
        );
        stack
    }

    /// Fine-tunes `pretrained` with `method`; `observer` watches. Returns
    /// the record and the trained model's units.
    pub fn finetune(
        &self,
        pretrained: &Pretrained,
        name: &str,
        method: &Method,
        observer: &mut impl Observer,
    ) -> Result<(RunRecord, Pretrained), JobError> {
        self.check()?;
        let device = backend::device(0);
        match pretrained {
            Pretrained::Vit(stack) => {
                let task = BandImages::new(FINETUNE_CLASSES, 3, 16, self.seed ^ FINETUNE_DATA);
                let (record, stack) =
                    self.finetune_stack(stack.clone(), name, method, &TaskBatcher(task), observer)?;
                let _ = device;
                Ok((record, Pretrained::Vit(stack)))
            }
            Pretrained::Bert(stack) => {
                let task = self.tokens(FINETUNE_DATA);
                let (record, stack) =
                    self.finetune_stack(stack.clone(), name, method, &TaskBatcher(task), observer)?;
                Ok((record, Pretrained::Bert(stack)))
            }
        }
    }

    /// The real path: loads a Hugging Face BERT checkpoint from `weights`
    /// (config.json, model.safetensors, tokenizer.json; a fresh 2-class
    /// classifier on the mean-pooled states) and SST-2 from `data` (train.txt
    /// and dev.txt, PTB trees), sentences tokenized to `max_length` tokens.
    /// `samples` (when smaller than the training split) picks a seeded
    /// subset, `eval_samples` the first dev sentences.
    pub fn load_sst(
        &self,
        weights: &Path,
        data: &Path,
        max_length: usize,
    ) -> Result<(Pretrained, SstJob), JobError> {
        let fail = |flag: &str, path: &Path, error: &dyn std::fmt::Display| {
            JobError::Data(format!("{flag} {}: {error}", path.display()))
        };
        let train =
            SstDataset::split(data, SstSplit::Train).map_err(|e| fail("--data", data, &e))?;
        let dev = SstDataset::split(data, SstSplit::Dev).map_err(|e| fail("--data", data, &e))?;
        if train.is_empty() || dev.is_empty() {
            return Err(JobError::Data(format!(
                "--data {}: train.txt or dev.txt holds no positive or negative sentence",
                data.display()
            )));
        }
        let train = if self.samples < train.len() {
            let items = train.items();
            let mut sampler = ElasticSampler::new(
                items.len(),
                BatchPolicy::FixedGlobal {
                    batch: self.samples,
                },
                self.seed,
            )
            .map_err(|e| JobError::Spec(e.to_string()))?;
            let chosen = sampler.next_batch(1).expect("a non-empty split");
            SstDataset::from(
                chosen
                    .into_iter()
                    .map(|i| items[i].clone())
                    .collect::<Vec<_>>(),
            )
        } else {
            train
        };
        let dev = dev.take(self.eval_samples);
        let checkpoint =
            BertCheckpoint::open(weights).map_err(|e| fail("--weights", weights, &e))?;
        let device = backend::device(0);
        <Inner as Backend>::seed(&device, self.seed);
        let config = checkpoint.config(2).with_pooling(BertPooling::Mean);
        if max_length > config.max_position {
            return Err(JobError::Spec(format!(
                "--max-length {max_length} exceeds the {} positions of {}",
                config.max_position,
                weights.display()
            )));
        }
        let (model, report) = checkpoint
            .load::<Train>(&config, &device)
            .map_err(|e| fail("--weights", weights, &e))?;
        tracing::info!(%report, "pretrained weights loaded");
        let tokenizer = WordPieceTokenizer::from_file(checkpoint.tokenizer_path())
            .map_err(|e| fail("--weights", weights, &e))?
            .with_max_length(max_length)
            .with_padding(Padding::Fixed(max_length));
        let job = SstJob {
            train,
            dev,
            batcher: SstPairs(SstBatcher::new(tokenizer)),
        };
        Ok((Pretrained::Bert(model.into_layer_stack()), job))
    }

    /// [`finetune`](Self::finetune) on SST-2 ([`load_sst`](Self::load_sst)).
    pub fn finetune_sst(
        &self,
        pretrained: &Pretrained,
        job: &SstJob,
        name: &str,
        method: &Method,
        observer: &mut impl Observer,
    ) -> Result<(RunRecord, Pretrained), JobError> {
        let Pretrained::Bert(stack) = pretrained else {
            return Err(JobError::Spec("SST-2 fine-tunes a BERT".into()));
        };
        let held_out = job
            .batcher
            .batch(job.dev.items().to_vec(), &backend::device(0));
        let (record, stack) = self.finetune_data(
            stack.clone(),
            name,
            method,
            &job.train,
            &job.batcher,
            held_out,
            observer,
        )?;
        Ok((record, Pretrained::Bert(stack)))
    }

    fn finetune_stack<S, Bt>(
        &self,
        stack: LayerStack<S>,
        name: &str,
        method: &Method,
        batcher: &Bt,
        observer: &mut impl Observer,
    ) -> Result<(RunRecord, LayerStack<S>), JobError>
    where
        S: StackTypes<Backend = Train, Output = Tensor<Train, 2>>,
        Bt: Batcher<Train, usize, (S::Input, Tensor<Train, 1, Int>)>,
        InnerInput<S>: Cacheable<InnerBackendOf<S>>,
        InnerHidden<S>: Cacheable<InnerBackendOf<S>>,
    {
        // Held-out samples: indices past the training set's.
        let held_out: Vec<usize> = (self.samples..self.samples + self.eval_samples).collect();
        let held_out = batcher.batch(held_out, &backend::device(0));
        self.finetune_data(
            stack,
            name,
            method,
            &indices(self.samples),
            batcher,
            held_out,
            observer,
        )
    }

    /// Fine-tunes `stack` on `data` (every sample once per epoch), the
    /// accuracy measured on `held_out` after each epoch.
    #[allow(clippy::too_many_arguments)]
    fn finetune_data<S, I, D, Bt>(
        &self,
        stack: LayerStack<S>,
        name: &str,
        method: &Method,
        data: &D,
        batcher: &Bt,
        held_out: (S::Input, Tensor<Train, 1, Int>),
        observer: &mut impl Observer,
    ) -> Result<(RunRecord, LayerStack<S>), JobError>
    where
        S: StackTypes<Backend = Train, Output = Tensor<Train, 2>>,
        D: Dataset<I>,
        Bt: Batcher<Train, I, (S::Input, Tensor<Train, 1, Int>)>,
        InnerInput<S>: Cacheable<InnerBackendOf<S>>,
        InnerHidden<S>: Cacheable<InnerBackendOf<S>>,
    {
        let device = backend::device(0);
        let (held_x, held_y) = held_out;
        let evaluate = |logits: Tensor<Inner, 2>| accuracy(logits, held_y.clone().inner());
        match method {
            Method::Plain => {
                let (stack, record) = plain(
                    stack,
                    name,
                    self,
                    self.epochs,
                    data,
                    batcher,
                    Some((&held_x, &evaluate)),
                    observer,
                );
                Ok((record, stack))
            }
            Method::Trainer { config, devices } | Method::Resume { config, devices } => {
                let devices: Vec<_> = (0..*devices).map(backend::device).collect();
                let config = config
                    .clone()
                    .with_batch(BatchPolicy::FixedGlobal { batch: self.batch })
                    .with_lr(self.lr)
                    .with_seed(self.seed);
                let adam = || AdamConfig::new().init();
                let loss_fn = CrossEntropyLossConfig::new().init(&device);
                let loss = move |logits, labels| loss_fn.forward(logits, labels);
                let mut trainer = if matches!(method, Method::Resume { .. }) {
                    let (trainer, path) = Trainer::resume(stack, devices, config, adam, loss)?;
                    tracing::info!(checkpoint = %path.display(), "resuming fine-tuning");
                    trainer
                } else {
                    config.init(stack, devices, adam, loss)?
                };
                observer.start(name, self.epochs, data.len());
                let mut epochs = Vec::with_capacity(self.epochs);
                while trainer.epoch() < self.epochs {
                    let report =
                        trainer.fit_epoch_observed(data, batcher, |step: &StepProgress| {
                            observer.step(step.samples, step.loss)
                        })?;
                    let accuracy = evaluate(trainer.forward_inner(held_x.clone().inner()));
                    let record = EpochRecord::from_trainer(&report, accuracy);
                    observer.epoch(&record);
                    epochs.push(record);
                }
                let record = RunRecord {
                    name: name.to_string(),
                    seconds: epochs.iter().map(|e| e.seconds).sum(),
                    accuracy: epochs.last().map_or(0.0, |e| e.accuracy),
                    epochs,
                };
                Ok((record, trainer.into_layer_stack()))
            }
        }
    }
}

/// Held-out inputs and the accuracy of logits on them.
type HeldOut<'a, S> = (
    &'a <S as StackTypes>::Input,
    &'a dyn Fn(Tensor<Inner, 2>) -> f64,
);

/// Plain Burn training of the whole model on one device, the batches in
/// the order the trainer's sampler gives (one replica).
#[allow(clippy::too_many_arguments)]
fn plain<S, I, D, Bt>(
    stack: LayerStack<S>,
    name: &str,
    spec: &JobSpec,
    epochs: usize,
    data: &D,
    batcher: &Bt,
    eval: Option<HeldOut<'_, S>>,
    observer: &mut impl Observer,
) -> (LayerStack<S>, RunRecord)
where
    S: StackTypes<Backend = Train, Output = Tensor<Train, 2>>,
    D: Dataset<I>,
    Bt: Batcher<Train, I, (S::Input, Tensor<Train, 1, Int>)>,
{
    let device = backend::device(0);
    let loss_fn = CrossEntropyLossConfig::new().init(&device);
    let mut sampler = ElasticSampler::new(
        data.len(),
        BatchPolicy::FixedGlobal { batch: spec.batch },
        spec.seed,
    )
    .expect("a checked spec has samples and a batch");
    // The model as one module: (first, middle, last) is a Burn module.
    let units = stack.num_units();
    let mut model = stack.into_parts();
    let mut optim = AdamConfig::new().init::<Train, (S::First, Vec<S::Middle>, S::Last)>();
    observer.start(name, epochs, data.len());
    let mut records = Vec::with_capacity(epochs);
    for epoch in 0..epochs {
        if epoch > 0 {
            sampler.start_epoch();
        }
        let start = Instant::now();
        let mut total = 0.0;
        let mut steps = 0;
        while let Some(items) = sampler.next_items(data, 1) {
            let n = items.len();
            let (input, labels) = batcher.batch(items, &device);
            let loss = loss_fn.forward(forward::<S>(&model, input), labels);
            let value = loss.clone().into_scalar().elem::<f32>();
            total += f64::from(value) * n as f64;
            let grads = GradientsParams::from_grads(loss.backward(), &model);
            model = optim.step(spec.lr, model, grads);
            observer.step(n, value);
            steps += 1;
        }
        let seconds = start.elapsed().as_secs_f64();
        let accuracy = eval.map_or(f64::NAN, |(x, evaluate)| {
            let stack =
                LayerStack::<S>::from_parts(model.0.clone(), model.1.clone(), model.2.clone());
            evaluate(burn_freeze::FreezableStack::new(stack).forward_inner(x.clone().inner()))
        });
        let record = EpochRecord {
            epoch,
            loss: total / data.len() as f64,
            accuracy,
            seconds,
            samples_per_second: data.len() as f64 / seconds,
            frozen_layers: 0,
            front: 0,
            stages: 1,
            replicas: 1,
            micro_batches: 1,
            balance: vec![units],
            transition_seconds: 0.0,
            all_reduce_seconds: 0.0,
            steps,
            bubble_seconds: 0.0,
            cache_hits: 0,
            cache_misses: 0,
        };
        observer.epoch(&record);
        records.push(record);
    }
    let run = RunRecord {
        name: name.to_string(),
        seconds: records.iter().map(|e| e.seconds).sum(),
        accuracy: records.last().map_or(f64::NAN, |e| e.accuracy),
        epochs: records,
    };
    (LayerStack::from_parts(model.0, model.1, model.2), run)
}

/// The model's forward pass, unit after unit.
fn forward<S: StackTypes>(
    model: &(S::First, Vec<S::Middle>, S::Last),
    input: S::Input,
) -> S::Output {
    let mut hidden = model.0.forward(input);
    for unit in &model.1 {
        hidden = unit.forward(hidden);
    }
    model.2.forward(hidden)
}
