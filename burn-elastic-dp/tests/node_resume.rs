//! A killed rank in a two-rank MPI job: the survivor's step fails with an
//! error naming it, within the bound, and the job ends; both ranks then
//! resume from their last checkpoints (weights and Adam's state, through
//! Burn's recorders) and end bit for bit where a run never interrupted ends.
//!
//! The test binary runs itself under `mpirun` as the two ranks;
//! `ELASTIC_DP_RESUME_ROLE` selects what such a rank does (see [`child`]).
//! Without `mpirun` on PATH the test fails with the line that installs it.

#![cfg(feature = "mpi")]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::AdamConfig;
use burn::prelude::*;
use burn::record::{BinBytesRecorder, FullPrecisionSettings, Recorder};
use burn_elastic_dp::{Mpi, NodeConfig, ReplicaConfig};
use burn_freeze::LayerStack;
use burn_pipe::PipelineConfig;

mod common;

use common::{B, Types, block, loss};

const WIDTH: usize = 6;
const STEPS: u64 = 6;
const ROLE: &str = "ELASTIC_DP_RESUME_ROLE";
const TEST: &str = "a_killed_process_fails_the_step_and_the_run_resumes_to_the_same_result";

/// The same weights in every process.
fn stack() -> LayerStack<Types> {
    let stack = LayerStack::new(
        block(1, WIDTH),
        vec![block(2, WIDTH), block(3, WIDTH)],
        block(4, WIDTH),
    );
    stack.materialize();
    stack
}

/// Global batch `step`, the same in every process.
fn batch(step: u64) -> (Tensor<B, 2>, Tensor<B, 1, Int>) {
    let mut state = (step + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 40) as f32 / (1u64 << 24) as f32
    };
    let n = 8;
    let x: Vec<f32> = (0..n * WIDTH).map(|_| 2.0 * next() - 1.0).collect();
    let y: Vec<i64> = (0..n).map(|_| (next() * WIDTH as f32) as i64 % 3).collect();
    let device = Default::default();
    (
        Tensor::<B, 1>::from_data(TensorData::new(x, [n * WIDTH]), &device).reshape([n, WIDTH]),
        Tensor::from_data(TensorData::new(y, [n]), &device),
    )
}

struct Collect(Vec<u8>);
impl<Be: Backend> ModuleVisitor<Be> for Collect {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<Be, D>>) {
        for v in param.val().to_data().to_vec::<f32>().unwrap() {
            self.0.extend(v.to_le_bytes());
        }
    }
}

fn weight_bytes(stack: &LayerStack<Types>) -> Vec<u8> {
    let mut collect = Collect(Vec::new());
    stack.first().visit(&mut collect);
    stack.middle().iter().for_each(|u| u.visit(&mut collect));
    stack.last().visit(&mut collect);
    collect.0
}

fn var(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} is set"))
}

/// Writes `bytes` to `path` atomically (a temporary file, then a rename).
fn write_atomic(path: &Path, bytes: &[u8]) {
    let temporary = path.with_extension("tmp");
    std::fs::write(&temporary, bytes).unwrap();
    std::fs::rename(&temporary, path).unwrap();
}

/// An MPI rank of two, one replica, Adam. It resumes from its checkpoint
/// in `ELASTIC_DP_DIR` when one is there, trains to step `STEPS` writing a
/// checkpoint (weights, optimizer state, step) after every step, and writes
/// its final weights to `final-<rank>`. With `ELASTIC_DP_DIE_AT`, rank 1
/// writes `killed-1` and exits (killed) before that step; a failed step
/// writes `error-<rank>` and exits with code 3.
fn child() {
    let mpi = Mpi::init().unwrap();
    let rank = mpi.rank();
    let dir = PathBuf::from(var("ELASTIC_DP_DIR"));
    let die_at: Option<u64> = std::env::var("ELASTIC_DP_DIE_AT")
        .ok()
        .map(|s| s.parse().unwrap());
    let device: Device<B> = Default::default();
    let recorder = BinBytesRecorder::<FullPrecisionSettings>::default();
    let checkpoint = dir.join(format!("checkpoint-{rank}"));
    let (mut stack, mut start, mut optimizer) = (stack(), 0, None);
    if checkpoint.join("step").exists() {
        start = std::fs::read_to_string(checkpoint.join("step"))
            .unwrap()
            .parse()
            .unwrap();
        let record = recorder
            .load(std::fs::read(checkpoint.join("model")).unwrap(), &device)
            .unwrap();
        let (first, middle, last) = stack.into_parts().load_record(record);
        stack = LayerStack::from_parts(first, middle, last);
        optimizer = Some(
            recorder
                .load(
                    std::fs::read(checkpoint.join("optimizer")).unwrap(),
                    &device,
                )
                .unwrap(),
        );
    }
    let config = ReplicaConfig::new()
        .with_timeout_ms(5_000)
        .with_pipeline(PipelineConfig::new().with_micro_batches(Some(2)))
        .with_nodes(Some(NodeConfig::new().with_join_timeout_ms(Some(60_000))));
    let mut group = config
        .init(stack, vec![vec![device]], || AdamConfig::new().init())
        .unwrap();
    if let Some(record) = optimizer {
        group.load_optimizer_record(record);
    }
    std::fs::create_dir_all(&checkpoint).unwrap();
    for step in start..STEPS {
        if rank == 1 && die_at == Some(step) {
            std::fs::write(dir.join("killed-1"), step.to_string()).unwrap();
            std::process::exit(9); // killed
        }
        let (x, y) = batch(step);
        if let Err(error) = group.train_step(x, y, loss, 1e-2) {
            std::fs::write(dir.join(format!("error-{rank}")), error.to_string()).unwrap();
            std::process::exit(3);
        }
        let model = recorder
            .record(
                group.to_layer_stack().unwrap().into_parts().into_record(),
                (),
            )
            .unwrap();
        let optimizer = recorder
            .record(group.optimizer_record().unwrap(), ())
            .unwrap();
        write_atomic(&checkpoint.join("model"), &model);
        write_atomic(&checkpoint.join("optimizer"), &optimizer);
        write_atomic(&checkpoint.join("step"), (step + 1).to_string().as_bytes());
    }
    write_atomic(
        &dir.join(format!("final-{rank}")),
        &weight_bytes(&group.to_layer_stack().unwrap()),
    );
}

/// Runs the two ranks in `dir` (`mpirun`); rank 1 dies before step
/// `die_at`. Whether mpirun succeeded (`None`: it was still running after
/// `bound`, and was killed) and its stderr.
fn run_two(dir: &Path, die_at: Option<u64>, bound: Duration) -> (Option<bool>, String) {
    let mut vars = vec![
        (ROLE, "node".to_string()),
        ("ELASTIC_DP_DIR", dir.display().to_string()),
    ];
    if let Some(step) = die_at {
        vars.push(("ELASTIC_DP_DIE_AT", step.to_string()));
    }
    // With a rank that dies, the survivor reports it (`--enable-recovery`;
    // mpirun's status then says nothing of the ranks').
    let job = common::mpirun(TEST, 2, die_at.is_some(), &vars);
    let (status, stderr) = common::finish(job, bound);
    (status.map(|s| s.success()), stderr)
}

#[test]
fn a_killed_process_fails_the_step_and_the_run_resumes_to_the_same_result() {
    if std::env::var(ROLE).is_ok() {
        return child();
    }
    let bound = Duration::from_secs(120);
    let base = std::env::temp_dir().join(format!("burn-elastic-dp-resume-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);

    // A run never interrupted.
    let clean = base.join("clean");
    std::fs::create_dir_all(&clean).unwrap();
    let (status, stderr) = run_two(&clean, None, bound);
    assert_eq!(status, Some(true), "clean run:\n{stderr}");
    let expected = std::fs::read(clean.join("final-0")).unwrap();
    assert_eq!(
        std::fs::read_to_string(clean.join("checkpoint-0/step")).unwrap(),
        STEPS.to_string()
    );
    assert_eq!(std::fs::read(clean.join("final-1")).unwrap(), expected);

    // Rank 1 is killed before step 3: rank 0's step fails, naming it, well
    // within the bound (its checkpoint is after step 3, rank 1's after 3),
    // and the job ends.
    let dir = base.join("killed");
    std::fs::create_dir_all(&dir).unwrap();
    let started = Instant::now();
    let (status, stderr) = run_two(&dir, Some(3), bound);
    assert!(started.elapsed() < bound, "the survivor hung");
    assert!(status.is_some(), "the job ends:\n{stderr}");
    assert_eq!(
        std::fs::read_to_string(dir.join("killed-1")).unwrap(),
        "3",
        "rank 1 was killed:\n{stderr}"
    );
    let error = std::fs::read_to_string(dir.join("error-0"))
        .unwrap_or_else(|_| panic!("rank 0 ends with an error:\n{stderr}"));
    assert!(error.contains("ranks that did not arrive: [1]"), "{error}");
    println!("the survivor's error: {error}");
    assert_eq!(
        std::fs::read_to_string(dir.join("checkpoint-0/step")).unwrap(),
        "3"
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("checkpoint-1/step")).unwrap(),
        "3"
    );

    // Both start again from their checkpoints and finish.
    let (status, stderr) = run_two(&dir, None, bound);
    assert_eq!(status, Some(true), "resumed run:\n{stderr}");
    assert_eq!(std::fs::read(dir.join("final-0")).unwrap(), expected);
    assert_eq!(std::fs::read(dir.join("final-1")).unwrap(), expected);
    let _ = std::fs::remove_dir_all(&base);
}
