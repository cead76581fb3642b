//! The stage-gradient hook (`StageGradients`): each stage hands its
//! gradients of a pass on from its own thread, once; what the hook returns
//! is what the step applies; a failing or panicking hook fails the pass and
//! keeps nothing; a hooked pass with gradients pending is refused.

mod common;

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use burn::module::{ModuleVisitor, Param};
use burn::nn::loss::CrossEntropyLossConfig;
use burn::optim::{GradientsParams, Optimizer, SgdConfig};
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;
use burn_freeze::{LayerStack, TrainableUnits};
use burn_pipe::StepOptions;
use burn_pipe::{PipeError, Pipeline, PipelineConfig, StageGradients};
use common::{B, UserTypes, Weights, user_batch, user_stack};

const LR: f64 = 0.1;
const BATCH: usize = 8;

fn pipeline(
    stack: LayerStack<UserTypes>,
) -> Pipeline<UserTypes, impl Optimizer<TrainableUnits<UserTypes>, B>> {
    PipelineConfig::new()
        .with_micro_batches(Some(4))
        .with_balance(Some(vec![3, 2, 2]))
        .init(stack, vec![Default::default(); 3], || {
            SgdConfig::new().init()
        })
        .unwrap()
}

/// Every unit's weights.
fn weights(stack: &LayerStack<UserTypes>) -> Weights {
    let mut all = Weights::of(stack.first());
    for unit in stack.middle() {
        all.0.extend(Weights::of(unit).0);
    }
    all.0.extend(Weights::of(stack.last()).0);
    all
}

/// Doubles every gradient of a module's parameters in `grads`.
struct Double<'a> {
    grads: &'a mut GradientsParams,
}

impl<AB: AutodiffBackend> ModuleVisitor<AB> for Double<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<AB, D>>) {
        if let Some(grad) = self.grads.remove::<AB::InnerBackend, D>(param.id) {
            self.grads.register(param.id, grad.mul_scalar(2.0));
        }
    }
}

/// Records the calls, and doubles the gradients when asked (as an
/// all-reduce over two identical replicas would).
struct Recorder {
    modules: Vec<TrainableUnits<UserTypes>>,
    double: bool,
    stages: Mutex<Vec<usize>>,
    computed: AtomicUsize,
    /// How many stages had been handed on when `all_computed` came.
    handed_before_computed: AtomicUsize,
    fail_at: Option<usize>,
    panic_at: Option<usize>,
}

impl Recorder {
    fn new<O: Optimizer<TrainableUnits<UserTypes>, B>>(
        pipe: &Pipeline<UserTypes, O>,
        double: bool,
    ) -> Self {
        Self {
            modules: (0..pipe.num_stages())
                .map(|s| pipe.stage(s).trainable().clone())
                .collect(),
            double,
            stages: Mutex::new(Vec::new()),
            computed: AtomicUsize::new(0),
            handed_before_computed: AtomicUsize::new(usize::MAX),
            fail_at: None,
            panic_at: None,
        }
    }
}

impl StageGradients for Recorder {
    fn stage_done(
        &self,
        stage: usize,
        mut grads: GradientsParams,
    ) -> Result<GradientsParams, String> {
        self.stages.lock().unwrap().push(stage);
        if self.fail_at == Some(stage) {
            return Err("refused by the test".into());
        }
        if self.panic_at == Some(stage) {
            panic!("the test's hook panicked at stage {stage}");
        }
        if self.double {
            self.modules[stage].visit(&mut Double { grads: &mut grads });
        }
        Ok(grads)
    }

    fn all_computed(&self) {
        self.computed.fetch_add(1, Ordering::SeqCst);
        let handed = self.stages.lock().unwrap().len();
        self.handed_before_computed.store(handed, Ordering::SeqCst);
    }
}

#[test]
fn every_stage_hands_its_gradients_on_once_and_the_step_applies_what_the_hook_returns() {
    let device = Default::default();
    let loss_fn = CrossEntropyLossConfig::new().init(&device);
    let base = user_stack(6, 8, 4, 3);
    let loss = |l, t| loss_fn.forward(l, t);

    // Without a hook, at twice the learning rate: SGD's step is linear in
    // the gradient, so doubling the gradients is the same step.
    let mut plain = pipeline(base.clone());
    // With a hook that hands the gradients on unchanged, then one that
    // doubles them, at the plain learning rate.
    let mut same = pipeline(base.clone());
    let mut doubled = pipeline(base.clone());
    for b in 0..3u64 {
        let (x, y) = user_batch(b, BATCH, 6, 3);
        let expected = plain
            .forward_backward(x.clone(), y.clone(), loss, StepOptions::new())
            .unwrap();
        plain.step(2.0 * LR).unwrap();

        let keep = Recorder::new(&same, false);
        let report = same
            .forward_backward(
                x.clone(),
                y.clone(),
                loss,
                StepOptions::new().with_hook(&keep),
            )
            .unwrap();
        assert_eq!(report.loss, expected.loss, "batch {b}: the same pass");
        same.step(2.0 * LR).unwrap();
        let mut stages = keep.stages.into_inner().unwrap();
        stages.sort_unstable();
        assert_eq!(stages, [0, 1, 2], "batch {b}: every stage once");
        assert_eq!(keep.computed.load(Ordering::SeqCst), 1, "all_computed once");
        assert!(
            keep.handed_before_computed.load(Ordering::SeqCst) < 3,
            "all_computed comes before the last stage's hand-off"
        );

        let twice = Recorder::new(&doubled, true);
        doubled
            .forward_backward(x, y, loss, StepOptions::new().with_hook(&twice))
            .unwrap();
        doubled.step(LR).unwrap();
    }
    let plain = weights(&plain.to_layer_stack());
    assert_eq!(
        weights(&same.to_layer_stack()).relative_diff(&plain),
        0.0,
        "a hook that hands the gradients on unchanged trains as no hook"
    );
    let diff = weights(&doubled.to_layer_stack()).relative_diff(&plain);
    assert!(
        diff <= 1e-6,
        "the step applied the hook's gradients: {diff}"
    );
    assert!(
        weights(&base).relative_diff(&plain) > 1e-3,
        "training moved the weights"
    );
}

#[test]
fn a_failing_or_panicking_hook_fails_the_pass_and_keeps_nothing() {
    let device = Default::default();
    let loss_fn = CrossEntropyLossConfig::new().init(&device);
    let loss = |l, t| loss_fn.forward(l, t);
    let base = user_stack(6, 8, 4, 3);
    let (x, y) = user_batch(5, BATCH, 6, 3);
    for (fail_at, panic_at) in [(Some(1), None), (None, Some(2))] {
        let mut pipe = pipeline(base.clone());
        let hook = Recorder {
            fail_at,
            panic_at,
            ..Recorder::new(&pipe, false)
        };
        match pipe.forward_backward(
            x.clone(),
            y.clone(),
            loss,
            StepOptions::new().with_hook(&hook),
        ) {
            Err(PipeError::GradientHook { stage, message }) => {
                assert_eq!(Some(stage), fail_at.or(panic_at));
                let expected = if panic_at.is_some() {
                    "panicked"
                } else {
                    "refused"
                };
                assert!(message.contains(expected), "{message}");
            }
            other => panic!("expected GradientHook, got {other:?}"),
        }
        // Nothing pending: a plain pass and step run, and the weights are
        // those of that one step.
        pipe.forward_backward(x.clone(), y.clone(), loss, StepOptions::new())
            .unwrap();
        pipe.step(LR).unwrap();
        let mut fresh = pipeline(base.clone());
        fresh
            .forward_backward(x.clone(), y.clone(), loss, StepOptions::new())
            .unwrap();
        fresh.step(LR).unwrap();
        assert_eq!(
            weights(&pipe.to_layer_stack()).relative_diff(&weights(&fresh.to_layer_stack())),
            0.0
        );
    }
}

#[test]
fn a_hooked_pass_with_gradients_pending_is_refused() {
    let device = Default::default();
    let loss_fn = CrossEntropyLossConfig::new().init(&device);
    let loss = |l, t| loss_fn.forward(l, t);
    let mut pipe = pipeline(user_stack(6, 8, 4, 3));
    let (x, y) = user_batch(2, BATCH, 6, 3);
    pipe.forward_backward(x.clone(), y.clone(), loss, StepOptions::new())
        .unwrap();
    let hook = Recorder::new(&pipe, false);
    assert!(matches!(
        pipe.forward_backward(x, y, loss, StepOptions::new().with_hook(&hook)),
        Err(PipeError::GradientsPending(
            "forward_backward with a gradient hook"
        ))
    ));
    assert!(hook.stages.into_inner().unwrap().is_empty(), "no work done");
}
