//! The argmin of the epoch's accumulated gradient (the paper's code) against
//! the summed per-step norms, and the running sums that feed it checked
//! against gradients summed by hand.

mod common;

use burn::module::Module;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::nn::{Initializer, Linear, LinearConfig};
use burn::optim::{GradientsParams, Optimizer, SgdConfig};
use burn::prelude::*;
use burn_freeze::{
    AlphaArgmin, AlphaArgminConfig, ArgminStatistic, AutoFreeze, FreezableStack, FreezeFront,
    FreezePolicy, LayerMap, LayerStack, StackMarker, TrainableUnits,
};
use common::{B, Inner};

/// A bare linear map `[batch, in] -> [batch, out]`.
#[derive(Module, Debug)]
pub struct Lin<B: Backend> {
    linear: Linear<B>,
}

impl<B: Backend> Lin<B> {
    fn run(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        self.linear.forward(x)
    }
}

burn_freeze::unit!(Lin<B>: Tensor<B, 2> => Tensor<B, 2>, via run);

type LinTypes = StackMarker<B, Lin<B>, Lin<B>, Lin<B>>;

/// `y = W2 (W1 W0 x + b1) + b2`: unit 0 has no bias and tiny weights.
fn linear_stack() -> LayerStack<LinTypes> {
    let device = Default::default();
    B::seed(&device, 17);
    let lin = |i, o, bias: bool| Lin::<B> {
        linear: LinearConfig::new(i, o).with_bias(bias).init(&device),
    };
    let first = Lin::<B> {
        linear: LinearConfig::new(16, 4)
            .with_bias(false)
            .with_initializer(Initializer::Constant { value: 0.001 })
            .init(&device),
    };
    let stack = LayerStack::new(first, vec![lin(4, 4, true)], lin(4, 2, true));
    stack.materialize();
    stack
}

fn argmin_rule(statistic: ArgminStatistic) -> AlphaArgmin {
    AlphaArgmin::new(
        AlphaArgminConfig::new()
            .with_alpha(1.0)
            .with_statistic(statistic),
    )
    .unwrap()
}

/// The loss `sum(y)` on `x` and on `-x`: every weight gradient of units 0
/// and 1 flips sign between the two steps (so unit 0's, with no bias, sums
/// to exactly 0), while the biases' gradients (units 1 and 2) do not.
#[test]
fn cancelling_steps_give_a_zero_accumulated_norm_and_another_front() {
    let device = Default::default();
    let mut stack = FreezableStack::new(linear_stack());
    let map = LayerMap::per_unit(3);
    let mut accumulated = AutoFreeze::new(argmin_rule(ArgminStatistic::AccumulatedGradient), map);
    let mut summed = AutoFreeze::new(
        argmin_rule(ArgminStatistic::SummedStepNorms),
        LayerMap::per_unit(3),
    );
    accumulated.prepare(&mut stack);
    assert!(!summed.policy().needs_gradient_sums());
    let mut step_norms = [0.0f64; 3];
    for sign in [1.0, -1.0] {
        let x = Tensor::<B, 2>::ones([1, 16], &device).mul_scalar(100.0 * sign);
        let loss = stack.forward(x).sum();
        let _grads = stack.gradients(loss.backward());
        for (total, norm) in step_norms.iter_mut().zip(stack.last_gradient_norms()) {
            *total += norm.unwrap().l2;
        }
        // No optimizer step: the weights stay, so the gradients cancel exactly.
        assert_eq!(accumulated.after_step(&mut stack).unwrap(), None);
        assert_eq!(summed.after_step(&mut stack).unwrap(), None);
    }
    let sums = stack.gradient_sum_norms();
    assert_eq!(sums[0].unwrap().l2, 0.0, "unit 0's two gradients cancel");
    assert!(
        sums[1].unwrap().l2 > 0.1 && sums[2].unwrap().l2 > 0.1,
        "{sums:?}"
    );
    // Per step, unit 0's gradient (scaled by |x| = 400) is the largest.
    assert!(
        step_norms[0] > 10.0 * step_norms[1].max(step_norms[2]),
        "{step_norms:?}"
    );

    let mut other = stack.clone();
    let by_steps = summed.after_epoch(&mut other).unwrap().unwrap();
    assert!(
        by_steps >= 2,
        "summed step norms freeze through unit 1 or 2"
    );
    assert_eq!(accumulated.after_epoch(&mut stack).unwrap(), Some(1));
    assert_eq!(stack.front(), 1);
    assert_ne!(by_steps, 1);
    // The epoch's sums are reset: a new epoch starts from nothing.
    assert!(stack.gradient_sum_norms().iter().all(Option::is_none));
}

/// Several SGD steps on the shared test stack: the plumbing's norms of the
/// summed gradients equal those of the gradients summed by hand; a unit
/// that freezes loses its sum.
#[test]
fn accumulated_norms_equal_the_norm_of_the_gradients_summed_by_hand() {
    let device: Device<B> = Default::default();
    let mut stack = FreezableStack::new(common::stack(3, 0.0, 23));
    stack.set_gradient_sums(true);
    let mut optim = SgdConfig::new().init::<B, TrainableUnits<common::Types>>();
    let ce = CrossEntropyLossConfig::new().init(&device);
    let unit = stack.trainable().1[1].linear.clone(); // unit 2
    let (w_id, b_id) = (unit.weight.id, unit.bias.as_ref().unwrap().id);
    let mut hand_w: Option<Tensor<Inner, 2>> = None;
    let mut hand_b: Option<Tensor<Inner, 1>> = None;
    let mut step_norms = 0.0;
    for step in 0..4u64 {
        let ids: Vec<u64> = (step * 6..step * 6 + 6).collect();
        let (x, y) = common::batch(&ids, 3);
        let loss = ce.forward(stack.forward(x), y);
        let grads: GradientsParams = stack.gradients(loss.backward());
        let gw = grads.get::<Inner, 2>(w_id).unwrap();
        let gb = grads.get::<Inner, 1>(b_id).unwrap();
        step_norms += stack.last_gradient_norms()[2].unwrap().l2;
        hand_w = Some(hand_w.map_or(gw.clone(), |s| s + gw));
        hand_b = Some(hand_b.map_or(gb.clone(), |s| s + gb));
        stack.map_trainable(|units| optim.step(0.5, units, grads));
    }
    let (hw, hb) = (hand_w.unwrap(), hand_b.unwrap());
    let l1 = hw.clone().abs().sum().into_scalar() + hb.clone().abs().sum().into_scalar();
    let l2 = (hw.powi_scalar(2).sum().into_scalar() + hb.powi_scalar(2).sum().into_scalar()).sqrt();
    let sums = stack.gradient_sum_norms();
    let n = sums[2].unwrap();
    assert!((n.l2 - l2 as f64).abs() <= 1e-5 * n.l2, "{n:?} vs {l2}");
    assert!((n.l1 - l1 as f64).abs() <= 1e-5 * n.l1, "{n:?} vs {l1}");
    // Below the sum of the per-step norms: the steps' directions differ.
    assert!(n.l2 < 0.99 * step_norms, "{} vs {step_norms}", n.l2);
    assert!(sums.iter().all(Option::is_some));

    // Freezing drops the frozen units' sums; the others are kept.
    stack.freeze_to(2).unwrap();
    let after = stack.gradient_sum_norms();
    assert!(after[..2].iter().all(Option::is_none));
    assert_eq!(after[2], sums[2]);
    stack.reset_gradient_sums();
    assert!(stack.gradient_sum_norms().iter().all(Option::is_none));
    stack.set_gradient_sums(false);
    let (x, y) = common::batch(&[0, 1], 3);
    let loss = ce.forward(stack.forward(x), y);
    let _ = stack.gradients(loss.backward());
    assert!(stack.gradient_sum_norms().iter().all(Option::is_none));
}

/// The policy state: the accumulated statistic keeps nothing of its own
/// (the sums are the target's), the summed step norms are carried.
#[test]
fn only_the_summed_step_norms_travel_in_the_policy_state() {
    let accumulated = argmin_rule(ArgminStatistic::AccumulatedGradient);
    assert_eq!(accumulated.save_state(), None);
    assert_eq!(
        AlphaArgminConfig::new().statistic,
        ArgminStatistic::AccumulatedGradient
    );
    let mut summed = argmin_rule(ArgminStatistic::SummedStepNorms);
    let state = burn_freeze::FreezeState {
        frozen_layers: 0,
        num_layers: 2,
        epoch: 0,
        step: 1,
    };
    let n = |l2| Some(burn_freeze::GradNorm { l1: l2, l2 });
    summed.after_step(state, &[n(2.0), n(1.0)]);
    let saved = summed.save_state().unwrap();
    let mut resumed = argmin_rule(ArgminStatistic::SummedStepNorms);
    resumed.load_state(saved);
    summed.after_step(state, &[n(0.5), n(3.0)]);
    resumed.after_step(state, &[n(0.5), n(3.0)]);
    assert_eq!(summed.after_epoch(state), Some(1));
    assert_eq!(resumed.after_epoch(state), Some(1));
}
