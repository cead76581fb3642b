//! Fault injection over many seeded runs of the trainer: a panic or error at
//! a chosen phase, stage and micro-batch. Each run recovers (a replica that
//! fails leaves the group, the step is redone where nothing of it was
//! applied) and then matches a clean run, or ends with an error naming the
//! place; none hangs, and no thread is left behind.

use std::sync::mpsc;
use std::time::Duration;

use burn::data::dataloader::batcher::Batcher;
use burn::data::dataset::InMemDataset;
use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::AdamConfig;
use burn::prelude::*;
use burn_elastic_dp::{BatchPolicy, CostModel, FreezeRule, ReplicaConfig, TrainerConfig};
use burn_freeze::LayerStack;
use burn_freeze::fault::{self, Fault, Phase};
use burn_pipe::fault::{BACKWARD, FORWARD, REPARTITION, REPLICATE, STEP};

/// The phases drawn from (the order fixes the seeded draws).
const PHASES: [Phase; 8] = [
    FORWARD,
    BACKWARD,
    STEP,
    burn_elastic_dp::fault::ALL_REDUCE,
    Phase::CACHE_READ,
    Phase::CACHE_WRITE,
    REPARTITION,
    REPLICATE,
];
use burn_pipe::PipelineConfig;

mod common;

use common::{B, Types, block, loss};
const WIDTH: usize = 8;

fn stack() -> LayerStack<Types> {
    let stack = LayerStack::new(
        block(1, WIDTH),
        (2..8).map(|u| block(u, WIDTH)).collect(),
        block(8, WIDTH),
    );
    stack.materialize();
    stack
}

type Item = ([f32; WIDTH], i64);

fn dataset() -> InMemDataset<Item> {
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 40) as f32 / (1u64 << 24) as f32
    };
    InMemDataset::new(
        (0..64)
            .map(|_| {
                let x: [f32; WIDTH] = std::array::from_fn(|_| 2.0 * next() - 1.0);
                let y = i64::from(x[0] > x[1]) + 2 * i64::from(x[2] > 0.0);
                (x, y)
            })
            .collect(),
    )
}

#[derive(Clone)]
struct Points;
impl Batcher<B, Item, (Tensor<B, 2>, Tensor<B, 1, Int>)> for Points {
    fn batch(&self, items: Vec<Item>, device: &Device<B>) -> (Tensor<B, 2>, Tensor<B, 1, Int>) {
        let n = items.len();
        let x: Vec<f32> = items.iter().flat_map(|(x, _)| *x).collect();
        let y: Vec<i64> = items.iter().map(|(_, y)| *y).collect();
        (
            Tensor::<B, 1>::from_data(TensorData::new(x, [n * WIDTH]), device).reshape([n, WIDTH]),
            Tensor::from_data(TensorData::new(y, [n]), device),
        )
    }
}

struct Collect(Vec<f32>);
impl<Be: Backend> ModuleVisitor<Be> for Collect {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<Be, D>>) {
        self.0
            .extend(param.val().to_data().to_vec::<f32>().unwrap());
    }
}

fn weights(stack: &LayerStack<Types>) -> Vec<f32> {
    let mut collect = Collect(Vec::new());
    stack.first().visit(&mut collect);
    stack.middle().iter().for_each(|u| u.visit(&mut collect));
    stack.last().visit(&mut collect);
    collect.0
}

/// K=2, R=2 on 4 devices, then K=1, R=4 once 4 units are frozen (cached);
/// waits bounded at 5 s.
fn config() -> TrainerConfig {
    TrainerConfig::new()
        .with_freeze(FreezeRule::Fronts {
            layers: vec![0, 4, 6],
        })
        .with_stages(Some(2))
        .with_batch(BatchPolicy::FixedGlobal { batch: 16 })
        .with_lr(1e-2)
        .with_costs(CostModel::Parameters {
            frozen_factor: 1.0 / 3.0,
        })
        .with_replicas(
            ReplicaConfig::new().with_timeout_ms(5_000).with_pipeline(
                PipelineConfig::new()
                    .with_micro_batches(Some(2))
                    .with_timeout_ms(5_000),
            ),
        )
}

/// Trains 3 epochs; the final weights, or the error's message.
fn run() -> Result<Vec<f32>, String> {
    run_with(config())
}

/// [`run`] with `config`.
fn run_with(config: TrainerConfig) -> Result<Vec<f32>, String> {
    let device: Device<B> = Default::default();
    let mut trainer = config
        .init(stack(), vec![device; 4], || AdamConfig::new().init(), loss)
        .map_err(|e| e.to_string())?;
    let data = dataset();
    for _ in 0..3 {
        trainer
            .fit_epoch(&data, &Points)
            .map_err(|e| e.to_string())?;
    }
    Ok(weights(
        &trainer.to_layer_stack().map_err(|e| e.to_string())?,
    ))
}

/// Threads of this process (Linux), or `None` elsewhere.
fn threads() -> Option<usize> {
    std::fs::read_dir("/proc/self/task").ok().map(|d| d.count())
}

/// A small deterministic generator for the fault choices.
struct Rng(u64);
impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

#[test]
fn injected_faults_recover_or_fail_with_a_named_error_and_never_hang() {
    let clean = run().expect("the clean run trains");
    let baseline_threads = threads();
    let mut rng = Rng(2026);
    let (mut runs, mut fired, mut recovered, mut errored, mut hung) = (0, 0, 0, 0, 0);
    for _ in 0..40 {
        let phase = PHASES[rng.below(PHASES.len() as u64) as usize];
        // Only faults on worker threads may panic (their panics become
        // errors); the others run on the caller's thread and return errors.
        let on_stage = [FORWARD, BACKWARD, burn_elastic_dp::fault::ALL_REDUCE].contains(&phase);
        let on_worker = on_stage;
        let fault = Fault {
            phase,
            stage: on_stage.then(|| rng.below(2) as usize),
            micro_batch: [FORWARD, BACKWARD]
                .contains(&phase)
                .then(|| rng.below(2) as usize),
            panic: on_worker && rng.below(2) == 0,
            stall: None,
        };
        runs += 1;
        fault::arm(fault);
        let (tx, rx) = mpsc::channel();
        let worker = std::thread::spawn(move || {
            let _ = tx.send(run());
        });
        let outcome = rx.recv_timeout(Duration::from_secs(120));
        let still_armed = fault::disarm();
        match outcome {
            Err(_) => {
                hung += 1;
                continue;
            }
            Ok(result) => {
                worker.join().expect("the run's thread ends");
                if still_armed {
                    // The point was never reached: a clean run.
                    assert_eq!(result.as_ref().ok(), Some(&clean), "{fault:?}");
                    continue;
                }
                fired += 1;
                match result {
                    Ok(weights) => {
                        recovered += 1;
                        let worst = weights
                            .iter()
                            .zip(&clean)
                            .map(|(a, b)| (a - b).abs())
                            .fold(0.0f32, f32::max);
                        // Fewer replicas sum in another order; nothing is
                        // lost or applied twice.
                        assert!(worst <= 1e-4, "{fault:?}: recovered {worst} away");
                    }
                    Err(message) => {
                        errored += 1;
                        assert!(
                            message.contains(phase.name()) || message.contains("panicked"),
                            "{fault:?}: the error does not name the place: {message}"
                        );
                    }
                }
            }
        }
    }
    println!(
        "fault injection: runs {runs}, faults fired {fired}, recovered {recovered}, errored {errored}, hung {hung}"
    );
    assert_eq!(hung, 0);
    assert!(recovered > 0 && errored > 0, "both outcomes are exercised");
    if let Some(before) = baseline_threads {
        // Detached threads (collective registrations, replica workers) send
        // their result before they exit: on a loaded machine the last of
        // them may still be exiting here. Wait for them, bounded; a thread
        // left behind never exits and still fails.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let mut after = threads().unwrap_or(0);
        while after > before && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(20));
            after = threads().unwrap_or(0);
        }
        assert!(after <= before, "threads left behind: {before} -> {after}");
    }

    // A replica stuck in its own computation (3 s in its first forward,
    // against a 1 s bound): the step returns at the bound, the stuck replica
    // is left behind, the survivors redo the step, and the run ends at the
    // clean run's weights. (Last: the stuck thread outlives the run by the
    // rest of its stall, which the thread count above would see.)
    fault::arm(Fault {
        phase: FORWARD,
        stage: Some(0),
        micro_batch: Some(0),
        panic: false,
        stall: Some(Duration::from_secs(3)),
    });
    let stalled = run_with(
        config().with_replicas(
            ReplicaConfig::new().with_timeout_ms(1_000).with_pipeline(
                PipelineConfig::new()
                    .with_micro_batches(Some(2))
                    .with_timeout_ms(5_000),
            ),
        ),
    );
    assert!(!fault::disarm(), "the stall fired");
    let weights = stalled.expect("the survivors finish the run");
    let worst = weights
        .iter()
        .zip(&clean)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    println!(
        "a replica stuck 3 s left behind at the 1 s bound: the survivors end {worst:e} from the clean run"
    );
    assert!(worst <= 1e-4, "the survivors ended {worst} away");
}
