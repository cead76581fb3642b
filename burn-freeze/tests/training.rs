//! Training with a frozen prefix: frozen weights stay bit-identical while the
//! others move, and the losses equal plain training that drops the frozen
//! parameters' gradients (the same maths).

mod common;

use burn::module::list_param_ids;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::optim::{AdamConfig, GradientsParams, Optimizer};
use burn::prelude::*;
use burn_freeze::FreezeFront;
use burn_freeze::{FreezableStack, LayerStack, TrainableUnits};
use common::*;

const STEPS: usize = 40;

fn batch_of(step: usize) -> (Tensor<B, 3>, Tensor<B, 1, Int>) {
    let ids: Vec<u64> = (0..8).map(|i| (step * 8 + i) as u64 % 64).collect();
    batch(&ids, 4)
}

#[test]
fn frozen_weights_are_bit_identical_after_many_steps() {
    let mut stack = FreezableStack::new(stack(4, 0.1, 7));
    stack.freeze_to(3).unwrap();
    let frozen_before = (
        weights::<Inner, _>(stack.frozen().first().unwrap()),
        weights::<Inner, _>(&stack.frozen().middle().to_vec()),
    );
    let active_before = weights::<B, _>(stack.trainable());
    let loss_fn = CrossEntropyLossConfig::new().init(&Default::default());
    let mut optim = AdamConfig::new().init::<B, TrainableUnits<Types>>();
    for step in 0..STEPS {
        let (x, y) = batch_of(step);
        let loss = loss_fn.forward(stack.forward(x), y);
        let grads = stack.gradients(loss.backward());
        stack.map_trainable(|a| optim.step(1e-2, a, grads));
    }
    assert!(bit_identical(
        &frozen_before.0,
        &weights::<Inner, _>(stack.frozen().first().unwrap())
    ));
    assert!(bit_identical(
        &frozen_before.1,
        &weights::<Inner, _>(&stack.frozen().middle().to_vec())
    ));
    let active_after = weights::<B, _>(stack.trainable());
    assert_eq!(active_before.len(), active_after.len());
    for (before, after) in active_before.iter().zip(&active_after) {
        assert_ne!(
            before.as_bytes(),
            after.as_bytes(),
            "a trainable weight did not move"
        );
    }
    // Unfrozen again, the weights are the ones frozen.
    let full = stack.into_layer_stack();
    assert!(bit_identical(
        &frozen_before.0,
        &weights::<B, _>(full.first())
    ));
}

/// The same model trained as a plain Burn module (the whole stack in one
/// tuple), with the frozen units' gradients removed before the optimizer step.
fn plain_losses(stack: LayerStack<Types>, frozen_middle: usize) -> Vec<f32> {
    let loss_fn = CrossEntropyLossConfig::new().init(&Default::default());
    let (first, middle, last) = stack.into_parts();
    let mut model = (first, middle, last);
    let frozen_ids: Vec<_> = list_param_ids(&model.0)
        .into_iter()
        .chain(list_param_ids(&model.1[..frozen_middle].to_vec()))
        .collect();
    let mut optim = AdamConfig::new().init::<B, (Embed<B>, Vec<Block<B>>, Head<B>)>();
    let mut losses = Vec::new();
    for step in 0..STEPS {
        let (x, y) = batch_of(step);
        let h = model.1.iter().fold(model.0.run(x), |h, u| u.run(h));
        let loss = loss_fn.forward(model.2.run(h), y);
        losses.push(loss.clone().into_scalar());
        let mut grads = GradientsParams::from_grads(loss.backward(), &model);
        for id in &frozen_ids {
            let _ = grads.remove::<Inner, 2>(*id);
            let _ = grads.remove::<Inner, 1>(*id);
        }
        model = optim.step(1e-2, model, grads);
    }
    losses
}

#[test]
fn frozen_training_matches_plain_training_without_frozen_gradients() {
    let frozen_units = 3;
    // One set of weights for both runs (tests share the backend's generator).
    let base = stack(4, 0.0, 8);
    let expected = plain_losses(base.clone(), frozen_units - 1);

    let mut stack = FreezableStack::new(base);
    stack.freeze_to(frozen_units).unwrap();
    let loss_fn = CrossEntropyLossConfig::new().init(&Default::default());
    let mut optim = AdamConfig::new().init::<B, TrainableUnits<Types>>();
    let mut losses = Vec::new();
    for step in 0..STEPS {
        let (x, y) = batch_of(step);
        let loss = loss_fn.forward(stack.forward(x), y);
        losses.push(loss.clone().into_scalar());
        let grads = stack.gradients(loss.backward());
        stack.map_trainable(|a| optim.step(1e-2, a, grads));
    }
    for (step, (a, b)) in losses.iter().zip(&expected).enumerate() {
        assert!((a - b).abs() <= 1e-5, "step {step}: frozen {a}, plain {b}");
    }
    let mean = |s: &[f32]| s.iter().sum::<f32>() / s.len() as f32;
    assert!(
        mean(&losses[STEPS - 5..]) < mean(&losses[..5]),
        "training did not lower the loss: {losses:?}"
    );
}
