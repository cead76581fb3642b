//! The trainer's micro-batch count: chosen from micro-batch times for each
//! shape (at the first step and after each transition) and run, logged with
//! each transition, under any cost model; the times checkpointed, so that a
//! resumed run chooses as the run it continues; the paper's rule with
//! measuring off; a configured count always holds.

use std::time::Duration;

use burn::data::dataset::InMemDataset;
use burn::optim::AdamConfig;
use burn::prelude::*;
use burn_elastic_dp::{
    BatchPolicy, CostModel, FreezeRule, ReplicaConfig, Trainer, TrainerConfig, TrainerError,
    TrainerTypesOf,
};
use burn_freeze::{LayerStack, TrainableUnits};
use burn_pipe::balance::UnitState;
use burn_pipe::micro::{
    MicroBatchQuery, MicroBatchTimes, micro_batch_candidates, micro_batch_profile_sizes,
};
use burn_pipe::{PipelineConfig, UnitProfile, choose_micro_batches, default_micro_batches};

mod common;

use common::{B, Rows, Types, block_stack, loss, numbers};

const WIDTH: usize = 8;
const UNITS: usize = 8;
const BATCH: usize = 32;

fn stack() -> LayerStack<Types> {
    block_stack(UNITS, WIDTH)
}

type Item = ([f32; WIDTH], i64);

fn dataset(len: usize) -> InMemDataset<Item> {
    let values = numbers(11, len * WIDTH);
    InMemDataset::new(
        values
            .chunks(WIDTH)
            .map(|x| {
                let x: [f32; WIDTH] = x.try_into().unwrap();
                (x, i64::from(x[0] + x[1] > 0.0))
            })
            .collect(),
    )
}

/// Half the units frozen after epoch 0 (K = 4, R = 1 -> K = 2, R = 2 on
/// parameter costs), a global batch of 32.
fn config() -> TrainerConfig {
    // The paper's start (4 stages), so that M has a pipeline to fill; a run
    // that starts at one stage keeps M = 1 and measures nothing.
    TrainerConfig::new()
        .with_stages(Some(4))
        .with_freeze(FreezeRule::Fronts {
            layers: vec![0, UNITS / 2],
        })
        .with_batch(BatchPolicy::FixedGlobal { batch: BATCH })
        .with_costs(CostModel::Parameters {
            frozen_factor: 1.0 / 3.0,
        })
        .with_seed(5)
}

type Run = Trainer<
    TrainerTypesOf<
        Types,
        burn::optim::adaptor::OptimizerAdaptor<burn::optim::Adam, TrainableUnits<Types>, B>,
        Tensor<B, 1, Int>,
    >,
>;

fn trainer(config: TrainerConfig) -> Run {
    let device: Device<B> = Default::default();
    config
        .init(stack(), vec![device; 4], || AdamConfig::new().init(), loss)
        .unwrap()
}

/// Per-sample time that rises steeply below 8 samples: a micro-batch of
/// fewer costs as much as one of 8 (1 ms forward, 2 ms backward per sample).
fn steep_below_8() -> MicroBatchTimes {
    MicroBatchTimes::from_fn(&micro_batch_profile_sizes(BATCH), UNITS, |_, n| {
        UnitProfile {
            forward: Duration::from_millis(n.max(8) as u64),
            backward: Duration::from_millis(2 * n.max(8) as u64),
        }
    })
    .unwrap()
}

fn tempdir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("micro-batches-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

#[test]
fn the_chosen_micro_batch_count_is_what_runs_at_every_shape() {
    let out = tempdir("chosen");
    let mut trainer = trainer(config().with_output_dir(Some(out.clone())));
    assert_eq!(trainer.group().micro_batches(), default_micro_batches(4));
    let choice = trainer
        .set_micro_batch_times(steep_below_8())
        .unwrap()
        .cloned();
    // K = 4 on 32 samples: micro-batches of 8 or more (4 of 8 on devices
    // of their own; fewer where the 4 logical devices share this machine's
    // cores), not the paper's 16 of 2.
    let choice = choice.expect("no count configured: M is chosen");
    let m = expected_m(&trainer, &steep_below_8(), 0);
    assert_eq!(choice.micro_batches, m);
    assert!((1..=4).contains(&m), "{choice:?}");
    assert_eq!(choice.paper_micro_batches, 16);
    assert_eq!(trainer.group().micro_batches(), m);

    let data = dataset(4 * BATCH);
    let first = trainer.fit_epoch(&data, &Rows).unwrap();
    assert_eq!((first.stages, first.replicas), (4, 1));
    assert_eq!(first.micro_batches, m, "the steps ran with the chosen M");
    assert_eq!(first.samples, 4 * BATCH);

    // After the transition: K = 2, R = 2, 16 samples per replica, half
    // the units cached; M chosen again for that shape.
    let [transition] = first.transitions.as_slice() else {
        panic!("one transition: {:?}", first.transitions);
    };
    assert_eq!((transition.stages, transition.replicas), ((4, 2), (1, 2)));
    let shape = trainer.shape();
    let states: Vec<UnitState> = (0..UNITS)
        .map(|u| UnitState::of(u, UNITS / 2, (UNITS / 2).min(shape.balance[0])))
        .collect();
    let expected = choose_micro_batches(
        &steep_below_8(),
        &MicroBatchQuery {
            balance: &shape.balance,
            states: &states,
            batch_per_replica: BATCH / 2,
            schedule: trainer.config().replicas.pipeline.schedule,
            // Logical devices: the cores they share bound the step.
            shared: trainer.shape_rule().settings().shared(shape.replicas),
        },
    )
    .unwrap();
    assert_eq!(transition.micro_batch_choice.as_ref(), Some(&expected));
    assert_eq!(transition.micro_batches, expected.micro_batches);
    assert!((1..=2).contains(&expected.micro_batches), "{expected:?}");
    assert_ne!(expected.micro_batches, default_micro_batches(2));
    assert_eq!(trainer.micro_batch_choice(), Some(&expected));

    let second = trainer.fit_epoch(&data, &Rows).unwrap();
    assert_eq!((second.stages, second.replicas), (2, 2));
    assert_eq!(second.micro_batches, expected.micro_batches);
    for r in 0..trainer.group().num_replicas() {
        assert_eq!(
            trainer.group().replica(r).micro_batches(),
            expected.micro_batches
        );
    }
    // The log has M and how it was chosen next to it.
    let lines = std::fs::read_to_string(out.join("transitions.jsonl")).unwrap();
    let after = expected.micro_batches;
    assert!(
        lines.contains(&format!(
            "\"micro_batches\":{after},\"micro_batch_choice\":{{\"micro_batches\":{after}"
        )),
        "{lines}"
    );
    let epochs = std::fs::read_to_string(out.join("epochs.jsonl")).unwrap();
    assert!(
        epochs.contains(&format!("\"micro_batches\":{m}")),
        "{epochs}"
    );
    let _ = std::fs::remove_dir_all(out);
}

#[test]
fn measuring_off_keeps_the_papers_count() {
    let mut trainer = trainer(config().with_measure_micro_batches(false));
    let report = trainer.fit_epoch(&dataset(2 * BATCH), &Rows).unwrap();
    assert_eq!(report.micro_batches, default_micro_batches(4));
    assert_eq!(
        report.transitions[0].micro_batches,
        default_micro_batches(2)
    );
    assert_eq!(report.transitions[0].micro_batch_choice, None);
    assert!(trainer.micro_batch_choice().is_none());
}

#[test]
fn a_configured_count_holds_over_measured_times() {
    let pipeline = PipelineConfig::new().with_micro_batches(Some(8));
    let mut trainer = trainer(config().with_replicas(ReplicaConfig::new().with_pipeline(pipeline)));
    assert!(
        trainer
            .set_micro_batch_times(steep_below_8())
            .unwrap()
            .is_none()
    );
    let report = trainer.fit_epoch(&dataset(2 * BATCH), &Rows).unwrap();
    assert_eq!(report.micro_batches, 8);
    assert_eq!(report.transitions[0].micro_batches, 8);
    assert_eq!(trainer.group().micro_batches(), 8);
}

#[test]
fn a_table_of_another_model_is_refused() {
    let mut trainer = trainer(config());
    let times = MicroBatchTimes::from_fn(&[1, 2], UNITS - 1, |_, _| UnitProfile {
        forward: Duration::from_millis(1),
        backward: Duration::from_millis(1),
    })
    .unwrap();
    let error = trainer.set_micro_batch_times(times).unwrap_err();
    assert!(
        matches!(
            error,
            TrainerError::InvalidRunValue {
                what: "micro_batch_times",
                ..
            }
        ),
        "{error}"
    );
    assert!(trainer.micro_batch_choice().is_none());
    assert_eq!(trainer.group().micro_batches(), default_micro_batches(4));
}

#[test]
fn parameter_costs_measure_micro_batch_times_on_the_first_batch() {
    measured_on_the_first_batch(config());
}

#[test]
fn profiled_costs_measure_micro_batch_times_on_the_first_batch() {
    measured_on_the_first_batch(config().with_costs(CostModel::Profiled { repeats: 1 }));
}

#[test]
fn profiled_costs_are_the_micro_batch_tables_row_at_the_whole_batch() {
    // One profile of the first batch, not two: the costs the pipeline is
    // balanced on are the table's times at the batch's size.
    let mut trainer = trainer(config().with_costs(CostModel::Profiled { repeats: 1 }));
    trainer.fit_epoch(&dataset(2 * BATCH), &Rows).unwrap();
    let table = trainer
        .shape_rule()
        .micro_batch_times()
        .expect("measured on the first batch");
    assert_eq!(table.sizes().last(), Some(&BATCH));
    let row = table.profiles().last().unwrap();
    assert_eq!(trainer.unit_costs(), &burn_pipe::UnitCosts::from_profile(row));
}

fn measured_on_the_first_batch(config: TrainerConfig) {
    let mut trainer = trainer(config);
    assert!(
        trainer.micro_batch_choice().is_none(),
        "nothing measured before the first batch"
    );
    let report = trainer.fit_epoch(&dataset(2 * BATCH), &Rows).unwrap();
    // Whatever the clock said: the chosen M is the one that ran, it keeps a
    // sample per micro-batch, and each transition chose again.
    let transition = &report.transitions[0];
    let after = transition
        .micro_batch_choice
        .as_ref()
        .expect("chosen after the transition");
    assert_eq!(after.micro_batches, transition.micro_batches);
    assert_eq!(trainer.micro_batch_choice(), Some(after));
    let per_replica = BATCH / transition.replicas.1;
    assert!((1..=per_replica).contains(&after.micro_batches));
    let searched: Vec<usize> = after.candidates.iter().map(|c| c.micro_batches).collect();
    assert_eq!(
        searched,
        micro_batch_candidates(transition.stages.1, per_replica)
    );
    assert!(report.micro_batches >= 1 && report.micro_batches <= BATCH);
    assert_eq!(trainer.group().micro_batches(), after.micro_batches);
}

#[test]
fn a_run_that_starts_at_one_stage_measures_nothing() {
    // Memory-aware AutoPipe without a budget: K = 1, R = 4 from the start;
    // one stage has no bubble and no rule lengthens the pipeline.
    let mut trainer = trainer(
        config()
            .with_stages(None)
            .with_costs(CostModel::Profiled { repeats: 1 }),
    );
    let parameter_costs = trainer.unit_costs().clone();
    let report = trainer.fit_epoch(&dataset(2 * BATCH), &Rows).unwrap();
    assert_eq!((report.stages, report.replicas), (1, 4));
    assert!(trainer.micro_batch_choice().is_none());
    assert_eq!(report.micro_batches, 1);
    // Nor unit costs: one stage has no balance to set.
    assert_eq!(trainer.unit_costs(), &parameter_costs);
    drop(trainer);
    // At the paper's start the same configuration profiles them.
    let mut trainer = self::trainer(
        config()
            .with_stages(Some(4))
            .with_costs(CostModel::Profiled { repeats: 1 }),
    );
    trainer.fit_epoch(&dataset(2 * BATCH), &Rows).unwrap();
    assert_ne!(trainer.unit_costs(), &parameter_costs);
}

#[test]
fn the_group_sets_every_replicas_count_and_refuses_zero() {
    let device: Device<B> = Default::default();
    let mut group = ReplicaConfig::new()
        .init(stack(), vec![vec![device; 2]; 2], || {
            AdamConfig::new().init()
        })
        .unwrap();
    assert_eq!(group.micro_batches(), default_micro_batches(2));
    assert!(group.set_micro_batches(Some(0)).is_err());
    assert_eq!(group.micro_batches(), default_micro_batches(2));
    group.set_micro_batches(Some(3)).unwrap();
    assert_eq!(
        (
            group.replica(0).micro_batches(),
            group.replica(1).micro_batches()
        ),
        (3, 3)
    );
    // The configuration keeps the user's setting; the running count is
    // the group's.
    assert_eq!(group.config().pipeline.micro_batches, None);
    group.set_micro_batches(None).unwrap();
    assert_eq!(group.micro_batches(), default_micro_batches(2));
}

/// The expected M of `trainer`'s current shape from `times`, the units up
/// to `front` frozen and cached on stage 0.
fn expected_m(trainer: &Run, times: &MicroBatchTimes, front: usize) -> usize {
    let shape = trainer.shape();
    let states: Vec<UnitState> = (0..UNITS)
        .map(|u| UnitState::of(u, front, front.min(shape.balance[0])))
        .collect();
    let total = trainer.group().total_replicas();
    choose_micro_batches(
        times,
        &MicroBatchQuery {
            balance: &shape.balance,
            states: &states,
            batch_per_replica: BATCH / total,
            schedule: trainer.config().replicas.pipeline.schedule,
            shared: trainer.shape_rule().settings().shared(shape.replicas),
        },
    )
    .unwrap()
    .micro_batches
}

#[test]
fn a_resumed_run_chooses_from_the_checkpointed_times_on_the_same_and_fewer_devices() {
    let dir = tempdir("resume");
    let checkpointed =
        config().with_checkpoint(Some(burn_elastic_dp::CheckpointConfig::new(dir.clone())));
    let mut trainer = trainer(checkpointed.clone());
    trainer.set_micro_batch_times(steep_below_8()).unwrap();
    let data = dataset(4 * BATCH);
    let first = trainer.fit_epoch(&data, &Rows).unwrap();
    assert_eq!(first.transitions.len(), 1);
    let (shape, m) = (trainer.shape(), trainer.group().micro_batches());
    assert_eq!((shape.stages(), shape.replicas), (2, 2));
    assert_eq!(m, expected_m(&trainer, &steep_below_8(), UNITS / 2));
    drop(trainer);

    let device: Device<B> = Default::default();
    for devices in [4, 2] {
        let (mut resumed, _) = Run::resume(
            stack(),
            vec![device; devices],
            checkpointed.clone().with_stages(Some(devices.min(4))),
            || AdamConfig::new().init(),
            loss,
        )
        .unwrap();
        // The table is the checkpoint's, not measured again (a measurement
        // on this machine's clock would not be the synthetic one).
        assert_eq!(
            resumed.shape_rule().micro_batch_times(),
            Some(&steep_below_8())
        );
        let report = resumed.fit_epoch(&data, &Rows).unwrap();
        let expected = expected_m(&resumed, &steep_below_8(), UNITS / 2);
        assert_eq!((report.stages, report.replicas), (2, devices / 2));
        assert_eq!(report.micro_batches, expected, "on {devices} devices");
        assert_eq!(resumed.group().micro_batches(), expected);
        if devices == 4 {
            assert_eq!(expected, m, "the uninterrupted run's M");
        }
        assert_eq!(
            resumed.micro_batch_choice().map(|c| c.micro_batches),
            Some(expected)
        );
    }
    let _ = std::fs::remove_dir_all(dir);
}
