//! The freeze front moves down (thaw): AutoFreeze thaws when a schedule goes
//! down; a stack frozen up and then thawed trains as plain Burn with the
//! same fronts applied by hand; an unfreeze above the front is refused and
//! changes nothing; thawed units start with no gradient sum; the paper's
//! alpha schedule never thaws.

mod common;

use burn::module::{Module, ModuleVisitor, Param};
use burn::nn::loss::CrossEntropyLossConfig;
use burn::optim::{AdamConfig, Optimizer};
use burn::prelude::*;
use burn_freeze::plumbing::retain_optimizer_state;
use burn_freeze::testing::PlainFronts;
use burn_freeze::{
    AutoFreeze, FixedSchedule, FreezableStack, FreezeError, FreezeFront, FreezePolicy, FreezeState,
    LayerMap, TrainableUnits, UnitRange,
};
use common::*;

const LR: f64 = 1e-2;

#[test]
fn auto_freeze_thaws_when_a_schedule_goes_down() {
    let mut stack = FreezableStack::new(stack(4, 0.0, 31));
    // Layers of two units after the embedding: layer l ends at unit 2l + 3.
    let map = LayerMap::uniform(1, 2, 2, 6).unwrap();
    let mut auto = AutoFreeze::new(FixedSchedule::Fronts(vec![0, 2, 1, 0, 2]), map);
    let mut moves = Vec::new();
    for _ in 0..4 {
        let moved = auto.after_epoch(&mut stack).unwrap();
        moves.push((moved, stack.front(), auto.frozen_layers()));
    }
    assert_eq!(
        moves,
        vec![
            (Some(2), 5, 2),
            (Some(1), 3, 1), // thawed: units 3 and 4 train again
            (Some(0), 0, 0), // layer 0 and the embedding too
            (Some(2), 5, 2),
        ]
    );
    // The last entry holds: no move.
    assert_eq!(auto.after_epoch(&mut stack).unwrap(), None);
}

#[test]
fn unfreeze_above_the_front_is_refused_and_changes_nothing() {
    let mut stack = FreezableStack::new(stack(3, 0.0, 32));
    stack.freeze_to(2).unwrap();
    let params = stack.trainable_params();
    let refused = FreezeFront::unfreeze_to(&mut stack, 4);
    assert_eq!(
        refused,
        Err(FreezeError::WouldFreeze {
            frozen: 2,
            requested: 4
        })
    );
    assert_eq!((stack.front(), stack.trainable_params()), (2, params));
    // Down to the same front: nothing to do.
    stack.unfreeze_to(2).unwrap();
    assert_eq!((stack.front(), stack.trainable_params()), (2, params));
    stack.unfreeze_to(0).unwrap();
    assert_eq!(stack.front(), 0);
    assert!(stack.trainable_params() > params);
}

#[test]
fn thawed_units_start_with_no_gradient_sum_and_no_norm() {
    let loss_fn = CrossEntropyLossConfig::new().init(&Default::default());
    let mut stack = FreezableStack::new(stack(3, 0.0, 33));
    stack.set_gradient_sums(true);
    let mut optim = AdamConfig::new().init::<B, TrainableUnits<Types>>();
    let mut step = |stack: &mut FreezableStack<Types>, seed: u64| {
        let ids: Vec<u64> = (seed..seed + 6).collect();
        let (x, y) = batch(&ids, 4);
        let loss = loss_fn.forward(stack.forward(x), y);
        let grads = stack.gradients(loss.backward());
        stack.map_trainable(|units| optim.step(LR, units, grads));
    };
    step(&mut stack, 0);
    step(&mut stack, 6);
    stack.freeze_to(3).unwrap();
    stack.unfreeze_to(1).unwrap();
    let sums = stack.gradient_sum_norms();
    assert_eq!(sums[0], None, "still frozen");
    assert_eq!((sums[1], sums[2]), (None, None), "thawed: no sum yet");
    assert!(
        sums[3].is_some() && sums[4].is_some(),
        "units that kept training"
    );
    let norms = stack.last_gradient_norms();
    assert_eq!((norms[1], norms[2]), (None, None));
    // One step later the thawed units' sums are that step's gradients.
    step(&mut stack, 12);
    let (sums, norms) = (stack.gradient_sum_norms(), stack.last_gradient_norms());
    for unit in 1..3 {
        let (sum, norm) = (sums[unit].unwrap(), norms[unit].unwrap());
        assert!(
            (sum.l2 - norm.l2).abs() <= 1e-6 * norm.l2,
            "unit {unit}: sum {sum:?}, step {norm:?}"
        );
    }
}

#[test]
fn freezing_up_then_down_trains_as_plain_burn_with_the_fronts_by_hand() {
    let loss_fn = CrossEntropyLossConfig::new().init(&Default::default());
    let base = stack(4, 0.0, 34);
    let mut stack = FreezableStack::new(base.clone());
    let mut optim = AdamConfig::new().init::<B, TrainableUnits<Types>>();
    let mut plain = PlainFronts::new(base.clone(), AdamConfig::new().init());
    // Per epoch the unit front: up, down past where it was, up again.
    for (epoch, front) in [0usize, 3, 5, 1, 2].into_iter().enumerate() {
        if front >= stack.front() {
            stack.freeze_to(front).unwrap();
        } else {
            stack.unfreeze_to(front).unwrap();
        }
        // The stack's optimizer keeps only the trainable units' state: a
        // frozen unit's is dropped, so a thawed one starts fresh.
        optim = retain_optimizer_state(optim, stack.trainable());
        plain.set_front(front);
        for step in 0..3u64 {
            let first = (epoch as u64 * 3 + step) * 6;
            let ids: Vec<u64> = (first..first + 6).collect();
            let (x, y) = batch(&ids, 4);
            let loss = loss_fn.forward(stack.forward(x.clone()), y.clone());
            let expected = plain.step(LR, x, |logits| loss_fn.forward(logits, y));
            let value = loss.clone().into_scalar();
            assert!(
                (value - expected).abs() <= 1e-6,
                "epoch {epoch}: {value} against {expected}"
            );
            let grads = stack.gradients(loss.backward());
            stack.map_trainable(|units| optim.step(LR, units, grads));
        }
    }
    let trained = stack.to_layer_stack();
    let reference = plain.to_layer_stack();
    let pairs = [
        (
            weights::<B, _>(trained.first()),
            weights::<B, _>(reference.first()),
        ),
        (
            weights::<B, _>(trained.last()),
            weights::<B, _>(reference.last()),
        ),
    ];
    let middles = trained.middle().iter().zip(reference.middle());
    let middles = middles.map(|(a, b)| (weights::<B, _>(a), weights::<B, _>(b)));
    for (a, b) in pairs.into_iter().chain(middles) {
        for (a, b) in a.iter().zip(&b) {
            a.assert_approx_eq::<f32>(b, burn::tensor::Tolerance::absolute(1e-6));
        }
    }
    // Training moved every unit (each trained in some epoch).
    assert!(!bit_identical(
        &weights::<B, _>(base.first()),
        &weights::<B, _>(trained.first())
    ));
}

#[test]
fn the_alpha_schedule_never_returns_a_front_below_the_current_one() {
    let state = |frozen, epoch| FreezeState {
        frozen_layers: frozen,
        num_layers: 4,
        epoch,
        step: 0,
    };
    // alpha = 1.5: (1 - alpha)^T alternates in sign, the closed form goes
    // 0, 4 (clamped), 3, ...: the policy holds the front at 4.
    let mut alpha = FixedSchedule::alpha(4, 1.5);
    assert_eq!(alpha.after_epoch(state(0, 0)), Some(4));
    assert_eq!(alpha.front(2), 3);
    assert_eq!(alpha.after_epoch(state(4, 1)), Some(4));
    // A list of fronts may go down.
    let mut fronts = FixedSchedule::Fronts(vec![0, 3, 1]);
    assert_eq!(fronts.after_epoch(state(3, 1)), Some(1));
}

/// Whether each float parameter requires gradients.
struct RequireGrad(Vec<bool>);

impl ModuleVisitor<B> for RequireGrad {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        self.0.push(param.val().is_require_grad());
    }
}

#[test]
fn units_moved_to_a_device_while_frozen_train_again_when_thawed() {
    // A pipeline moves frozen units (a new replica, a repartition): Burn's
    // `to_device` on the inner backend drops the `require_grad` flag, and a
    // thawed unit would then never get a gradient.
    let mut range = UnitRange::whole(stack(3, 0.0, 35));
    range.freeze_to(4);
    let mut range = range.fork(&Default::default());
    assert_eq!(range.unfreeze_to(0), 4);
    let mut flags = RequireGrad(Vec::new());
    range.trainable().visit(&mut flags);
    assert_eq!(flags.0.len(), 10, "5 units of weight and bias");
    assert!(flags.0.iter().all(|&g| g), "{:?}", flags.0);
}
