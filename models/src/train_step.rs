//! burn-train's `TrainStep` and `InferenceStep` for ViT and BERT (cargo
//! feature `burn-train`): inputs and class labels to a cross-entropy [`ClassificationOutput`].

use burn::nn::loss::CrossEntropyLossConfig;
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;
use burn::train::{ClassificationOutput, InferenceStep, TrainOutput, TrainStep};

use crate::bert::{Bert, BertInput};
use crate::vit::Vit;

/// The classification output of `logits` against `labels`.
fn classify<B: Backend>(
    logits: Tensor<B, 2>,
    labels: Tensor<B, 1, Int>,
) -> ClassificationOutput<B> {
    let loss = CrossEntropyLossConfig::new()
        .init(&logits.device())
        .forward(logits.clone(), labels.clone());
    ClassificationOutput::new(loss, logits, labels)
}

/// Images `[batch, channels, size, size]` and their classes.
impl<B: AutodiffBackend> TrainStep for Vit<B> {
    type Input = (Tensor<B, 4>, Tensor<B, 1, Int>);
    type Output = ClassificationOutput<B>;

    fn step(&self, (images, labels): Self::Input) -> TrainOutput<Self::Output> {
        let item = classify(self.forward(images), labels);
        TrainOutput::new(self, item.loss.backward(), item)
    }
}

/// Images `[batch, channels, size, size]` and their classes.
impl<B: Backend> InferenceStep for Vit<B> {
    type Input = (Tensor<B, 4>, Tensor<B, 1, Int>);
    type Output = ClassificationOutput<B>;

    fn step(&self, (images, labels): Self::Input) -> Self::Output {
        classify(self.forward(images), labels)
    }
}

/// Token sequences and their classes.
impl<B: AutodiffBackend> TrainStep for Bert<B> {
    type Input = (BertInput<B>, Tensor<B, 1, Int>);
    type Output = ClassificationOutput<B>;

    fn step(&self, (input, labels): Self::Input) -> TrainOutput<Self::Output> {
        let item = classify(self.forward(input), labels);
        TrainOutput::new(self, item.loss.backward(), item)
    }
}

/// Token sequences and their classes.
impl<B: Backend> InferenceStep for Bert<B> {
    type Input = (BertInput<B>, Tensor<B, 1, Int>);
    type Output = ClassificationOutput<B>;

    fn step(&self, (input, labels): Self::Input) -> Self::Output {
        classify(self.forward(input), labels)
    }
}
