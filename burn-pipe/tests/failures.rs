//! Failures end the step with an error naming the stage and micro-batch, in
//! bounded time, with every worker stopped and no state lost; bad
//! configurations are refused at construction.

mod common;

use std::time::{Duration, Instant};

use burn::module::Module;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::nn::{Linear, LinearConfig};
use burn::optim::{GradientsParams, SgdConfig};
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;
use burn_freeze::{InnerOf, IntoLayerStack, LayerStack, StackMarker, Unit};
use burn_pipe::StepOptions;
use burn_pipe::{PipeError, Pipeline, PipelineConfig, Schedule};
use common::{B, Classify, CompareGrads, Project, user_batch, user_stack};
use pipetransformer_models::vit::VitConfig;

/// A middle unit that misbehaves on micro-batches of exactly `trip` samples:
/// it panics, or stalls for `stall_ms` before going on.
#[derive(Module, Debug)]
pub struct Tripwire<B: Backend> {
    linear: Linear<B>,
    trip: usize,
    stall_ms: u64,
}

impl<B: Backend> Tripwire<B> {
    fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        if x.dims()[0] == self.trip {
            if self.stall_ms == 0 {
                panic!("tripwire hit by a micro-batch of {} samples", self.trip);
            }
            std::thread::sleep(Duration::from_millis(self.stall_ms));
        }
        self.linear.forward(x)
    }
}

impl<B: AutodiffBackend> Unit<B> for Tripwire<B> {
    type Input = Tensor<B, 2>;
    type Output = Tensor<B, 2>;
    fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        Tripwire::forward(self, x)
    }
    fn forward_inner(
        unit: &Tripwire<B::InnerBackend>,
        x: InnerOf<B, Tensor<B, 2>>,
    ) -> InnerOf<B, Tensor<B, 2>> {
        unit.forward(x)
    }
}

/// The user stack with tripwire middle units.
type TripwireTypes = StackMarker<B, Project<B>, Tripwire<B>, Classify<B>>;

fn tripwire_stack(trip: usize, stall_ms: u64) -> LayerStack<TripwireTypes> {
    let device = Default::default();
    let (first, _, last) = user_stack(4, 8, 1, 2).into_parts();
    let wire = |trip| Tripwire {
        linear: LinearConfig::new(8, 8).init(&device),
        trip,
        stall_ms,
    };
    // Units: project, wire (never trips), wire (trips), classify.
    LayerStack::new(first, vec![wire(usize::MAX), wire(trip)], last)
}

#[test]
fn a_panicking_stage_is_named_with_its_micro_batch_and_loses_nothing() {
    let device = Default::default();
    let config = PipelineConfig::new().with_micro_batches(Some(4));
    // Batch 10 in 4 micro-batches: 3, 3, 2, 2. Micro-batch 2 is the first of 2.
    let mut pipeline = config
        .with_balance(Some(vec![1, 1, 1, 1]))
        .init(tripwire_stack(2, 0), vec![device; 4], || {
            SgdConfig::new().init()
        })
        .unwrap();
    let loss_fn = CrossEntropyLossConfig::new().init(&device);
    let (x, labels) = user_batch(3, 10, 4, 2);
    let start = Instant::now();
    let error = pipeline
        .forward_backward(
            x,
            labels,
            |logits, t| loss_fn.forward(logits, t),
            StepOptions::new(),
        )
        .unwrap_err();
    match &error {
        PipeError::StageFailed {
            stage,
            micro_batch,
            phase,
            message,
        } => {
            assert_eq!((*stage, *micro_batch, *phase), (2, 2, "forward"));
            assert!(message.contains("tripwire hit"), "{message}");
        }
        other => panic!("expected StageFailed, got {other:?}"),
    }
    assert!(error.to_string().contains("stage 2"), "{error}");
    assert!(start.elapsed() < Duration::from_secs(30));
    assert!(
        pipeline.gradients(0).is_none(),
        "a failed pass keeps no gradient"
    );

    // Every unit is still there: a batch that does not trip trains normally.
    let (x, labels) = user_batch(4, 12, 4, 2);
    let report = pipeline
        .train_step(
            x,
            labels,
            |logits, t| loss_fn.forward(logits, t),
            StepOptions::new(),
            0.1,
        )
        .unwrap();
    assert!(report.loss.is_finite());
    assert_eq!(pipeline.into_layer_stack().num_units(), 4);
}

#[test]
fn a_stalled_stage_times_out_instead_of_hanging() {
    let device = Default::default();
    // Far apart, so that a loaded machine cannot make a healthy stage miss
    // the bound: stage 2 stalls 2.5 s, every wait is bounded by 0.4 s.
    let config = PipelineConfig::new()
        .with_micro_batches(Some(4))
        .with_timeout_ms(400);
    let mut pipeline = config
        .with_balance(Some(vec![1, 1, 1, 1]))
        .init(tripwire_stack(2, 2_500), vec![device; 4], || {
            SgdConfig::new().init()
        })
        .unwrap();
    let loss_fn = CrossEntropyLossConfig::new().init(&device);
    let (x, labels) = user_batch(3, 10, 4, 2);
    let error = pipeline
        .forward_backward(
            x,
            labels,
            |logits, t| loss_fn.forward(logits, t),
            StepOptions::new(),
        )
        .unwrap_err();
    // Stage 2 stalls on micro-batch 2; its neighbours give up waiting on it
    // (stage 3 for that forward, stage 1 for a backward), and stage 0 on
    // stage 1: the error reported is the one that names the stalled stage.
    assert!(
        matches!(error, PipeError::Timeout { from: 2, .. }),
        "{error:?}"
    );
    assert!(error.to_string().contains("from stage 2"), "{error}");
}

#[test]
fn bad_configurations_are_refused_at_construction() {
    let device = Default::default();
    let stack = || VitConfig::tiny(2).init::<B>(&device).into_layer_stack();
    let sgd = || SgdConfig::new().init();
    let config = PipelineConfig::new();

    let error = config
        .clone()
        .with_balance(Some(vec![]))
        .init(stack(), vec![], sgd)
        .err()
        .unwrap();
    assert!(matches!(error, PipeError::NoStages));
    let error = config.init(stack(), vec![], sgd).err().unwrap();
    assert!(matches!(error, PipeError::NoStages));
    let error = config.init(stack(), vec![device; 8], sgd).err().unwrap();
    assert!(
        matches!(
            error,
            PipeError::TooManyStages {
                stages: 8,
                units: 7
            }
        ),
        "{error}"
    );
    let error = config
        .clone()
        .with_balance(Some(vec![1; 8]))
        .init(stack(), vec![device; 8], sgd)
        .err()
        .unwrap();
    assert!(matches!(
        error,
        PipeError::TooManyStages {
            stages: 8,
            units: 7
        }
    ));
    let error = config
        .clone()
        .with_balance(Some(vec![4, 4]))
        .init(stack(), vec![device; 2], sgd)
        .err()
        .unwrap();
    assert!(matches!(error, PipeError::BadBalance { .. }), "{error}");
    let error = config
        .clone()
        .with_balance(Some(vec![3, 4]))
        .init(stack(), vec![device; 3], sgd)
        .err()
        .unwrap();
    assert!(matches!(
        error,
        PipeError::DeviceCount {
            devices: 3,
            stages: 2
        }
    ));
    assert!(error.to_string().contains("3 devices given for 2 stages"));
    let zero = config.clone().with_micro_batches(Some(0));
    let error = zero
        .with_balance(Some(vec![3, 4]))
        .init(stack(), vec![device; 2], sgd)
        .err()
        .unwrap();
    assert!(matches!(error, PipeError::NoMicroBatches));

    // A batch smaller than M and mismatched targets fail before any worker starts.
    let eight = config.with_micro_batches(Some(8));
    let mut pipeline = eight
        .with_balance(Some(vec![3, 4]))
        .init(stack(), vec![device; 2], sgd)
        .unwrap();
    let loss_fn = CrossEntropyLossConfig::new().init(&device);
    let images = Tensor::<B, 4>::zeros([4, 3, 16, 16], &device);
    let labels = Tensor::<B, 1, Int>::zeros([4], &device);
    let error = pipeline
        .forward_backward(
            images.clone(),
            labels,
            |l, t| loss_fn.forward(l, t),
            StepOptions::new(),
        )
        .unwrap_err();
    assert!(matches!(
        error,
        PipeError::BatchTooSmall {
            batch: 4,
            micro_batches: 8
        }
    ));
    let error = pipeline
        .forward_backward(
            images,
            Tensor::<B, 1, Int>::zeros([5], &device),
            |l, t| loss_fn.forward(l, t),
            StepOptions::new(),
        )
        .unwrap_err();
    assert!(matches!(
        error,
        PipeError::TargetsMismatch {
            input: 4,
            targets: 5
        }
    ));
}

#[test]
fn the_configuration_is_honoured_at_construction() {
    let device = Default::default();
    let stack = || VitConfig::tiny(2).init::<B>(&device).into_layer_stack();
    let sgd = || SgdConfig::new().init();
    let automatic = PipelineConfig::new()
        .init(stack(), vec![device; 3], sgd)
        .unwrap()
        .balance();
    let given = vec![1, 2, 4];
    assert_ne!(automatic, given, "a balance the partitioner does not pick");
    let mut pipeline = PipelineConfig::new()
        .with_balance(Some(given.clone()))
        .with_micro_batches(Some(5))
        .with_schedule(Schedule::GPipe)
        .init(stack(), vec![device; 3], sgd)
        .unwrap();
    assert_eq!(pipeline.balance(), given);
    let loss_fn = CrossEntropyLossConfig::new().init(&device);
    let images = Tensor::<B, 4>::zeros([10, 3, 16, 16], &device);
    let labels = Tensor::<B, 1, Int>::zeros([10], &device);
    let report = pipeline
        .forward_backward(
            images,
            labels,
            |l, t| loss_fn.forward(l, t),
            StepOptions::new(),
        )
        .unwrap();
    assert_eq!(report.micro_batches, 5);
    assert_eq!(
        report.peak_saved[0], 5,
        "GPipe: stage 0 holds every micro-batch (under 1F1B, 3)"
    );
}

#[test]
fn a_stage_with_no_trainable_parameter_works() {
    // The user stack's units: project, residual, tanh (no parameter), classify.
    let device = Default::default();
    let stack = user_stack(4, 8, 1, 2);
    assert_eq!(stack.unit_params()[2], 0);
    let loss_fn = CrossEntropyLossConfig::new().init(&device);
    let (x, labels) = user_batch(5, 9, 4, 2);
    // Plain training's gradients on the same batch, on its own fresh leaves.
    let plain = stack.clone().fork(&device);
    let plain_loss = loss_fn.forward(plain.forward(x.clone()), labels.clone());
    let mut raw = plain_loss.clone().backward();
    let plain_grads = GradientsParams::from_module(
        &mut raw,
        &(
            plain.first().clone(),
            plain.middle().to_vec(),
            plain.last().clone(),
        ),
    );
    let mut pipeline = PipelineConfig::new()
        .with_micro_batches(Some(3))
        .with_schedule(Schedule::GPipe)
        .with_balance(Some(vec![2, 1, 1]))
        .init(stack, vec![device; 3], || SgdConfig::new().init())
        .unwrap();
    let report = pipeline
        .forward_backward(x, labels, |l, t| loss_fn.forward(l, t), StepOptions::new())
        .unwrap();
    // Stage 1 is the parameter-free tanh: it trains (it is not frozen), holds
    // no parameter, gets no gradient of its own, and passes the gradient on.
    assert_eq!(pipeline.stage(1).num_trainable(), 1);
    assert_eq!(pipeline.stage(1).trainable().num_params(), 0);
    assert_eq!(pipeline.gradients(1).map_or(0, |g| g.len()), 0);
    assert_eq!(
        report.peak_saved[1], 3,
        "stage 1 held every micro-batch (GPipe)"
    );
    let relative = (report.loss - plain_loss.into_scalar()).abs() / report.loss.abs();
    assert!(relative < 1e-5, "loss {} vs plain", report.loss);
    // Stage 0 sits before it: its gradients crossed stage 1 and equal plain training's.
    let grads = pipeline.gradients(0).expect("stage 0 trains");
    let mut compare = CompareGrads::new(grads, &plain_grads, 0.0);
    pipeline.stage(0).trainable().visit(&mut compare);
    assert!(
        compare.missing.is_empty(),
        "stage 0 lacks {:?}",
        compare.missing
    );
    assert!(compare.compared >= 4, "compared {}", compare.compared);
    assert!(
        compare.worst <= 1e-5,
        "stage 0 differs by {}",
        compare.worst
    );
    pipeline.step(0.05).unwrap();
    assert!(
        pipeline.gradients(0).is_none(),
        "the step applied the gradients"
    );
}

/// Every weight of a pipeline, in visiting order.
fn all_weights<O>(pipeline: &Pipeline<common::UserTypes, O>) -> Vec<Vec<f32>>
where
    O: burn::optim::Optimizer<burn_freeze::TrainableUnits<common::UserTypes>, B>,
{
    let stack = pipeline.to_layer_stack();
    let mut all = vec![common::Weights::of(stack.first())];
    all.extend(stack.middle().iter().map(common::Weights::of));
    all.push(common::Weights::of(stack.last()));
    all.into_iter()
        .flat_map(|w| w.0.into_iter().map(|(_, values, _)| values))
        .collect()
}

#[test]
fn a_non_finite_loss_or_gradient_refuses_the_step_and_changes_nothing() {
    let device = Default::default();
    let mut pipeline = PipelineConfig::new()
        .with_micro_batches(Some(2))
        .init(user_stack(4, 8, 2, 3), vec![device; 2], || {
            burn::optim::AdamConfig::new().init()
        })
        .unwrap();
    let (x, y) = user_batch(7, 8, 4, 3);
    let loss_fn = CrossEntropyLossConfig::new().init(&device);
    pipeline
        .train_step(
            x.clone(),
            y.clone(),
            |l, t| loss_fn.forward(l, t),
            StepOptions::new(),
            1e-2,
        )
        .unwrap();
    let before = all_weights(&pipeline);

    // A NaN in the input: the loss is NaN; no gradient is kept.
    let mut values = x.clone().into_data().to_vec::<f32>().unwrap();
    values[5] = f32::NAN;
    let poisoned = Tensor::<B, 1>::from_floats(values.as_slice(), &device).reshape([8, 4]);
    let error = pipeline
        .forward_backward(
            poisoned,
            y.clone(),
            |l, t| loss_fn.forward(l, t),
            StepOptions::new(),
        )
        .unwrap_err();
    assert!(
        matches!(
            error,
            PipeError::NonFinite {
                what: "loss",
                stage: 1,
                ..
            }
        ),
        "{error}"
    );
    assert!(pipeline.gradients(0).is_none() && pipeline.gradients(1).is_none());

    // A finite loss whose gradient is not: sqrt at 0 has an infinite slope.
    pipeline
        .forward_backward(
            x.clone(),
            y.clone(),
            |l, _| l.mul_scalar(0.0).sqrt().sum().reshape([1]),
            StepOptions::new(),
        )
        .unwrap();
    let error = pipeline.step(1e-2).unwrap_err();
    assert!(
        matches!(
            error,
            PipeError::NonFinite {
                what: "gradient",
                unit: Some(_),
                ..
            }
        ),
        "{error}"
    );
    assert!(pipeline.gradients(0).is_none() && pipeline.gradients(1).is_none());
    assert_eq!(
        all_weights(&pipeline),
        before,
        "a refused step changed weights"
    );

    // And training goes on, Adam's state intact.
    pipeline
        .train_step(x, y, |l, t| loss_fn.forward(l, t), StepOptions::new(), 1e-2)
        .unwrap();
    assert_ne!(all_weights(&pipeline), before);
}

/// A middle unit `x + tanh(linear(x))`, or, when `ignores`, `linear(0)`: an
/// output that does not depend on the input.
#[derive(Module, Debug)]
pub struct Ignoring<B: Backend> {
    linear: Linear<B>,
    ignores: bool,
}

impl<B: Backend> Ignoring<B> {
    fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        if self.ignores {
            self.linear.forward(x.zeros_like())
        } else {
            x.clone() + self.linear.forward(x).tanh()
        }
    }
}

burn_freeze::unit!(Ignoring<B>: Tensor<B, 2> => Tensor<B, 2>);

/// The user stack with `Ignoring` middle units.
type IgnoringTypes = StackMarker<B, Project<B>, Ignoring<B>, Classify<B>>;

#[test]
fn a_stage_whose_output_ignores_its_input_is_an_error_naming_it() {
    let device = Default::default();
    let (first, _, last) = user_stack(4, 8, 1, 2).into_parts();
    let ignoring = |ignores| Ignoring {
        linear: LinearConfig::new(8, 8).init(&device),
        ignores,
    };
    // Stage 1 starts with the unit that ignores its input: no gradient can
    // reach stage 0, which trains.
    let stack: LayerStack<IgnoringTypes> =
        LayerStack::new(first, vec![ignoring(false), ignoring(true)], last);
    let mut pipeline = PipelineConfig::new()
        .with_micro_batches(Some(2))
        .with_balance(Some(vec![2, 2]))
        .init(stack, vec![device; 2], || SgdConfig::new().init())
        .unwrap();
    let loss_fn = CrossEntropyLossConfig::new().init(&device);
    let (x, labels) = user_batch(5, 8, 4, 2);
    let error = pipeline
        .forward_backward(
            x,
            labels,
            |logits, t| loss_fn.forward(logits, t),
            StepOptions::new(),
        )
        .unwrap_err();
    assert!(
        matches!(
            error,
            PipeError::OutputIgnoresInput {
                stage: 1,
                micro_batch: 0
            }
        ),
        "{error:?}"
    );
    assert!(
        error
            .to_string()
            .starts_with("stage 1's output does not depend on its input"),
        "{error}"
    );
    assert!((0..2).all(|s| pipeline.gradients(s).is_none()));
    // Every unit is still there.
    assert_eq!(pipeline.into_layer_stack().num_units(), 4);
}
