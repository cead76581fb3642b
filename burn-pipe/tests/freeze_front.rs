//! One freeze policy drives a `FreezableStack` and a `Pipeline` alike through
//! `FreezeFront`: on the same run, the same policy moves both fronts at the
//! same steps to the same units.

mod common;

use burn::nn::loss::CrossEntropyLossConfig;
use burn::optim::{GradientsParams, Optimizer, SgdConfig, momentum::MomentumConfig};
use burn_freeze::{
    AlphaArgmin, AlphaArgminConfig, ArgminStatistic, AutoFreeze, ChangeRate, ChangeRateConfig,
    FreezableStack, FreezeFront, FreezePolicy, GradNorm, LayerMap, ParamStates, TrainableUnits,
};
use burn_pipe::StepOptions;
use burn_pipe::{Pipeline, PipelineConfig};
use common::{B, UserStack, UserTypes, user_batch, user_stack};

const STEPS_PER_EPOCH: usize = 6;
const EPOCHS: usize = 3;
const LR: f64 = 0.05;

fn sgd() -> impl Optimizer<TrainableUnits<UserTypes>, B, Record: ParamStates> {
    SgdConfig::new()
        .with_momentum(Some(MomentumConfig::new()))
        .init()
}

/// What the policy saw and did: the front after every step and epoch, and
/// the per-unit gradient norms it was fed.
#[derive(Debug, Default)]
struct Trace {
    fronts: Vec<usize>,
    norms: Vec<Vec<Option<GradNorm>>>,
    /// Per epoch, the norms of the epoch's summed gradients at its end.
    sums: Vec<Vec<Option<GradNorm>>>,
}

impl Trace {
    fn record(&mut self, target: &impl FreezeFront) {
        self.fronts.push(target.front());
        self.norms.push(target.last_gradient_norms());
    }
}

/// Layers of two units after the projection (unit 0): the user stack with
/// 4 residual blocks has units project, residual, tanh, residual x3, classify.
fn layer_map() -> LayerMap {
    LayerMap::uniform(1, 2, 3, 7).unwrap()
}

fn run_stack<P: FreezePolicy>(stack: UserStack, policy: P) -> Trace {
    let device = Default::default();
    let loss_fn = CrossEntropyLossConfig::new().init(&device);
    let mut stack = FreezableStack::new(stack.fork(&device));
    let mut auto = AutoFreeze::new(policy, layer_map());
    auto.prepare(&mut stack);
    let mut optim = sgd();
    let mut trace = Trace::default();
    for epoch in 0..EPOCHS {
        for step in 0..STEPS_PER_EPOCH {
            let (x, y) = user_batch((epoch * STEPS_PER_EPOCH + step) as u64, 24, 6, 3);
            let loss = loss_fn.forward(stack.forward(x), y);
            let grads: GradientsParams = stack.gradients(loss.backward());
            stack.map_trainable(|units| optim.step(LR, units, grads));
            auto.after_step(&mut stack).unwrap();
            trace.record(&stack);
            optim = burn_freeze::plumbing::retain_optimizer_state(optim, stack.trainable());
        }
        trace.sums.push(stack.gradient_sum_norms());
        auto.after_epoch(&mut stack).unwrap();
        trace.record(&stack);
        optim = burn_freeze::plumbing::retain_optimizer_state(optim, stack.trainable());
    }
    trace
}

fn run_pipeline<P: FreezePolicy>(stack: UserStack, policy: P) -> Trace {
    let device = Default::default();
    let loss_fn = CrossEntropyLossConfig::new().init(&device);
    let mut pipeline = PipelineConfig::new()
        .with_micro_batches(Some(4))
        .with_balance(Some(vec![3, 2, 2]))
        .init(stack, vec![device; 3], sgd)
        .unwrap();
    let mut auto = AutoFreeze::new(policy, layer_map());
    auto.prepare(&mut pipeline);
    let mut trace = Trace::default();
    for epoch in 0..EPOCHS {
        for step in 0..STEPS_PER_EPOCH {
            let (x, y) = user_batch((epoch * STEPS_PER_EPOCH + step) as u64, 24, 6, 3);
            pipeline
                .train_step(x, y, |l, t| loss_fn.forward(l, t), StepOptions::new(), LR)
                .unwrap();
            auto.after_step(&mut pipeline).unwrap();
            trace.record(&pipeline);
        }
        trace.sums.push(pipeline.gradient_sum_norms());
        auto.after_epoch(&mut pipeline).unwrap();
        trace.record(&pipeline);
    }
    trace
}

fn assert_same_run(stack: &Trace, pipeline: &Trace, policy: &str) {
    assert_eq!(stack.fronts, pipeline.fronts, "{policy}: fronts differ");
    assert!(
        stack.fronts.last() > stack.fronts.first(),
        "{policy}: the front never moved ({:?}), so nothing was compared",
        stack.fronts
    );
    assert_eq!(stack.sums.len(), pipeline.sums.len());
    assert_close(&stack.norms, &pipeline.norms, policy);
    assert_close(&stack.sums, &pipeline.sums, policy);
}

/// Per record, per unit: both `None`, or both values with `close(a, b)`.
fn assert_each_close<T: std::fmt::Debug>(
    a: &[Vec<Option<T>>],
    b: &[Vec<Option<T>>],
    what: &str,
    close: impl Fn(&T, &T) -> bool,
) {
    assert_eq!(a.len(), b.len());
    for (step, (a, b)) in a.iter().zip(b).enumerate() {
        assert_eq!(a.len(), b.len());
        for (unit, (a, b)) in a.iter().zip(b).enumerate() {
            match (a, b) {
                (Some(x), Some(y)) => assert!(
                    close(x, y),
                    "{what}: record {step}, unit {unit}: {a:?} vs {b:?}"
                ),
                (None, None) => {}
                _ => panic!("{what}: record {step}, unit {unit}: {a:?} vs {b:?}"),
            }
        }
    }
}

/// Per record, per unit: both `None`, or norms within 1e-4.
fn assert_close(a: &[Vec<Option<GradNorm>>], b: &[Vec<Option<GradNorm>>], policy: &str) {
    assert_each_close(a, b, policy, |a, b| {
        (a.l2 - b.l2).abs() <= 1e-4 * a.l2.max(1e-6) && (a.l1 - b.l1).abs() <= 1e-4 * a.l1.max(1e-6)
    });
}

/// One training step of batch `step` (24 samples) on `stack`, with
/// `optim`, and on `pipeline` alike.
fn step_both<O>(
    stack: &mut FreezableStack<UserTypes>,
    optim: &mut impl Optimizer<TrainableUnits<UserTypes>, B>,
    pipeline: &mut Pipeline<UserTypes, O>,
    step: u64,
) where
    O: Optimizer<TrainableUnits<UserTypes>, B>,
{
    let loss_fn = CrossEntropyLossConfig::new().init::<B>(&Default::default());
    let (x, y) = user_batch(step, 24, 6, 3);
    let loss = loss_fn.forward(stack.forward(x.clone()), y.clone());
    let grads: GradientsParams = stack.gradients(loss.backward());
    stack.map_trainable(|units| optim.step(LR, units, grads));
    pipeline
        .train_step(x, y, |l, t| loss_fn.forward(l, t), StepOptions::new(), LR)
        .unwrap();
}

#[test]
fn the_change_rate_rule_moves_a_pipeline_as_it_moves_a_stack() {
    let policy = || ChangeRate::new(ChangeRateConfig::new().with_every_steps(3)).unwrap();
    let model = user_stack(6, 16, 4, 3);
    let stack = run_stack(model.clone(), policy());
    let pipeline = run_pipeline(model, policy());
    assert_same_run(&stack, &pipeline, "change rate");
}

#[test]
fn the_papers_rule_moves_a_pipeline_as_it_moves_a_stack() {
    let policy = || AlphaArgmin::new(AlphaArgminConfig::new().with_alpha(0.5)).unwrap();
    let model = user_stack(6, 16, 4, 3);
    let stack = run_stack(model.clone(), policy());
    let pipeline = run_pipeline(model, policy());
    assert_same_run(&stack, &pipeline, "alpha argmin");
    // The accumulated gradient: every epoch's sums were read, on both.
    assert!(stack.sums.iter().all(|s| s.iter().any(Option::is_some)));
}

#[test]
fn the_papers_rule_on_summed_step_norms_moves_a_pipeline_as_it_moves_a_stack() {
    let policy = || {
        AlphaArgmin::new(
            AlphaArgminConfig::new()
                .with_alpha(0.5)
                .with_statistic(ArgminStatistic::SummedStepNorms),
        )
        .unwrap()
    };
    let model = user_stack(6, 16, 4, 3);
    let stack = run_stack(model.clone(), policy());
    let pipeline = run_pipeline(model, policy());
    assert_same_run(&stack, &pipeline, "alpha argmin, summed step norms");
    // No sums kept for it.
    assert!(stack.sums.iter().flatten().all(Option::is_none));
}

/// Gradient sums follow their units through a repartition in mid-epoch and
/// into a replica: the pipeline's equal a single stack's on the same steps.
#[test]
fn gradient_sums_follow_units_through_repartition_and_replication() {
    let device = Default::default();
    let model = user_stack(6, 16, 4, 3);
    let mut stack = FreezableStack::new(model.clone().fork(&device));
    stack.set_gradient_sums(true);
    let mut optim = sgd();
    let mut pipeline = PipelineConfig::new()
        .with_micro_batches(Some(3))
        .with_balance(Some(vec![3, 2, 2]))
        .init(model, vec![device; 3], sgd)
        .unwrap();
    pipeline.set_gradient_sums(true);
    for step in 0..6u64 {
        if step == 3 {
            pipeline.repartition(&[1, 4, 2], vec![device; 3]).unwrap();
        }
        if step == 4 {
            stack.freeze_to(1).unwrap();
            optim = burn_freeze::plumbing::retain_optimizer_state(optim, stack.trainable());
            pipeline.freeze_to(1).unwrap();
        }
        step_both(&mut stack, &mut optim, &mut pipeline, step);
    }
    let expected = stack.gradient_sum_norms();
    // Unit 0 froze; the tanh unit (2) has no parameters.
    assert!(expected[0].is_none() && expected[2].is_none());
    assert!([1, 3, 4, 5, 6].iter().all(|&u| expected[u].is_some()));
    let replica = pipeline.replicate(vec![device; 3]).unwrap();
    assert_close(
        &[expected.clone(), expected],
        &[pipeline.gradient_sum_norms(), replica.gradient_sum_norms()],
        "repartitioned",
    );
    pipeline.reset_gradient_sums();
    assert!(pipeline.gradient_sum_norms().iter().all(Option::is_none));
}

#[test]
fn a_pipeline_measures_update_gains_as_a_stack_does_across_restarts() {
    let device = Default::default();
    let stack = user_stack(6, 16, 4, 3);
    let mut plain = FreezableStack::new(stack.clone().fork(&device));
    let mut pipeline = PipelineConfig::new()
        .with_micro_batches(Some(4))
        .with_balance(Some(vec![3, 2, 2]))
        .init(stack, vec![device; 3], sgd)
        .unwrap();
    plain.set_update_gains(Some(1));
    pipeline.set_update_gains(Some(1));
    let mut optim = sgd();
    let (mut of_plain, mut of_pipeline) = (Vec::new(), Vec::new());
    for step in 0..7u64 {
        // A restart after steps 2 and 4: steps 3 and 5 read the moves
        // since the first and the second snapshot, then take new ones.
        if step == 3 || step == 5 {
            plain.restart_update_gains();
            pipeline.restart_update_gains();
        }
        step_both(&mut plain, &mut optim, &mut pipeline, step);
        of_plain.push(plain.last_update_gains());
        of_pipeline.push(pipeline.last_update_gains());
    }
    assert!(of_plain[0].iter().all(Option::is_none), "no move yet");
    // Every unit with weights from 1 on has a gain (unit 2, a tanh, has none).
    for gains in &of_plain[1..] {
        assert_eq!(gains[0], None, "unit 0 is not measured");
        assert!(gains[1].is_some() && gains[2].is_none(), "{gains:?}");
        assert!(gains[3..].iter().all(Option::is_some), "{gains:?}");
    }
    // Within 1e-3 of the larger.
    assert_each_close(&of_plain, &of_pipeline, "update gains", |a, b| {
        (a - b).abs() <= 1e-3 * a.abs().max(b.abs()).max(1e-9)
    });
}
