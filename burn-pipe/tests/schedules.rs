//! The runtime's own counter shows 1F1B's activation bound, and both
//! schedules train to the same weights as plain training.
//!
//! Multi-step comparisons of weights use SGD with momentum. A gradient that
//! is zero in exact arithmetic (attention's key bias) is ~1e-9 of rounding
//! noise whose sign differs between two summation orders; Adam divides it by
//! its own magnitude plus epsilon (1e-5 by default), so it moves that
//! zero-initialised bias by about 1e-4 of the learning rate in a
//! noise-chosen direction, which a relative comparison of a near-zero
//! tensor cannot bound; SGD moves it by the noise itself. Adam's state
//! moving with its units is tested in `repartition.rs`.

mod common;

use burn::module::Module;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::optim::momentum::MomentumConfig;
use burn::optim::{AdamConfig, GradientsParams, Optimizer, SgdConfig};
use burn_freeze::IntoLayerStack;
use burn_pipe::StepOptions;
use burn_pipe::{PipelineConfig, Schedule};
use common::{B, Weights, materialize};
use pipetransformer_models::synthetic::BandImages;
use pipetransformer_models::vit::{Vit, VitConfig};

#[test]
fn one_f_one_b_never_holds_more_than_k_minus_s_micro_batches() {
    let device = Default::default();
    let stack = VitConfig::tiny(4).init::<B>(&device).into_layer_stack();
    let (images, labels) = BandImages::new(4, 3, 16, 1).batch::<B>(0, 16, &device);
    let loss_fn = CrossEntropyLossConfig::new().init(&device);
    for (schedule, m) in [
        (Schedule::OneFOneB, 8),
        (Schedule::OneFOneB, 2),
        (Schedule::GPipe, 8),
    ] {
        let config = PipelineConfig::new()
            .with_schedule(schedule)
            .with_micro_batches(Some(m));
        let mut pipeline = config
            .with_balance(Some(vec![2, 2, 2, 1]))
            .init(stack.clone(), vec![device; 4], || AdamConfig::new().init())
            .unwrap();
        let report = pipeline
            .forward_backward(
                images.clone(),
                labels.clone(),
                |logits, labels| loss_fn.forward(logits, labels),
                StepOptions::new(),
            )
            .unwrap();
        let expected: Vec<usize> = match schedule {
            Schedule::OneFOneB => (0..4).map(|s| (4 - s).min(m)).collect(),
            Schedule::GPipe => vec![m; 4],
        };
        assert_eq!(report.peak_saved, expected, "{schedule:?} M={m}");
        // 3 boundaries, each crossed once forward and once backward per micro-batch.
        assert_eq!(report.messages, 2 * 3 * m);
    }
}

fn sgd() -> SgdConfig {
    SgdConfig::new().with_momentum(Some(MomentumConfig::new()))
}

/// `steps` steps of plain training with SGD and momentum; the losses and final model.
fn plain_training(mut vit: Vit<B>, steps: usize) -> (Vec<f32>, Vit<B>) {
    let device = Default::default();
    let task = BandImages::new(4, 3, 16, 2);
    let loss_fn = CrossEntropyLossConfig::new().init(&device);
    let mut optim = sgd().init();
    let mut losses = Vec::new();
    for step in 0..steps {
        let (images, labels) = task.batch::<B>(step, 12, &device);
        let loss = loss_fn.forward(vit.forward(images), labels);
        losses.push(loss.clone().into_scalar());
        let grads = GradientsParams::from_grads(loss.backward(), &vit);
        vit = optim.step(5e-2, vit, grads);
    }
    (losses, vit)
}

#[test]
fn pipelined_training_follows_plain_training() {
    let device = Default::default();
    let vit = materialize(VitConfig::tiny(4).init::<B>(&device));
    let steps = 5;
    let (plain_losses, plain) = plain_training(vit.clone(), steps);
    let task = BandImages::new(4, 3, 16, 2);
    let loss_fn = CrossEntropyLossConfig::new().init(&device);
    for schedule in [Schedule::GPipe, Schedule::OneFOneB] {
        let config = PipelineConfig::new()
            .with_schedule(schedule)
            .with_micro_batches(Some(5));
        let mut pipeline = config
            .with_balance(Some(vec![1, 4, 2]))
            .init(vit.clone().into_layer_stack(), vec![device; 3], || {
                sgd().init()
            })
            .unwrap();
        for (step, plain_loss) in plain_losses.iter().enumerate() {
            let (images, labels) = task.batch::<B>(step, 12, &device);
            let report = pipeline
                .train_step(
                    images,
                    labels,
                    |logits, labels| loss_fn.forward(logits, labels),
                    StepOptions::new(),
                    5e-2,
                )
                .unwrap();
            assert!(
                (report.loss - plain_loss).abs() <= 1e-5 * plain_loss.abs().max(1.0),
                "{schedule:?} step {step}"
            );
        }
        let trained = Vit::from_layer_stack(pipeline.into_layer_stack()).unwrap();
        let diff = Weights::of(&trained).relative_diff(&Weights::of(&plain));
        assert!(diff <= 1e-5, "{schedule:?}: weights differ by {diff}");
        assert!(
            Weights::of(&plain).relative_diff(&Weights::of(&vit)) > 1e-3,
            "training moved nothing"
        );
    }
}

#[test]
fn accumulating_two_half_batches_equals_one_full_batch() {
    let device = Default::default();
    let vit = materialize(VitConfig::tiny(4).init::<B>(&device));
    let (images, labels) = BandImages::new(4, 3, 16, 3).batch::<B>(0, 12, &device);
    let loss_fn = CrossEntropyLossConfig::new().init(&device);
    let config = PipelineConfig::new().with_micro_batches(Some(2));
    let make = || {
        config
            .clone()
            .with_balance(Some(vec![3, 4]))
            .init(vit.clone().into_layer_stack(), vec![device; 2], || {
                burn::optim::SgdConfig::new().init()
            })
            .unwrap()
    };
    let mut whole = make();
    whole
        .train_step(
            images.clone(),
            labels.clone(),
            |l, t| loss_fn.forward(l, t),
            StepOptions::new(),
            0.5,
        )
        .unwrap();
    let mut halves = make();
    for (start, len) in [(0, 6), (6, 6)] {
        halves
            .forward_backward(
                images.clone().narrow(0, start, len),
                labels.clone().narrow(0, start, len),
                |l, t| loss_fn.forward(l, t).div_scalar(2.0),
                StepOptions::new(),
            )
            .unwrap();
    }
    halves.step(0.5).unwrap();
    let diff = Weights::of(&Vit::from_layer_stack(halves.into_layer_stack()).unwrap())
        .relative_diff(&Weights::of(
            &Vit::from_layer_stack(whole.into_layer_stack()).unwrap(),
        ));
    assert!(diff <= 1e-5, "{diff}");
    let _ = vit.num_params();
}
