//! PipeTransformer across the ranks of an MPI job, every part on: AutoDP in
//! lockstep (every rank grows its replicas at the same step as its
//! pipeline compresses), measurements agreed across the ranks, every
//! sample once per epoch whatever the epoch's tail, and a run killed
//! mid-epoch resumed on fewer ranks.
//!
//! - Two ranks of 4 logical devices under a memory budget that holds a
//!   quarter of the model: (K, total R) goes 4x2 -> 2x4 -> 1x8 as the front
//!   moves; the ranks end bit for bit identical and within 1e-4 of one
//!   process of 8 devices on the same batches; the same with profiled
//!   costs and measured micro-batches (each rank measures, the ranks agree
//!   on the slowest's figures); the planner, told 2 nodes of 4 devices,
//!   predicts the same shapes.
//! - Tails: epochs of 32 + 3, 6 and 9 samples (below one rank's replicas x
//!   M, between that and the group's, above), both batch policies: every
//!   sample once (the ranks match one process of as many replicas).
//! - Three ranks, one killed (SIGKILL) mid-epoch: the job ends within the
//!   bound with no rank left running; two ranks resume from the newest
//!   checkpoint both hold and end within 1e-4 of the uninterrupted run; a
//!   rank holding no checkpoint the other holds makes both refuse to
//!   resume, naming each one's steps.
//! - A rank out of lockstep is named; a SIGTERM on one rank stops both
//!   after the same step, each with its checkpoint.
//!
//! The test binary runs itself under `mpirun` as the ranks: the variable
//! `LOCKSTEP_ROLE` makes it a rank. Without `mpirun` on PATH the tests fail
//! with the line that installs it.

#![cfg(feature = "mpi")]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use burn::data::dataset::InMemDataset;
use burn::optim::AdamConfig;
use burn::optim::adaptor::OptimizerAdaptor;
use burn::prelude::*;
use burn_elastic_dp::plan::{ClusterConfig, Link, ModelSpec, PlanConfig, UnitSpec, plan};
use burn_elastic_dp::{
    BatchPolicy, CheckpointConfig, CostModel, EpochReport, FreezeRule, LayerSpec, MemoryConfig,
    Mpi, NodeConfig, ReplicaConfig, Trainer, TrainerConfig, TrainerTypesOf,
};
use burn_freeze::TrainableUnits;
use burn_pipe::PipelineConfig;

mod common;

use common::{
    B, Rows, Types, block_stack, difference, finish, flat_weights, from_bytes, loss, mpirun,
    to_bytes, two_micro_batch_config,
};

const WIDTH: usize = 8;
const UNITS: usize = 8;
const ROLE: &str = "LOCKSTEP_ROLE";
const OUT: &str = "LOCKSTEP_OUT";

type Item = ([f32; WIDTH], i64);
type Job = Trainer<
    TrainerTypesOf<
        Types,
        OptimizerAdaptor<burn::optim::Adam, TrainableUnits<Types>, B>,
        Tensor<B, 1, Int>,
    >,
>;

/// `len` samples, the same in every process.
fn dataset(len: usize) -> InMemDataset<Item> {
    common::four_class_rows(len)
}

/// Bytes of one unit's parameters (a `WIDTH x WIDTH` linear with bias).
fn unit_param_bytes() -> u64 {
    ((WIDTH * WIDTH + WIDTH) * 4) as u64
}

/// A budget of 3 units' parameters, gradients and Adam's two moments:
/// 8 training units need 4 stages; with 6 frozen (parameters only) 2
/// stages; with 7 one.
fn budget() -> u64 {
    3 * 4 * unit_param_bytes()
}

/// Every part on, frozen layers 0, 6, 7 in epochs 0, 1, 2, the memory
/// budget above deciding the start, a fixed global batch of `batch`.
fn compressing(costs: CostModel, micro_batches: Option<usize>, batch: usize) -> TrainerConfig {
    TrainerConfig::new()
        .with_freeze(FreezeRule::Fronts {
            layers: vec![0, 6, 7],
        })
        .with_memory(MemoryConfig::new().with_device_bytes(Some(budget())))
        .with_batch(BatchPolicy::FixedGlobal { batch })
        .with_lr(1e-2)
        .with_costs(costs)
        .with_replicas(
            ReplicaConfig::new()
                .with_timeout_ms(60_000)
                .with_pipeline(PipelineConfig::new().with_micro_batches(micro_batches)),
        )
        .with_seed(3)
}

/// The two cases of the compression test and their epochs' samples:
/// parameter costs with M = 2 (batch 16), and profiled costs with M
/// measured (batch 64: the paper's M of 16 at K = 2 on 4 replicas).
fn compression_cases() -> Vec<(&'static str, TrainerConfig, usize)> {
    vec![
        (
            "parameter costs",
            compressing(
                CostModel::Parameters {
                    frozen_factor: 1.0 / 3.0,
                },
                Some(2),
                16,
            ),
            64,
        ),
        (
            "profiled costs",
            compressing(CostModel::Profiled { repeats: 1 }, None, 64),
            128,
        ),
    ]
}

/// The configuration across the processes of the job.
fn across(config: TrainerConfig) -> TrainerConfig {
    let replicas = config.replicas.clone().with_nodes(Some(NodeConfig::new()));
    config.with_replicas(replicas)
}

fn build(config: &TrainerConfig, devices: usize) -> Job {
    let device: Device<B> = Default::default();
    config
        .init(
            block_stack(UNITS, WIDTH),
            vec![device; devices],
            || AdamConfig::new().init(),
            loss,
        )
        .unwrap()
}

/// `(K, total R, front)` of each epoch, and each epoch's samples.
fn shapes(reports: &[EpochReport]) -> Vec<(usize, usize, usize)> {
    reports
        .iter()
        .map(|r| (r.stages, r.total_replicas, r.front))
        .collect()
}

/// Trains `epochs` epochs; the weights and the reports.
fn train(
    mut trainer: Job,
    data: &InMemDataset<Item>,
    epochs: usize,
) -> (Vec<f32>, Vec<EpochReport>) {
    let reports = (trainer.epoch()..epochs)
        .map(|_| trainer.fit_epoch(data, &Rows).unwrap())
        .collect();
    (flat_weights(&trainer.to_layer_stack().unwrap()), reports)
}

fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Runs this binary's test `test` as `ranks` ranks with role `role`,
/// writing under `out`; its status and stderr within `bound`.
fn job(
    test: &str,
    ranks: usize,
    role: &str,
    out: &Path,
    bound: Duration,
) -> (Option<std::process::ExitStatus>, String) {
    let vars = [(ROLE, role.to_string()), (OUT, out.display().to_string())];
    finish(mpirun(test, ranks, false, &vars), bound)
}

/// Runs this binary's test `test` as 2 ranks with role `role` within
/// `bound`, writing under a fresh directory named after `tag`, which it
/// returns once the job succeeded (the test fails otherwise, with the
/// ranks' stderr).
fn two_ranks_succeed(test: &str, role: &str, tag: &str, bound: Duration) -> PathBuf {
    let out = std::env::temp_dir().join(format!("burn-elastic-dp-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&out).unwrap();
    let (status, stderr) = job(test, 2, role, &out, bound);
    assert!(
        status.is_some_and(|s| s.success()),
        "the MPI job failed ({status:?}):\n{stderr}"
    );
    out
}

/// The rank's output directory and MPI.
fn rank_setup() -> (Mpi, PathBuf) {
    let mpi = Mpi::init().unwrap();
    let out = PathBuf::from(std::env::var(OUT).unwrap());
    (mpi, out)
}

// ---- AutoDP in lockstep as the pipeline compresses ----

const COMPRESSION: &str = "two_ranks_grow_their_replicas_in_lockstep_as_the_pipeline_compresses";

fn compression_rank() {
    let (mpi, out) = rank_setup();
    for (case, (_, config, len)) in compression_cases().into_iter().enumerate() {
        let trainer = build(&across(config), 4);
        let (weights, reports) = train(trainer, &dataset(len), 3);
        let rank = mpi.rank();
        std::fs::write(out.join(format!("{case}-{rank}")), to_bytes(&weights)).unwrap();
        std::fs::write(
            out.join(format!("{case}-{rank}.shapes")),
            format!("{:?}", shapes(&reports)),
        )
        .unwrap();
    }
}

/// The planner's `(K, total R)` by epoch for 2 nodes of 4 devices running
/// `config` (parameter costs).
fn planned(config: &TrainerConfig) -> Vec<(usize, usize)> {
    let units = (0..UNITS)
        .map(|u| UnitSpec {
            name: format!("block {u}"),
            forward: 1e-6,
            backward: 2e-6,
            forward_fixed: 0.0,
            backward_fixed: 0.0,
            measured: vec![],
            activation_bytes: 4 * WIDTH,
            saved_bytes: 0,
            param_tensors: vec![(WIDTH * WIDTH) * 4, WIDTH * 4],
        })
        .collect();
    let model = ModelSpec {
        model: "blocks".into(),
        source: "parameter counts".into(),
        layers: LayerSpec::PerUnit,
        units,
    };
    let link = Link::new(1e12, 0.0);
    let plan_config = PlanConfig::new(
        ClusterConfig::new(4, 2, link, link),
        config.batch,
        64,
        3,
        config.freeze.clone(),
    )
    .with_parts(config.parts)
    .with_costs(config.costs)
    .with_memory(config.memory.clone())
    .with_micro_batches(config.replicas.pipeline.micro_batches);
    plan(&plan_config, &model)
        .unwrap()
        .epochs
        .iter()
        .map(|e| (e.stages, e.replicas))
        .collect()
}

#[test]
fn two_ranks_grow_their_replicas_in_lockstep_as_the_pipeline_compresses() {
    if std::env::var(ROLE).is_ok() {
        return compression_rank();
    }
    let out = two_ranks_succeed(
        COMPRESSION,
        "compression",
        "lockstep",
        Duration::from_secs(600),
    );
    let expected_shapes = vec![(4, 2, 6), (2, 4, 7), (1, 8, 7)];
    for (case, (name, config, len)) in compression_cases().into_iter().enumerate() {
        // One process with every device of the two ranks.
        let (expected, reports) = train(build(&config, 8), &dataset(len), 3);
        assert_eq!(
            shapes(&reports),
            expected_shapes,
            "{name}: one process of 8 devices"
        );
        let weights: Vec<Vec<u8>> = (0..2)
            .map(|r| read(&out.join(format!("{case}-{r}"))))
            .collect();
        assert_eq!(weights[0], weights[1], "{name}: the ranks' weights differ");
        for rank in 0..2 {
            let shapes =
                String::from_utf8(read(&out.join(format!("{case}-{rank}.shapes")))).unwrap();
            assert_eq!(
                shapes,
                format!("{expected_shapes:?}"),
                "{name}: rank {rank}'s (K, total R, front) by epoch"
            );
        }
        let worst = difference(&from_bytes(&weights[0]), &expected);
        assert!(
            worst <= 1e-4,
            "{name}: two ranks and one process differ by {worst}"
        );
        assert_ne!(
            expected,
            flat_weights(&block_stack(UNITS, WIDTH)),
            "{name}: training moved the weights"
        );
        println!(
            "{name}: (K, total R, front) by epoch {expected_shapes:?} on 2 ranks x 4 devices; the ranks bit-identical; against one process of 8 devices: {worst:e}"
        );
    }
    // The planner, told 2 nodes of 4 devices, predicts the same shapes.
    let (_, parameters, _) = &compression_cases()[0];
    let predicted = planned(parameters);
    assert_eq!(
        predicted,
        vec![(4, 2), (2, 4), (1, 8)],
        "the planner's (K, R) by epoch"
    );
    let _ = std::fs::remove_dir_all(&out);
}

// ---- A rank out of lockstep ----

const DISAGREE: &str = "a_rank_out_of_lockstep_ends_the_job_with_an_error_naming_it";

/// Rank 1 freezes 6 layers after epoch 0, rank 0 freezes 4: their shapes
/// part at the transition. Each writes the error its epoch ends with.
fn disagree_rank() {
    let (mpi, out) = rank_setup();
    let rank = mpi.rank();
    let fronts = if rank == 1 { vec![0, 6] } else { vec![0, 4] };
    let (_, config, len) = compression_cases().remove(0);
    let config = across(config.with_freeze(FreezeRule::Fronts { layers: fronts }));
    let mut trainer = build(&config, 4);
    let data = dataset(len);
    let error = (0..2)
        .find_map(|_| trainer.fit_epoch(&data, &Rows).err())
        .expect("the ranks part");
    std::fs::write(out.join(format!("error-{rank}")), error.to_string()).unwrap();
}

#[test]
fn a_rank_out_of_lockstep_ends_the_job_with_an_error_naming_it() {
    if std::env::var(ROLE).is_ok() {
        return disagree_rank();
    }
    let out = std::env::temp_dir().join(format!("burn-elastic-dp-disagree-{}", std::process::id()));
    std::fs::create_dir_all(&out).unwrap();
    let (status, stderr) = job(DISAGREE, 2, "disagree", &out, Duration::from_secs(300));
    assert!(status.is_some(), "the job ends:\n{stderr}");
    for rank in 0..2 {
        let error = String::from_utf8(read(&out.join(format!("error-{rank}")))).unwrap();
        assert!(
            error.starts_with("node 1: out of lockstep")
                && error.contains("while rank 0 is at step"),
            "rank {rank}: {error}"
        );
        println!("rank {rank}: {error}");
    }
    let _ = std::fs::remove_dir_all(&out);
}

// ---- SIGTERM: every rank checkpoints after the same step ----

const TERM: &str = "a_sigterm_on_one_rank_stops_every_rank_after_the_same_step_with_a_checkpoint";

/// Rank 1 receives SIGTERM in step 3 (a real signal, handled by
/// `StopSignal::on_termination`); each rank writes the error its epoch
/// ends with and its step count.
fn term_rank() {
    let (mpi, out) = rank_setup();
    let rank = mpi.rank();
    let (_, config, len) = compression_cases().remove(0);
    let config = across(config).with_checkpoint(Some(
        CheckpointConfig::new(out.join("checkpoints")).with_every_steps(100),
    ));
    let mut trainer = build(&config, 4);
    let signal = burn_elastic_dp::StopSignal::on_termination().unwrap();
    trainer.set_stop_signal(signal.clone());
    let data = dataset(len);
    let mut step = 0;
    let error = trainer
        .fit_epoch_observed(&data, &Rows, |_| {
            step += 1;
            if rank == 1 && step == 3 {
                let _ = std::process::Command::new("kill")
                    .args(["-TERM", &std::process::id().to_string()])
                    .status();
                // The signal arrives asynchronously: wait (bounded) until
                // its handler ran, so that step 4's header carries it.
                let deadline = Instant::now() + Duration::from_secs(30);
                while !signal.raised() && Instant::now() < deadline {
                    std::thread::yield_now();
                }
                assert!(signal.raised(), "SIGTERM was not handled within 30 s");
            }
        })
        .expect_err("stopped");
    std::fs::write(
        out.join(format!("stopped-{rank}")),
        format!("{} | {error}", trainer.steps()),
    )
    .unwrap();
}

#[test]
fn a_sigterm_on_one_rank_stops_every_rank_after_the_same_step_with_a_checkpoint() {
    if std::env::var(ROLE).is_ok() {
        return term_rank();
    }
    let out = two_ranks_succeed(TERM, "term", "term", Duration::from_secs(300));
    for rank in 0..2 {
        let stopped = String::from_utf8(read(&out.join(format!("stopped-{rank}")))).unwrap();
        // Signalled after step 3: the next step's header carries it, and
        // every rank stops after step 4, its checkpoint written there.
        assert!(
            stopped.starts_with("4 | stopped as asked after step 4 (checkpoint "),
            "rank {rank}: {stopped}"
        );
        let checkpoint = out
            .join("checkpoints")
            .join(format!("rank-{rank}"))
            .join(format!("step-{:012}", 4));
        assert!(
            checkpoint.join("state.json").is_file(),
            "rank {rank}: {}",
            checkpoint.display()
        );
    }
    let _ = std::fs::remove_dir_all(&out);
}

// ---- Every sample once, whatever the tail ----

const TAILS: &str = "two_ranks_train_every_sample_once_whatever_the_epochs_tail";

/// Tails of an epoch of 32 + t samples on 2 ranks of 2 replicas, M = 2: a
/// rank's replicas need 4 samples a step, the group's 8.
const TAIL_SIZES: [usize; 3] = [3, 6, 9];

/// One stage on every device (no budget), 2 micro-batches, batches of
/// `batch`, nothing frozen, parameter costs.
fn one_stage_config(batch: BatchPolicy) -> TrainerConfig {
    two_micro_batch_config(batch).with_freeze(FreezeRule::Fronts { layers: vec![0] })
}

/// One stage on every device (no budget), 2 micro-batches, a global batch
/// of 16 under either policy; nothing frozen.
fn tails_cases() -> Vec<(String, TrainerConfig, usize)> {
    let mut cases = Vec::new();
    for tail in TAIL_SIZES {
        for batch in [
            BatchPolicy::FixedGlobal { batch: 16 },
            BatchPolicy::PerReplica { batch: 4 },
        ] {
            let config = one_stage_config(batch).with_seed(5);
            cases.push((format!("tail {tail}, {batch:?}"), config, 32 + tail));
        }
    }
    cases
}

/// A rank's run of case `case`: its weights and its samples per epoch,
/// written under `out`.
fn save_rank_run(out: &Path, case: &str, rank: usize, weights: &[f32], reports: &[EpochReport]) {
    let samples: Vec<usize> = reports.iter().map(|r| r.samples).collect();
    std::fs::write(out.join(format!("{case}-{rank}")), to_bytes(weights)).unwrap();
    std::fs::write(
        out.join(format!("{case}-{rank}.samples")),
        format!("{samples:?}"),
    )
    .unwrap();
}

/// Case `case` of the 2 ranks under `out` against one process's
/// `expected` weights: the ranks hold the same bits, each trained every
/// one of `len` samples in each of 2 epochs, within 1e-4 of one process.
fn check_rank_runs(out: &Path, case: &str, name: &str, expected: &[f32], len: usize) -> f32 {
    let weights: Vec<Vec<u8>> = (0..2)
        .map(|r| read(&out.join(format!("{case}-{r}"))))
        .collect();
    assert_eq!(weights[0], weights[1], "{name}: the ranks' weights differ");
    for rank in 0..2 {
        let samples = String::from_utf8(read(&out.join(format!("{case}-{rank}.samples")))).unwrap();
        assert_eq!(
            samples,
            format!("{:?}", [len, len]),
            "{name}: rank {rank}'s samples per epoch"
        );
    }
    let worst = difference(&from_bytes(&weights[0]), expected);
    assert!(
        worst <= 1e-4,
        "{name}: two ranks and one process differ by {worst}"
    );
    worst
}

fn tails_rank() {
    let (mpi, out) = rank_setup();
    for (case, (_, config, len)) in tails_cases().into_iter().enumerate() {
        let (weights, reports) = train(build(&across(config), 2), &dataset(len), 2);
        save_rank_run(&out, &case.to_string(), mpi.rank(), &weights, &reports);
    }
}

#[test]
fn two_ranks_train_every_sample_once_whatever_the_epochs_tail() {
    if std::env::var(ROLE).is_ok() {
        return tails_rank();
    }
    let out = two_ranks_succeed(TAILS, "tails", "tails", Duration::from_secs(600));
    for (case, (name, config, len)) in tails_cases().into_iter().enumerate() {
        // One process of as many replicas (4) trains the same batches.
        let (expected, reports) = train(build(&config, 4), &dataset(len), 2);
        assert!(
            reports
                .iter()
                .all(|r| r.samples == len && r.total_replicas == 4),
            "{name}: {reports:?}"
        );
        let worst = check_rank_runs(&out, &case.to_string(), &name, &expected, len);
        println!(
            "{name}: every sample once on 2 ranks x 2 replicas; against one process: {worst:e}"
        );
    }
    let _ = std::fs::remove_dir_all(&out);
}

// ---- Large gradients, summed in place, with an epoch's tail ----

const WIDE_TAIL: &str = "two_ranks_sum_large_gradients_in_place_with_an_epochs_tail_of_3";

/// Width of the wide model: each block's weight has 256 x 256 = 65 536
/// values, enough to be summed in its own memory (the exchange's large
/// path), its bias packed into the stage's arena (the small path).
const WIDE: usize = 256;
/// Its blocks.
const WIDE_UNITS: usize = 4;
/// An epoch of 32 + 3 samples on 2 ranks of 2 replicas, M = 2, a global
/// batch of 16: two full steps, then a tail of 3.
const WIDE_LEN: usize = 32 + 3;

/// One stage on every device, 2 micro-batches, a global batch of 16,
/// nothing frozen.
fn wide_config() -> TrainerConfig {
    one_stage_config(BatchPolicy::FixedGlobal { batch: 16 }).with_seed(7)
}

/// Two epochs of the wide model on `devices` devices; its weights and
/// reports.
fn train_wide(config: &TrainerConfig, devices: usize) -> (Vec<f32>, Vec<EpochReport>) {
    let device: Device<B> = Default::default();
    let mut trainer = config
        .init(
            block_stack(WIDE_UNITS, WIDE),
            vec![device; devices],
            || AdamConfig::new().init(),
            loss,
        )
        .unwrap();
    let data = common::four_class_rows::<WIDE>(WIDE_LEN);
    let reports = (0..2)
        .map(|_| trainer.fit_epoch(&data, &Rows).unwrap())
        .collect();
    (flat_weights(&trainer.to_layer_stack().unwrap()), reports)
}

fn wide_tail_rank() {
    let (mpi, out) = rank_setup();
    let (weights, reports) = train_wide(&across(wide_config()), 2);
    save_rank_run(&out, "wide", mpi.rank(), &weights, &reports);
}

#[test]
fn two_ranks_sum_large_gradients_in_place_with_an_epochs_tail_of_3() {
    if std::env::var(ROLE).is_ok() {
        return wide_tail_rank();
    }
    let out = two_ranks_succeed(WIDE_TAIL, "wide", "wide", Duration::from_secs(600));
    // One process of as many replicas (4) trains the same batches.
    let (expected, reports) = train_wide(&wide_config(), 4);
    assert!(
        reports
            .iter()
            .all(|r| r.samples == WIDE_LEN && r.total_replicas == 4),
        "{reports:?}"
    );
    check_rank_runs(&out, "wide", "wide, tail 3", &expected, WIDE_LEN);
    let _ = std::fs::remove_dir_all(&out);
}

// ---- Killed mid-epoch, resumed on fewer ranks ----

const RESUME: &str = "a_rank_killed_mid_epoch_resumes_on_fewer_ranks_where_the_whole_run_ends";
/// Steps of the run: 2 epochs of 48 samples in batches of 12.
const EPOCHS: usize = 2;
const SAMPLES: usize = 48;
/// Rank 1 is killed in this step, after its all-reduce and before its
/// checkpoint (the others may write theirs): epoch 1's second step.
const KILL_AT: usize = 6;
/// Each step's bound (the survivors' watchdog).
const STEP_TIMEOUT_MS: u64 = 10_000;

/// One stage on 2 devices a rank (no budget), M = 1, a fixed global batch
/// of 12 (the batches do not depend on R), 4 layers frozen after epoch 0
/// (then cached), a checkpoint after every step.
fn resume_config(dir: &Path) -> TrainerConfig {
    across(
        TrainerConfig::new()
            .with_freeze(FreezeRule::Fronts { layers: vec![0, 4] })
            .with_batch(BatchPolicy::FixedGlobal { batch: 12 })
            .with_lr(1e-2)
            .with_costs(CostModel::Parameters {
                frozen_factor: 1.0 / 3.0,
            })
            .with_replicas(
                ReplicaConfig::new()
                    .with_timeout_ms(STEP_TIMEOUT_MS)
                    .with_pipeline(PipelineConfig::new().with_micro_batches(Some(1))),
            )
            .with_checkpoint(Some(
                CheckpointConfig::new(dir.join("checkpoints")).with_every_steps(1),
            ))
            .with_seed(9),
    )
}

/// A rank: `run` trains from scratch (rank 1 killing itself in step
/// `KILL_AT` with `kill`), `resume` resumes from the checkpoints; the
/// weights in `final-<rank>`, the pid in `pid-<rank>`.
fn resume_rank(role: &str) {
    let (mpi, out) = rank_setup();
    let rank = mpi.rank();
    std::fs::write(
        out.join(format!("pid-{rank}")),
        std::process::id().to_string(),
    )
    .unwrap();
    let config = resume_config(&out);
    let device: Device<B> = Default::default();
    let devices = vec![device; 2];
    let mut trainer: Job = if role == "resume" {
        let resumed = Trainer::resume(
            block_stack(UNITS, WIDTH),
            devices,
            config,
            || AdamConfig::new().init(),
            loss,
        );
        match resumed {
            Ok((trainer, _)) => trainer,
            Err(error) => {
                std::fs::write(out.join(format!("error-{rank}")), error.to_string()).unwrap();
                return;
            }
        }
    } else {
        build(&config, 2)
    };
    let data = dataset(SAMPLES);
    let kill = role == "kill" && rank == 1;
    while trainer.epoch() < EPOCHS {
        let mut step = trainer.steps();
        trainer
            .fit_epoch_observed(&data, &Rows, |_| {
                step += 1;
                if kill && step == KILL_AT {
                    std::fs::write(out.join("killed"), step.to_string()).unwrap();
                    let _ = std::process::Command::new("kill")
                        .args(["-KILL", &std::process::id().to_string()])
                        .status();
                    unreachable!("killed");
                }
            })
            .unwrap();
    }
    let weights = flat_weights(&trainer.to_layer_stack().unwrap());
    std::fs::write(out.join(format!("final-{rank}")), to_bytes(&weights)).unwrap();
}

/// Whether process `pid` still runs (a zombie, ended but not yet reaped,
/// does not).
fn running(pid: &str) -> bool {
    std::fs::read_to_string(Path::new("/proc").join(pid).join("stat")).is_ok_and(|stat| {
        // "pid (name) S ...": the state follows the name's closing parenthesis.
        let state = stat.rsplit_once(')').map(|(_, rest)| rest.trim_start());
        !state.is_some_and(|s| s.starts_with('Z') || s.starts_with('X'))
    })
}

/// Whether process `pid` has ended within `bound`.
fn ends_within(pid: &str, bound: Duration) -> bool {
    let deadline = Instant::now() + bound;
    while running(pid) {
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    true
}

#[test]
fn a_rank_killed_mid_epoch_resumes_on_fewer_ranks_where_the_whole_run_ends() {
    if let Ok(role) = std::env::var(ROLE) {
        return resume_rank(&role);
    }
    let base = std::env::temp_dir().join(format!(
        "burn-elastic-dp-resume-fewer-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&base);
    let bound = Duration::from_secs(300);

    // The whole run on 3 ranks.
    let whole = base.join("whole");
    std::fs::create_dir_all(&whole).unwrap();
    let (status, stderr) = job(RESUME, 3, "run", &whole, bound);
    assert!(
        status.is_some_and(|s| s.success()),
        "the whole run failed ({status:?}):\n{stderr}"
    );
    let expected = from_bytes(&read(&whole.join("final-0")));
    for rank in 1..3 {
        assert_eq!(
            from_bytes(&read(&whole.join(format!("final-{rank}")))),
            expected,
            "rank {rank}"
        );
    }

    // Rank 1 killed (SIGKILL) mid-epoch: the job ends within the bound of
    // a step, and no rank is left running.
    let dir = base.join("killed");
    std::fs::create_dir_all(&dir).unwrap();
    let started = Instant::now();
    let (status, stderr) = job(RESUME, 3, "kill", &dir, bound);
    let took = started.elapsed();
    assert_eq!(
        read(&dir.join("killed")),
        KILL_AT.to_string().into_bytes(),
        "rank 1 was killed:\n{stderr}"
    );
    assert!(
        status.is_some_and(|s| !s.success()),
        "the job ends, failed ({status:?}):\n{stderr}"
    );
    assert!(
        took < Duration::from_millis(3 * STEP_TIMEOUT_MS) + Duration::from_secs(30),
        "the survivors took {took:?} to end:\n{stderr}"
    );
    for rank in 0..3 {
        let pid = String::from_utf8(read(&dir.join(format!("pid-{rank}")))).unwrap();
        assert!(
            ends_within(&pid, Duration::from_secs(10)),
            "rank {rank} (pid {pid}) still runs 10 s after mpirun ended"
        );
    }
    assert!(!dir.join("final-0").exists(), "no rank finished");
    // Rank 1 died before its checkpoint of step 6.
    let newest = |rank: usize| {
        let mut steps: Vec<String> =
            std::fs::read_dir(dir.join("checkpoints").join(format!("rank-{rank}")))
                .unwrap()
                .filter_map(|e| e.ok()?.file_name().into_string().ok())
                .filter(|n| n.starts_with("step-"))
                .collect();
        steps.sort();
        steps.pop().unwrap()
    };
    assert_eq!(newest(1), format!("step-{:012}", KILL_AT - 1));
    println!(
        "newest checkpoints: rank 0 {}, rank 1 {}",
        newest(0),
        newest(1)
    );

    // Two ranks resume from the newest checkpoint both hold (rank 1 has
    // none of step 6) and end where the whole run ends.
    let (status, stderr) = job(RESUME, 2, "resume", &dir, bound);
    assert!(
        status.is_some_and(|s| s.success()),
        "the resumed run failed ({status:?}):\n{stderr}"
    );
    let resumed = read(&dir.join("final-0"));
    assert_eq!(
        read(&dir.join("final-1")),
        resumed,
        "the resumed ranks' weights differ"
    );
    let worst = difference(&from_bytes(&resumed), &expected);
    assert!(
        worst <= 1e-4,
        "resumed on 2 ranks against the whole run on 3: {worst}"
    );
    println!(
        "killed in step {KILL_AT} after {took:?}; resumed on 2 ranks against the whole run on 3: {worst:e}"
    );

    // A rank that holds no checkpoint the others hold: the resume is
    // refused on every rank, naming what each holds.
    let lone = base.join("lone");
    let from = whole.join("checkpoints").join("rank-0");
    let to = lone.join("checkpoints").join("rank-0");
    for entry in std::fs::read_dir(&from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        std::fs::create_dir_all(&target).unwrap();
        for file in std::fs::read_dir(entry.path()).unwrap() {
            let file = file.unwrap();
            std::fs::copy(file.path(), target.join(file.file_name())).unwrap();
        }
    }
    let (status, stderr) = job(RESUME, 2, "resume", &lone, bound);
    assert!(status.is_some(), "the refused resume ends:\n{stderr}");
    for rank in 0..2 {
        let error = String::from_utf8(read(&lone.join(format!("error-{rank}")))).unwrap();
        assert!(
            error.starts_with("cannot resume across processes: no checkpoint step is held, verified, by every rank")
                && error.contains("rank 1 holds []"),
            "rank {rank}: {error}"
        );
    }
    let _ = std::fs::remove_dir_all(&base);
}
