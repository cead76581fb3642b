//! The job's two models: what differs is written once, in [`JobModel`]'s
//! impls; the one `match` over them is [`with_model!`].

use std::path::Path;

use burn::data::dataloader::batcher::Batcher;
use burn::module::Module;
use burn::prelude::*;
use burn::record::{FullPrecisionSettings, NamedMpkFileRecorder, RecorderError};
use burn_freeze::{IntoLayerStack, LayerStack, StackTypes};
use models::bert::{BertConfig, BertTypes};
use models::synthetic::{BandImages, MajorityTokens};
use models::vit::{VitConfig, VitTypes};

use super::{FinetuneTask, JobSpec};
use crate::backend::Train;
use crate::task::TaskBatcher;

/// A pretrained model, ready to fine-tune (fresh classifier).
#[derive(Debug, Clone)]
#[allow(clippy::large_enum_variant)] // one lives at a time
pub enum Pretrained {
    /// ViT's units.
    Vit(LayerStack<VitTypes<Train>>),
    /// BERT's units.
    Bert(LayerStack<BertTypes<Train>>),
}

/// Evaluates `$body` once per model kind with `$M` naming the model's
/// [`JobModel`] type: over a [`Pretrained`] (`$stack` bound to a reference
/// to its units) or over a [`ModelKind`](super::ModelKind) (`kind:`).
#[macro_export]
#[doc(hidden)]
macro_rules! with_model {
    (kind: $kind:expr, $M:ident => $body:expr) => {
        match $kind {
            $crate::job::ModelKind::Vit => {
                type $M = ::models::vit::VitTypes<$crate::backend::Train>;
                $body
            }
            $crate::job::ModelKind::Bert => {
                type $M = ::models::bert::BertTypes<$crate::backend::Train>;
                $body
            }
        }
    };
    ($pretrained:expr, $M:ident, $stack:ident => $body:expr) => {
        match $pretrained {
            $crate::job::Pretrained::Vit($stack) => {
                type $M = ::models::vit::VitTypes<$crate::backend::Train>;
                $body
            }
            $crate::job::Pretrained::Bert($stack) => {
                type $M = ::models::bert::BertTypes<$crate::backend::Train>;
                $body
            }
        }
    };
}
pub use crate::with_model;

/// What the job's two models do differently: their generated task, their
/// initialisation at the spec's sizes, and which [`Pretrained`] they are.
pub trait JobModel: StackTypes<Backend = Train, Output = Tensor<Train, 2>> {
    /// Draws the generated task's samples by index.
    type Task: Batcher<Train, usize, (Self::Input, Tensor<Train, 1, Int>)>;

    /// The generated task with `classes` classes (BERT's has two) after
    /// `rule` (the ViT has one rule; [`JobSpec::check`] refuses others),
    /// its samples seeded by `seed`.
    fn task(classes: usize, rule: FinetuneTask, seed: u64) -> Self::Task;

    /// Fresh units of `spec`'s sizes with a `classes`-way classifier
    /// (BERT's has two).
    fn init(spec: &JobSpec, classes: usize, device: &Device<Train>) -> LayerStack<Self>;

    /// `stack` as the job's model.
    fn wrap(stack: LayerStack<Self>) -> Pretrained;
}

impl JobModel for VitTypes<Train> {
    type Task = TaskBatcher<BandImages>;

    fn task(classes: usize, _rule: FinetuneTask, seed: u64) -> Self::Task {
        TaskBatcher(BandImages::new(classes, 3, 16, seed))
    }

    fn init(spec: &JobSpec, classes: usize, device: &Device<Train>) -> LayerStack<Self> {
        VitConfig::tiny(classes)
            .with_layers(spec.layers)
            .with_hidden(spec.hidden)
            .with_mlp_dim(2 * spec.hidden)
            .init::<Train>(device)
            .into_layer_stack()
    }

    fn wrap(stack: LayerStack<Self>) -> Pretrained {
        Pretrained::Vit(stack)
    }
}

impl JobModel for BertTypes<Train> {
    type Task = TaskBatcher<MajorityTokens>;

    fn task(_classes: usize, rule: FinetuneTask, seed: u64) -> Self::Task {
        TaskBatcher(MajorityTokens::new(64, 5, 15, seed).with_rule(rule.token_rule()))
    }

    fn init(spec: &JobSpec, _classes: usize, device: &Device<Train>) -> LayerStack<Self> {
        BertConfig::tiny(2)
            .with_layers(spec.layers)
            .with_hidden(spec.hidden)
            .with_intermediate(2 * spec.hidden)
            .init::<Train>(device)
            .into_layer_stack()
    }

    fn wrap(stack: LayerStack<Self>) -> Pretrained {
        Pretrained::Bert(stack)
    }
}

impl Pretrained {
    /// The model with every parameter drawn now. Burn initialises
    /// parameters lazily and a clone of a never-read parameter draws its own
    /// values on first read, so without this each fine-tuning run (which
    /// clones the model) would get its own random classifier, drawn from
    /// wherever the backend's random stream happens to be.
    pub(crate) fn materialized(self) -> Self {
        with_model!(&self, _M, stack => stack.materialize());
        self
    }

    /// Units of the model.
    pub fn num_units(&self) -> usize {
        with_model!(self, _M, stack => stack.num_units())
    }

    /// Parameters of each unit.
    pub fn unit_params(&self) -> Vec<usize> {
        with_model!(self, _M, stack => stack.unit_params())
    }

    /// Parameters of the model.
    pub fn num_params(&self) -> usize {
        with_model!(self, _M, stack => stack.unit_params().iter().sum())
    }

    /// Saves the model's units with Burn's recorder as `path.mpk`,
    /// replacing a model of an earlier run (without the recorder's warning).
    pub fn save_file(&self, path: &Path) -> Result<(), RecorderError> {
        let recorder = NamedMpkFileRecorder::<FullPrecisionSettings>::new();
        let _ = std::fs::remove_file(path.with_extension("mpk"));
        with_model!(self, _M, stack => stack.clone().into_parts().save_file(path, &recorder))
    }
}
