//! No failing part panics the caller: a group (or trainer) that lost every
//! replica keeps its shape and refuses the rest with `GroupLost`, an
//! optimizer step that panics is an error naming the replica and stage, and
//! a thread that cannot start is an error naming the replica (and stage).
//!
//! The tests arm injected faults (one registry per process) and each forms
//! the process's one collective group: they run one at a time.

mod common;

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use burn::nn::Linear;
use burn::optim::SgdConfig;
use burn::prelude::*;
use burn_elastic_dp::fault::{REGISTER_THREAD, REPLICA_THREAD};
use burn_elastic_dp::{
    BatchPolicy, CostModel, ElasticError, FreezeRule, ReplicaConfig, ReplicaGroup, TrainerConfig,
    TrainerError,
};
use burn_freeze::fault::{self, Fault, Phase};
use burn_freeze::testing::Tripwire;
use burn_freeze::{FreezeFront, LayerStack, StackMarker, StackOptimizer};
use burn_pipe::{PipeError, PipelineConfig};
use common::{B, Block, Rows, block, flat_weights, four_class_rows, linear, loss, numbers};

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(PoisonError::into_inner)
}

const WIDTH: usize = 8;

/// A residual unit that stalls for a second on a batch of exactly `stall_on`
/// samples (0: never): a replica stuck in its own computation (the test's
/// model sleeps; the tests themselves do not).
#[derive(Module, Debug)]
pub struct Stalling<B: Backend> {
    linear: Linear<B>,
    #[module(skip)]
    stall_on: usize,
}

impl<B: Backend> Stalling<B> {
    pub fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        if x.dims()[0] == self.stall_on {
            std::thread::sleep(Duration::from_secs(1));
        }
        x.clone() + self.linear.forward(x).tanh()
    }
}

burn_freeze::unit!(Stalling<B>: Tensor<B, 2> => Tensor<B, 2>);

type Types = StackMarker<B, Block<B>, Stalling<B>, Block<B>>;

/// 6 units of width 8; unit 1 (on stage 0) stalls on batches of `stall_on`.
fn stack(stall_on: usize) -> LayerStack<Types> {
    let stalling = |seed| Stalling {
        linear: linear(seed, WIDTH, WIDTH),
        stall_on: if seed == 2 { stall_on } else { 0 },
    };
    let stack = LayerStack::new(
        block(1, WIDTH),
        (2..6).map(stalling).collect(),
        block(6, WIDTH),
    );
    stack.materialize();
    stack
}

/// Batch `seed` of `n` samples of 4 classes.
fn batch(seed: u64, n: usize) -> (Tensor<B, 2>, Tensor<B, 1, Int>) {
    let device = Default::default();
    let labels: Vec<i64> = (0..n).map(|i| (i % 4) as i64).collect();
    (
        Tensor::<B, 1>::from_data(
            TensorData::new(numbers(seed, n * WIDTH), [n * WIDTH]),
            &device,
        )
        .reshape([n, WIDTH]),
        Tensor::from_data(TensorData::new(labels, [n]), &device),
    )
}

/// `replicas` replicas of a 2-stage pipeline (2 micro-batches) of
/// [`stack`], waits bounded at `timeout_ms`, each stage's SGD optimizer made
/// through `tripwire` (numbered replica after replica, stage after stage).
fn group(
    replicas: usize,
    timeout_ms: u64,
    stall_on: usize,
    tripwire: &Arc<Tripwire>,
) -> ReplicaGroup<Types, impl StackOptimizer<Types>> {
    let tripwire = Arc::clone(tripwire);
    ReplicaConfig::new()
        .with_timeout_ms(timeout_ms)
        .with_pipeline(
            PipelineConfig::new()
                .with_micro_batches(Some(2))
                .with_timeout_ms(5_000),
        )
        .init(
            stack(stall_on),
            vec![vec![Default::default(); 2]; replicas],
            move || tripwire.wrap(SgdConfig::new().init()),
        )
        .unwrap()
}

fn fault_at(phase: Phase, stage: usize) -> Fault {
    Fault {
        phase,
        stage: Some(stage),
        micro_batch: None,
        panic: false,
        stall: None,
    }
}

#[test]
fn a_group_that_lost_every_replica_keeps_its_shape_and_refuses_the_rest() {
    let _serial = serial();
    // One replica, which stalls a second on its 4-sample micro-batches,
    // against a 200 ms bound: the step leaves it behind.
    let mut group = group(1, 200, 4, &Tripwire::new());
    group.freeze_to(1).unwrap();
    let shape = (group.front(), group.balance(), group.micro_batches());
    let (x, y) = batch(1, 8);
    let error = group
        .train_step(x.clone(), y.clone(), loss, 0.1)
        .unwrap_err();
    assert!(
        matches!(&error, ElasticError::Timeout { lost, .. } if lost == &[0]),
        "{error}"
    );
    assert_eq!(group.num_replicas(), 0);

    // What the group tells of its model: as the replica had it.
    assert_eq!(
        (group.front(), group.balance(), group.micro_batches()),
        shape
    );
    assert_eq!((group.num_stages(), group.num_units()), (2, 6));
    assert_eq!(FreezeFront::last_gradient_norms(&group), vec![None; 6]);
    assert_eq!(FreezeFront::gradient_sum_norms(&group), vec![None; 6]);
    // The rest: a one-line error, no panic.
    let lost = |result: Result<(), ElasticError>| match result {
        Err(ElasticError::GroupLost) => {}
        other => panic!("expected GroupLost, got {other:?}"),
    };
    lost(group.to_layer_stack().map(drop));
    lost(group.forward_inner(x.clone().inner()).map(drop));
    lost(group.optimizer_record().map(drop));
    lost(group.freeze_to(2));
    lost(group.train_step(x, y, loss, 0.1).map(drop));
    let error = group.into_layer_stack().map(drop).unwrap_err();
    assert!(
        error
            .to_string()
            .starts_with("every replica of the group was lost"),
        "{error}"
    );
}

#[test]
fn a_trainer_that_lost_every_replica_keeps_its_front_and_refuses_the_rest() {
    let _serial = serial();
    let device: Device<B> = Default::default();
    // Batches of 16 in 2 micro-batches of 8 on K = 2, R = 1: the first step
    // stalls a second against a 200 ms bound, and the only replica is left
    // behind.
    let mut trainer = TrainerConfig::new()
        .with_freeze(FreezeRule::Fronts { layers: vec![0, 2] })
        .with_stages(Some(2))
        .with_batch(BatchPolicy::FixedGlobal { batch: 16 })
        .with_costs(CostModel::Parameters {
            frozen_factor: 1.0 / 3.0,
        })
        .with_replicas(
            ReplicaConfig::new().with_timeout_ms(200).with_pipeline(
                PipelineConfig::new()
                    .with_micro_batches(Some(2))
                    .with_timeout_ms(5_000),
            ),
        )
        .init(stack(8), vec![device; 2], || SgdConfig::new().init(), loss)
        .unwrap();
    let data = four_class_rows::<WIDTH>(64);
    let front = trainer.front();
    let error = trainer.fit_epoch(&data, &Rows).unwrap_err();
    assert!(
        matches!(&error, TrainerError::Elastic(ElasticError::Timeout { lost, .. }) if lost == &[0]),
        "{error}"
    );
    assert_eq!(trainer.front(), front);
    let lost = |result: Result<(), TrainerError>| match result {
        Err(TrainerError::Elastic(ElasticError::GroupLost)) => {}
        other => panic!("expected GroupLost, got {other:?}"),
    };
    let (x, _) = batch(2, 3);
    lost(trainer.to_layer_stack().map(drop));
    lost(trainer.forward_inner(x.inner()).map(drop));
    lost(trainer.fit_epoch(&data, &Rows).map(drop));
    lost(trainer.into_layer_stack().map(drop));
}

#[test]
fn an_optimizer_step_that_panics_names_the_replica_and_stage() {
    let _serial = serial();
    // Optimizers 0, 1 on replica 0's stages, 2, 3 on replica 1's.
    let tripwire = Tripwire::new();
    let mut group = group(2, 5_000, 0, &tripwire);
    let (x, y) = batch(3, 8);

    // Replica 1's stage 1 panics (after stepping): the step is undone on
    // replica 1, which is now a step behind replica 0 and leaves.
    group.forward_backward(x.clone(), y.clone(), loss).unwrap();
    tripwire.arm(&[3]);
    let error = group.step(0.1).unwrap_err();
    assert!(tripwire.fired());
    match &error {
        ElasticError::PartialStep { failed, source } => {
            assert_eq!(failed, &[1]);
            assert!(
                matches!(
                    **source,
                    ElasticError::Replica {
                        replica: 1,
                        source: PipeError::StepPanicked { stage: 1, .. }
                    }
                ),
                "{source}"
            );
        }
        other => panic!("expected PartialStep, got {other:?}"),
    }
    assert!(
        error.to_string().starts_with(
            "replicas [1] failed their optimizer step while the others stepped: replica 1: stage 1's optimizer step panicked: optimizer 3 failed on purpose"
        ),
        "{error}"
    );
    let behind = flat_weights(&group.replica(1).to_layer_stack());
    let ahead = flat_weights(&group.replica(0).to_layer_stack());
    assert_ne!(behind, ahead);
    group.remove_replica(1).unwrap();
    group.train_step(x.clone(), y.clone(), loss, 0.1).unwrap();

    // Every replica's stage 1 panics: nothing changed anywhere, and the
    // next step goes through.
    let mut group = {
        drop(group);
        group_of_two(&tripwire)
    };
    let before = flat_weights(&group.to_layer_stack().unwrap());
    group.forward_backward(x.clone(), y.clone(), loss).unwrap();
    tripwire.arm(&[5, 7]);
    let error = group.step(0.1).unwrap_err();
    assert!(tripwire.fired());
    assert!(
        matches!(
            error,
            ElasticError::Replica {
                replica: 0,
                source: PipeError::StepPanicked { stage: 1, .. }
            }
        ),
        "{error}"
    );
    for replica in 0..2 {
        assert_eq!(
            flat_weights(&group.replica(replica).to_layer_stack()),
            before
        );
        assert!(group.replica(replica).gradients(0).is_none());
    }
    group.train_step(x, y, loss, 0.1).unwrap();
    assert_ne!(flat_weights(&group.to_layer_stack().unwrap()), before);
}

/// A second group of two replicas through `tripwire` (its optimizers are
/// numbered on from the first group's).
fn group_of_two(tripwire: &Arc<Tripwire>) -> ReplicaGroup<Types, impl StackOptimizer<Types>> {
    group(2, 5_000, 0, tripwire)
}

#[test]
fn a_thread_that_cannot_start_is_an_error_naming_the_replica_and_changes_nothing() {
    let _serial = serial();
    let mut group = group(2, 5_000, 0, &Tripwire::new());
    let before = flat_weights(&group.to_layer_stack().unwrap());
    let (x, y) = batch(4, 8);

    // The registration of replica 1's peer with the collective.
    fault::arm(fault_at(REGISTER_THREAD, 1));
    let error = group
        .forward_backward(x.clone(), y.clone(), loss)
        .unwrap_err();
    assert!(!fault::disarm(), "the fault fired");
    assert!(
        matches!(
            error,
            ElasticError::Spawn {
                replica: 1,
                what: "registration",
                ..
            }
        ),
        "{error:?}"
    );

    // Replica 1's thread for its share of the step.
    fault::arm(fault_at(REPLICA_THREAD, 1));
    let error = group
        .forward_backward(x.clone(), y.clone(), loss)
        .unwrap_err();
    assert!(!fault::disarm(), "the fault fired");
    assert_eq!(
        error.to_string(),
        "replica 1: could not start its step thread: injected fault in replica thread start at stage 1"
    );

    // Stage 1's worker thread of a replica's pipeline: the error names both.
    fault::arm(fault_at(burn_pipe::fault::STAGE_THREAD, 1));
    let error = group
        .forward_backward(x.clone(), y.clone(), loss)
        .unwrap_err();
    assert!(!fault::disarm(), "the fault fired");
    assert!(
        matches!(
            error,
            ElasticError::Replica {
                source: PipeError::Spawn {
                    stage: 1,
                    what: "stage",
                    ..
                },
                ..
            }
        ),
        "{error:?}"
    );
    assert_eq!(group.num_replicas(), 2);
    for replica in 0..2 {
        assert!(group.replica(replica).gradients(0).is_none());
    }

    // Replica 1's thread for its optimizer step: no replica steps.
    group.forward_backward(x.clone(), y.clone(), loss).unwrap();
    fault::arm(fault_at(REPLICA_THREAD, 1));
    let error = group.step(0.1).unwrap_err();
    assert!(!fault::disarm(), "the fault fired");
    assert!(
        matches!(
            error,
            ElasticError::Spawn {
                replica: 1,
                what: "optimizer step",
                ..
            }
        ),
        "{error:?}"
    );
    for replica in 0..2 {
        assert_eq!(
            flat_weights(&group.replica(replica).to_layer_stack()),
            before
        );
        assert!(group.replica(replica).gradients(0).is_none());
    }

    // Nothing was lost: the next step trains both replicas alike.
    group.train_step(x, y, loss, 0.1).unwrap();
    let after = flat_weights(&group.replica(0).to_layer_stack());
    assert_ne!(after, before);
    assert_eq!(flat_weights(&group.replica(1).to_layer_stack()), after);
}

#[test]
fn a_repartition_into_no_stage_is_refused_naming_the_replica() {
    let _serial = serial();
    let mut group = group(2, 5_000, 0, &Tripwire::new());
    let balance = group.balance();
    let error = group.repartition(&[], vec![Vec::new(); 2]).unwrap_err();
    assert!(
        matches!(
            error,
            ElasticError::Replica {
                replica: 0,
                source: PipeError::NoStages
            }
        ),
        "{error:?}"
    );
    assert_eq!(group.balance(), balance);
}
