//! A replica group across the processes of an MPI job: two ranks on this
//! machine, with one replica each or two each (and three ranks of one),
//! train as one pipeline on the
//! whole batches (and as one process with as many replicas), and stay bit
//! for bit identical; a rank that never joins, exits or stalls ends every
//! rank within the bound with an error naming it, never a hang.
//!
//! The test binary runs itself under `mpirun` as the ranks: the variable
//! `ELASTIC_DP_NODE_ROLE` selects what such a rank does (see [`child`]).
//! Without `mpirun` on PATH the tests fail with the line that installs it.

#![cfg(feature = "mpi")]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use burn::nn::loss::CrossEntropyLossConfig;
use burn::optim::{AdamConfig, SgdConfig};
use burn::prelude::*;
use burn_elastic_dp::{ElasticError, Mpi, NodeConfig, ReplicaConfig};
use burn_freeze::{FreezeFront, LayerStack, StackMarker};
use burn_pipe::{Pipeline, PipelineConfig, StepOptions};

mod common;

use common::{
    B, Block, Head, block, difference, finish, flat_weights, from_bytes, linear, mpirun, numbers,
    to_bytes,
};

type Types = StackMarker<B, Block<B>, Block<B>, Head<B>>;

const WIDTH: usize = 8;
const CLASSES: usize = 3;
/// Samples per global batch: shards of 5 and 4 (two replicas), or 3, 2, 2
/// and 2 (four), so the loss weighting by shard size matters.
const BATCH: usize = 9;
const STEPS: u64 = 4;

/// 6 units (5 residual blocks and a head) with the same weights in every process.
fn stack() -> LayerStack<Types> {
    LayerStack::new(
        block(1, WIDTH),
        (2..6).map(|seed| block(seed, WIDTH)).collect(),
        Head {
            linear: linear(6, WIDTH, CLASSES),
        },
    )
}

/// Global batch `seed`.
fn batch(seed: u64) -> (Tensor<B, 2>, Tensor<B, 1, Int>) {
    let device = Default::default();
    let x = numbers(seed, BATCH * WIDTH);
    let y: Vec<i64> = numbers(seed + 7, BATCH)
        .into_iter()
        .map(|v| ((v + 1.0) * 1.5) as i64 % CLASSES as i64)
        .collect();
    (
        Tensor::<B, 1>::from_data(TensorData::new(x, [BATCH * WIDTH]), &device)
            .reshape([BATCH, WIDTH]),
        Tensor::from_data(TensorData::new(y, [BATCH]), &device),
    )
}

fn loss(logits: Tensor<B, 2>, labels: Tensor<B, 1, Int>) -> Tensor<B, 1> {
    CrossEntropyLossConfig::new()
        .init(&logits.device())
        .forward(logits, labels)
}

fn pipeline_config() -> PipelineConfig {
    PipelineConfig::new()
        .with_micro_batches(Some(2))
        .with_balance(Some(vec![3, 3]))
}

fn group_config(timeout_ms: u64) -> ReplicaConfig {
    ReplicaConfig::new()
        .with_pipeline(pipeline_config())
        .with_timeout_ms(timeout_ms)
        .with_nodes(Some(NodeConfig::new()))
}

/// The steps of the reshaping run, on a group of `replicas` replicas of two
/// stages: each step's gradients differ (another batch), and between steps
/// the gradients exchanged change size: a freeze of units 0..2 (stage 0's
/// shrink), then a repartition to stages of 2 and 4 units (both change).
/// (A macro: the group's optimizer type has no name to write.)
macro_rules! reshaping_steps {
    ($group:expr, $replicas:expr) => {{
        let group = $group;
        let device: Device<B> = Default::default();
        for step in 0..6u64 {
            if step == 2 {
                group.freeze_to(2).unwrap();
            }
            if step == 4 {
                group
                    .repartition(&[2, 4], vec![vec![device; 2]; $replicas])
                    .unwrap();
            }
            let (x, y) = batch(200 + step);
            group.train_step(x, y, loss, 0.5).unwrap();
        }
    }};
}

const ROLE: &str = "ELASTIC_DP_NODE_ROLE";

fn var(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} is set"))
}

/// What an MPI rank does, by `ELASTIC_DP_NODE_ROLE`:
/// - `train`: joins with as many replicas as `ELASTIC_DP_NODE_LAYOUT`
///   (comma-separated, by rank) gives its rank, trains `STEPS` steps and
///   writes its weights (little-endian f32) to `ELASTIC_DP_NODE_OUT-<rank>`;
/// - `reshape`: as `train`, through `reshaping_steps!` (the exchange's
///   buffers kept across steps while its gradients change size);
/// - `absent`: rank 1 never joins the group (rank 0 builds it, 1 s to join);
/// - `exit`: rank 1 joins and takes one step, then exits;
/// - `stall`: rank 1 joins and takes one step, then never steps again;
/// - `hold`: as `stall`, and rank 0, after its failed steps, does not end.
///
/// A rank 0 whose group fails prints `RANK 0 ERROR: <error>` (and, after a
/// failed step, `RANK 0 NEXT: <the next step's error>`) and exits with 3.
fn child(role: &str) {
    let mpi = Mpi::init().unwrap();
    let rank = mpi.rank();
    let device = Default::default();
    if role == "train" || role == "reshape" {
        let layout: Vec<usize> = var("ELASTIC_DP_NODE_LAYOUT")
            .split(',')
            .map(|n| n.parse().unwrap())
            .collect();
        assert_eq!(mpi.size(), layout.len());
        let replicas = layout[rank];
        // SGD: a gradient off by any factor shows in the weights.
        let mut group = group_config(60_000)
            .init(stack(), vec![vec![device; 2]; replicas], || {
                SgdConfig::new().init()
            })
            .unwrap();
        if role == "reshape" {
            reshaping_steps!(&mut group, replicas);
            // The last step's exchanges summed the 243 trainable values
            // (units 2..6: three 8x8 blocks and the 8x3 head, with biases).
            let phases = group.exchange_phases().unwrap();
            assert_eq!(phases.values, 3 * (8 * 8 + 8) + 8 * 3 + 3, "{phases:?}");
        } else {
            for step in 0..STEPS {
                let (x, y) = batch(100 + step);
                let report = group.train_step(x, y, loss, 0.5).unwrap();
                assert_eq!(report.shards.len(), replicas);
            }
        }
        let bytes = to_bytes(&flat_weights(&group.to_layer_stack().unwrap()));
        std::fs::write(format!("{}-{rank}", var("ELASTIC_DP_NODE_OUT")), bytes).unwrap();
        return;
    }
    assert_eq!(mpi.size(), 2);
    let fail = |error: ElasticError| -> ! {
        eprintln!("RANK 0 ERROR: {error}");
        std::process::exit(3)
    };
    if role == "absent" {
        if rank == 1 {
            loop {
                std::thread::park();
            }
        }
        let config = group_config(1_000);
        match config.init(stack(), vec![vec![device; 2]], || AdamConfig::new().init()) {
            Ok(_) => panic!("rank 1 never joined, yet the group formed"),
            Err(error) => fail(error),
        }
    }
    // Up to a minute to join, 1.5 s per step.
    let mut config = group_config(1_500);
    config.nodes = Some(NodeConfig::new().with_join_timeout_ms(Some(60_000)));
    let mut group = config
        .init(stack(), vec![vec![device; 2]], || AdamConfig::new().init())
        .unwrap();
    // One step together, then rank 1 leaves (mid-epoch).
    let (x, y) = batch(1);
    group.train_step(x, y, loss, 1e-2).unwrap();
    if rank == 1 {
        if role == "exit" {
            std::process::exit(0);
        }
        // "stall": in the group, never stepping, until the job ends.
        loop {
            std::thread::park();
        }
    }
    let (x, y) = batch(2);
    let first = group
        .train_step(x.clone(), y.clone(), loss, 1e-2)
        .unwrap_err();
    let second = group.train_step(x, y, loss, 1e-2).unwrap_err();
    eprintln!("RANK 0 NEXT: {second}");
    if role == "hold" {
        // Rank 0 does not end either: the watchdog ends the job.
        eprintln!("RANK 0 ERROR: {first}");
        loop {
            std::thread::park();
        }
    }
    fail(first)
}

/// The weights of one pipeline on the whole batches, and of one process
/// with `replicas` replicas, trained as the ranks are.
fn in_one_process(replicas: usize) -> (Vec<f32>, Vec<f32>) {
    let device: Device<B> = Default::default();
    let mut single: Pipeline<Types, _> = pipeline_config()
        .init(stack(), vec![device; 2], || SgdConfig::new().init())
        .unwrap();
    let mut group = ReplicaConfig::new()
        .with_pipeline(pipeline_config())
        .init(stack(), vec![vec![device; 2]; replicas], || {
            SgdConfig::new().init()
        })
        .unwrap();
    let initial = flat_weights(&single.to_layer_stack());
    for step in 0..STEPS {
        let (x, y) = batch(100 + step);
        single
            .train_step(x.clone(), y.clone(), loss, StepOptions::new(), 0.5)
            .unwrap();
        group.train_step(x, y, loss, 0.5).unwrap();
    }
    let expected = flat_weights(&single.to_layer_stack());
    // Training moved the weights.
    assert!(initial.iter().zip(&expected).any(|(a, b)| a != b));
    (expected, flat_weights(&group.to_layer_stack().unwrap()))
}

/// The largest difference between `actual` and `expected` at most 1e-4 of
/// the largest weight (at least 1).
fn assert_close(actual: &[f32], expected: &[f32], what: &str) {
    let worst = difference(actual, expected);
    assert!(
        worst <= 1e-4,
        "{what}: weights differ by {worst} (relative)"
    );
}

#[test]
fn two_processes_train_as_one_pipeline_on_the_whole_batches() {
    const TEST: &str = "two_processes_train_as_one_pipeline_on_the_whole_batches";
    if let Ok(role) = std::env::var(ROLE) {
        return child(&role);
    }
    // One replica per rank (shards of 5 and 4), then two per rank (shards
    // 3 + 2 and 2 + 2: burn-collective inside each rank, MPI between them),
    // then three ranks of one (where MPI does not promise the same bits on
    // every rank: the ranks compare theirs).
    for layout in [vec![1, 1], vec![2, 2], vec![1, 1, 1]] {
        let (total, ranks) = (layout.iter().sum(), layout.len());
        let (expected, one_process) = in_one_process(total);
        let out = std::env::temp_dir().join(format!(
            "burn-elastic-dp-nodes-{}-{total}",
            std::process::id()
        ));
        let out_of = |rank: usize| PathBuf::from(format!("{}-{rank}", out.display()));
        let layout_var = layout
            .iter()
            .map(|n| n.to_string())
            .collect::<Vec<_>>()
            .join(",");
        let job = mpirun(
            TEST,
            ranks,
            false,
            &[
                (ROLE, "train".into()),
                ("ELASTIC_DP_NODE_LAYOUT", layout_var),
                ("ELASTIC_DP_NODE_OUT", out.display().to_string()),
            ],
        );
        let (status, stderr) = finish(job, Duration::from_secs(300));
        assert!(
            status.is_some_and(|s| s.success()),
            "{layout:?}: the MPI job failed ({status:?}):\n{stderr}"
        );
        let trained: Vec<Vec<u8>> = (0..ranks)
            .map(|rank| {
                let bytes = std::fs::read(out_of(rank)).unwrap();
                let _ = std::fs::remove_file(out_of(rank));
                bytes
            })
            .collect();
        assert!(!trained[0].is_empty());
        for rank in 1..ranks {
            assert_eq!(
                trained[0], trained[rank],
                "{layout:?}: the weights of ranks 0 and {rank} differ"
            );
        }
        // The ranks trained as the single pipeline did, and as one process
        // with as many replicas (the same maths; rounding differs with the
        // summation order).
        let actual = from_bytes(&trained[0]);
        assert_close(
            &actual,
            &expected,
            &format!("{layout:?} against one pipeline"),
        );
        assert_close(
            &actual,
            &one_process,
            &format!("{layout:?} against one process of {total} replicas"),
        );
    }
}

/// Runs the MPI job of fault `role` and returns rank 0's error lines and
/// how long the job took; every rank must have ended within `bound`.
fn fault(role: &str, bound: Duration) -> (String, Duration) {
    const TEST: &str = "a_rank_that_never_joins_exits_or_stalls_ends_every_rank_with_an_error";
    let started = Instant::now();
    // A rank that exits: the survivor reports it (`--enable-recovery`,
    // else mpirun ends the job at once, and only mpirun reports it).
    let job = mpirun(TEST, 2, role == "exit", &[(ROLE, role.into())]);
    let (status, stderr) = finish(job, bound);
    let took = started.elapsed();
    assert!(status.is_some(), "{role}: the MPI job hung:\n{stderr}");
    if role != "exit" {
        assert!(
            !status.unwrap().success(),
            "{role}: the job succeeded:\n{stderr}"
        );
    }
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("RANK 0 "))
        .collect();
    assert!(
        !lines.is_empty(),
        "{role}: rank 0 reported no error:\n{stderr}"
    );
    (lines.join("\n"), took)
}

#[test]
fn a_rank_that_never_joins_exits_or_stalls_ends_every_rank_with_an_error() {
    if let Ok(role) = std::env::var(ROLE) {
        return child(&role);
    }
    let bound = Duration::from_secs(120);
    // Rank 1 never joins: rank 0's group fails to form within its 1 s.
    let (error, _) = fault("absent", bound);
    println!("never joins: {error}");
    assert!(
        error.contains("nodes [1] did not answer within 1s"),
        "{error}"
    );
    // Rank 1 joins and takes a step, then exits, or never steps again:
    // rank 0's second step ends at its 1.5 s bound naming step 2 and rank
    // 1, the next fails at once (the link stays failed), and the whole job
    // ends.
    for role in ["exit", "stall"] {
        let (error, took) = fault(role, bound);
        println!("{role}: {error} (the job ended after {took:?})");
        assert!(
            error.contains("step 2: the cross-process all-reduce did not complete within 1.5s; ranks that did not arrive: [1]"),
            "{role}: {error}"
        );
        assert!(
            error.contains("start every process again"),
            "{role}: {error}"
        );
    }
}

#[test]
fn the_watchdog_ends_the_job_when_no_rank_ends_by_itself() {
    const TEST: &str = "the_watchdog_ends_the_job_when_no_rank_ends_by_itself";
    if let Ok(role) = std::env::var(ROLE) {
        return child(&role);
    }
    // Rank 1 stalls and rank 0 holds on after its failed step: the
    // watchdog's MPI_Abort, one step timeout (1.5 s) later, ends both.
    let started = Instant::now();
    let job = mpirun(TEST, 2, false, &[(ROLE, "hold".into())]);
    let (status, stderr) = finish(job, Duration::from_secs(120));
    assert!(status.is_some(), "the MPI job hung:\n{stderr}");
    assert!(!status.unwrap().success(), "{stderr}");
    assert!(
        stderr.contains("ending the MPI job (MPI_Abort)"),
        "{stderr}"
    );
    assert!(started.elapsed() < Duration::from_secs(60));
}

#[test]
fn buffers_kept_across_steps_sum_as_fresh_ones_while_the_gradients_change_size() {
    const TEST: &str =
        "buffers_kept_across_steps_sum_as_fresh_ones_while_the_gradients_change_size";
    if let Ok(role) = std::env::var(ROLE) {
        return child(&role);
    }
    // Two ranks of two replicas (the leader's buffers, the followers'
    // shared result), against one process of four replicas, which never
    // exchanges through MPI.
    let device: Device<B> = Default::default();
    let mut one_process = ReplicaConfig::new()
        .with_pipeline(pipeline_config())
        .init(stack(), vec![vec![device; 2]; 4], || {
            SgdConfig::new().init()
        })
        .unwrap();
    let initial = flat_weights(&one_process.to_layer_stack().unwrap());
    reshaping_steps!(&mut one_process, 4);
    let expected = flat_weights(&one_process.to_layer_stack().unwrap());
    assert!(initial.iter().zip(&expected).any(|(a, b)| a != b));
    let out = std::env::temp_dir().join(format!(
        "burn-elastic-dp-nodes-reshape-{}",
        std::process::id()
    ));
    let job = mpirun(
        TEST,
        2,
        false,
        &[
            (ROLE, "reshape".into()),
            ("ELASTIC_DP_NODE_LAYOUT", "2,2".into()),
            ("ELASTIC_DP_NODE_OUT", out.display().to_string()),
        ],
    );
    let (status, stderr) = finish(job, Duration::from_secs(300));
    assert!(
        status.is_some_and(|s| s.success()),
        "the MPI job failed ({status:?}):\n{stderr}"
    );
    let trained: Vec<Vec<u8>> = (0..2)
        .map(|rank| {
            let path = PathBuf::from(format!("{}-{rank}", out.display()));
            let bytes = std::fs::read(&path).unwrap();
            let _ = std::fs::remove_file(&path);
            bytes
        })
        .collect();
    assert_eq!(trained[0], trained[1], "the ranks' weights differ");
    let actual = from_bytes(&trained[0]);
    assert_close(&actual, &expected, "against one process of 4 replicas");
}
