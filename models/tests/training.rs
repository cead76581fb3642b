//! A short training loop on a generated, learnable task lowers the loss well
//! below where it started. Seeded, and run one at a time (`common::seeded`),
//! so the same weights and dropout masks come every run.

mod common;

use burn::module::AutodiffModule;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::optim::{AdamConfig, GradientsParams, Optimizer};
use common::B;
use pipetransformer_models::bert::BertConfig;
use pipetransformer_models::synthetic::{BandImages, MajorityTokens};
use pipetransformer_models::vit::VitConfig;

/// Mean of the first and of the last `window` losses.
fn ends(losses: &[f32], window: usize) -> (f32, f32) {
    let mean = |s: &[f32]| s.iter().sum::<f32>() / s.len() as f32;
    (
        mean(&losses[..window]),
        mean(&losses[losses.len() - window..]),
    )
}

#[test]
fn tiny_vit_learns_the_band_task() {
    common::seeded(21, train_tiny_vit);
}

fn train_tiny_vit() {
    let device = Default::default();
    let mut vit = VitConfig::tiny(4).init::<B>(&device);
    let task = BandImages::new(4, 3, 16, 11);
    let loss_fn = CrossEntropyLossConfig::new().init(&device);
    let mut optim = AdamConfig::new().init();
    let mut losses = Vec::new();
    for step in 0..100 {
        let (images, labels) = task.batch::<B>(step, 32, &device);
        let loss = loss_fn.forward(vit.forward(images), labels);
        losses.push(loss.clone().into_scalar());
        let grads = GradientsParams::from_grads(loss.backward(), &vit);
        vit = optim.step(3e-3, vit, grads);
    }
    let (start, end) = ends(&losses, 5);
    println!("mean loss of the first 5 steps {start:.4}, of the last 5 {end:.4}");
    assert!(
        end < 0.3 * start,
        "loss went from {start} to {end}: {losses:?}"
    );

    // And it generalises to batches it never saw.
    let (images, labels) = task.batch::<B>(10_000, 64, &device);
    let predicted = vit
        .valid()
        .forward(images.inner())
        .argmax(1)
        .flatten::<1>(0, 1);
    let correct = predicted.equal(labels.inner()).int().sum().into_scalar();
    assert!(correct >= 56, "{correct}/64 held-out images right");
}

#[test]
fn tiny_bert_learns_the_majority_task() {
    common::seeded(22, train_tiny_bert);
}

fn train_tiny_bert() {
    let device = Default::default();
    let mut bert = BertConfig::tiny(2).init::<B>(&device);
    let task = MajorityTokens::new(64, 5, 15, 12);
    let loss_fn = CrossEntropyLossConfig::new().init(&device);
    let mut optim = AdamConfig::new().init();
    let mut losses = Vec::new();
    for step in 0..400 {
        let (input, labels) = task.batch::<B>(step, 32, &device);
        let loss = loss_fn.forward(bert.forward(input), labels);
        losses.push(loss.clone().into_scalar());
        let grads = GradientsParams::from_grads(loss.backward(), &bert);
        bert = optim.step(3e-3, bert, grads);
    }
    let (start, end) = ends(&losses, 5);
    println!("mean loss of the first 5 steps {start:.4}, of the last 5 {end:.4}");
    assert!(
        end < 0.5 * start,
        "loss went from {start} to {end}: {losses:?}"
    );
}
