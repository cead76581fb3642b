//! AutoFreeze policies on worked examples, and gradient statistics read from
//! a real step's gradients.

mod common;

use burn::nn::loss::CrossEntropyLossConfig;
use burn_freeze::{
    AlphaArgmin, AlphaArgminConfig, ArgminStatistic, AutoFreeze, ChangeRate, ChangeRateConfig,
    FixedSchedule, FreezableStack, FreezeFront, FreezePolicy, FreezeState, GradNorm, LayerMap,
    alpha_front,
};
use common::*;

fn state(frozen: usize, layers: usize, epoch: usize) -> FreezeState {
    FreezeState {
        frozen_layers: frozen,
        num_layers: layers,
        epoch,
        step: 0,
    }
}

#[test]
fn alpha_closed_form_matches_the_paper() {
    let third: Vec<usize> = (0..10).map(|t| alpha_front(12, 1.0 / 3.0, t)).collect();
    assert_eq!(third, [0, 4, 7, 9, 10, 11, 11, 12, 12, 12]);
    let half: Vec<usize> = (0..5).map(|t| alpha_front(12, 0.5, t)).collect();
    assert_eq!(half, [0, 6, 9, 11, 12]);
}

#[test]
fn fixed_schedule_drives_the_front_epoch_by_epoch() {
    let mut schedule = FixedSchedule::alpha(12, 1.0 / 3.0);
    let mut frozen = 0;
    let mut fronts = vec![frozen];
    for epoch in 0..9 {
        frozen = schedule.after_epoch(state(frozen, 12, epoch)).unwrap();
        fronts.push(frozen);
    }
    assert_eq!(fronts, [0, 4, 7, 9, 10, 11, 11, 12, 12, 12]);
    let explicit = FixedSchedule::Fronts(vec![0, 2, 5]);
    assert_eq!(
        (0..5).map(|t| explicit.front(t)).collect::<Vec<_>>(),
        [0, 2, 5, 5, 5]
    );
}

#[test]
fn paper_rule_takes_the_smaller_of_alpha_bound_and_argmin() {
    let rule = AlphaArgmin::new(AlphaArgminConfig::new().with_alpha(1.0 / 3.0)).unwrap();
    let norms = |min_at: usize| -> Vec<Option<f64>> {
        (0..12)
            .map(|l| Some(if l == min_at { 0.5 } else { 1.0 + l as f64 }))
            .collect()
    };
    // Smallest gradient deep in the stack: the alpha bound limits the step.
    assert_eq!(rule.decide(0, 12, &norms(11)), 4);
    assert_eq!(rule.decide(4, 12, &norms(11)), 7);
    // Smallest gradient early: freeze through it.
    assert_eq!(rule.decide(0, 12, &norms(1)), 2);
    // Frozen layers are out of the argmin: min among active layers 4.. is layer 4.
    assert_eq!(rule.decide(4, 12, &norms(0)), 5);
    // Following the bound alone from 0 gives the iterative alpha sequence.
    let mut front = 0;
    let mut seq = vec![0];
    for _ in 0..7 {
        front = rule.decide(front, 12, &norms(11));
        seq.push(front);
    }
    assert_eq!(seq, [0, 4, 7, 9, 10, 11, 12, 12]);
}

#[test]
fn paper_rule_sums_norms_over_the_epoch() {
    let mut rule = AlphaArgmin::new(
        AlphaArgminConfig::new()
            .with_alpha(0.5)
            .with_statistic(ArgminStatistic::SummedStepNorms),
    )
    .unwrap();
    let s = state(0, 4, 0);
    let n = |l2: f64| Some(GradNorm { l1: l2, l2 });
    // Step 1 alone would pick layer 0; over the epoch layer 1 is smallest.
    rule.after_step(s, &[n(0.1), n(0.5), n(2.0), n(2.0)]);
    rule.after_step(s, &[n(1.0), n(0.2), n(2.0), n(2.0)]);
    assert_eq!(rule.after_epoch(s), Some(2));
    // A new epoch starts from nothing: no statistics, no move.
    assert_eq!(rule.after_epoch(state(2, 4, 1)), None);
}

#[test]
fn change_rate_rule_evaluates_every_n_steps() {
    let mut rule = ChangeRate::new(ChangeRateConfig::new().with_every_steps(2)).unwrap();
    let s = state(0, 3, 0);
    let n = |v: [f64; 3]| v.map(|l1| Some(GradNorm { l1, l2: l1 })).to_vec();
    assert_eq!(rule.after_step(s, &n([1.0, 1.0, 1.0])), None);
    assert_eq!(rule.after_step(s, &n([1.0, 1.0, 1.0])), None); // first evaluation: prev = 2,2,2
    assert_eq!(rule.after_step(s, &n([1.0, 0.5, 0.1])), None); // between evaluations
    // cur = 2.0, 1.5, 1.1: rates 0, .25, .45; median .25; layer 0 settled.
    assert_eq!(rule.after_step(s, &n([1.0, 1.0, 1.0])), Some(1));
}

#[test]
fn gradient_norms_come_from_the_steps_own_gradients() {
    let (x, y) = batch(&(0..8).collect::<Vec<_>>(), 4);
    let mut stack = FreezableStack::new(stack(4, 0.0, 9));
    stack.freeze_to(2).unwrap();
    let loss = CrossEntropyLossConfig::new()
        .init(&Default::default())
        .forward(stack.forward(x), y);
    let grads = stack.gradients(loss.backward());
    let norms = stack.last_gradient_norms();
    assert_eq!(norms.len(), 6);
    assert!(norms[..2].iter().all(Option::is_none));
    // Unit 2 is middle unit 1: its weight and bias gradients, by hand.
    let unit = &stack.trainable().1[0];
    let gw = grads.get::<Inner, 2>(unit.linear.weight.id).unwrap();
    let gb = grads
        .get::<Inner, 1>(unit.linear.bias.as_ref().unwrap().id)
        .unwrap();
    let l1 = gw.clone().abs().sum().into_scalar() + gb.clone().abs().sum().into_scalar();
    let l2 = (gw.powi_scalar(2).sum().into_scalar() + gb.powi_scalar(2).sum().into_scalar()).sqrt();
    let n = norms[2].unwrap();
    assert!(
        (n.l1 - l1 as f64).abs() < 1e-5 * n.l1.max(1.0),
        "{n:?} vs {l1}"
    );
    assert!(
        (n.l2 - l2 as f64).abs() < 1e-5 * n.l2.max(1.0),
        "{n:?} vs {l2}"
    );
    assert!(norms[2..].iter().all(|n| n.is_some_and(|n| n.l2 > 0.0)));

    // Layers of two units: a layer's L2 combines its units' norms.
    let map = LayerMap::uniform(1, 2, 2, 6).unwrap();
    let layers = map.layer_norms(&norms);
    let (a, b) = (norms[3].unwrap(), norms[4].unwrap());
    assert!((layers[1].unwrap().l2 - (a.l2 * a.l2 + b.l2 * b.l2).sqrt()).abs() < 1e-9);
    assert_eq!(layers[0], norms[2]); // unit 1 is frozen, unit 2 carries layer 0
}

#[test]
fn auto_freeze_moves_a_stack_by_layers() {
    let mut stack = FreezableStack::new(stack(4, 0.0, 10));
    let map = LayerMap::uniform(1, 2, 2, 6).unwrap();
    let mut auto = AutoFreeze::new(FixedSchedule::Fronts(vec![0, 1, 2]), map);
    assert_eq!(auto.after_epoch(&mut stack).unwrap(), Some(1));
    assert_eq!(stack.front(), 3); // embedding + layer 0's two units
    assert_eq!(auto.after_epoch(&mut stack).unwrap(), Some(2));
    assert_eq!(stack.front(), 5); // the head still trains
    assert_eq!(auto.after_epoch(&mut stack).unwrap(), None);
    // A map for another stack is refused.
    let mut other = FreezableStack::new(common::stack(2, 0.0, 10));
    assert!(auto.after_epoch(&mut other).is_err());
    assert_eq!(other.front(), 0);
}
