//! The trainer's learning-rate schedules and its observer's control of the
//! epoch: a scheduled run equals plain Burn with the same scheduler on the
//! same batches; a resumed run continues the scheduler's state; a closure
//! gives each step's rate; an observer stops an epoch that the next call
//! finishes, every sample still trained once.

mod common;

use std::ops::ControlFlow;
use std::sync::{Arc, Mutex};

use burn::data::dataloader::batcher::Batcher;
use burn::data::dataset::{Dataset, InMemDataset};
use burn::lr_scheduler::LrScheduler;
use burn::lr_scheduler::cosine::{CosineAnnealingLrScheduler, CosineAnnealingLrSchedulerConfig};
use burn::module::{ModuleVisitor, Param};
use burn::optim::{AdamConfig, Optimizer};
use burn::prelude::*;
use burn_elastic_dp::{
    BatchPolicy, CheckpointConfig, CostModel, Parts, ReplicaConfig, StepProgress, TrainerConfig,
    TrainerError,
};
use burn_freeze::{FreezableStack, LayerStack, TrainableUnits};
use burn_pipe::PipelineConfig;
use common::{B, Types, block, loss, numbers};

const WIDTH: usize = 6;
const SAMPLES: usize = 48;
const BATCH: usize = 8;

type Item = (usize, Vec<f32>, i64);

fn stack() -> LayerStack<Types> {
    let stack = LayerStack::new(
        block(11, WIDTH),
        (0..3).map(|u| block(12 + u, WIDTH)).collect(),
        block(20, WIDTH),
    );
    stack.materialize();
    stack
}

fn dataset() -> InMemDataset<Item> {
    let x = numbers(5, SAMPLES * WIDTH);
    InMemDataset::new(
        (0..SAMPLES)
            .map(|i| {
                let row = x[i * WIDTH..(i + 1) * WIDTH].to_vec();
                let label = i64::from(row[0] > 0.0) + 2 * i64::from(row[1] + row[2] > 0.0);
                (i, row, label)
            })
            .collect(),
    )
}

fn make_batch(items: &[Item], device: &Device<B>) -> (Tensor<B, 2>, Tensor<B, 1, Int>) {
    let x: Vec<f32> = items.iter().flat_map(|(_, x, _)| x.clone()).collect();
    let y: Vec<i64> = items.iter().map(|(_, _, y)| *y).collect();
    let n = items.len();
    (
        Tensor::<B, 1>::from_data(TensorData::new(x, [n * WIDTH]), device).reshape([n, WIDTH]),
        Tensor::from_data(TensorData::new(y, [n]), device),
    )
}

/// Makes batches and records which samples each held.
#[derive(Clone, Default)]
struct Recording(Arc<Mutex<Vec<Vec<usize>>>>);

impl Batcher<B, Item, (Tensor<B, 2>, Tensor<B, 1, Int>)> for Recording {
    fn batch(&self, items: Vec<Item>, device: &Device<B>) -> (Tensor<B, 2>, Tensor<B, 1, Int>) {
        self.0
            .lock()
            .unwrap()
            .push(items.iter().map(|(i, _, _)| *i).collect());
        make_batch(&items, device)
    }
}

/// One device, one stage, nothing frozen: the run plain Burn makes.
fn config() -> TrainerConfig {
    TrainerConfig::new()
        .with_parts(Parts::new().with_freeze(false))
        .with_stages(Some(1))
        .with_batch(BatchPolicy::FixedGlobal { batch: BATCH })
        .with_costs(CostModel::Parameters { frozen_factor: 1.0 })
        .with_replicas(
            ReplicaConfig::new().with_pipeline(PipelineConfig::new().with_micro_batches(Some(1))),
        )
        .with_seed(9)
}

fn cosine() -> CosineAnnealingLrScheduler {
    CosineAnnealingLrSchedulerConfig::new(2e-2, 10)
        .with_min_lr(1e-3)
        .init()
        .unwrap()
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

/// Records each step's loss and learning rate.
fn recorder(steps: &mut Vec<(f32, f64)>) -> impl FnMut(&StepProgress) + '_ {
    |p| steps.push((p.loss, p.learning_rate))
}

fn temp_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("lr-schedule-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

#[test]
fn a_scheduled_run_equals_plain_burn_with_the_same_scheduler() {
    let device: Device<B> = Default::default();
    let data = dataset();
    let batcher = Recording::default();
    let mut trainer = config()
        .init(stack(), vec![device], || AdamConfig::new().init(), loss)
        .unwrap();
    trainer.set_lr_scheduler(cosine()).unwrap();
    let mut steps = Vec::new();
    for _ in 0..2 {
        trainer
            .fit_epoch_observed(&data, &batcher, recorder(&mut steps))
            .unwrap();
    }
    assert_eq!(steps.len(), 2 * SAMPLES / BATCH);

    // Plain Burn: the same batches, the scheduler stepped before each
    // optimizer step, as burn-train's loop does.
    let items: Vec<Item> = data.iter().collect();
    let mut plain = FreezableStack::new(stack());
    let mut adam = AdamConfig::new().init::<B, TrainableUnits<Types>>();
    let mut scheduler = cosine();
    let batches = batcher.0.lock().unwrap().clone();
    for (step, indices) in batches.iter().enumerate() {
        let chosen: Vec<Item> = indices.iter().map(|&i| items[i].clone()).collect();
        let (x, y) = make_batch(&chosen, &device);
        let lr = scheduler.step();
        let l = loss(plain.forward(x), y);
        let value = l.clone().into_scalar().elem::<f32>();
        let grads = plain.gradients(l.backward());
        plain.map_trainable(|units| adam.step(lr, units, grads));
        let (trained, trained_lr) = steps[step];
        assert!(
            (trained - value).abs() <= 1e-5 * value.abs().max(1.0),
            "step {step}: loss {trained} against plain Burn's {value}"
        );
        assert!(
            (trained_lr - lr).abs() <= 1e-12,
            "step {step}: lr {trained_lr} against {lr}"
        );
    }
    // The rate moved: the schedule was followed, not the configured lr.
    assert!(steps[0].1 > steps[9].1 * 5.0, "{steps:?}");
    let (trained, expected) = (
        weights(&trainer.to_layer_stack().unwrap()),
        weights(&plain.to_layer_stack()),
    );
    let worst = trained
        .iter()
        .zip(&expected)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    assert!(worst <= 1e-5, "weights differ by {worst}");
}

#[test]
fn a_resumed_run_continues_the_schedule_where_the_checkpoint_left_it() {
    let device: Device<B> = Default::default();
    let data = dataset();
    let dir = temp_dir("resume");
    let with_checkpoints = || {
        config().with_checkpoint(Some(
            CheckpointConfig::new(dir.join("ckpt")).with_every_steps(1),
        ))
    };
    // Uninterrupted.
    let mut straight = Vec::new();
    let mut trainer = config()
        .init(stack(), vec![device], || AdamConfig::new().init(), loss)
        .unwrap();
    trainer.set_lr_scheduler(cosine()).unwrap();
    for _ in 0..2 {
        trainer
            .fit_epoch_observed(&data, &Recording::default(), recorder(&mut straight))
            .unwrap();
    }
    // One group per process (burn-collective): this run's ends first.
    drop(trainer);
    // Stopped after 4 steps (a checkpoint after each), then resumed with a
    // fresh scheduler, which takes the checkpoint's state.
    let mut resumed = Vec::new();
    let mut first = with_checkpoints()
        .init(stack(), vec![device], || AdamConfig::new().init(), loss)
        .unwrap();
    first.set_lr_scheduler(cosine()).unwrap();
    first
        .fit_epoch_observed(&data, &Recording::default(), |p| {
            resumed.push((p.loss, p.learning_rate));
            if p.steps == 4 {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        })
        .unwrap();
    drop(first);
    let (mut second, _) = burn_elastic_dp::Trainer::resume(
        stack(),
        vec![device],
        with_checkpoints(),
        || AdamConfig::new().init(),
        loss,
    )
    .unwrap();
    assert_eq!(second.steps(), 4);
    second.set_lr_scheduler(cosine()).unwrap();
    while second.epoch() < 2 {
        second
            .fit_epoch_observed(&data, &Recording::default(), recorder(&mut resumed))
            .unwrap();
    }
    assert_eq!(resumed, straight, "losses and rates, step by step");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_closure_gives_each_steps_rate_and_a_bad_rate_fails_the_step() {
    let device: Device<B> = Default::default();
    let data = dataset();
    let mut trainer = config()
        .init(stack(), vec![device], || AdamConfig::new().init(), loss)
        .unwrap();
    trainer.set_lr_fn(|step| 1e-2 / (step + 1) as f64);
    let mut steps = Vec::new();
    trainer
        .fit_epoch_observed(&data, &Recording::default(), recorder(&mut steps))
        .unwrap();
    let rates: Vec<f64> = steps.iter().map(|s| s.1).collect();
    let expected: Vec<f64> = (0..SAMPLES / BATCH)
        .map(|s| 1e-2 / (s + 1) as f64)
        .collect();
    assert_eq!(rates, expected);

    trainer.set_lr_fn(|step| if step >= 7 { f64::NAN } else { 1e-3 });
    let error = trainer.fit_epoch(&data, &Recording::default()).unwrap_err();
    assert!(
        matches!(
            &error,
            TrainerError::InvalidRunValue {
                what: "learning-rate schedule",
                ..
            }
        ),
        "{error}"
    );
    assert_eq!(trainer.steps(), 7, "the refused step changed nothing");
}

#[test]
fn an_observer_stops_the_epoch_and_the_next_call_trains_the_rest() {
    let device: Device<B> = Default::default();
    let data = dataset();
    let batcher = Recording::default();
    let mut trainer = config()
        .init(stack(), vec![device], || AdamConfig::new().init(), loss)
        .unwrap();
    let part = trainer
        .fit_epoch_observed(&data, &batcher, |p| {
            // The shape each step ran with: K=1, R=1, M=1.
            assert_eq!((p.stages, p.replicas, p.micro_batches), (1, 1, 1));
            if p.epoch_samples >= 2 * BATCH {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        })
        .unwrap();
    assert_eq!((part.samples, part.steps), (2 * BATCH, 2));
    assert_eq!(trainer.epoch(), 0);
    assert!(trainer.epoch_in_progress());
    let rest = trainer.fit_epoch(&data, &batcher).unwrap();
    assert_eq!(rest.samples, SAMPLES - 2 * BATCH);
    assert_eq!(trainer.epoch(), 1);
    assert!(!trainer.epoch_in_progress());
    let mut seen: Vec<usize> = batcher
        .0
        .lock()
        .unwrap()
        .iter()
        .flatten()
        .copied()
        .collect();
    seen.sort_unstable();
    assert_eq!(seen, (0..SAMPLES).collect::<Vec<_>>(), "every sample once");
    // A stop on the epoch's last step closes the epoch as usual.
    let whole = trainer
        .fit_epoch_observed(&data, &batcher, |p| {
            if p.epoch_samples == SAMPLES {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        })
        .unwrap();
    assert_eq!((whole.samples, trainer.epoch()), (SAMPLES, 2));
}
