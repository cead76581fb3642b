//! Injected faults (the `fault-injection` feature of burn-freeze, which this
//! crate's tests turn on) at each of the pipeline's own fault points: the
//! error names the place, nothing changes, and the next call works.
//!
//! One test, alone in its binary: an armed fault fires at the first point
//! that matches, whichever test reaches it.

mod common;

use burn::optim::SgdConfig;
use burn_freeze::fault::{self, Fault, Phase};
use burn_pipe::StepOptions;
use burn_pipe::fault::{FORWARD, REPARTITION, REPLICATE, STAGE_THREAD, STEP};
use burn_pipe::{PipeError, Pipeline, PipelineConfig};
use common::{B, UserTypes, Weights, user_batch, user_stack};

fn fault_at(phase: Phase, stage: Option<usize>, micro_batch: Option<usize>) -> Fault {
    Fault {
        phase,
        stage,
        micro_batch,
        panic: false,
        stall: None,
    }
}

#[test]
fn each_pipeline_fault_point_fails_cleanly_and_the_next_call_works() {
    let device = Default::default();
    let stack = user_stack(4, 8, 2, 2);
    let units = stack.num_units();
    let mut pipeline = PipelineConfig::new()
        .with_micro_batches(Some(4))
        .with_balance(Some(vec![2, units - 3, 1]))
        .init(stack, vec![device; 3], || SgdConfig::new().init())
        .unwrap();
    let cross_entropy = burn::nn::loss::CrossEntropyLossConfig::new().init(&device);
    let loss = |output, targets| cross_entropy.forward(output, targets);
    let (x, labels) = user_batch(7, 12, 4, 2);

    // A stage's forward pass: the pass fails naming stage and micro-batch,
    // and keeps no gradient.
    fault::arm(fault_at(FORWARD, Some(1), Some(2)));
    let error = pipeline
        .forward_backward(x.clone(), labels.clone(), loss, StepOptions::new())
        .unwrap_err();
    assert!(!fault::disarm(), "the fault fired");
    let message = error.to_string();
    assert!(
        message.contains("forward at stage 1, micro-batch 2"),
        "{message}"
    );
    assert!((0..3).all(|s| pipeline.gradients(s).is_none()));
    let clean = pipeline
        .forward_backward(x.clone(), labels.clone(), loss, StepOptions::new())
        .unwrap();

    // The optimizer step: refused, the gradients dropped, no weight moved.
    let before = weights(&pipeline);
    fault::arm(fault_at(STEP, None, None));
    let error = pipeline.step(0.1).unwrap_err();
    assert!(matches!(error, PipeError::Injected(_)), "{error}");
    assert!((0..3).all(|s| pipeline.gradients(s).is_none()));
    assert_eq!(weights(&pipeline).relative_diff(&before), 0.0);
    // The same pass again gives the same loss, and now the step goes through.
    let again = pipeline
        .train_step(x, labels, loss, StepOptions::new(), 0.1)
        .unwrap();
    assert_eq!(again.loss, clean.loss);
    assert!(weights(&pipeline).relative_diff(&before) > 0.0);

    // Repartition and replica spawn: refused, the shape unchanged.
    fault::arm(fault_at(REPARTITION, None, None));
    let error = pipeline
        .repartition(&[1, units - 1], vec![device; 2])
        .unwrap_err();
    assert!(error.to_string().contains("repartition"), "{error}");
    assert_eq!(pipeline.balance(), [2, units - 3, 1]);
    pipeline
        .repartition(&[1, units - 1], vec![device; 2])
        .unwrap();
    assert_eq!(pipeline.balance(), [1, units - 1]);

    fault::arm(fault_at(REPLICATE, None, None));
    let error = pipeline.replicate(vec![device; 2]).err().unwrap();
    assert!(error.to_string().contains("replica spawn"), "{error}");
    assert_eq!(
        pipeline.replicate(vec![device; 2]).unwrap().balance(),
        [1, units - 1]
    );

    // A stage's worker thread that cannot start: the pass fails before any
    // stage runs, naming the stage, and loses no unit.
    let (x, labels) = user_batch(8, 12, 4, 2);
    let before = weights(&pipeline);
    fault::arm(fault_at(STAGE_THREAD, Some(1), None));
    let error = pipeline
        .forward_backward(x.clone(), labels.clone(), loss, StepOptions::new())
        .unwrap_err();
    assert!(!fault::disarm(), "the fault fired");
    assert!(
        matches!(
            error,
            PipeError::Spawn {
                stage: 1,
                what: "stage",
                ..
            }
        ),
        "{error:?}"
    );
    assert_eq!(
        error.to_string(),
        "stage 1: could not start its stage thread: injected fault in stage thread start at stage 1"
    );
    assert!((0..2).all(|s| pipeline.gradients(s).is_none()));
    pipeline
        .forward_backward(x.clone(), labels.clone(), loss, StepOptions::new())
        .unwrap();

    // A step thread that cannot start: the step is refused, the gradients
    // dropped, no weight moved; the next step goes through.
    fault::arm(fault_at(STAGE_THREAD, Some(0), None));
    let error = pipeline.step(0.1).unwrap_err();
    assert!(!fault::disarm(), "the fault fired");
    assert!(
        matches!(
            error,
            PipeError::Spawn {
                stage: 0,
                what: "step",
                ..
            }
        ),
        "{error:?}"
    );
    assert!((0..2).all(|s| pipeline.gradients(s).is_none()));
    assert_eq!(weights(&pipeline).relative_diff(&before), 0.0);
    pipeline
        .train_step(x, labels, loss, StepOptions::new(), 0.1)
        .unwrap();
    assert!(weights(&pipeline).relative_diff(&before) > 0.0);
}

/// Every weight of the pipeline's units.
fn weights<O>(pipeline: &Pipeline<UserTypes, O>) -> Weights
where
    O: burn::optim::Optimizer<burn_freeze::TrainableUnits<UserTypes>, B>,
{
    let (first, middle, last) = pipeline.to_layer_stack().into_parts();
    Weights::of::<B, _>(&(first, middle, last))
}
