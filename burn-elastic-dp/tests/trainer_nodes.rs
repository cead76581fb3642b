//! The PipeTransformer trainer across the processes of an MPI job: two ranks
//! of one replica each (then two each), AutoFreeze, AutoPipe and AutoCache on (AutoDP off:
//! each rank keeps its replicas; `tests/lockstep.rs` runs AutoDP), train the same batches as
//! one process with as many replicas, end bit for bit identical, at
//! the same freeze front and shape, each writing its logs and checkpoints
//! into its own `rank-<r>` directory; the batch is checked against the
//! whole group's replicas before any work.
//!
//! The test binary runs itself under `mpirun` as the ranks: the variable
//! `ELASTIC_DP_TRAINER_NODE_OUT` makes it a rank (see [`rank`]). Without
//! `mpirun` on PATH the test fails with the line that installs it.

#![cfg(feature = "mpi")]

use std::path::{Path, PathBuf};
use std::time::Duration;

use burn::data::dataloader::batcher::Batcher;
use burn::data::dataset::InMemDataset;
use burn::optim::AdamConfig;
use burn::prelude::*;
use burn_elastic_dp::{
    BatchPolicy, CheckpointConfig, CostModel, EpochReport, FreezeRule, Mpi, NodeConfig, Parts,
    TrainerConfig,
};
use burn_freeze::LayerStack;

mod common;

use common::{
    B, Types, block, difference, finish, flat_weights, from_bytes, loss, mpirun, to_bytes,
    two_micro_batch_config,
};

const WIDTH: usize = 8;
const UNITS: usize = 8;
const EPOCHS: usize = 3;
const OUT: &str = "ELASTIC_DP_TRAINER_NODE_OUT";
const DEVICES: &str = "ELASTIC_DP_TRAINER_NODE_DEVICES";

/// 8 units of equal cost, the same weights in every process.
fn stack() -> LayerStack<Types> {
    LayerStack::new(
        block(1, WIDTH),
        (0..UNITS as u64 - 2).map(|u| block(2 + u, WIDTH)).collect(),
        block(UNITS as u64, WIDTH),
    )
}

/// A sample: its features and label.
type Item = ([f32; WIDTH], i64);

/// 64 samples, the same in every process.
fn dataset() -> InMemDataset<Item> {
    common::four_class_rows(64)
}

#[derive(Clone)]
struct Rows;

impl Batcher<B, Item, (Tensor<B, 2>, Tensor<B, 1, Int>)> for Rows {
    fn batch(&self, items: Vec<Item>, device: &Device<B>) -> (Tensor<B, 2>, Tensor<B, 1, Int>) {
        let x: Vec<f32> = items.iter().flat_map(|(x, _)| *x).collect();
        let y: Vec<i64> = items.iter().map(|(_, y)| *y).collect();
        let n = items.len();
        (
            Tensor::<B, 1>::from_data(TensorData::new(x, [n * WIDTH]), device).reshape([n, WIDTH]),
            Tensor::from_data(TensorData::new(y, [n]), device),
        )
    }
}

/// Frozen layers 0, 4, 6 in epochs 0, 1, 2 (the pipeline of 4 stages
/// shortens to 2, then 1), parameter-count costs, AutoDP off, a fixed
/// global batch of 16, 2 micro-batches per replica.
fn config() -> TrainerConfig {
    two_micro_batch_config(BatchPolicy::FixedGlobal { batch: 16 })
        .with_parts(Parts::new().with_dp(false))
        .with_freeze(FreezeRule::Fronts {
            layers: vec![0, 4, 6],
        })
        .with_stages(Some(4))
        .with_seed(3)
}

/// The shape each epoch ran with and the front after it: `(K, R, front)`.
fn shapes(reports: &[EpochReport]) -> Vec<(usize, usize, usize)> {
    reports
        .iter()
        .map(|r| (r.stages, r.replicas, r.front))
        .collect()
}

/// Trains `EPOCHS` epochs of `config` on `devices` devices; the weights
/// and the shapes.
fn train(config: &TrainerConfig, devices: usize) -> (Vec<f32>, Vec<(usize, usize, usize)>) {
    let device: Device<B> = Default::default();
    let mut trainer = config
        .init(
            stack(),
            vec![device; devices],
            || AdamConfig::new().init(),
            loss,
        )
        .unwrap();
    let data = dataset();
    let reports: Vec<EpochReport> = (0..EPOCHS)
        .map(|_| trainer.fit_epoch(&data, &Rows).unwrap())
        .collect();
    (
        flat_weights(&trainer.to_layer_stack().unwrap()),
        shapes(&reports),
    )
}

/// A rank: joins the group with `ELASTIC_DP_TRAINER_NODE_DEVICES` devices
/// (4 per replica), trains, and writes its weights (little-endian f32) to
/// `<out>-<rank>` and its shapes to `<out>-<rank>.shapes`; logs and
/// checkpoints go under `<out>.run`.
fn rank(out: &str) {
    let mpi = Mpi::init().unwrap();
    assert_eq!(mpi.size(), 2);
    let devices: usize = std::env::var(DEVICES).unwrap().parse().unwrap();
    let run = PathBuf::from(format!("{out}.run"));
    let config = config()
        .with_replicas(config().replicas.with_nodes(Some(NodeConfig::new())))
        .with_output_dir(Some(run.clone()))
        .with_checkpoint(Some(CheckpointConfig::new(run.join("checkpoints"))));
    let (weights, shapes) = train(&config, devices);
    let rank = mpi.rank();
    std::fs::write(format!("{out}-{rank}"), to_bytes(&weights)).unwrap();
    std::fs::write(format!("{out}-{rank}.shapes"), format!("{shapes:?}")).unwrap();
}

fn read_and_remove(path: &Path) -> Vec<u8> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let _ = std::fs::remove_file(path);
    bytes
}

#[test]
fn two_processes_train_with_freezing_and_pipelining_as_one_process_with_as_many_replicas() {
    const TEST: &str =
        "two_processes_train_with_freezing_and_pipelining_as_one_process_with_as_many_replicas";
    if let Ok(out) = std::env::var(OUT) {
        return rank(&out);
    }
    // One replica per rank, then two (burn-collective inside each rank, MPI
    // between them; the pipeline shortens without the group resizing).
    for per_rank in [1, 2] {
        across_two_processes(TEST, per_rank);
    }
}

/// Two ranks of `per_rank` replicas against one process of twice as many.
fn across_two_processes(test: &str, per_rank: usize) {
    let replicas = 2 * per_rank;
    let (expected, expected_shapes) = train(&config(), 4 * replicas);
    println!("one process, (K, R, front) by epoch: {expected_shapes:?}");
    // AutoFreeze moved the front, AutoPipe shortened the pipeline, R held.
    assert_eq!(expected_shapes[0], (4, replicas, 4));
    assert!(expected_shapes.iter().all(|&(_, r, _)| r == replicas));
    assert!(expected_shapes[EPOCHS - 1].0 < 4, "{expected_shapes:?}");
    let out = std::env::temp_dir().join(format!(
        "burn-elastic-dp-trainer-nodes-{}-{per_rank}",
        std::process::id()
    ));
    let vars = [
        (OUT, out.display().to_string()),
        (DEVICES, (4 * per_rank).to_string()),
    ];
    let job = mpirun(test, 2, false, &vars);
    let (status, stderr) = finish(job, Duration::from_secs(300));
    assert!(
        status.is_some_and(|s| s.success()),
        "{per_rank} per rank: the MPI job failed ({status:?}):\n{stderr}"
    );
    let of = |rank: usize, tail: &str| PathBuf::from(format!("{}-{rank}{tail}", out.display()));
    let trained: Vec<Vec<u8>> = (0..2).map(|r| read_and_remove(&of(r, ""))).collect();
    let shapes: Vec<String> = (0..2)
        .map(|r| String::from_utf8(read_and_remove(&of(r, ".shapes"))).unwrap())
        .collect();
    assert_eq!(
        trained[0], trained[1],
        "{per_rank} per rank: the weights of ranks 0 and 1 differ"
    );
    assert_eq!(
        shapes[0], shapes[1],
        "{per_rank} per rank: the ranks ran different shapes"
    );
    // Each rank runs its share of the replicas: the same K and front.
    let local: Vec<_> = expected_shapes
        .iter()
        .map(|&(k, _, f)| (k, per_rank, f))
        .collect();
    assert_eq!(shapes[0], format!("{local:?}"));
    let actual = from_bytes(&trained[0]);
    let worst = difference(&actual, &expected);
    assert!(
        worst <= 1e-4,
        "{per_rank} per rank: weights differ by {worst} (relative)"
    );
    println!(
        "two ranks of {per_rank} against one process: weights differ by at most {worst} (relative)"
    );
    // Training moved the weights.
    assert_ne!(expected, flat_weights(&stack()));
    // Every rank wrote its own logs and checkpoints.
    let run = PathBuf::from(format!("{}.run", out.display()));
    for r in 0..2 {
        let dir = run.join(format!("rank-{r}"));
        assert!(dir.join("epochs.jsonl").is_file(), "{}", dir.display());
        assert!(
            run.join("checkpoints").join(format!("rank-{r}")).is_dir(),
            "rank {r}'s checkpoints"
        );
    }
    let _ = std::fs::remove_dir_all(run);
}

#[test]
fn autodp_and_profiled_costs_are_accepted_across_processes_and_the_batch_is_checked_for_the_whole_group()
 {
    let across = config().with_replicas(config().replicas.with_nodes(Some(NodeConfig::new())));
    // AutoDP (in lockstep) and profiled costs (agreed across the ranks).
    let every_part = across
        .clone()
        .with_parts(Parts::new())
        .with_costs(CostModel::Profiled { repeats: 1 });
    assert!(every_part.validate_on(4, 2).is_ok());
    // A global batch of 16 with M = 2: 8 replicas in all at the most. On
    // 4 ranks of 4 devices, K = 1 would hold 16 of them.
    let error = every_part.validate_on(4, 4).unwrap_err().to_string();
    assert!(error.contains("16 replicas"), "{error}");
    let error = across.validate_on(4, 0).unwrap_err().to_string();
    assert!(
        error.starts_with("processes = 0 is not accepted"),
        "{error}"
    );
}
