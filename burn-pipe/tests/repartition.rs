//! Units move between stages with their weights and optimizer state: training
//! continues step for step as if the pipeline had never changed shape.

mod common;

use burn::nn::loss::CrossEntropyLossConfig;
use burn::optim::AdamConfig;
use burn_freeze::IntoLayerStack;
use burn_pipe::StepOptions;
use burn_pipe::{PipeError, PipelineConfig};
use common::{B, Weights, materialize};
use pipetransformer_models::synthetic::BandImages;
use pipetransformer_models::vit::{Vit, VitConfig};

#[test]
fn training_continues_exactly_after_a_repartition() {
    let device = Default::default();
    let vit = materialize(VitConfig::tiny(4).init::<B>(&device));
    let task = BandImages::new(4, 3, 16, 9);
    let loss_fn = CrossEntropyLossConfig::new().init(&device);
    let config = PipelineConfig::new().with_micro_batches(Some(4));
    let build = |balance: &[usize]| {
        config
            .clone()
            .with_balance(Some(balance.to_vec()))
            .init(
                vit.clone().into_layer_stack(),
                vec![device; balance.len()],
                || AdamConfig::new().init(),
            )
            .unwrap()
    };
    let mut fixed = build(&[3, 2, 2]);
    let mut moving = build(&[3, 2, 2]);
    // Every unit changes stage at least once, and the stage count changes too.
    let plan: [(usize, &[usize]); 3] = [(2, &[1, 3, 3]), (4, &[5, 2]), (6, &[2, 1, 1, 3])];
    for step in 0..8 {
        if let Some((_, balance)) = plan.iter().find(|(at, _)| *at == step) {
            moving
                .repartition(balance, vec![device; balance.len()])
                .unwrap();
            assert_eq!(moving.balance(), balance.to_vec());
        }
        let (images, labels) = task.batch::<B>(step, 12, &device);
        let a = fixed
            .train_step(
                images.clone(),
                labels.clone(),
                |l, t| loss_fn.forward(l, t),
                StepOptions::new(),
                1e-2,
            )
            .unwrap();
        let b = moving
            .train_step(
                images,
                labels,
                |l, t| loss_fn.forward(l, t),
                StepOptions::new(),
                1e-2,
            )
            .unwrap();
        assert!(
            (a.loss - b.loss).abs() <= 1e-5 * a.loss.abs().max(1.0),
            "step {step}: {} vs {}",
            a.loss,
            b.loss
        );
    }
    let fixed = Vit::from_layer_stack(fixed.into_layer_stack()).unwrap();
    let moved = Vit::from_layer_stack(moving.into_layer_stack()).unwrap();
    let diff = Weights::of(&moved).relative_diff(&Weights::of(&fixed));
    assert!(diff <= 1e-5, "weights differ by {diff}");
}

#[test]
fn a_bad_repartition_changes_nothing() {
    let device = Default::default();
    let vit = materialize(VitConfig::tiny(4).init::<B>(&device));
    let mut pipeline = PipelineConfig::new()
        .with_balance(Some(vec![3, 4]))
        .init(vit.clone().into_layer_stack(), vec![device; 2], || {
            AdamConfig::new().init()
        })
        .unwrap();
    let before = Weights::of(&Vit::from_layer_stack(vit.into_layer_stack()).unwrap());
    assert!(matches!(
        pipeline.repartition(&[3, 3], vec![device; 2]),
        Err(PipeError::BadBalance { .. })
    ));
    assert!(matches!(
        pipeline.repartition(&[3, 4], vec![device; 3]),
        Err(PipeError::DeviceCount {
            devices: 3,
            stages: 2
        })
    ));
    assert!(matches!(
        pipeline.repartition(&[0, 7], vec![device; 2]),
        Err(PipeError::BadBalance { .. })
    ));
    assert_eq!(pipeline.balance(), vec![3, 4]);

    let task = BandImages::new(4, 3, 16, 9);
    let (images, labels) = task.batch::<B>(0, 16, &device);
    let loss_fn = CrossEntropyLossConfig::new().init(&device);
    pipeline
        .forward_backward(
            images,
            labels,
            |l, t| loss_fn.forward(l, t),
            StepOptions::new(),
        )
        .unwrap();
    assert!(matches!(
        pipeline.repartition(&[2, 5], vec![device; 2]),
        Err(PipeError::GradientsPending(_))
    ));
    pipeline.clear_gradients();
    pipeline.repartition(&[2, 5], vec![device; 2]).unwrap();
    let after = Weights::of(&Vit::from_layer_stack(pipeline.into_layer_stack()).unwrap());
    assert_eq!(after.relative_diff(&before), 0.0);
}
