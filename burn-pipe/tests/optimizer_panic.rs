//! An optimizer step that panics on one stage (after its optimizer changed
//! the weights and state) is an error naming the stage, and the step is
//! undone on every stage, the ones that stepped included: the same step
//! again then equals a clean pipeline's, bit for bit.

mod common;

use burn::nn::loss::CrossEntropyLossConfig;
use burn::optim::AdamConfig;
use burn_freeze::testing::Tripwire;
use burn_pipe::StepOptions;
use burn_pipe::{PipeError, Pipeline, PipelineConfig};
use common::{B, UserTypes, Weights, user_batch, user_stack};

/// Every weight of the pipeline's units.
fn weights<O>(pipeline: &Pipeline<UserTypes, O>) -> Weights
where
    O: burn::optim::Optimizer<burn_freeze::TrainableUnits<UserTypes>, B>,
{
    let (first, middle, last) = pipeline.to_layer_stack().into_parts();
    Weights::of::<B, _>(&(first, middle, last))
}

#[test]
fn a_panicking_optimizer_step_names_its_stage_and_is_undone_on_every_stage() {
    let device = Default::default();
    let stack = user_stack(4, 8, 2, 2);
    let units = stack.num_units();
    let pipeline = |tripwire: &std::sync::Arc<Tripwire>| {
        let tripwire = tripwire.clone();
        PipelineConfig::new()
            .with_micro_batches(Some(2))
            .with_balance(Some(vec![2, units - 3, 1]))
            .init(stack.clone(), vec![device; 3], move || {
                tripwire.wrap(AdamConfig::new().init())
            })
            .unwrap()
    };
    let (failing, never) = (Tripwire::new(), Tripwire::new());
    let (mut pipeline, mut clean) = (pipeline(&failing), pipeline(&never));
    let cross_entropy = CrossEntropyLossConfig::new().init(&device);
    let loss = |output, targets| cross_entropy.forward(output, targets);
    // A first step on both, so that Adam's state is not empty.
    for p in [&mut pipeline, &mut clean] {
        let (x, labels) = user_batch(1, 12, 4, 2);
        p.train_step(x, labels, loss, StepOptions::new(), 1e-2)
            .unwrap();
    }

    let (x, labels) = user_batch(2, 12, 4, 2);
    pipeline
        .forward_backward(x.clone(), labels.clone(), loss, StepOptions::new())
        .unwrap();
    let before = weights(&pipeline);
    // Stage 1's optimizer (the second made) panics after stepping; stages
    // 0 and 2 step.
    failing.arm(&[1]);
    let error = pipeline.step(1e-2).unwrap_err();
    assert!(failing.fired(), "the optimizer panicked");
    match &error {
        PipeError::StepPanicked { stage, message } => {
            assert_eq!(*stage, 1);
            assert!(
                message.contains("optimizer 1 failed on purpose"),
                "{message}"
            );
        }
        other => panic!("expected StepPanicked, got {other:?}"),
    }
    assert!(
        error
            .to_string()
            .starts_with("stage 1's optimizer step panicked"),
        "{error}"
    );
    assert!((0..3).all(|s| pipeline.gradients(s).is_none()));
    assert_eq!(weights(&pipeline).relative_diff(&before), 0.0);

    // Weights and optimizer state as before: the same step now equals the
    // clean pipeline's (Adam's moments would differ on a stage stepped twice).
    pipeline
        .train_step(x.clone(), labels.clone(), loss, StepOptions::new(), 1e-2)
        .unwrap();
    clean
        .train_step(x, labels, loss, StepOptions::new(), 1e-2)
        .unwrap();
    assert!(weights(&pipeline).relative_diff(&before) > 0.0);
    assert_eq!(weights(&pipeline).relative_diff(&weights(&clean)), 0.0);
}
