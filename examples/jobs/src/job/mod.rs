//! The main job: a tiny transformer pretrained on a generated task, then
//! fine-tuned on a related one, plainly or with PipeTransformer's trainer.

mod finetune;
mod model;
mod plain;
mod record;
mod sst;
#[cfg(test)]
mod tests;

use burn::data::dataloader::batcher::Batcher;
use burn_elastic_dp::{TrainerConfig, TrainerError};
use burn_freeze::{Cacheable, InnerBackendOf, InnerHidden, InnerInput, LayerStack};
use serde::{Deserialize, Serialize};

pub use model::Pretrained;
pub use model::{JobModel, with_model};
pub use models::sst::SstLabels;
pub use record::{EpochRecord, Observer, RunRecord, Silent};
pub use sst::{SstJob, SstPairs, sst_accuracy};

use crate::backend;
use crate::task::indices;

/// Which model and tasks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
pub enum ModelKind {
    /// Tiny ViT: 8 bright bands, then 4 coarser ones.
    Vit,
    /// Tiny BERT: majority of upper-half tokens.
    Bert,
}

/// The job's sizes; every run of one spec starts from the same weights.
///
/// The main job: a tiny transformer pretrained in the same run on a
/// generated task, then fine-tuned on a related one, plainly (Burn as a user
/// writes it) or with PipeTransformer's trainer. Freezing pays on pretrained
/// layers only, so the job pretrains first; every run starts from the same
/// pretrained weights, so runs compare.
///
/// - ViT: pretrained to tell which of 8 horizontal bands of an image is
///   bright, fine-tuned (fresh classifier) on 4 coarser bands of new images.
/// - BERT: pretrained on whether most tokens of a sequence come from the
///   upper half of the vocabulary, fine-tuned (fresh classifier) on new
///   sequences of the same rule, or of another ([`FinetuneTask`]).
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
    /// The fine-tuning task's rule (pretraining always takes the model's
    /// own rule).
    #[serde(default)]
    pub task: FinetuneTask,
}

/// Samples in the freeze rule's validation batch of a job that trains on
/// `training` samples, drawn from outside the training and evaluation
/// samples: a sixteenth of them, at least 64 and at most 256 (a held-out
/// loss on fewer is noise; more only costs time).
///
/// ```
/// use pipetransformer_jobs::job::validation_samples;
///
/// assert_eq!(validation_samples(2048), 128);
/// assert_eq!(validation_samples(256), 64);
/// assert_eq!(validation_samples(usize::MAX), 256);
/// ```
pub fn validation_samples(training: usize) -> usize {
    (training / 16).clamp(64, 256)
}

/// Which rule the generated fine-tuning task follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
pub enum FinetuneTask {
    /// The pretraining's rule on new samples, with a fresh classifier; the
    /// frozen encoder already solves it.
    #[default]
    Same,
    /// BERT only: whether the first drawn token is from the upper half of
    /// the vocabulary (pretraining counts upper tokens over the whole
    /// sequence, so the encoder's summary does not carry one position).
    FirstToken,
    /// BERT only: whether most tokens come from the middle half of the ids.
    MiddleMajority,
}

impl FinetuneTask {
    /// The token rule of this task for BERT.
    pub(crate) fn token_rule(self) -> models::synthetic::TokenRule {
        use models::synthetic::TokenRule;
        match self {
            FinetuneTask::Same => TokenRule::UpperMajority,
            FinetuneTask::FirstToken => TokenRule::FirstUpper,
            FinetuneTask::MiddleMajority => TokenRule::MiddleMajority,
        }
    }
}

/// How pretraining runs where it differs from fine-tuning: a fine-tuning
/// run usually takes a smaller learning rate or a larger batch (fewer steps
/// per epoch) than pretraining did.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PretrainSettings {
    /// Adam's learning rate while pretraining.
    pub lr: f64,
    /// Samples per pretraining step.
    pub batch: usize,
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

const PRETRAIN_CLASSES: usize = 8;
/// Classes of the fine-tuning tasks.
pub const FINETUNE_CLASSES: usize = 4;
/// Seeds of the tasks, mixed with the spec's.
const PRETRAIN_DATA: u64 = 0x5052_4554;
const FINETUNE_DATA: u64 = 0x4649_4E45;

impl JobSpec {
    /// Checks the sizes before any work.
    pub fn validate(&self) -> Result<(), JobError> {
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
        if self.model == ModelKind::Vit && self.task != FinetuneTask::Same {
            return fail(format!(
                "the fine-tuning task {:?} is BERT's; the ViT fine-tunes on its own bands (task same)",
                self.task
            ));
        }
        Ok(())
    }

    /// Pretrains the model (plain training, `pretrain_epochs` epochs of
    /// `samples` samples at the spec's `lr` and `batch`) and gives it a
    /// fresh classifier for fine-tuning; the weights depend only on the
    /// spec.
    pub fn pretrain(&self, observer: &mut impl Observer) -> Pretrained {
        self.pretrain_with(
            PretrainSettings {
                lr: self.lr,
                batch: self.batch,
            },
            observer,
        )
    }

    /// [`pretrain`](Self::pretrain) at `pretraining`'s learning rate and
    /// batch instead of the spec's, which are then fine-tuning's alone.
    pub fn pretrain_with(
        &self,
        pretraining: PretrainSettings,
        observer: &mut impl Observer,
    ) -> Pretrained {
        let spec = self.for_pretraining(pretraining);
        with_model!(kind: self.model, M => spec.pretrain_model::<M>(observer))
    }

    /// A fresh model of the fine-tuning's shape (its sizes, for checks
    /// before any work; its weights are random).
    pub fn fresh_model(&self) -> Pretrained {
        let device = backend::device(0);
        with_model!(kind: self.model, M => M::wrap(M::init(self, FINETUNE_CLASSES, &device)).materialized())
    }

    /// The spec pretraining runs with: this one at `pretraining`'s
    /// learning rate and batch ([`validate`](Self::validate) it before
    /// [`pretrain_with`](Self::pretrain_with)).
    pub fn for_pretraining(&self, pretraining: PretrainSettings) -> JobSpec {
        JobSpec {
            lr: pretraining.lr,
            batch: pretraining.batch,
            ..self.clone()
        }
    }

    /// Samples in the freeze rule's validation batch of this spec
    /// ([`validation_samples`]).
    pub fn validation_samples(&self) -> usize {
        validation_samples(self.samples)
    }

    /// Fine-tunes `pretrained` on the generated task with `method`;
    /// `observer` watches. Returns the record and the trained model.
    pub fn finetune(
        &self,
        pretrained: &Pretrained,
        name: &str,
        method: &Method,
        observer: &mut impl Observer,
    ) -> Result<(RunRecord, Pretrained), JobError> {
        self.validate()?;
        with_model!(pretrained, M, stack => {
            let task = M::task(FINETUNE_CLASSES, self.task, self.seed ^ FINETUNE_DATA);
            let (record, stack) =
                self.finetune_generated(stack.clone(), name, method, &task, observer)?;
            Ok((record, M::wrap(stack)))
        })
    }

    /// Fine-tunes `stack` on the first `samples` of `task`, the accuracy
    /// measured on the next `eval_samples`; the freeze rule's validation
    /// batch is the [`validation_samples`](Self::validation_samples) after
    /// those (no sample of either).
    fn finetune_generated<M: JobModel>(
        &self,
        stack: LayerStack<M>,
        name: &str,
        method: &Method,
        task: &M::Task,
        observer: &mut impl Observer,
    ) -> Result<(RunRecord, LayerStack<M>), JobError>
    where
        InnerInput<M>: Cacheable<InnerBackendOf<M>>,
        InnerHidden<M>: Cacheable<InnerBackendOf<M>>,
    {
        let held_out: Vec<usize> = (self.samples..self.samples + self.eval_samples).collect();
        let held_out = task.batch(held_out, &backend::device(0));
        let first = self.samples + self.eval_samples;
        let validation: Vec<usize> = (first..first + self.validation_samples()).collect();
        let validation = Some(task.batch(validation, &backend::device(0)));
        let data = indices(self.samples);
        self.finetune_data(
            stack, name, method, &data, task, held_out, validation, observer,
        )
    }
}
