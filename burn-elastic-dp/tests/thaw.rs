//! The freeze front moves down (thaw) in the PipeTransformer trainer: a
//! schedule of fronts that goes up and then down, every part on (the cache
//! serving the frozen prefix, AutoPipe and AutoDP changing K and R, a thaw
//! lengthening the pipeline again), trains as plain Burn with the same
//! fronts applied by hand; a run that thawed, checkpointed and resumed
//! continues as the uninterrupted one; a replica group refuses an unfreeze
//! above its front or with gradients pending, changing nothing.

use burn::data::dataset::Dataset;
use burn::optim::AdamConfig;
use burn::prelude::*;
use burn_elastic_dp::{CheckpointConfig, ElasticError, ReplicaConfig, Trainer, Transition};
use burn_freeze::{FreezeError, FreezeFront};
use burn_pipe::{PipeError, PipelineConfig};

mod common;

use burn_freeze::CacheHolder;
use common::thaw::{
    FRONTS, Item, LR, Recording, UNITS, WIDTH, config, dataset, make_batch, plain, tempdir, worst,
};
use common::{B, block_stack, flat_weights, loss};

#[test]
fn a_schedule_that_goes_up_and_down_trains_as_plain_burn_with_the_fronts_by_hand() {
    let device: Device<B> = Default::default();
    let data = dataset();
    let batcher = Recording::default();
    let mut trainer = config()
        .init(
            block_stack(UNITS, WIDTH),
            vec![device; 4],
            || AdamConfig::new().init(),
            loss,
        )
        .unwrap();
    let mut batches = Vec::new();
    let mut transitions: Vec<Transition> = Vec::new();
    let mut shapes = Vec::new();
    let mut losses = Vec::new();
    for _ in 0..FRONTS.len() {
        let report = trainer.fit_epoch(&data, &batcher).unwrap();
        losses.push(report.loss);
        batches.push(std::mem::take(&mut *batcher.batches.lock().unwrap()));
        shapes.push((report.stages, report.replicas));
        transitions.extend(report.transitions);
    }
    let moves: Vec<_> = transitions
        .iter()
        .map(|t| (t.front, t.stages, t.replicas))
        .collect();
    assert_eq!(
        moves,
        vec![
            ((0, 2), (4, 2), (1, 2)),
            ((2, 3), (2, 2), (2, 2)),
            ((3, 1), (2, 4), (2, 1)), // the thaw lengthens the pipeline again
            ((1, 2), (4, 2), (1, 2)),
        ]
    );
    let thaws: Vec<bool> = transitions.iter().map(Transition::is_thaw).collect();
    assert_eq!(thaws, [false, false, true, false]);
    assert_eq!(shapes, vec![(4, 1), (2, 2), (2, 2), (4, 1), (2, 2)]);
    let served = trainer.group().cache().map(|c| c.stats());
    assert!(
        served.is_some_and(|s| s.hits + s.partial_hits > 0),
        "the cache served: {served:?}"
    );

    let (expected, plain_losses) = plain(&batches);
    for (epoch, (loss, plain)) in losses.iter().zip(&plain_losses).enumerate() {
        assert!(
            (loss - plain).abs() <= 1e-5 * plain.abs().max(1.0),
            "epoch {epoch}: loss {loss}, plain Burn {plain}"
        );
    }
    let weights = flat_weights(&trainer.to_layer_stack().unwrap());
    let diff = worst(&weights, &expected);
    println!("thaw schedule {FRONTS:?}: trainer against plain Burn {diff:e}");
    assert!(diff <= 1e-6, "weights differ from plain Burn by {diff}");
    assert!(worst(&expected, &flat_weights(&block_stack(UNITS, WIDTH))) > 1e-3);
}

/// Trains to the end of the schedule, each step's loss pushed to `$losses`.
macro_rules! to_the_end {
    ($trainer:expr, $batcher:expr, $losses:expr) => {
        let data = dataset();
        while $trainer.epoch() < FRONTS.len() {
            $trainer
                .fit_epoch_observed(&data, $batcher, |step| $losses.push(step.loss))
                .unwrap();
        }
    };
}

#[test]
fn a_run_that_thawed_and_resumed_continues_as_the_uninterrupted_one() {
    let device: Device<B> = Default::default();
    let checkpointed = |dir: &std::path::Path| {
        config().with_checkpoint(Some(
            CheckpointConfig::new(dir.to_path_buf()).with_every_steps(2),
        ))
    };
    let build = |dir: &std::path::Path| {
        checkpointed(dir)
            .init(
                block_stack(UNITS, WIDTH),
                vec![device; 4],
                || AdamConfig::new().init(),
                loss,
            )
            .unwrap()
    };
    // 4 steps per epoch: the thaw (front 3 -> 1) after step 12.
    let dir = tempdir("reference");
    let mut expected = Vec::new();
    let mut trainer = build(&dir);
    to_the_end!(trainer, &Recording::default(), expected);
    assert_eq!(expected.len(), 20);
    let expected_weights = flat_weights(&trainer.to_layer_stack().unwrap());
    drop(trainer);
    let _ = std::fs::remove_dir_all(&dir);

    // Crashes before step 13 (the last checkpoint the thaw's, after step
    // 12: thawed units without optimizer state) and before step 16 (after
    // step 14: the thawed units' Adam state of two steps).
    for (crash_at, checkpoint_step) in [(13, 12), (16, 14)] {
        let dir = tempdir(&format!("crash-{crash_at}"));
        let mut trainer = build(&dir);
        let crashing = Recording {
            crash_at,
            ..Recording::default()
        };
        let mut before = Vec::new();
        let crashed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            to_the_end!(trainer, &crashing, before);
        }));
        assert!(crashed.is_err(), "the run was to crash");
        drop(trainer);
        assert_eq!(before, expected[..crash_at - 1]);

        let (mut resumed, path) = Trainer::resume(
            block_stack(UNITS, WIDTH),
            vec![device; 4],
            checkpointed(&dir),
            || AdamConfig::new().init(),
            loss,
        )
        .unwrap();
        assert!(
            path.ends_with(format!("step-{checkpoint_step:012}")),
            "{path:?}"
        );
        assert_eq!((resumed.steps(), resumed.epoch()), (checkpoint_step, 3));
        // The thawed front, the policy's layer count and the shape it ran.
        assert_eq!((resumed.group().front(), resumed.frozen_layers()), (1, 1));
        assert_eq!((resumed.shape().stages(), resumed.shape().replicas), (4, 1));
        let mut after = Vec::new();
        to_the_end!(resumed, &Recording::default(), after);
        assert_eq!(
            after,
            expected[checkpoint_step..],
            "crash before step {crash_at}"
        );
        assert_eq!(
            flat_weights(&resumed.to_layer_stack().unwrap()),
            expected_weights
        );
        drop(resumed);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[test]
fn a_group_refuses_an_unfreeze_above_its_front_or_with_gradients_pending() {
    let device: Device<B> = Default::default();
    let mut group = ReplicaConfig::new()
        .with_pipeline(PipelineConfig::new().with_micro_batches(Some(2)))
        .init(block_stack(UNITS, WIDTH), vec![vec![device; 2]; 2], || {
            AdamConfig::new().init()
        })
        .unwrap();
    group.freeze_to(3).unwrap();
    match FreezeFront::unfreeze_to(&mut group, 4) {
        Err(ElasticError::Freeze(FreezeError::WouldFreeze {
            frozen: 3,
            requested: 4,
        })) => {}
        other => panic!("expected WouldFreeze, got {other:?}"),
    }
    assert_eq!(group.front(), 3);
    let items: Vec<Item> = dataset().iter().take(8).collect();
    let (x, y) = make_batch(&items, &device);
    group.forward_backward(x, y, loss).unwrap();
    match group.unfreeze_to(1) {
        Err(ElasticError::Replica {
            source: PipeError::GradientsPending("unfreeze_to"),
            ..
        }) => {}
        other => panic!("expected GradientsPending, got {other:?}"),
    }
    for r in 0..group.num_replicas() {
        assert_eq!(group.replica(r).front(), 3, "replica {r} unchanged");
    }
    group.step(LR).unwrap();
    group.unfreeze_to(1).unwrap();
    for r in 0..group.num_replicas() {
        let replica = group.replica(r);
        assert_eq!(replica.front(), 1, "replica {r}");
        let trainable: usize = (0..replica.num_stages())
            .map(|s| replica.stage(s).num_trainable())
            .sum();
        assert_eq!(trainable, UNITS - 1, "replica {r}");
    }
}
