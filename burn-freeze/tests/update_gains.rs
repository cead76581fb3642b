//! Update gains (loss-change allocation): each unit's `-<g_t, W_t - W_s>`, read from a later
//! step's gradient against the weights of the snapshot (the first step, or the first after a
//! restart), adds up to the first-order change of that step's loss since the snapshot.

mod common;

use burn::optim::{GradientsParams, Optimizer, SgdConfig};
use burn::prelude::*;
use burn::tensor::Distribution;
use burn_freeze::testing::Residual;
use burn_freeze::{FreezableStack, FreezeFront, LayerStack, StackMarker, TrainableUnits};
use common::B;

type Types = StackMarker<B, Residual<B>, Residual<B>, Residual<B>>;

fn stack() -> LayerStack<Types> {
    let device = Default::default();
    B::seed(&device, 5);
    let unit = || Residual::<B> {
        linear: burn::nn::LinearConfig::new(6, 6).init(&device),
    };
    let stack = LayerStack::new(unit(), vec![unit(), unit()], unit());
    stack.materialize();
    stack
}

fn batch(seed: u64) -> Tensor<B, 2> {
    let device = Default::default();
    B::seed(&device, seed);
    Tensor::random([16, 6], Distribution::Normal(0.0, 1.0), &device)
}

fn loss(stack: &FreezableStack<Types>, x: Tensor<B, 2>) -> Tensor<B, 1> {
    stack.forward(x).powi_scalar(2).mean()
}

#[test]
fn the_gains_add_up_to_the_first_order_change_of_the_next_batch_loss() {
    let mut stack = FreezableStack::new(stack());
    stack.freeze_to(1).unwrap();
    stack.set_update_gains(Some(0));
    let mut optim = SgdConfig::new().init::<B, TrainableUnits<Types>>();
    let lr = 1e-4;
    // Step 1: no move yet to measure.
    let grads: GradientsParams = stack.gradients(loss(&stack, batch(1)).backward());
    assert!(stack.last_update_gains().iter().all(Option::is_none));
    let before = stack.clone();
    stack.map_trainable(|units| optim.step(lr, units, grads));
    // Step 2's batch: the loss before and after step 1's move.
    let x = batch(2);
    let (old, new): (f32, f32) = (
        loss(&before, x.clone()).into_scalar(),
        loss(&stack, x.clone()).into_scalar(),
    );
    let _ = stack.gradients(loss(&stack, x).backward());
    let gains = stack.last_update_gains();
    assert_eq!(gains[0], None, "a frozen unit has no gain");
    assert!(gains[1..].iter().all(Option::is_some));
    let total: f64 = gains.iter().flatten().sum();
    let decrease = (old - new) as f64;
    assert!(decrease > 0.0, "step 1 lowered the loss: {old} -> {new}");
    assert!(
        (total - decrease).abs() < 0.05 * decrease,
        "gains {total} against the decrease {decrease} ({gains:?})"
    );
    // Stopped: no gain, no snapshot.
    stack.set_update_gains(None);
    assert!(stack.last_update_gains().iter().all(Option::is_none));
}

/// One step on `batch(seed)`: its gains, then the optimizer's move.
fn step(
    stack: &mut FreezableStack<Types>,
    optim: &mut impl Optimizer<TrainableUnits<Types>, B>,
    seed: u64,
) -> f64 {
    let grads: GradientsParams = stack.gradients(loss(stack, batch(seed)).backward());
    let total = stack.last_update_gains().iter().flatten().sum();
    stack.map_trainable(|units| optim.step(1e-4, units, grads));
    total
}

/// The first-order change of `batch(seed)`'s loss from `before` to `now`.
fn decrease(before: &FreezableStack<Types>, now: &FreezableStack<Types>, seed: u64) -> f64 {
    let old: f32 = loss(before, batch(seed)).into_scalar();
    let new: f32 = loss(now, batch(seed)).into_scalar();
    (old - new) as f64
}

#[test]
fn the_gains_measure_the_moves_since_the_last_restart() {
    let mut stack = FreezableStack::new(stack());
    stack.set_update_gains(Some(0));
    let mut optim = SgdConfig::new().init::<B, TrainableUnits<Types>>();
    let start = stack.clone();
    step(&mut stack, &mut optim, 1);
    step(&mut stack, &mut optim, 2);
    // Step 3 reads the moves of steps 1 and 2 together, not step 2's alone.
    let moved_twice = decrease(&start, &stack, 3);
    let total = step(&mut stack, &mut optim, 3);
    assert!(moved_twice > 0.0);
    assert!(
        (total - moved_twice).abs() < 0.05 * moved_twice,
        "gains {total} against the two moves' decrease {moved_twice}"
    );
    // A restart: step 4 still reads against the first snapshot (3 moves),
    // then takes its own, which step 5 reads step 4's move against.
    stack.restart_update_gains();
    let moved_thrice = decrease(&start, &stack, 4);
    let before_4 = stack.clone();
    let total = step(&mut stack, &mut optim, 4);
    assert!((total - moved_thrice).abs() < 0.05 * moved_thrice);
    let moved_once = decrease(&before_4, &stack, 5);
    let total = step(&mut stack, &mut optim, 5);
    assert!(
        (total - moved_once).abs() < 0.05 * moved_once.abs(),
        "gains {total} against step 4's decrease {moved_once}"
    );
}
