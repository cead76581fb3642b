//! A killed process in a two-process group: the survivor's step fails with
//! an error naming it, within the bound; both processes then resume from
//! their last checkpoints (weights and Adam's state, through Burn's
//! recorders) and end bit for bit where a run never interrupted ends.
//!
//! The test binary runs itself again as the two processes;
//! `ELASTIC_DP_RESUME_ROLE` selects what such a child does (see [`child`]).

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::AdamConfig;
use burn::prelude::*;
use burn::record::{BinBytesRecorder, FullPrecisionSettings, Recorder};
use burn_elastic_dp::{NodeConfig, ReplicaConfig};
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

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
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

/// A child process: rank `ELASTIC_DP_RANK` of two, one replica, Adam.
/// It resumes from its checkpoint in `ELASTIC_DP_DIR` when one is there,
/// trains to step `STEPS` writing a checkpoint (weights, optimizer state,
/// step) after every step, and writes its final weights to `final-<rank>`.
/// With `ELASTIC_DP_DIE_AT` it exits (killed) before that step; a failed
/// step writes `error-<rank>` and exits with code 3.
fn child() {
    let rank: usize = var("ELASTIC_DP_RANK").parse().unwrap();
    let port: u16 = var("ELASTIC_DP_PORT").parse().unwrap();
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
        .with_timeout_ms(20_000)
        .with_pipeline(PipelineConfig::new().with_micro_batches(Some(2)))
        .with_nodes(Some(
            NodeConfig::new(2, rank, format!("127.0.0.1:{port}"))
                .with_join_timeout_ms(Some(60_000)),
        ));
    let mut group = config
        .init(stack, vec![vec![device]], || AdamConfig::new().init())
        .unwrap();
    if let Some(record) = optimizer {
        group.load_optimizer_record(record);
    }
    std::fs::create_dir_all(&checkpoint).unwrap();
    for step in start..STEPS {
        if die_at == Some(step) {
            std::process::exit(9); // killed
        }
        let (x, y) = batch(step);
        if let Err(error) = group.train_step(x, y, loss, 1e-2) {
            std::fs::write(dir.join(format!("error-{rank}")), error.to_string()).unwrap();
            std::process::exit(3);
        }
        let model = recorder
            .record(group.to_layer_stack().into_parts().into_record(), ())
            .unwrap();
        let optimizer = recorder.record(group.optimizer_record(), ()).unwrap();
        write_atomic(&checkpoint.join("model"), &model);
        write_atomic(&checkpoint.join("optimizer"), &optimizer);
        write_atomic(&checkpoint.join("step"), (step + 1).to_string().as_bytes());
    }
    write_atomic(
        &dir.join(format!("final-{rank}")),
        &weight_bytes(&group.to_layer_stack()),
    );
}

/// Runs the two processes in `dir`; rank 1 dies before step `die_at`.
/// Their exit codes and stderr (each waited for at most `bound`).
fn run_two(dir: &Path, die_at: Option<u64>, bound: Duration) -> Vec<(Option<i32>, String)> {
    let port = free_port();
    let children: Vec<Child> = (0..2)
        .map(|rank| {
            let mut command = Command::new(std::env::current_exe().unwrap());
            command
                .args([TEST, "--exact", "--nocapture", "--test-threads=1"])
                .env(ROLE, "node")
                .env("ELASTIC_DP_RANK", rank.to_string())
                .env("ELASTIC_DP_PORT", port.to_string())
                .env("ELASTIC_DP_DIR", dir)
                .stdout(Stdio::null())
                .stderr(Stdio::piped());
            if let (1, Some(step)) = (rank, die_at) {
                command.env("ELASTIC_DP_DIE_AT", step.to_string());
            }
            command.spawn().unwrap()
        })
        .collect();
    children
        .into_iter()
        .map(|child| {
            let (status, stderr) = common::finish(child, bound);
            (status.and_then(|s| s.code()), stderr)
        })
        .collect()
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
    let outcome = run_two(&clean, None, bound);
    for (rank, (status, stderr)) in outcome.iter().enumerate() {
        assert_eq!(*status, Some(0), "clean run, rank {rank}:\n{stderr}");
    }
    let expected = std::fs::read(clean.join("final-0")).unwrap();
    assert_eq!(
        std::fs::read_to_string(clean.join("checkpoint-0/step")).unwrap(),
        STEPS.to_string()
    );
    assert_eq!(std::fs::read(clean.join("final-1")).unwrap(), expected);

    // Rank 1 is killed before step 3: rank 0's step fails, naming it, well
    // within the bound (its checkpoint is after step 3, rank 1's after 3).
    let dir = base.join("killed");
    std::fs::create_dir_all(&dir).unwrap();
    let started = Instant::now();
    let outcome = run_two(&dir, Some(3), bound);
    assert!(started.elapsed() < bound, "the survivor hung");
    assert_eq!(
        outcome[1].0,
        Some(9),
        "rank 1 was killed:\n{}",
        outcome[1].1
    );
    assert_eq!(
        outcome[0].0,
        Some(3),
        "rank 0 ends with an error:\n{}",
        outcome[0].1
    );
    let error = std::fs::read_to_string(dir.join("error-0")).unwrap();
    assert!(
        error.contains("process 1") || error.contains("node 1"),
        "{error}"
    );
    println!("the survivor's error: {error}");
    assert_eq!(
        std::fs::read_to_string(dir.join("checkpoint-1/step")).unwrap(),
        "3"
    );

    // Both start again from their checkpoints and finish.
    let outcome = run_two(&dir, None, bound);
    for (rank, (status, stderr)) in outcome.iter().enumerate() {
        assert_eq!(*status, Some(0), "resumed run, rank {rank}:\n{stderr}");
    }
    assert_eq!(std::fs::read(dir.join("final-0")).unwrap(), expected);
    assert_eq!(std::fs::read(dir.join("final-1")).unwrap(), expected);
    let _ = std::fs::remove_dir_all(&base);
}
