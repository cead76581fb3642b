//! Memory-aware AutoPipe in the trainer: the pipeline starts at the fewest
//! stages whose every stage fits the per-device budget (1 without one), a
//! budget no partition meets is refused at init naming the unit, and on the
//! first batch the activations measured on the counted heap decide the
//! start again.

use burn::data::dataset::InMemDataset;
use burn::optim::AdamConfig;
use burn::prelude::*;
use burn_elastic_dp::{
    BatchPolicy, CostModel, FreezeRule, MemoryConfig, ReplicaConfig, TrainerConfig, TrainerError,
};
use burn_freeze::LayerStack;
use burn_pipe::PipelineConfig;
use burn_pipe::balance::HeapCounter;

mod common;

use common::{B, Rows, Types, block_stack, loss, numbers};

/// This binary counts its heap, so that the trainer measures activations.
#[global_allocator]
static HEAP: HeapCounter = HeapCounter;

/// The heap is the process's: one test at a time, so that a measurement
/// sees its own allocations only.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

const WIDTH: usize = 32;
const UNITS: usize = 8;
const DEVICES: usize = 4;
const BATCH: usize = 32;

fn stack() -> LayerStack<Types> {
    block_stack(UNITS, WIDTH)
}

/// Bytes of one unit's parameters, gradients and Adam's two moments.
fn unit_state_bytes() -> u64 {
    (WIDTH * WIDTH + WIDTH) as u64 * 4 * 4
}

type Item = ([f32; WIDTH], i64);

fn dataset(len: usize) -> InMemDataset<Item> {
    let values = numbers(5, len * WIDTH);
    InMemDataset::new(
        (0..len)
            .map(|i| {
                let x: [f32; WIDTH] = std::array::from_fn(|j| values[i * WIDTH + j]);
                (x, i64::from(x[0] > 0.0))
            })
            .collect(),
    )
}

fn config(budget: Option<u64>) -> TrainerConfig {
    TrainerConfig::new()
        .with_freeze(FreezeRule::Fronts { layers: vec![0, 6] })
        .with_batch(BatchPolicy::FixedGlobal { batch: BATCH })
        .with_costs(CostModel::Parameters {
            frozen_factor: 1.0 / 3.0,
        })
        .with_replicas(
            ReplicaConfig::new().with_pipeline(PipelineConfig::new().with_micro_batches(Some(2))),
        )
        .with_memory(MemoryConfig::new().with_device_bytes(budget))
        .with_seed(1)
}

fn init(
    config: TrainerConfig,
) -> Result<
    burn_elastic_dp::Trainer<
        burn_elastic_dp::TrainerTypesOf<
            Types,
            burn::optim::adaptor::OptimizerAdaptor<
                burn::optim::Adam,
                burn_freeze::TrainableUnits<Types>,
                B,
            >,
            Tensor<B, 1, Int>,
        >,
    >,
    TrainerError,
> {
    let device: Device<B> = Default::default();
    config.init(
        stack(),
        vec![device; DEVICES],
        || AdamConfig::new().init(),
        loss,
    )
}

#[test]
fn the_start_is_the_fewest_stages_that_fit() {
    let _serial = serial();
    // No budget, or one that holds the whole model: 1 stage, 4 replicas.
    for budget in [None, Some(UNITS as u64 * unit_state_bytes() * 4)] {
        let trainer = init(config(budget)).unwrap();
        assert_eq!(
            (trainer.shape().stages(), trainer.shape().replicas),
            (1, DEVICES),
            "{budget:?}"
        );
    }
    // About a quarter of the model (two units' state, and room for their
    // activations): 4 stages of 2 units.
    let trainer = init(config(Some(
        2 * unit_state_bytes() + unit_state_bytes() / 2,
    )))
    .unwrap();
    assert_eq!(trainer.shape().balance, vec![2; 4]);
    assert_eq!(trainer.shape().replicas, 1);
    // One group per process at a time.
    drop(trainer);
    // About half: 2 stages on 2 replicas.
    let trainer = init(config(Some(
        4 * unit_state_bytes() + unit_state_bytes() / 2,
    )))
    .unwrap();
    assert_eq!(trainer.shape().balance, vec![4, 4]);
    assert_eq!(trainer.shape().replicas, 2);
}

#[test]
fn a_budget_no_partition_meets_is_refused_at_init_naming_the_unit() {
    let _serial = serial();
    // Less than one unit's parameters, gradients and optimizer state.
    let error = init(config(Some(unit_state_bytes() / 2))).err().unwrap();
    let text = error.to_string();
    assert!(
        matches!(
            error,
            TrainerError::DoesNotFit {
                unit: 0,
                alone: true,
                ..
            }
        ),
        "{text}"
    );
    assert!(
        text.contains("unit 0") && text.contains(&unit_state_bytes().to_string()),
        "{text}"
    );
    assert!(!text.contains('\n'));
    // One unit fits, but 4 devices cannot hold 8 units at 1 a device.
    let error = init(config(Some(unit_state_bytes() + 1024))).err().unwrap();
    assert!(
        matches!(
            error,
            TrainerError::DoesNotFit {
                alone: false,
                stages: 4,
                ..
            }
        ),
        "{error}"
    );
    // A configured start with a stage over the budget.
    let error =
        init(config(Some(2 * unit_state_bytes() + unit_state_bytes() / 2)).with_stages(Some(2)))
            .err()
            .unwrap();
    assert!(
        matches!(error, TrainerError::StageDoesNotFit { stages: 2, .. }),
        "{error}"
    );
}

#[test]
fn measured_activations_decide_the_start_again_on_the_first_batch() {
    let _serial = serial();
    let data = dataset(64);
    // No budget: nothing to decide, nothing measured.
    let mut trainer = init(config(None)).unwrap();
    trainer.fit_epoch(&data, &Rows).unwrap();
    assert!(!trainer.unit_memory().knows_activations());
    drop(trainer);
    // A budget that holds everything: the activations are measured, the
    // start stays at K = 1.
    let mut trainer = init(config(Some(u64::MAX / 4))).unwrap();
    assert!(!trainer.unit_memory().knows_activations());
    trainer.fit_epoch(&data, &Rows).unwrap();
    assert_eq!(trainer.shape().stages(), 1);
    let memory = trainer.unit_memory().clone();
    drop(trainer);
    assert!(memory.knows_activations(), "{memory:?}");
    assert!(memory.activations.iter().all(|&a| a > 0), "{memory:?}");
    // A budget that holds the whole model's state and a few samples of
    // activations but not the 8 samples a replica of K = 1 R = 4 keeps:
    // parameters alone say K = 1 at init, the measured activations move
    // the start before the first step.
    let state = UNITS as u64 * unit_state_bytes();
    let activations: u64 = memory.activations.iter().sum();
    let budget = state + activations * 2;
    let mut trainer = init(config(Some(budget))).unwrap();
    assert_eq!(trainer.shape().stages(), 1);
    let report = trainer.fit_epoch(&data, &Rows).unwrap();
    assert!(report.stages > 1, "started at K = {}", report.stages);
    for stage in trainer.stage_memory() {
        assert!(stage.total() <= budget, "{stage:?} over {budget}");
    }
}
