//! The generated tasks as Burn datasets: a sample is its index, drawn the
//! same in any batch (as AutoCache requires).

use burn::data::dataloader::batcher::Batcher;
use burn::data::dataset::InMemDataset;
use burn::prelude::*;

/// `len` samples, each its own index.
pub fn indices(len: usize) -> InMemDataset<usize> {
    InMemDataset::new((0..len).collect())
}

/// Draws a generated task's samples by index (the tasks are Burn batchers
/// of sample ids themselves; this wrapper keeps the jobs' one batcher type).
#[derive(Debug, Clone)]
pub struct TaskBatcher<T>(pub T);

impl<B: Backend, O, T: Batcher<B, usize, O>> Batcher<B, usize, O> for TaskBatcher<T> {
    fn batch(&self, items: Vec<usize>, device: &B::Device) -> O {
        self.0.batch(items, device)
    }
}

/// Share of `labels` that the arg-max of `logits` gets right.
pub fn accuracy<B: Backend>(logits: Tensor<B, 2>, labels: Tensor<B, 1, Int>) -> f64 {
    let samples = labels.dims()[0];
    correct(logits, labels) as f64 / samples as f64
}

/// How many of `labels` the arg-max of `logits` gets right.
pub fn correct<B: Backend>(logits: Tensor<B, 2>, labels: Tensor<B, 1, Int>) -> i64 {
    logits
        .argmax(1)
        .flatten::<1>(0, 1)
        .equal(labels)
        .int()
        .sum()
        .into_scalar()
        .elem::<i64>()
}
