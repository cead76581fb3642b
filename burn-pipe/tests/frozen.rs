//! Frozen units in a pipeline: forward only, on the inner backend, no
//! optimizer state; a stage of frozen units works; gradients of the
//! trainable units equal those of plain training with the same frozen prefix.

mod common;

use burn::module::AutodiffModule;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::optim::{AdamConfig, SgdConfig};
use burn_freeze::FreezeFront;
use burn_freeze::{FreezableStack, IntoLayerStack};
use burn_pipe::StepOptions;
use burn_pipe::{PipeError, Pipeline, PipelineConfig, Schedule};
use common::{B, CompareGrads, MaxGrad, Weights, materialize};
use pipetransformer_models::synthetic::BandImages;
use pipetransformer_models::vit::{Vit, VitConfig};

#[test]
fn frozen_prefix_gradients_equal_plain_frozen_training() {
    let device = Default::default();
    let vit = materialize(VitConfig::tiny(4).init::<B>(&device));
    let (images, labels) = BandImages::new(4, 3, 16, 8).batch::<B>(0, 10, &device);
    let loss_fn = CrossEntropyLossConfig::new().init(&device);
    for front in [1, 3, 6] {
        // Plain: burn-freeze's frozen stack on one thread.
        let mut plain = FreezableStack::new(vit.clone().into_layer_stack());
        plain.freeze_to(front).unwrap();
        let loss = loss_fn.forward(plain.forward(images.clone()), labels.clone());
        let plain_loss = loss.clone().into_scalar();
        let plain_grads = plain.gradients(loss.backward());
        let mut max = MaxGrad {
            grads: &plain_grads,
            max: 0.0,
        };
        burn::module::Module::visit(plain.trainable(), &mut max);

        for (balance, m, schedule) in [
            (vec![7], 3, Schedule::GPipe),
            (vec![2, 2, 3], 4, Schedule::OneFOneB),
            (vec![4, 1, 2], 5, Schedule::GPipe),
            (vec![1, 1, 1, 1, 1, 1, 1], 2, Schedule::OneFOneB),
        ] {
            let stages = balance.len();
            let config = PipelineConfig::new()
                .with_schedule(schedule)
                .with_micro_batches(Some(m));
            let mut pipeline = config
                .with_balance(Some(balance.to_vec()))
                .init(vit.clone().into_layer_stack(), vec![device; stages], || {
                    SgdConfig::new().init()
                })
                .unwrap();
            pipeline.freeze_to(front).unwrap();
            let report = pipeline
                .forward_backward(
                    images.clone(),
                    labels.clone(),
                    |l, t| loss_fn.forward(l, t),
                    StepOptions::new(),
                )
                .unwrap();
            let what = format!("front {front}, {balance:?}, M={m}, {schedule:?}");
            assert!(
                (report.loss - plain_loss).abs() <= 1e-5 * plain_loss.max(1.0),
                "{what}"
            );
            let mut trainable_units = 0;
            for s in 0..stages {
                trainable_units += pipeline.stage(s).num_trainable();
                let Some(grads) = pipeline.gradients(s) else {
                    assert!(
                        pipeline.stage(s).num_trainable() == 0,
                        "{what}: stage {s} trains but has no gradient"
                    );
                    continue;
                };
                let mut compare = CompareGrads::new(grads, &plain_grads, 1e-6 * max.max);
                burn::module::Module::visit(pipeline.stage(s).trainable(), &mut compare);
                assert!(
                    compare.missing.is_empty() && compare.not_zero.is_empty(),
                    "{what}: stage {s}"
                );
                assert!(
                    compare.worst <= 1e-5,
                    "{what}: stage {s} differs by {}",
                    compare.worst
                );
            }
            assert_eq!(trainable_units, 7 - front, "{what}");
        }
    }
}

#[test]
fn a_stage_of_frozen_units_trains_with_the_rest_and_its_weights_never_move() {
    let device = Default::default();
    let vit = materialize(VitConfig::tiny(4).init::<B>(&device));
    let task = BandImages::new(4, 3, 16, 4);
    let loss_fn = CrossEntropyLossConfig::new().init(&device);
    let config = PipelineConfig::new().with_micro_batches(Some(4));
    let mut pipeline = config
        .with_balance(Some(vec![3, 2, 2]))
        .init(vit.clone().into_layer_stack(), vec![device; 3], || {
            AdamConfig::new().init()
        })
        .unwrap();
    pipeline.freeze_to(3).unwrap();
    assert_eq!(pipeline.stage(0).num_trainable(), 0);
    for step in 0..15 {
        let (images, labels) = task.batch::<B>(step, 16, &device);
        let report = pipeline
            .train_step(
                images,
                labels,
                |l, t| loss_fn.forward(l, t),
                StepOptions::new(),
                5e-3,
            )
            .unwrap();
        assert_eq!(report.peak_saved[0], 0, "a frozen stage keeps no graph");
        assert!(report.loss.is_finite(), "step {step}: loss {}", report.loss);
    }
    let trained = Vit::from_layer_stack(pipeline.into_layer_stack()).unwrap();
    let before = Weights::of(&vit.embedding);
    let after = Weights::of(&trained.embedding);
    assert_eq!(after.relative_diff(&before), 0.0, "frozen embedding moved");
    assert_eq!(
        Weights::of(&trained.blocks[0].attention)
            .relative_diff(&Weights::of(&vit.blocks[0].attention)),
        0.0
    );
    assert!(
        Weights::of(&trained.head).relative_diff(&Weights::of(&vit.head)) > 1e-4,
        "head did not train"
    );
}

#[test]
fn the_freeze_front_follows_the_stacks_rule() {
    let device = Default::default();
    let task = BandImages::new(4, 3, 16, 12);
    let vit = VitConfig::tiny(4).init::<B>(&device);
    let stack = vit.into_layer_stack();
    // Read the weights before cloning: Burn initialises them lazily.
    let _ = stack.forward(task.batch::<B>(0, 1, &device).0);
    let mut pipeline = PipelineConfig::new()
        .with_micro_batches(Some(2))
        .with_balance(Some(vec![3, 4]))
        .init(stack.clone(), vec![device; 2], || AdamConfig::new().init())
        .unwrap();
    pipeline.freeze_to(4).unwrap();
    // The same rule as FreezableStack (burn_freeze::check_freeze), the same errors.
    let mut plain = FreezableStack::new(stack);
    plain.freeze_to(4).unwrap();
    for front in [2, 8] {
        let Err(PipeError::Freeze(pipe_error)) = pipeline.freeze_to(front) else {
            panic!("freeze_to({front}) was accepted");
        };
        assert_eq!(pipe_error, plain.freeze_to(front).unwrap_err());
    }
    assert_eq!(pipeline.front(), 4);
    // Repartitioning keeps frozen units frozen.
    pipeline.repartition(&[5, 2], vec![device; 2]).unwrap();
    assert_eq!(pipeline.front(), 4);
    assert_eq!(pipeline.stage(0).num_trainable(), 1);
    assert_eq!(pipeline.stage(1).num_trainable(), 2);
    // Every unit may be frozen, as in the stack; a step then has nothing to
    // train and says so, while evaluation still runs.
    pipeline.freeze_to(7).unwrap();
    plain.freeze_to(7).unwrap();
    let (images, labels) = task.batch::<B>(0, 4, &device);
    let loss_fn = CrossEntropyLossConfig::new().init(&device);
    assert!(matches!(
        pipeline.forward_backward(
            images.clone(),
            labels,
            |l, t| loss_fn.forward(l, t),
            StepOptions::new()
        ),
        Err(PipeError::NothingToTrain { units: 7 })
    ));
    pipeline
        .forward_inner(images.clone().inner())
        .into_data()
        .assert_approx_eq::<f32>(
            &plain.forward_inner(images.inner()).into_data(),
            Default::default(),
        );
}

#[test]
fn the_whole_model_can_be_copied_out_mid_training() {
    let device = Default::default();
    let vit = materialize(VitConfig::tiny(4).init::<B>(&device));
    let task = BandImages::new(4, 3, 16, 13);
    let loss_fn = CrossEntropyLossConfig::new().init(&device);
    let mut pipeline = PipelineConfig::new()
        .with_micro_batches(Some(2))
        .with_balance(Some(vec![3, 4]))
        .init(vit.into_layer_stack(), vec![device; 2], || {
            AdamConfig::new().init()
        })
        .unwrap();
    pipeline.freeze_to(2).unwrap();
    let step = |pipeline: &mut Pipeline<_, _>, index| {
        let (images, labels) = task.batch::<B>(index, 8, &device);
        pipeline
            .train_step(
                images,
                labels,
                |l, t| loss_fn.forward(l, t),
                StepOptions::new(),
                1e-2,
            )
            .unwrap();
    };
    step(&mut pipeline, 0);
    // A copy of every unit, frozen ones included, as the model type: it
    // evaluates as the pipeline does, and the pipeline trains on.
    let (images, _) = task.batch::<B>(99, 8, &device);
    let copy = Vit::from_layer_stack(pipeline.to_layer_stack()).unwrap();
    let expected = pipeline.forward_inner(images.clone().inner());
    copy.valid()
        .forward(images.clone().inner())
        .into_data()
        .assert_approx_eq::<f32>(&expected.clone().into_data(), Default::default());
    step(&mut pipeline, 1);
    assert_eq!(pipeline.front(), 2);
    let moved = pipeline.forward_inner(images.clone().inner());
    assert!(
        (moved - expected).abs().max().into_scalar() > 0.0,
        "training went on after the copy"
    );
    // The copy kept the weights it was taken with.
    let head_then = Weights::of(&copy.head);
    let head_now = Weights::of(
        &Vit::from_layer_stack(pipeline.into_layer_stack())
            .unwrap()
            .head,
    );
    assert!(head_now.relative_diff(&head_then) > 0.0);
}

/// A batch scored again and again (a freeze rule's held-out batch) keeps its
/// activation after the frozen units: running the units frozen since, then
/// the rest, gives what the whole forward gives; an entry past stage 0's
/// frozen units, or a flow the entry does not take, is refused.
#[test]
fn a_kept_activation_enters_after_the_frozen_units() {
    use burn_freeze::plumbing::Flow;

    let device = Default::default();
    let vit = materialize(VitConfig::tiny(4).init::<B>(&device));
    let (images, _) = BandImages::new(4, 3, 16, 17).batch::<B>(0, 6, &device);
    let mut pipeline = PipelineConfig::new()
        .with_balance(Some(vec![4, 3]))
        .init(vit.into_layer_stack(), vec![device; 2], || {
            AdamConfig::new().init()
        })
        .unwrap();
    pipeline.freeze_to(1).unwrap();
    let input = Flow::Input(images.clone().inner());
    let kept = pipeline
        .evaluation_copy()
        .forward_frozen_inner(input, 0, 1)
        .unwrap();
    // The front moves on: only units 1..3 run on the kept activation.
    pipeline.freeze_to(3).unwrap();
    assert_eq!(pipeline.cached_prefix(), 3);
    let kept = pipeline
        .evaluation_copy()
        .forward_frozen_inner(kept, 1, 3)
        .unwrap();
    let expected = pipeline.forward_inner(images.clone().inner());
    let evaluation = pipeline.evaluation_copy();
    // On this thread, and on another.
    let here = evaluation.forward_inner_from(kept.clone(), 3).unwrap();
    let there = std::thread::scope(|s| {
        s.spawn(|| evaluation.forward_inner_from(kept.clone(), 3))
            .join()
            .unwrap()
    })
    .unwrap();
    for output in [here, there] {
        output
            .into_data()
            .assert_approx_eq::<f32>(&expected.clone().into_data(), Default::default());
    }
    // Past stage 0's frozen units (3 of its 4), or past them on the way.
    let past = [
        evaluation.forward_inner_from(kept.clone(), 4).map(|_| ()),
        (evaluation.forward_frozen_inner(Flow::Input(images.clone().inner()), 0, 4)).map(|_| ()),
    ];
    for result in past {
        assert!(matches!(
            result,
            Err(PipeError::BadEntry {
                entry: 4,
                frozen_on_first: 3
            })
        ));
    }
    // The input where an activation enters, and an activation at unit 0.
    assert!(matches!(
        evaluation.forward_inner_from(Flow::Input(images.inner()), 2),
        Err(PipeError::FlowMismatch { entry: 2, .. })
    ));
    let error = evaluation.forward_inner_from(kept, 0).unwrap_err();
    assert!(
        matches!(error, PipeError::FlowMismatch { entry: 0, .. }),
        "{error}"
    );
    assert!(
        error.to_string().contains("takes the model input"),
        "{error}"
    );
}
