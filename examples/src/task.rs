//! The generated tasks as Burn datasets: a sample is its index, and a
//! batcher draws the samples of a batch (the same sample whatever batch it
//! falls in, as AutoCache requires), so the trainer's sampler can hand out
//! every sample once per epoch.

use burn::data::dataloader::batcher::Batcher;
use burn::data::dataset::InMemDataset;
use burn::prelude::*;
use models::bert::BertInput;
use models::synthetic::{BandImages, MajorityTokens};

/// `len` samples, each its own index.
pub fn indices(len: usize) -> InMemDataset<usize> {
    InMemDataset::new((0..len).collect())
}

/// Draws a generated task's samples by index.
#[derive(Debug, Clone)]
pub struct TaskBatcher<T>(pub T);

impl<B: Backend> Batcher<B, usize, (Tensor<B, 4>, Tensor<B, 1, Int>)> for TaskBatcher<BandImages> {
    fn batch(&self, items: Vec<usize>, device: &B::Device) -> (Tensor<B, 4>, Tensor<B, 1, Int>) {
        self.0.samples(&items, device)
    }
}

impl<B: Backend> Batcher<B, usize, (BertInput<B>, Tensor<B, 1, Int>)>
    for TaskBatcher<MajorityTokens>
{
    fn batch(&self, items: Vec<usize>, device: &B::Device) -> (BertInput<B>, Tensor<B, 1, Int>) {
        self.0.samples(&items, device)
    }
}

/// Share of `labels` that the arg-max of `logits` gets right.
pub fn accuracy<B: Backend>(logits: Tensor<B, 2>, labels: Tensor<B, 1, Int>) -> f64 {
    let samples = labels.dims()[0];
    let correct = logits
        .argmax(1)
        .flatten::<1>(0, 1)
        .equal(labels)
        .int()
        .sum()
        .into_scalar()
        .elem::<i64>();
    correct as f64 / samples as f64
}
