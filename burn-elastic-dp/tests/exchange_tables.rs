//! The exchange across processes on gradients large enough to be summed in their own memory
//! (no copy into the stage's arena) and on a word-embedding table of which a step touches few
//! rows (only those sent): two ranks of one replica each train with the same bits as one process
//! of two replicas (two ranks of two replicas and three of one as one process of four and of
//! three, rounding apart, every rank with the same bits), whether a step touched few of the
//! table's rows (sent packed) or most of them (sent whole).
//!
//! The test binary runs itself under `mpirun` as the ranks (`ELASTIC_DP_TABLE_ROLE`).

#![cfg(feature = "mpi")]

use std::path::PathBuf;
use std::time::Duration;

use burn::module::{Module, Param};
use burn::nn::Embedding;
use burn::optim::SgdConfig;
use burn::prelude::*;
use burn_elastic_dp::{Mpi, NodeConfig, ReplicaConfig};
use burn_freeze::testing::{numbers, seeded_linear};
use burn_freeze::{LayerStack, StackMarker};
use burn_pipe::PipelineConfig;

mod common;

use common::{B, Head, difference, finish, flat_weights, from_bytes, loss, mpirun, to_bytes};

/// Rows of the table: as many as the exchange's least table
/// (`SPARSE_ROWS`), of `WIDTH` values, 65 536 in all (as many as its
/// least gradient summed in its own memory).
const ROWS: usize = 8192;
const WIDTH: usize = 8;
const CLASSES: usize = 3;
/// Samples per global batch: shards of 5 and 4 (two replicas), or 3, 2, 2
/// and 2 (four).
const BATCH: usize = 9;
/// Tokens per sample of each step: few (a few rows touched: packed), then
/// 1024 (about 5 500 of the 8 192 rows: more than half, sent whole), then
/// few again.
const LENGTHS: [usize; 3] = [3, 1024, 2];

/// The table: each sample the mean of its tokens' rows.
#[derive(Module, Debug)]
pub struct Table<B: Backend> {
    embedding: Embedding<B>,
}

impl<B: Backend> Table<B> {
    pub fn forward(&self, ids: Tensor<B, 2, Int>) -> Tensor<B, 2> {
        let [n, _] = ids.dims();
        self.embedding.forward(ids).mean_dim(1).reshape([n, WIDTH])
    }
}

burn_freeze::unit!(Table<B>: Tensor<B, 2, Int> => Tensor<B, 2>);

/// The table, a linear map wide enough that its gradient is summed in its
/// own memory (8 x 8192 weights) and the classifier.
type Types = StackMarker<B, Table<B>, Head<B>, Head<B>>;

/// The table, the wide map and the classifier, the same in every process.
fn stack() -> LayerStack<Types> {
    let device = Default::default();
    let table: Vec<f32> = numbers(1, ROWS * WIDTH);
    LayerStack::new(
        Table {
            embedding: Embedding {
                weight: Param::from_tensor(Tensor::from_data(
                    TensorData::new(table, [ROWS, WIDTH]),
                    &device,
                )),
            },
        },
        vec![Head {
            linear: seeded_linear(2, WIDTH, ROWS, &device),
        }],
        Head {
            linear: seeded_linear(3, ROWS, CLASSES, &device),
        },
    )
}

/// Step `step`'s global batch: `LENGTHS[step]` token ids per sample.
fn batch(step: usize) -> (Tensor<B, 2, Int>, Tensor<B, 1, Int>) {
    let device = Default::default();
    let length = LENGTHS[step];
    let ids: Vec<i64> = numbers(50 + step as u64, BATCH * length)
        .into_iter()
        .map(|v| (((v + 1.0) / 2.0 * ROWS as f32) as i64).clamp(0, ROWS as i64 - 1))
        .collect();
    let labels: Vec<i64> = numbers(70 + step as u64, BATCH)
        .into_iter()
        .map(|v| ((v + 1.0) * 1.5) as i64 % CLASSES as i64)
        .collect();
    (
        Tensor::from_data(TensorData::new(ids, [BATCH, length]), &device),
        Tensor::from_data(TensorData::new(labels, [BATCH]), &device),
    )
}

/// Stages of 1 and 2 units: the table alone, then the wide map and the
/// classifier.
fn group_config() -> ReplicaConfig {
    ReplicaConfig::new().with_pipeline(
        PipelineConfig::new()
            .with_micro_batches(Some(1))
            .with_balance(Some(vec![1, 2])),
    )
}

const ROLE: &str = "ELASTIC_DP_TABLE_ROLE";

fn var(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} is set"))
}

/// A rank: joins with `ELASTIC_DP_TABLE_REPLICAS` replicas, trains the
/// steps, checks after each how many of the table's values it did not
/// send, and writes its weights (little-endian f32) to
/// `ELASTIC_DP_TABLE_OUT-<rank>`.
fn child() {
    let mpi = Mpi::init().unwrap();
    let rank = mpi.rank();
    let replicas: usize = var("ELASTIC_DP_TABLE_REPLICAS").parse().unwrap();
    let device = Default::default();
    let mut group = group_config()
        .with_timeout_ms(120_000)
        .with_nodes(Some(NodeConfig::new()))
        .init(stack(), vec![vec![device; 2]; replicas], || {
            SgdConfig::new().init()
        })
        .unwrap();
    let trainable = ROWS * WIDTH + (WIDTH * ROWS + ROWS) + (ROWS * CLASSES + CLASSES);
    for (step, &length) in LENGTHS.iter().enumerate() {
        let (x, y) = batch(step);
        group.train_step(x, y, loss, 0.5).unwrap();
        let phases = group.exchange_phases().unwrap();
        assert_eq!(phases.values, trainable, "step {step}: {phases:?}");
        if length > 16 {
            // Most rows touched: the whole table sent.
            assert_eq!(phases.skipped, 0, "step {step}: {phases:?}");
        } else {
            // At most BATCH x length rows touched, the rest not sent.
            let touched = BATCH * length;
            assert!(
                phases.skipped >= (ROWS - touched) * WIDTH,
                "step {step}: {phases:?}"
            );
        }
    }
    let bytes = to_bytes(&flat_weights(&group.to_layer_stack().unwrap()));
    std::fs::write(format!("{}-{rank}", var("ELASTIC_DP_TABLE_OUT")), bytes).unwrap();
}

/// The weights of one process of `replicas` replicas trained on the same
/// steps, and the weights before training.
fn in_one_process(replicas: usize) -> (Vec<f32>, Vec<f32>) {
    let device: Device<B> = Default::default();
    let mut group = group_config()
        .init(stack(), vec![vec![device; 2]; replicas], || {
            SgdConfig::new().init()
        })
        .unwrap();
    let initial = flat_weights(&group.to_layer_stack().unwrap());
    for step in 0..LENGTHS.len() {
        let (x, y) = batch(step);
        group.train_step(x, y, loss, 0.5).unwrap();
    }
    (flat_weights(&group.to_layer_stack().unwrap()), initial)
}

#[test]
fn large_gradients_and_a_sparse_table_train_as_one_process() {
    const TEST: &str = "large_gradients_and_a_sparse_table_train_as_one_process";
    if std::env::var(ROLE).is_ok() {
        return child();
    }
    // Two ranks of one replica and of two, three ranks of one (where MPI
    // does not promise the same bits on every rank: the ranks compare
    // theirs).
    for (ranks, per_rank) in [(2, 1), (2, 2), (3, 1)] {
        let (expected, initial) = in_one_process(ranks * per_rank);
        // Training moved the table, the wide map and the classifier.
        let moved = |range: std::ops::Range<usize>| {
            initial[range.clone()]
                .iter()
                .zip(&expected[range])
                .any(|(a, b)| a != b)
        };
        let table = ROWS * WIDTH;
        assert!(
            moved(0..table) && moved(table..2 * table) && moved(2 * table + ROWS..initial.len())
        );
        let out = std::env::temp_dir().join(format!(
            "burn-elastic-dp-tables-{}-{ranks}x{per_rank}",
            std::process::id()
        ));
        let out_of = |rank: usize| PathBuf::from(format!("{}-{rank}", out.display()));
        let job = mpirun(
            TEST,
            ranks,
            false,
            &[
                (ROLE, "train".into()),
                ("ELASTIC_DP_TABLE_REPLICAS", per_rank.to_string()),
                ("ELASTIC_DP_TABLE_OUT", out.display().to_string()),
            ],
        );
        let (status, stderr) = finish(job, Duration::from_secs(300));
        assert!(
            status.is_some_and(|s| s.success()),
            "{ranks} x {per_rank}: the MPI job failed ({status:?}):\n{stderr}"
        );
        let trained: Vec<Vec<f32>> = (0..ranks)
            .map(|rank| {
                let bytes = std::fs::read(out_of(rank)).unwrap();
                let _ = std::fs::remove_file(out_of(rank));
                from_bytes(&bytes)
            })
            .collect();
        let bits = |values: &[f32]| values.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        assert_eq!(trained[0].len(), expected.len());
        for rank in 1..ranks {
            assert!(
                bits(&trained[0]) == bits(&trained[rank]),
                "{ranks} x {per_rank}: the weights of ranks 0 and {rank} differ"
            );
        }
        if (ranks, per_rank) == (2, 1) {
            // Two gradients, one per rank: each sum is one f32 addition,
            // in any layout the same bits.
            let differ = trained[0]
                .iter()
                .zip(&expected)
                .filter(|(a, b)| a.to_bits() != b.to_bits())
                .count();
            assert_eq!(
                differ, 0,
                "rank 0's weights differ from one process's in {differ} values"
            );
        } else {
            // Three or four: (a + b) + (c + d) across two ranks, MPI's
            // order across three, another inside one process; the same
            // maths, rounding apart.
            let worst = difference(&trained[0], &expected);
            assert!(
                worst <= 1e-5,
                "{ranks} x {per_rank}: the weights differ from one process's by {worst} (relative)"
            );
        }
    }
}
