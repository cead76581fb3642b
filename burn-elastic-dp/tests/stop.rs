//! A stop asked for mid-epoch (a [`StopSignal`] raised, as SIGTERM does):
//! the trainer stops after the step under way, writes a checkpoint there
//! and returns `TrainerError::Stopped`; resumed, the run ends where a run
//! never stopped ends.

use burn::data::dataset::InMemDataset;
use burn::optim::AdamConfig;
use burn::prelude::*;
use burn_elastic_dp::{
    BatchPolicy, CheckpointConfig, CostModel, FreezeRule, ReplicaConfig, StopSignal, Trainer,
    TrainerConfig, TrainerError,
};
use burn_pipe::PipelineConfig;

mod common;

use common::{B, Rows, block_stack, flat_weights, loss, numbers};

const WIDTH: usize = 8;

fn dataset() -> InMemDataset<([f32; WIDTH], i64)> {
    let values = numbers(7, 64 * WIDTH);
    InMemDataset::new(
        values
            .chunks_exact(WIDTH)
            .map(|x| {
                let x: [f32; WIDTH] = x.try_into().unwrap();
                (x, i64::from(x[0] > 0.0))
            })
            .collect(),
    )
}

fn config(dir: &std::path::Path) -> TrainerConfig {
    TrainerConfig::new()
        .with_freeze(FreezeRule::Fronts { layers: vec![0, 3] })
        .with_stages(Some(2))
        .with_batch(BatchPolicy::FixedGlobal { batch: 16 })
        .with_lr(1e-2)
        .with_costs(CostModel::Parameters {
            frozen_factor: 1.0 / 3.0,
        })
        .with_replicas(
            ReplicaConfig::new().with_pipeline(PipelineConfig::new().with_micro_batches(Some(2))),
        )
        .with_checkpoint(Some(
            CheckpointConfig::new(dir.to_path_buf()).with_every_steps(100),
        ))
        .with_seed(4)
}

#[test]
fn a_stop_mid_epoch_checkpoints_after_the_step_and_the_resumed_run_ends_as_one_never_stopped() {
    let base = std::env::temp_dir().join(format!("burn-elastic-dp-stop-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    let device: Device<B> = Default::default();
    let data = dataset();
    let adam = || AdamConfig::new().init();
    // A run never stopped: 2 epochs of 4 steps.
    let mut whole = config(&base.join("whole"))
        .init(block_stack(6, WIDTH), vec![device; 2], adam, loss)
        .unwrap();
    for _ in 0..2 {
        whole.fit_epoch(&data, &Rows).unwrap();
    }
    let expected = flat_weights(&whole.to_layer_stack().unwrap());
    drop(whole);

    // Asked to stop in epoch 1's second step (step 6).
    let dir = base.join("stopped");
    let mut trainer = config(&dir)
        .init(block_stack(6, WIDTH), vec![device; 2], adam, loss)
        .unwrap();
    let signal = StopSignal::new();
    trainer.set_stop_signal(signal.clone());
    trainer.fit_epoch(&data, &Rows).unwrap();
    let mut step = trainer.steps();
    let error = trainer
        .fit_epoch_observed(&data, &Rows, |_| {
            step += 1;
            if step == 6 {
                signal.raise();
            }
        })
        .unwrap_err();
    let TrainerError::Stopped { steps, checkpoint } = &error else {
        panic!("{error}");
    };
    assert_eq!(*steps, 6, "{error}");
    let checkpoint = checkpoint.clone().expect("a checkpoint is configured");
    assert!(
        checkpoint.ends_with(format!("step-{:012}", 6)),
        "{}",
        checkpoint.display()
    );
    drop(trainer);

    let (mut resumed, from) = Trainer::resume(
        block_stack(6, WIDTH),
        vec![device; 2],
        config(&dir),
        adam,
        loss,
    )
    .unwrap();
    assert_eq!(from, checkpoint);
    assert_eq!((resumed.steps(), resumed.epoch()), (6, 1));
    resumed.fit_epoch(&data, &Rows).unwrap();
    assert_eq!(resumed.steps(), 8);
    assert_eq!(flat_weights(&resumed.to_layer_stack().unwrap()), expected);
    let _ = std::fs::remove_dir_all(&base);
}
