//! The default freeze rule's per-layer evidence through the trainer: layers whose updates
//! gain nothing freeze within two checks, layers that carry the signal stay, and a run
//! resumed from a checkpoint decides as the run it continues.

mod common;

use burn::optim::AdamConfig;
use burn::prelude::*;
use burn_elastic_dp::{BatchPolicy, CheckpointConfig, FreezeRule, LayerSpec, TrainerConfig};
use burn_freeze::EvidenceConfig;
use common::{B, Rows, block, block_stack, four_class_rows, loss};

const UNITS: usize = 6;
const WIDTH: usize = 8;
const SAMPLES: usize = 128;
/// Checks every 4 steps; 8 steps an epoch (batch 16 over 128 rows less the
/// carved ones).
const EVERY: usize = 4;

/// The default rule with checks every [`EVERY`] steps, nothing frozen
/// before the held-out loss fell at all.
fn config() -> TrainerConfig {
    let rule = EvidenceConfig::new()
        .with_every_steps(Some(EVERY))
        .with_learned_drop(0.0);
    TrainerConfig::new()
        .with_freeze(FreezeRule::Evidence { rule })
        .with_layers(LayerSpec::PerUnit)
        .with_stages(Some(2))
        .with_batch(BatchPolicy::FixedGlobal { batch: 16 })
        .with_lr(3e-3)
        .with_seed(11)
        .with_held_out(Some(16))
}

/// Block `u` of the stack, its residual branch saturated (`tanh` of a bias
/// of 1000 is exactly 1 in f32, whose derivative is exactly 0): the block
/// adds a constant and gets a zero gradient.
fn dead(u: usize) -> common::Block<B> {
    let mut unit = block(u as u64 + 1, WIDTH);
    let device = Default::default();
    unit.linear.bias = Some(burn::module::Param::from_tensor(Tensor::full([WIDTH], 1000.0, &device)));
    unit
}

/// The stack with the units in `dead_units` saturated.
fn stack(dead_units: &[usize]) -> burn_freeze::LayerStack<common::Types> {
    let mut units: Vec<_> = block_stack(UNITS, WIDTH).into_units();
    for &u in dead_units {
        units[u] = dead(u);
    }
    let last = units.pop().unwrap();
    let first = units.remove(0);
    let stack = burn_freeze::LayerStack::new(first, units, last);
    stack.materialize();
    stack
}

/// Trains `epochs` epochs of `stack` with `config`; per transition, the
/// step it came after and the layer front it moved to.
fn fronts(config: TrainerConfig, stack: burn_freeze::LayerStack<common::Types>, epochs: usize) -> Vec<(usize, usize)> {
    let device: Device<B> = Default::default();
    let mut trainer = config
        .init(stack, vec![device; 2], || AdamConfig::new().init(), loss)
        .unwrap();
    let data = four_class_rows::<WIDTH>(SAMPLES);
    let mut moves = Vec::new();
    for _ in 0..epochs {
        let report = trainer.fit_epoch(&data, &Rows).unwrap();
        moves.extend(report.transitions.iter().map(|t| (t.step, t.frozen_layers)));
    }
    moves
}

#[test]
fn layers_whose_gradient_is_zero_freeze_within_two_checks() {
    let moves = fronts(config(), stack(&[0, 1]), 2);
    // Read at the first check (4 steps), learned at the second: the two
    // dead bottom layers freeze there.
    let (step, front) = moves.first().copied().expect("nothing froze");
    assert_eq!(step, 2 * EVERY, "{moves:?}");
    assert!(front >= 2, "{moves:?}");
}

#[test]
fn layers_that_carry_the_signal_stay_frozen_nowhere() {
    // The two bottom units and the classifier learn; the three between
    // them add a constant. The bottom layer keeps about a third of the
    // loss's decrease: nothing freezes.
    let moves = fronts(config(), stack(&[2, 3, 4]), 2);
    assert!(moves.is_empty(), "{moves:?}");
}
