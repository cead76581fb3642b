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
/// Checks every 4 steps; 7 steps an epoch (batches of 16 over the 112 rows
/// left once 16 are carved for the held-out loss).
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
    let (first, middle, last) = block_stack(UNITS, WIDTH).into_parts();
    let mut units: Vec<_> = std::iter::once(first).chain(middle).chain([last]).collect();
    for &u in dead_units {
        units[u] = dead(u);
    }
    let last = units.pop().expect("units");
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
    // The first step measures no gain (no move before it): the first check
    // with four gains is the second (step 8), the two dead bottom layers
    // are quiet there and at the next check, and freeze.
    let (step, front) = moves.first().copied().expect("nothing froze");
    assert_eq!(step, 3 * EVERY, "{moves:?}");
    assert!(front >= 2, "{moves:?}");
}

#[test]
fn layers_that_carry_the_signal_stay_frozen_nowhere() {
    // Only the bottom unit learns (the units above it, the classifier
    // too, add a constant): it carries the whole decrease, and nothing
    // freezes while the loss falls.
    let moves = fronts(config(), stack(&[1, 2, 3, 4, 5]), 2);
    assert!(moves.is_empty(), "{moves:?}");
}

/// [`Rows`] that panics on its `crash_at`-th batch (a crash mid-run).
struct Crashing {
    calls: std::sync::atomic::AtomicUsize,
    crash_at: usize,
}

impl Crashing {
    fn at(crash_at: usize) -> Self {
        Self {
            calls: std::sync::atomic::AtomicUsize::new(0),
            crash_at,
        }
    }
}

impl burn::data::dataloader::batcher::Batcher<B, ([f32; WIDTH], i64), (Tensor<B, 2>, Tensor<B, 1, Int>)>
    for Crashing
{
    fn batch(&self, items: Vec<([f32; WIDTH], i64)>, device: &Device<B>) -> (Tensor<B, 2>, Tensor<B, 1, Int>) {
        let call = self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
        assert!(call != self.crash_at, "simulated crash");
        burn::data::dataloader::batcher::Batcher::batch(&Rows, items, device)
    }
}

/// A directory of its own for this process's run `name`.
fn scratch(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("burn-elastic-dp-evidence-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

#[test]
fn a_resumed_run_decides_as_the_run_it_continues() {
    let device: Device<B> = Default::default();
    let data = four_class_rows::<WIDTH>(SAMPLES);
    let checkpointed = |dir: &std::path::Path| {
        config().with_checkpoint(Some(CheckpointConfig::new(dir.to_path_buf()).with_every_steps(3)))
    };
    // Per step its loss, until 3 epochs are done (or the batcher panics);
    // the front at the end.
    let run = |trainer: &mut burn_elastic_dp::Trainer<_>, batcher: &Crashing| {
        let mut seen = Vec::new();
        let done = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            while trainer.epoch() < 3 {
                trainer
                    .fit_epoch_observed(&data, batcher, |step| seen.push(step.loss))
                    .unwrap();
            }
        }));
        (seen, done.is_ok().then(|| trainer.front()))
    };
    let never = Crashing::at(usize::MAX);
    let dir = scratch("reference");
    let mut trainer = checkpointed(&dir)
        .init(stack(&[0, 1]), vec![device; 2], || AdamConfig::new().init(), loss)
        .unwrap();
    let (expected, front) = run(&mut trainer, &never);
    let front = front.expect("the reference ran to its end");
    assert!(front >= 2, "the reference froze nothing");
    drop(trainer);

    // A crash before step 11: batches 1-4 are steps 1-4, batch 5 the
    // held-out one (fetched at the first check), 6-11 steps 5-10.
    // Checkpoints after steps 3, 6, 7 (the epoch's end) and 9: the last is
    // inside a window of the rule.
    let dir = scratch("crashed");
    let mut trainer = checkpointed(&dir)
        .init(stack(&[0, 1]), vec![device; 2], || AdamConfig::new().init(), loss)
        .unwrap();
    let (before, finished) = run(&mut trainer, &Crashing::at(12));
    assert!(finished.is_none(), "the run was to crash");
    assert_eq!(before, expected[..10]);
    drop(trainer);
    let (mut resumed, path) = burn_elastic_dp::Trainer::resume(
        stack(&[0, 1]),
        vec![device; 2],
        checkpointed(&dir),
        || AdamConfig::new().init(),
        loss,
    )
    .unwrap();
    assert!(path.ends_with(format!("step-{:012}", 9)), "{path:?}");
    let (after, resumed_front) = run(&mut resumed, &never);
    assert_eq!(after, expected[9..], "the resumed run's losses");
    assert_eq!(resumed_front, Some(front));
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(scratch("reference"));
}
