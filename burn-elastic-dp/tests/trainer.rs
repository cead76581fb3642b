//! The PipeTransformer trainer: an elastic run (K = 4, R = 1 -> K = 2, R = 2
//! -> K = 1, R = 4) sees every sample once per epoch and ends at the weights
//! of plain training with the same freeze schedule and batches; cached and
//! uncached training agree, spilling or recomputing; every combination of
//! the four parts runs; bad configurations are refused before any work; a
//! batch refused in mid-epoch is trained once the epoch goes on; an epoch
//! reports the shape it ran with.

use std::sync::{Arc, Mutex};

use burn::data::dataloader::batcher::Batcher;
use burn::data::dataset::InMemDataset;
use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::{AdamConfig, Optimizer};
use burn::prelude::*;
use burn_elastic_dp::{
    BatchPolicy, CostModel, ElasticError, FreezeRule, MemoryConfig, Parts, ReplicaConfig,
    TrainerConfig, TrainerError,
};
use burn_freeze::{CacheConfig, FreezableStack, LayerStack, TrainableUnits};
use burn_pipe::PipelineConfig;

mod common;

use burn_freeze::CacheHolder;
use burn_freeze::FreezeFront;
use common::{B, Types, block, loss};

const WIDTH: usize = 8;
const UNITS: usize = 8;

/// 8 units of equal cost, the same weights in every call (drawn without the
/// backend's random state, which tests running in parallel share).
fn stack() -> LayerStack<Types> {
    let stack = LayerStack::new(
        block(1, WIDTH),
        (0..UNITS as u64 - 2).map(|u| block(2 + u, WIDTH)).collect(),
        block(UNITS as u64, WIDTH),
    );
    stack.materialize();
    stack
}

/// A sample: its index, features and label.
type Item = (usize, [f32; WIDTH], i64);

fn dataset(len: usize) -> InMemDataset<Item> {
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 40) as f32 / (1u64 << 24) as f32
    };
    InMemDataset::new(
        (0..len)
            .map(|i| {
                let x: [f32; WIDTH] = std::array::from_fn(|_| 2.0 * next() - 1.0);
                let label = i64::from(x[0] + x[1] > 0.0) + 2 * i64::from(x[2] > 0.3);
                (i, x, label)
            })
            .collect(),
    )
}

/// Makes batches and records which samples each batch held.
#[derive(Clone, Default)]
struct Recording {
    batches: Arc<Mutex<Vec<Vec<usize>>>>,
}

impl Recording {
    fn take(&self) -> Vec<Vec<usize>> {
        std::mem::take(&mut self.batches.lock().unwrap())
    }
}

fn make_batch(items: &[Item], device: &Device<B>) -> (Tensor<B, 2>, Tensor<B, 1, Int>) {
    common::rows_batch(items, device)
}

impl Batcher<B, Item, (Tensor<B, 2>, Tensor<B, 1, Int>)> for Recording {
    fn batch(&self, items: Vec<Item>, device: &Device<B>) -> (Tensor<B, 2>, Tensor<B, 1, Int>) {
        self.batches
            .lock()
            .unwrap()
            .push(items.iter().map(|(i, _, _)| *i).collect());
        make_batch(&items, device)
    }
}

struct Collect(Vec<Vec<f32>>);
impl<Be: Backend> ModuleVisitor<Be> for Collect {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<Be, D>>) {
        self.0.push(param.val().to_data().to_vec().unwrap());
    }
}

fn weights(stack: &LayerStack<Types>) -> Vec<Vec<f32>> {
    let mut collect = Collect(Vec::new());
    stack.first().visit(&mut collect);
    stack.middle().iter().for_each(|u| u.visit(&mut collect));
    stack.last().visit(&mut collect);
    collect.0
}

/// Largest |a - b| relative to max(1, largest |b|), per tensor.
fn worst_difference(actual: &[Vec<f32>], expected: &[Vec<f32>]) -> f32 {
    actual
        .iter()
        .zip(expected)
        .map(|(a, b)| {
            let scale = b.iter().fold(1.0f32, |m, v| m.max(v.abs()));
            a.iter()
                .zip(b)
                .map(|(x, y)| (x - y).abs())
                .fold(0.0, f32::max)
                / scale
        })
        .fold(0.0, f32::max)
}

const LR: f64 = 1e-2;

/// The elastic run's configuration: per-unit layers frozen 0, 4, 6 in
/// epochs 0, 1, 2; parameter-count costs (deterministic shapes); 2
/// micro-batches per replica; a fixed global batch of 16.
/// The paper's start on 4 devices (one pipeline over all of them), so that
/// the run compresses; memory-aware starts are tested in `memory.rs`.
fn elastic_config() -> TrainerConfig {
    TrainerConfig::new()
        .with_stages(Some(4))
        .with_freeze(FreezeRule::Fronts {
            layers: vec![0, 4, 6],
        })
        .with_batch(BatchPolicy::FixedGlobal { batch: 16 })
        .with_lr(LR)
        .with_costs(CostModel::Parameters {
            frozen_factor: 1.0 / 3.0,
        })
        .with_replicas(
            ReplicaConfig::new().with_pipeline(PipelineConfig::new().with_micro_batches(Some(2))),
        )
        .with_seed(3)
}

#[test]
fn an_elastic_run_sees_every_sample_once_and_trains_as_plain_training() {
    let device: Device<B> = Default::default();
    let model = stack();
    let data = dataset(64);
    let batcher = Recording::default();
    let out = tempfile_dir("elastic");
    let mut trainer = elastic_config()
        .with_output_dir(Some(out.clone()))
        .init(
            model.clone(),
            vec![device; 4],
            || AdamConfig::new().init(),
            loss,
        )
        .unwrap();
    let mut shapes = Vec::new();
    let mut epochs = Vec::new();
    for _ in 0..3 {
        let report = trainer.fit_epoch(&data, &batcher).unwrap();
        // Exactly once per epoch.
        let batches = batcher.take();
        let mut seen: Vec<usize> = batches.iter().flatten().copied().collect();
        seen.sort_unstable();
        assert_eq!(seen, (0..64).collect::<Vec<_>>());
        assert_eq!(report.samples, 64);
        shapes.push((report.stages, report.replicas));
        epochs.push((batches, report));
    }
    // The front after epoch T is the schedule's entry T + 1; the shape
    // follows at once: K=4,R=1 -> K=2,R=2 -> K=1,R=4.
    let transitions: Vec<_> = epochs
        .iter()
        .flat_map(|(_, r)| r.transitions.clone())
        .collect();
    assert_eq!(
        transitions
            .iter()
            .map(|t| (t.front, t.stages, t.replicas))
            .collect::<Vec<_>>(),
        vec![((0, 4), (4, 2), (1, 2)), ((4, 6), (2, 1), (2, 4))]
    );
    // Each epoch reports the shape it ran with; the transition at its end
    // carries the next one.
    assert_eq!(shapes, vec![(4, 1), (2, 2), (1, 4)]);
    // The same lines in the output directory.
    let lines = std::fs::read_to_string(out.join("transitions.jsonl")).unwrap();
    assert_eq!(lines.lines().count(), 2);
    assert!(lines.contains("\"replicas\":[2,4]"), "{lines}");
    let lines = std::fs::read_to_string(out.join("epochs.jsonl")).unwrap();
    assert_eq!(lines.lines().count(), 3);

    // Plain training on one device: the same batches, the same fronts.
    let mut plain = FreezableStack::new(model);
    let mut adam = AdamConfig::new().init::<B, TrainableUnits<Types>>();
    let fronts = [4, 6, 6];
    let items = data_items(&data);
    for (epoch, (batches, report)) in epochs.iter().enumerate() {
        let mut total = 0.0;
        for indices in batches {
            let chosen: Vec<Item> = indices.iter().map(|&i| items[i]).collect();
            let (x, y) = make_batch(&chosen, &device);
            let l = loss(plain.forward(x), y);
            total += f64::from(l.clone().into_scalar().elem::<f32>()) * indices.len() as f64;
            let grads = plain.gradients(l.backward());
            plain.map_trainable(|units| adam.step(LR, units, grads));
        }
        let mean = total / 64.0;
        assert!(
            (mean - report.loss).abs() <= 1e-4 * mean.abs().max(1.0),
            "epoch {epoch}: loss {} against plain {mean}",
            report.loss
        );
        plain.freeze_to(fronts[epoch]).unwrap();
    }
    // Summation order differs (shards, micro-batches, the all-reduce mean):
    // rounding of about 1e-7 per gradient, which 12 Adam steps keep well
    // inside 1e-4 of the weights' scale.
    let worst = worst_difference(
        &weights(&trainer.to_layer_stack().unwrap()),
        &weights(&plain.to_layer_stack()),
    );
    assert!(worst <= 1e-4, "weights differ by {worst}");
    // Every replica holds the same weights, bit for bit.
    let group = trainer.group();
    let first = weights(&group.replica(0).to_layer_stack());
    for r in 1..group.num_replicas() {
        assert_eq!(weights(&group.replica(r).to_layer_stack()), first);
    }
    let _ = std::fs::remove_dir_all(out);
}

fn data_items(data: &InMemDataset<Item>) -> Vec<Item> {
    use burn::data::dataset::Dataset;
    data.iter().collect()
}

/// A fresh directory under the system's temporary one.
fn tempfile_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "burn-elastic-dp-trainer-{name}-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// Trains 3 epochs under `config` on 4 devices; the epoch losses, the final
/// weights and the cache's counters.
fn run(config: TrainerConfig) -> (Vec<f64>, Vec<Vec<f32>>, Option<burn_freeze::CacheStats>) {
    let device: Device<B> = Default::default();
    let data = dataset(64);
    let batcher = Recording::default();
    let mut trainer = config
        .init(stack(), vec![device; 4], || AdamConfig::new().init(), loss)
        .unwrap();
    let losses = (0..3)
        .map(|_| trainer.fit_epoch(&data, &batcher).unwrap().loss)
        .collect();
    let stats = trainer.group().cache().map(|c| c.stats());
    (losses, weights(&trainer.to_layer_stack().unwrap()), stats)
}

#[test]
fn cached_and_uncached_training_agree_spilling_or_recomputing() {
    let (plain_losses, plain_weights, none) =
        run(elastic_config().with_parts(Parts::new().with_cache(false)));
    assert!(none.is_none(), "no cache without AutoCache");
    let spill = tempfile_dir("spill");
    std::fs::create_dir_all(&spill).unwrap();
    let cases = [
        ("in memory", CacheConfig::new(64 << 20)),
        (
            "spilled to disk",
            CacheConfig::new(0).with_spill_dir(Some(spill.clone())),
        ),
        ("recomputed", CacheConfig::new(0)),
    ];
    for (case, cache) in cases {
        let (log, (losses, weights, stats)) = logged(|| run(elastic_config().with_cache(cache)));
        let warnings = log.matches("activation cache full").count();
        let expected_warnings = usize::from(case == "recomputed");
        assert_eq!(
            warnings, expected_warnings,
            "{case}: said so {warnings} times:\n{log}"
        );
        let stats = stats.unwrap();
        for (a, b) in losses.iter().zip(&plain_losses) {
            assert!(
                (a - b).abs() <= 1e-5 * b.abs().max(1.0),
                "{case}: {a} against {b}"
            );
        }
        let worst = worst_difference(&weights, &plain_weights);
        assert!(worst <= 1e-5, "{case}: weights differ by {worst}");
        // Epoch 1 computes the prefix at front 4 (64 misses); epoch 2 moves
        // to front 6 from those entries (partial hits) when they were kept.
        assert_eq!(
            stats.misses + stats.partial_hits + stats.hits,
            128,
            "{case}"
        );
        match case {
            "in memory" => assert_eq!((stats.misses, stats.partial_hits), (64, 64)),
            "spilled to disk" => {
                assert!(
                    stats.spilled > 0 && stats.partial_hits == 64,
                    "{case}: {stats:?}"
                )
            }
            _ => assert!(
                stats.not_cached > 0 && stats.misses == 128,
                "{case}: {stats:?}"
            ),
        }
    }
    let _ = std::fs::remove_dir_all(spill);
}

/// Runs `f` with the calling thread's log captured.
fn logged<R>(f: impl FnOnce() -> R) -> (String, R) {
    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);
    impl std::io::Write for Buffer {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let buffer = Buffer::default();
    let writer = buffer.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let result = tracing::subscriber::with_default(subscriber, f);
    let text = String::from_utf8(buffer.0.lock().unwrap().clone()).unwrap();
    (text, result)
}

#[test]
fn every_combination_of_the_four_parts_runs() {
    let device: Device<B> = Default::default();
    let data = dataset(32);
    let batcher = Recording::default();
    for bits in 0..16u8 {
        let parts = Parts::new()
            .with_freeze(bits & 1 != 0)
            .with_pipe(bits & 2 != 0)
            .with_dp(bits & 4 != 0)
            .with_cache(bits & 8 != 0);
        let mut trainer = elastic_config()
            .with_parts(parts)
            .with_batch(BatchPolicy::FixedGlobal { batch: 8 })
            .init(stack(), vec![device; 4], || AdamConfig::new().init(), loss)
            .unwrap();
        for _ in 0..3 {
            let report = trainer.fit_epoch(&data, &batcher).unwrap();
            assert_eq!(report.samples, 32, "{parts:?}");
            assert!(report.loss.is_finite(), "{parts:?}");
            let expected_front = if parts.freeze { report.front } else { 0 };
            assert_eq!(trainer.front(), expected_front);
            if !parts.pipe || !parts.freeze {
                assert_eq!(report.stages, 4, "{parts:?}: K moved without AutoPipe");
            }
            if !(parts.dp && parts.freeze && parts.pipe) {
                assert_eq!(report.replicas, 1, "{parts:?}: R moved without AutoDP");
            }
        }
        if parts.freeze {
            assert_eq!(trainer.front(), 6, "{parts:?}");
        }
        // Cached, the 6 frozen units cost nothing: one stage does what 4
        // did, and 4 replicas run; uncached they still cost their forward.
        if parts.freeze && parts.pipe && parts.dp {
            let expected = if parts.cache { 4 } else { 2 };
            assert_eq!(trainer.shape().replicas, expected, "{parts:?}");
        }
        let cached = trainer.group().cache().is_some();
        assert_eq!(cached, parts.cache && parts.freeze, "{parts:?}");
    }
}

#[test]
fn the_per_replica_batch_grows_with_the_replicas_and_scales_the_learning_rate() {
    let device: Device<B> = Default::default();
    let data = dataset(64);
    let batcher = Recording::default();
    let mut trainer = elastic_config()
        .with_batch(BatchPolicy::PerReplica { batch: 8 })
        .init(stack(), vec![device; 4], || AdamConfig::new().init(), loss)
        .unwrap();
    for epoch in 0..3 {
        let report = trainer.fit_epoch(&data, &batcher).unwrap();
        let batches = batcher.take();
        assert_eq!(batches.iter().map(Vec::len).sum::<usize>(), 64);
        // The replica count at the start of each epoch sets its batches.
        let expected = [8, 16, 32][epoch];
        assert!(
            batches.iter().all(|b| b.len() == expected),
            "epoch {epoch}: {:?}",
            batches.iter().map(Vec::len).collect::<Vec<_>>()
        );
        assert!(report.loss.is_finite());
        // The linear rule: the learning rate follows the global batch.
        let replicas = trainer.shape().replicas;
        assert_eq!(trainer.learning_rate(), LR * replicas as f64);
    }
}

#[test]
fn bad_configurations_are_refused_before_any_work() {
    let device: Device<B> = Default::default();
    let cases: Vec<(TrainerConfig, usize, &str)> = vec![
        (elastic_config().with_lr(f64::NAN), 4, "lr"),
        (elastic_config().with_lr(-1.0), 4, "lr"),
        (
            elastic_config().with_freeze(FreezeRule::AlphaArgmin {
                alpha: 1.5,
                statistic: None,
            }),
            4,
            "alpha",
        ),
        (
            elastic_config().with_freeze(FreezeRule::AlphaSchedule { alpha: 0.0 }),
            4,
            "alpha",
        ),
        (
            elastic_config().with_freeze(FreezeRule::ChangeRate {
                every_steps: 0,
                percentile: 50.0,
            }),
            4,
            "every_steps",
        ),
        (elastic_config().with_stages(Some(5)), 4, "stages"),
        (elastic_config().with_stages(Some(0)), 4, "stages"),
        (elastic_config(), 0, "devices"),
        (
            elastic_config().with_batch(BatchPolicy::FixedGlobal { batch: 0 }),
            4,
            "batch",
        ),
        // K = 1, R = 4 needs 4 x 2 samples per step.
        (
            elastic_config().with_batch(BatchPolicy::FixedGlobal { batch: 4 }),
            4,
            "micro-batches",
        ),
        (
            elastic_config().with_memory(MemoryConfig::new().with_device_bytes(Some(0))),
            4,
            "device_bytes",
        ),
        (
            elastic_config().with_memory(MemoryConfig::new().with_optimizer_slots(-1.0)),
            4,
            "optimizer_slots",
        ),
        (
            elastic_config().with_costs(CostModel::Profiled { repeats: 0 }),
            4,
            "repeats",
        ),
    ];
    for (config, devices, what) in cases {
        let error = config
            .init(
                stack(),
                vec![device; devices],
                || AdamConfig::new().init(),
                loss,
            )
            .err()
            .unwrap_or_else(|| panic!("{what}: accepted"));
        let text = error.to_string();
        assert!(!text.contains('\n'), "{what}: {text}");
        assert!(
            text.contains(what)
                || matches!(error, TrainerError::BatchTooSmall { .. } if what == "micro-batches"),
            "{what}: {text}"
        );
    }
    // More stages than units.
    let error = elastic_config()
        .with_stages(Some(9))
        .with_batch(BatchPolicy::FixedGlobal { batch: 64 })
        .init(stack(), vec![device; 9], || AdamConfig::new().init(), loss)
        .err()
        .unwrap();
    assert!(
        matches!(error, TrainerError::TooManyStages { .. }),
        "{error}"
    );
    // A dataset too small for one step, and a bad output directory.
    let mut trainer = elastic_config()
        .init(stack(), vec![device; 4], || AdamConfig::new().init(), loss)
        .unwrap();
    let error = trainer
        .fit_epoch(&dataset(1), &Recording::default())
        .unwrap_err();
    assert!(
        matches!(error, TrainerError::DatasetTooSmall { .. }),
        "{error}"
    );
    let file = tempfile_dir("not-a-dir");
    std::fs::write(&file, b"x").unwrap();
    let error = elastic_config()
        .with_output_dir(Some(file.join("sub")))
        .init(stack(), vec![device; 4], || AdamConfig::new().init(), loss)
        .err()
        .unwrap();
    assert!(matches!(error, TrainerError::Io { .. }), "{error}");
    let _ = std::fs::remove_file(file);
}

/// A batcher that panics on its `crash_at`-th call (1-based; 0: never), as a
/// killed process stops a run between two steps.
#[derive(Clone)]
struct Crashing {
    calls: Arc<Mutex<usize>>,
    crash_at: usize,
}

impl Batcher<B, Item, (Tensor<B, 2>, Tensor<B, 1, Int>)> for Crashing {
    fn batch(&self, items: Vec<Item>, device: &Device<B>) -> (Tensor<B, 2>, Tensor<B, 1, Int>) {
        let mut calls = self.calls.lock().unwrap();
        *calls += 1;
        assert!(
            *calls != self.crash_at,
            "simulated crash before step {}",
            *calls
        );
        make_batch(&items, device)
    }
}

/// Trains until 3 epochs are done, recording each step's loss.
macro_rules! train_to_three_epochs {
    ($trainer:expr, $data:expr, $batcher:expr, $losses:expr) => {
        while $trainer.epoch() < 3 {
            $trainer
                .fit_epoch_observed($data, $batcher, |step| $losses.push(step.loss))
                .unwrap();
        }
    };
}

#[test]
fn a_run_resumed_from_a_checkpoint_gives_the_losses_of_an_uninterrupted_one() {
    let device: Device<B> = Default::default();
    let data = dataset(64);
    let config = |dir: &std::path::Path| {
        elastic_config().with_stages(Some(2)).with_checkpoint(Some(
            burn_elastic_dp::CheckpointConfig::new(dir.to_path_buf()).with_every_steps(3),
        ))
    };
    let resume = |dir: &std::path::Path| {
        burn_elastic_dp::Trainer::resume(
            stack(),
            vec![device; 2],
            config(dir),
            || AdamConfig::new().init(),
            loss,
        )
    };
    let never = Crashing {
        calls: Arc::default(),
        crash_at: 0,
    };
    // Two devices: K=2,R=1, then K=1,R=2 once 4 units are frozen (after
    // step 4). At most two replicas: burn-collective sums the replicas of a
    // process in hash-map order, so with three or more the last bit of a
    // sum can differ between any two runs, resumed or not.
    // The uninterrupted run: 4 steps per epoch, transitions after steps 4 and 8.
    let dir = tempfile_dir("resume-reference");
    let mut expected = Vec::new();
    let mut trainer = config(&dir)
        .init(stack(), vec![device; 2], || AdamConfig::new().init(), loss)
        .unwrap();
    train_to_three_epochs!(trainer, &data, &never, expected);
    assert_eq!(expected.len(), 12);
    let expected_weights = weights(&trainer.to_layer_stack().unwrap());
    drop(trainer);

    // Crashes before step 6 (the last checkpoint after step 4, a transition's)
    // and before step 8 (after step 6, the every-3-steps one, mid-epoch).
    for (crash_at, checkpoint_step) in [(6, 4), (8, 6)] {
        let dir = tempfile_dir(&format!("resume-{crash_at}"));
        let mut trainer = config(&dir)
            .init(stack(), vec![device; 2], || AdamConfig::new().init(), loss)
            .unwrap();
        let crashing = Crashing {
            calls: Arc::default(),
            crash_at,
        };
        let mut before = Vec::new();
        let crashed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            train_to_three_epochs!(trainer, &data, &crashing, before)
        }));
        assert!(crashed.is_err(), "the run was to crash");
        drop(trainer);
        assert_eq!(before, expected[..crash_at - 1]);

        let (mut resumed, path) = resume(&dir).unwrap();
        assert!(
            path.ends_with(format!("step-{checkpoint_step:012}")),
            "{path:?}"
        );
        assert_eq!(resumed.steps(), checkpoint_step);
        let mut after = Vec::new();
        train_to_three_epochs!(resumed, &data, &never, after);
        assert_eq!(
            after,
            expected[checkpoint_step..],
            "crash before step {crash_at}"
        );
        assert_eq!(
            weights(&resumed.to_layer_stack().unwrap()),
            expected_weights
        );
        drop(resumed);

        // A truncated newest checkpoint is rejected; the one before is used.
        let newest = dir.join(format!("step-{:012}", 12));
        let model = newest.join("model.bin");
        let bytes = std::fs::read(&model).unwrap();
        std::fs::write(&model, &bytes[..bytes.len() / 2]).unwrap();
        let (older, path) = resume(&dir).unwrap();
        assert!(
            older.steps() < 12 && !path.ends_with("step-000000000012"),
            "{path:?}"
        );
        drop(older);
        let _ = std::fs::remove_dir_all(&dir);
    }
    let _ = std::fs::remove_dir_all(&dir);
    // Nothing to resume from is an error that says why.
    let empty = tempfile_dir("resume-empty");
    let error = resume(&empty).err().unwrap();
    assert!(
        matches!(error, TrainerError::NoCheckpoint { .. }),
        "{error}"
    );
}

#[test]
fn one_process_resumes_on_fewer_devices_or_says_why_it_cannot() {
    let device: Device<B> = Default::default();
    let data = dataset(64);
    let dir = tempfile_dir("resume-fewer-devices");
    // Nothing frozen before epoch 2, so the checkpoint after epoch 1 is
    // still at the start's shape.
    let config = || {
        elastic_config()
            .with_stages(Some(2))
            .with_freeze(FreezeRule::Fronts {
                layers: vec![0, 0, 6],
            })
            .with_checkpoint(Some(
                burn_elastic_dp::CheckpointConfig::new(dir.clone()).with_every_steps(3),
            ))
    };
    let batcher = Recording::default();
    // Written on 4 devices: K=2, R=2.
    let mut trainer = config()
        .init(stack(), vec![device; 4], || AdamConfig::new().init(), loss)
        .unwrap();
    trainer.fit_epoch(&data, &batcher).unwrap();
    assert_eq!((trainer.shape().stages(), trainer.shape().replicas), (2, 2));
    let written = trainer.steps();
    drop(trainer);
    let resume = |devices: usize| {
        burn_elastic_dp::Trainer::resume(
            stack(),
            vec![device; devices],
            config(),
            || AdamConfig::new().init(),
            loss,
        )
    };
    // One device cannot hold the checkpoint's two stages: a one-line
    // error naming its shape and the devices given, and nothing trains.
    // (With `stages: Some(2)` the configuration itself is refused first;
    // left to memory-aware AutoPipe, the checkpoint's K is what decides.)
    let error = burn_elastic_dp::Trainer::resume(
        stack(),
        vec![device; 1],
        config().with_stages(None),
        || AdamConfig::new().init(),
        loss,
    )
    .err()
    .unwrap();
    let message = error.to_string();
    assert!(
        matches!(error, TrainerError::Checkpoint(_))
            && message.contains("K=2")
            && message.contains("1 device(s) given")
            && !message.contains('\n'),
        "{message}"
    );
    // On 2 devices AutoDP derives R again: K=2, R=1, and the run goes on.
    let (mut resumed, _) = resume(2).unwrap();
    assert_eq!(resumed.steps(), written);
    assert_eq!((resumed.shape().stages(), resumed.shape().replicas), (2, 1));
    let mut losses = Vec::new();
    while resumed.epoch() < 3 {
        resumed
            .fit_epoch_observed(&data, &batcher, |step| losses.push(step.loss))
            .unwrap();
    }
    assert!(!losses.is_empty() && losses.iter().all(|l| l.is_finite()));
    drop(resumed);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn valid_random_configurations_finish_a_short_job() {
    let device: Device<B> = Default::default();
    let data = dataset(48);
    let batcher = Recording::default();
    let mut state = 7u64;
    let mut below = |n: u64| {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (state >> 33) % n
    };
    let mut finished = 0;
    for _ in 0..12 {
        let devices = 1 + below(4) as usize;
        let stages = 1 + below(devices as u64) as usize;
        let micro = 1 + below(3) as usize;
        let parts = Parts::new()
            .with_freeze(below(4) != 0)
            .with_pipe(below(2) == 0)
            .with_dp(below(2) == 0)
            .with_cache(below(2) == 0);
        let rule = match below(3) {
            0 => FreezeRule::AlphaSchedule { alpha: 0.3 },
            1 => FreezeRule::AlphaArgmin {
                alpha: 0.5,
                statistic: None,
            },
            _ => FreezeRule::ChangeRate {
                every_steps: 2,
                percentile: 50.0,
            },
        };
        let batch = if below(2) == 0 {
            BatchPolicy::FixedGlobal { batch: 16 }
        } else {
            BatchPolicy::PerReplica { batch: 8 }
        };
        let config = elastic_config()
            .with_parts(parts)
            .with_freeze(rule)
            .with_stages(Some(stages))
            .with_batch(batch)
            .with_replicas(
                ReplicaConfig::new()
                    .with_pipeline(PipelineConfig::new().with_micro_batches(Some(micro))),
            );
        let mut trainer = config
            .init(
                stack(),
                vec![device; devices],
                || AdamConfig::new().init(),
                loss,
            )
            .unwrap_or_else(|e| panic!("{devices} devices, {stages} stages, M={micro}: {e}"));
        for _ in 0..2 {
            let report = trainer.fit_epoch(&data, &batcher).unwrap();
            assert_eq!(report.samples, 48);
            assert!(report.loss.is_finite());
        }
        finished += 1;
    }
    assert_eq!(finished, 12);
}

/// [`Recording`] that gives its `refuse_at`-th batch (1-based) one target
/// too few, which the group refuses.
#[derive(Clone)]
struct Refusing {
    recording: Recording,
    calls: Arc<Mutex<usize>>,
    refuse_at: usize,
}

impl Refusing {
    fn at(refuse_at: usize) -> Self {
        Self {
            recording: Recording::default(),
            calls: Arc::default(),
            refuse_at,
        }
    }
}

impl Batcher<B, Item, (Tensor<B, 2>, Tensor<B, 1, Int>)> for Refusing {
    fn batch(&self, items: Vec<Item>, device: &Device<B>) -> (Tensor<B, 2>, Tensor<B, 1, Int>) {
        let (x, y) = self.recording.batch(items, device);
        let mut calls = self.calls.lock().unwrap();
        *calls += 1;
        if *calls == self.refuse_at {
            let n = y.dims()[0];
            return (x, y.narrow(0, 0, n - 1));
        }
        (x, y)
    }
}

#[test]
fn a_batch_refused_in_mid_epoch_is_trained_once_the_epoch_goes_on() {
    let device: Device<B> = Default::default();
    let data = dataset(64);
    let init = || {
        elastic_config()
            .init(stack(), vec![device; 4], || AdamConfig::new().init(), loss)
            .unwrap()
    };
    // The uninterrupted run's batches in epochs 0 and 1.
    let reference = Recording::default();
    let mut trainer = init();
    let expected: Vec<Vec<Vec<usize>>> = (0..2)
        .map(|_| {
            trainer.fit_epoch(&data, &reference).unwrap();
            reference.take()
        })
        .collect();
    drop(trainer); // one group per process at a time
    // The third batch of epoch 0 is refused; the next call trains it first.
    let mut trainer = init();
    let refusing = Refusing::at(3);
    let error = trainer.fit_epoch(&data, &refusing).unwrap_err();
    assert!(
        matches!(
            error,
            TrainerError::Elastic(ElasticError::TargetsMismatch { .. })
        ),
        "{error}"
    );
    let mut batches = refusing.recording.take();
    let refused = batches.pop().unwrap();
    assert_eq!((trainer.epoch(), trainer.steps()), (0, 2));
    let good = Recording::default();
    let report = trainer.fit_epoch(&data, &good).unwrap();
    let rest = good.take();
    assert_eq!(rest[0], refused, "the refused batch comes first");
    batches.extend(rest);
    let mut seen: Vec<usize> = batches.iter().flatten().copied().collect();
    seen.sort_unstable();
    assert_eq!(seen, (0..64).collect::<Vec<_>>(), "every sample once");
    assert_eq!(
        batches, expected[0],
        "the same batches as without the refusal"
    );
    assert_eq!(
        (report.samples, trainer.epoch(), trainer.steps()),
        (32, 1, 4)
    );
    // Refused as the first batch of epoch 1: the same epoch goes on, in the
    // same order.
    let refusing = Refusing::at(1);
    assert!(trainer.fit_epoch(&data, &refusing).is_err());
    assert_eq!(trainer.steps(), 4);
    trainer.fit_epoch(&data, &good).unwrap();
    assert_eq!(good.take(), expected[1]);
}

#[test]
fn an_epoch_reports_the_shape_it_ran_with() {
    let device: Device<B> = Default::default();
    let data = dataset(64);
    let mut trainer = elastic_config()
        .init(stack(), vec![device; 4], || AdamConfig::new().init(), loss)
        .unwrap();
    let micro_batches = |stages: usize| {
        PipelineConfig::new()
            .with_micro_batches(Some(2))
            .micro_batches_for(stages)
    };
    for epoch in 0..3 {
        let during = trainer.shape();
        let report = trainer.fit_epoch(&data, &Recording::default()).unwrap();
        assert_eq!(
            (report.stages, report.replicas, &report.balance),
            (during.stages(), during.replicas, &during.balance),
            "epoch {epoch}"
        );
        assert_eq!(report.micro_batches, micro_batches(during.stages()));
        // The transition at the epoch's end carries the shape that follows.
        let after = trainer.shape();
        match report.transitions.last() {
            Some(transition) => {
                assert_eq!(transition.stages, (during.stages(), after.stages()));
                assert_eq!(transition.replicas, (during.replicas, after.replicas));
                assert_eq!(transition.balance, after.balance);
            }
            None => assert_eq!(after, during, "epoch {epoch}"),
        }
    }
}

#[test]
fn pipeline_and_group_errors_convert_with_the_question_mark() {
    fn pipeline() -> Result<(), TrainerError> {
        PipelineConfig::new().init(stack(), Vec::new(), || AdamConfig::new().init())?;
        Ok(())
    }
    fn group() -> Result<(), TrainerError> {
        ReplicaConfig::new().init(stack(), Vec::new(), || AdamConfig::new().init())?;
        Ok(())
    }
    let error = pipeline().unwrap_err();
    assert!(
        matches!(error, TrainerError::Pipe(burn_pipe::PipeError::NoStages)),
        "{error}"
    );
    let error = group().unwrap_err();
    assert!(
        matches!(error, TrainerError::Elastic(ElasticError::NoReplicas)),
        "{error}"
    );
}
