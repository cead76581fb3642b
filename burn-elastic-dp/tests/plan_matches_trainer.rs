//! The planner decides as the trainer does: on the main job's configuration
//! (`examples/src/bin/train.rs`: ViT's layout of an embedding, two units
//! per block and a head; the alpha schedule at 1/3; every part on;
//! parameter-count costs; 4 devices; a global batch of 32), the planner's
//! F, front, K, R, M and balance of every epoch equal the shape the trainer
//! trains that epoch with: its starting shape, then each transition's.
//! The units differ in size, so that balancing and compressing have
//! choices to make. Three starts: the paper's (one pipeline over every
//! device, compressed under the starting largest stage), memory-aware
//! AutoPipe under a budget that needs 4 stages, and memory-aware without a
//! budget (pure data parallelism from the start).

use burn::data::dataloader::batcher::Batcher;
use burn::data::dataset::InMemDataset;
use burn::nn::{Linear, LinearConfig};
use burn::optim::AdamConfig;
use burn::prelude::*;
use burn_elastic_dp::plan::{ClusterConfig, Link, ModelSpec, PlanConfig, UnitSpec, plan};
use burn_elastic_dp::shape::{ShapeRule, ShapeSettings};
use burn_elastic_dp::{
    BatchPolicy, CostModel, FreezeRule, LayerSpec, MemoryConfig, Parts, ReplicaConfig,
    TrainerConfig,
};
use burn_freeze::{LayerStack, StackMarker};
use burn_pipe::micro::MicroBatchTimes;
use burn_pipe::{UnitCosts, UnitMemory};

mod common;

use common::{B, loss, numbers};

const WIDTH: usize = 8;
const DEVICES: usize = 4;
const BATCH: usize = 32;
const SAMPLES: usize = 64;
const EPOCHS: usize = 5;

/// A residual MLP unit whose hidden width sets its parameter count.
#[derive(Module, Debug)]
pub struct Mlp<B: Backend> {
    up: Linear<B>,
    down: Linear<B>,
}

impl<B: Backend> Mlp<B> {
    pub fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        x.clone() + self.down.forward(self.up.forward(x).tanh())
    }
}

burn_freeze::unit!(Mlp<B>: Tensor<B, 2> => Tensor<B, 2>);

type Types = StackMarker<B, Mlp<B>, Mlp<B>, Mlp<B>>;

fn mlp(hidden: usize, device: &Device<B>) -> Mlp<B> {
    Mlp {
        up: LinearConfig::new(WIDTH, hidden).init(device),
        down: LinearConfig::new(hidden, WIDTH).init(device),
    }
}

/// ViT's layout at 4 blocks: an embedding, attention and MLP per block,
/// a norm and a head (11 units), each its own size.
fn stack(device: &Device<B>) -> LayerStack<Types> {
    let mut middle = Vec::new();
    for _ in 0..4 {
        middle.push(mlp(2, device)); // attention
        middle.push(mlp(8, device)); // MLP
    }
    middle.push(mlp(1, device)); // norm
    LayerStack::new(mlp(4, device), middle, mlp(4, device))
}

/// The main job's trainer configuration (`train`'s defaults on 4 devices).
fn job_config() -> TrainerConfig {
    TrainerConfig::new()
        .with_parts(Parts::new())
        .with_freeze(FreezeRule::AlphaSchedule { alpha: 1.0 / 3.0 })
        .with_layers(LayerSpec::Uniform {
            offset: 1,
            per_layer: 2,
            layers: 4,
        })
        .with_costs(CostModel::Parameters {
            frozen_factor: 1.0 / 3.0,
        })
        .with_replicas(ReplicaConfig::new())
        .with_batch(BatchPolicy::FixedGlobal { batch: BATCH })
        .with_lr(3e-3)
        .with_seed(42)
}

/// The planner's view of the same run: the stack's units (parameter bytes
/// of 4-byte values), the trainer's layers, parts, freeze rule and costs.
fn planned(
    config: &TrainerConfig,
    params: &[usize],
    times: Option<MicroBatchTimes>,
) -> Vec<EpochShape> {
    planned_on(config, params, 1, times)
}

/// [`planned`] on `nodes` nodes of `DEVICES` devices (the ranks of an MPI
/// job, every one running the shape rule in lockstep), M chosen from
/// `times` (the trainer's measured micro-batch times) when given.
fn planned_on(
    config: &TrainerConfig,
    params: &[usize],
    nodes: usize,
    times: Option<MicroBatchTimes>,
) -> Vec<EpochShape> {
    let units = params
        .iter()
        .enumerate()
        .map(|(u, &n)| UnitSpec {
            name: format!("unit {u}"),
            forward: 1e-6 * n as f64,
            backward: 2e-6 * n as f64,
            forward_fixed: 0.0,
            backward_fixed: 0.0,
            measured: vec![],
            activation_bytes: 4 * WIDTH,
            saved_bytes: 0,
            param_tensors: vec![4 * n],
        })
        .collect();
    let model = ModelSpec {
        model: "the job's layout".into(),
        source: "parameter counts".into(),
        layers: config.layers,
        units,
    };
    let link = Link::new(1e15, 0.0);
    let plan_config = PlanConfig::new(
        ClusterConfig::new(DEVICES, nodes, link, link),
        config.batch,
        SAMPLES,
        EPOCHS,
        config.freeze.clone(),
    )
    .with_parts(config.parts)
    .with_costs(config.costs)
    .with_stages(config.stages)
    .with_memory(config.memory.clone())
    .with_micro_batches(config.replicas.pipeline.micro_batches)
    .with_micro_batch_times(times);
    plan(&plan_config, &model)
        .unwrap()
        .epochs
        .iter()
        .map(|e| EpochShape {
            frozen_layers: e.frozen_layers,
            front: e.front,
            stages: e.stages,
            replicas: e.replicas,
            micro_batches: e.micro_batches,
            balance: e.balance.clone(),
        })
        .collect()
}

/// What an epoch trains with.
#[derive(Debug, Clone, PartialEq)]
struct EpochShape {
    frozen_layers: usize,
    front: usize,
    stages: usize,
    replicas: usize,
    micro_batches: usize,
    balance: Vec<usize>,
}

#[derive(Clone)]
struct Points;

impl Batcher<B, ([f32; WIDTH], i64), (Tensor<B, 2>, Tensor<B, 1, Int>)> for Points {
    fn batch(
        &self,
        items: Vec<([f32; WIDTH], i64)>,
        device: &Device<B>,
    ) -> (Tensor<B, 2>, Tensor<B, 1, Int>) {
        let n = items.len();
        let x: Vec<f32> = items.iter().flat_map(|(x, _)| *x).collect();
        let y: Vec<i64> = items.iter().map(|(_, y)| *y).collect();
        (
            Tensor::<B, 1>::from_data(TensorData::new(x, [n * WIDTH]), device).reshape([n, WIDTH]),
            Tensor::from_data(TensorData::new(y, [n]), device),
        )
    }
}

/// The trainer's shapes, epoch by epoch: the starting one, then after each
/// epoch the last transition's (or the same when the front did not move);
/// R counts the replicas of every process, M is the count the epoch ran
/// with; and the micro-batch times the trainer measured.
fn trained(config: &TrainerConfig) -> (Vec<EpochShape>, Vec<usize>, Option<MicroBatchTimes>) {
    let device: Device<B> = Default::default();
    <B as Backend>::seed(&device, 7);
    let stack = stack(&device);
    let params = stack.unit_params();
    let values = numbers(3, SAMPLES * WIDTH);
    let data = InMemDataset::new(
        (0..SAMPLES)
            .map(|i| {
                let x: [f32; WIDTH] = std::array::from_fn(|j| values[i * WIDTH + j]);
                (x, i64::from(x[0] + x[1] > 0.0))
            })
            .collect(),
    );
    let mut trainer = config
        .init(
            stack,
            vec![device; DEVICES],
            || AdamConfig::new().init(),
            loss,
        )
        .unwrap();
    let shape = trainer.shape();
    let mut current = EpochShape {
        frozen_layers: trainer.frozen_layers(),
        front: trainer.front(),
        stages: shape.stages(),
        replicas: trainer.group().total_replicas(),
        micro_batches: config.replicas.pipeline.micro_batches_for(shape.stages()),
        balance: shape.balance.clone(),
    };
    let mut epochs = Vec::new();
    for epoch in 0..EPOCHS {
        let report = trainer.fit_epoch(&data, &Points).unwrap();
        if epoch == 0 {
            // M measured on the first batch, before the first step.
            current.micro_batches = report.micro_batches;
        }
        epochs.push(current.clone());
        if let Some(t) = report.transitions.last() {
            current = EpochShape {
                frozen_layers: t.frozen_layers,
                front: t.front.1,
                stages: t.stages.1,
                replicas: t.total_replicas.1,
                micro_batches: t.micro_batches,
                balance: t.balance.clone(),
            };
        }
    }
    let times = trainer.shape_rule().micro_batch_times().cloned();
    (epochs, params, times)
}

/// Trains `config`, plans it, and checks that the two agree epoch by
/// epoch; returns the epochs.
fn agree(config: &TrainerConfig) -> Vec<EpochShape> {
    let (trained, params, times) = trained(config);
    // Given the trainer's micro-batch times, the planner chooses each
    // shape's M as the trainer did.
    let planned = planned(config, &params, times);
    assert_eq!(planned, trained);
    trained
}

/// The run reshapes: the front moves, the pipeline compresses and replicas
/// grow.
fn assert_reshapes(epochs: &[EpochShape]) {
    let last = epochs.last().unwrap();
    assert!(
        last.front > 0 && last.stages < epochs[0].stages,
        "{epochs:?}"
    );
    assert!(last.replicas > epochs[0].replicas, "{epochs:?}");
}

#[test]
fn the_planner_decides_every_epoch_as_the_trainer_does() {
    // The paper's start: one pipeline over the 4 devices.
    let epochs = agree(&job_config().with_stages(Some(DEVICES)));
    assert_eq!(epochs[0].stages, DEVICES);
    assert_reshapes(&epochs);
}

#[test]
fn memory_aware_the_planner_decides_as_the_trainer_does() {
    // A budget that holds the largest stage of the 4-stage balance (its
    // parameters, gradients and Adam's two moments; activations are not
    // measured here) and no 2-stage one: the run starts at K = 4 and falls
    // as frozen units shed their gradients and optimizer state.
    let config =
        job_config().with_memory(MemoryConfig::new().with_device_bytes(Some(four_stage_budget())));
    let epochs = agree(&config);
    assert_eq!((epochs[0].stages, epochs[0].replicas), (4, 1), "{epochs:?}");
    assert_reshapes(&epochs);
    // Without a budget every model fits one device: 1 stage, 4 replicas
    // from the start, the same shape throughout.
    let epochs = agree(&job_config());
    assert!(
        epochs
            .iter()
            .all(|e| (e.stages, e.replicas) == (1, DEVICES)),
        "{epochs:?}"
    );
}

/// A budget that holds the largest stage of the 4-stage balance (its
/// parameters, gradients and Adam's two moments; activations are not
/// measured here) and no 2-stage one.
fn four_stage_budget() -> u64 {
    let device: Device<B> = Default::default();
    let params = stack(&device).unit_params();
    let costs = UnitCosts::from_params(&params, 1.0 / 3.0);
    let mut settings = ShapeSettings::new(DEVICES, BatchPolicy::FixedGlobal { batch: BATCH });
    settings.stages = Some(4);
    let mut rule = ShapeRule::new(settings, costs, UnitMemory::from_param_counts(&params, 4));
    let four = rule.start().unwrap();
    rule.stage_memory(&four.balance, 0)
        .iter()
        .map(|m| m.total())
        .max()
        .unwrap()
}

/// Across the 2 ranks of an MPI job, 4 devices each, memory-aware with the
/// budget of 4 stages (a global batch of 64: the paper's M of 16 on up to
/// 4 replicas): the planner told 2 nodes predicts every epoch's shape, R
/// counting both ranks' replicas. The test binary runs itself under
/// `mpirun` as the ranks (`PLAN_MATCHES_RANK_OUT` makes it a rank).
#[cfg(feature = "mpi")]
#[test]
fn across_two_ranks_the_planner_decides_every_epoch_as_the_trainer_does() {
    const OUT: &str = "PLAN_MATCHES_RANK_OUT";
    // M pinned to the paper's count (each rank's clock is its own; the
    // planner here has no table).
    let config = job_config()
        .with_batch(BatchPolicy::FixedGlobal { batch: 64 })
        .with_memory(MemoryConfig::new().with_device_bytes(Some(four_stage_budget())))
        .with_measure_micro_batches(false);
    if let Ok(out) = std::env::var(OUT) {
        let mpi = burn_elastic_dp::Mpi::init().unwrap();
        let replicas = config
            .replicas
            .clone()
            .with_nodes(Some(burn_elastic_dp::NodeConfig::new()));
        let (epochs, _, _) = trained(&config.clone().with_replicas(replicas));
        std::fs::write(format!("{out}-{}", mpi.rank()), format!("{epochs:?}")).unwrap();
        return;
    }
    let out =
        std::env::temp_dir().join(format!("burn-elastic-dp-plan-ranks-{}", std::process::id()));
    let job = common::mpirun(
        "across_two_ranks_the_planner_decides_every_epoch_as_the_trainer_does",
        2,
        false,
        &[(OUT, out.display().to_string())],
    );
    let (status, stderr) = common::finish(job, std::time::Duration::from_secs(300));
    assert!(
        status.is_some_and(|s| s.success()),
        "the MPI job failed ({status:?}):\n{stderr}"
    );
    let device: Device<B> = Default::default();
    let params = stack(&device).unit_params();
    let planned = planned_on(&config, &params, 2, None);
    assert_eq!(
        (planned[0].stages, planned[0].replicas),
        (4, 2),
        "{planned:?}"
    );
    assert_reshapes(&planned);
    for rank in 0..2 {
        let path = format!("{}-{rank}", out.display());
        let trained = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        let _ = std::fs::remove_file(&path);
        assert_eq!(trained, format!("{planned:?}"), "rank {rank}");
    }
    println!(
        "2 ranks x {DEVICES} devices, (F, K, total R) by epoch: {:?}",
        planned
            .iter()
            .map(|e| (e.frozen_layers, e.stages, e.replicas))
            .collect::<Vec<_>>()
    );
}
