//! Plain Burn training as a user writes it (forward, backward, one optimizer
//! step, one device; no crate of ours on the hot path), and pretraining.

use std::time::Instant;

use burn::data::dataloader::batcher::Batcher;
use burn::data::dataset::Dataset;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::optim::{AdamConfig, GradientsParams, Optimizer};
use burn::prelude::*;
use burn_elastic_dp::{BatchPolicy, ElasticSampler, EpochReport};
use burn_freeze::{AutodiffActivation, LayerStack, StackTypes, Unit};

use super::record::{EpochRecord, Observer, RunRecord};
use super::{
    FINETUNE_CLASSES, FinetuneTask, JobModel, JobSpec, PRETRAIN_CLASSES, PRETRAIN_DATA, Pretrained,
};
use crate::backend::{self, Inner, Train};
use crate::task::indices;

impl JobSpec {
    /// The model pretrained on the pretraining task (plain Burn training),
    /// with the fresh classifier of fine-tuning.
    pub(super) fn pretrain_model<M: JobModel>(&self, observer: &mut impl Observer) -> Pretrained {
        let device = backend::device(0);
        <Inner as Backend>::seed(&device, self.seed);
        let task = M::task(
            PRETRAIN_CLASSES,
            FinetuneTask::Same,
            self.seed ^ PRETRAIN_DATA,
        );
        let stack = M::init(self, PRETRAIN_CLASSES, &device);
        let stack = if self.pretrain_epochs == 0 {
            stack
        } else {
            let data = indices(self.samples);
            let epochs = self.pretrain_epochs;
            plain(
                stack,
                "pretraining",
                self,
                epochs,
                &data,
                &task,
                None,
                observer,
            )
            .0
        };
        let head = M::init(self, FINETUNE_CLASSES, &device);
        let (first, middle, _) = stack.into_parts();
        // The fresh classifier drawn here, once: every run fine-tunes the
        // same weights (see `Pretrained::materialized`).
        M::wrap(LayerStack::from_parts(first, middle, head.into_parts().2)).materialized()
    }
}

/// Held-out inputs and the accuracy of logits on them.
pub(super) type HeldOut<'a, S> = (
    &'a <S as StackTypes>::Input,
    &'a dyn Fn(Tensor<Inner, 2>) -> f64,
);

/// The model as one Burn module: (first, middle, last).
type Whole<S> = (
    <S as StackTypes>::First,
    Vec<<S as StackTypes>::Middle>,
    <S as StackTypes>::Last,
);

/// Plain Burn training of the whole model on one device for `epochs`
/// epochs of `data`, the batches in the order the trainer's sampler gives
/// (one replica); the accuracy on `eval` after each epoch (NaN without).
#[allow(clippy::too_many_arguments)]
pub(super) fn plain<S, I, D, Bt>(
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
    let units = stack.num_units();
    let mut model: Whole<S> = stack.into_parts();
    let mut optim = AdamConfig::new().init::<Train, Whole<S>>();
    observer.start(name, epochs, data.len());
    let mut records = Vec::with_capacity(epochs);
    for epoch in 0..epochs {
        if epoch > 0 {
            sampler.start_epoch();
        }
        let start = Instant::now();
        let mut total = 0.0;
        let mut steps = 0;
        while let Some(items) = sampler
            .next_items(data, 1)
            .expect("the sampler was made with the dataset's length")
        {
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
        let report = one_device_report(epoch, steps, data.len(), total, seconds, units);
        let record = EpochRecord { report, accuracy };
        observer.epoch(&record);
        records.push(record);
    }
    let run = RunRecord::new(name, records);
    (LayerStack::from_parts(model.0, model.1, model.2), run)
}

/// A plain epoch in the trainer's terms: one stage of all `units`, one
/// replica, one micro-batch, nothing frozen, cached or all-reduced.
fn one_device_report(
    epoch: usize,
    steps: usize,
    samples: usize,
    loss_sum: f64,
    seconds: f64,
    units: usize,
) -> EpochReport {
    EpochReport {
        epoch,
        steps,
        samples,
        loss: loss_sum / samples as f64,
        seconds,
        samples_per_second: samples as f64 / seconds,
        transition_seconds: 0.0,
        profiling_seconds: 0.0,
        rule_seconds: 0.0,
        all_reduce_seconds: 0.0,
        bubble_seconds: 0.0,
        frozen_layers: 0,
        front: 0,
        stages: 1,
        replicas: 1,
        total_replicas: 1,
        micro_batches: 1,
        balance: vec![units],
        transitions: Vec::new(),
        cache_hits: 0,
        cache_misses: 0,
    }
}

/// The model's forward pass, unit after unit.
fn forward<S: StackTypes>(model: &Whole<S>, input: S::Input) -> S::Output {
    let mut hidden = model.0.forward(input);
    for unit in &model.1 {
        hidden = unit.forward(hidden);
    }
    model.2.forward(hidden)
}
