//! What the trainer's test files share: the backend, a user's own residual
//! unit, a linear one, the loss, and how ranks hand their weights back.

#![allow(dead_code)] // each test binary uses a part

use burn::nn::Linear;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::prelude::*;
use burn_elastic_dp::{BatchPolicy, CostModel, ReplicaConfig, TrainerConfig};
use burn_freeze::testing::weights;
use burn_freeze::{LayerStack, StackMarker, StackTypes};
use burn_pipe::PipelineConfig;

pub mod thaw;

burn_freeze::test_backend!();

/// A user's own unit: a residual block (the last one is the classifier, as
/// wide as the blocks so that every unit costs the same).
pub use burn_freeze::testing::Residual as Block;
pub use burn_freeze::testing::numbers;

/// A stack of blocks only.
pub type Types = StackMarker<B, Block<B>, Block<B>, Block<B>>;

pub fn loss(logits: Tensor<B, 2>, labels: Tensor<B, 1, Int>) -> Tensor<B, 1> {
    CrossEntropyLossConfig::new()
        .init(&logits.device())
        .forward(logits, labels)
}

/// A `Linear` of `inputs` by `outputs` whose weights depend only on `seed`
/// (the bias on `seed + 1000`), scaled to +-1/sqrt(inputs).
pub fn linear(seed: u64, inputs: usize, outputs: usize) -> Linear<B> {
    let device = Default::default();
    let scale = 1.0 / (inputs as f32).sqrt();
    let weight: Vec<f32> = numbers(seed, inputs * outputs)
        .into_iter()
        .map(|v| v * scale)
        .collect();
    Linear {
        weight: burn::module::Param::from_tensor(Tensor::from_data(
            TensorData::new(weight, [inputs, outputs]),
            &device,
        )),
        bias: Some(burn::module::Param::from_tensor(Tensor::from_data(
            TensorData::new(numbers(seed + 1000, outputs), [outputs]),
            &device,
        ))),
    }
}

/// A block of width `width` whose weights depend only on `seed`.
pub fn block(seed: u64, width: usize) -> Block<B> {
    Block {
        linear: linear(seed, width, width),
    }
}

/// `units` blocks of width `width`, unit `u` drawn from seed `u + 1`,
/// materialised (every call gives the same weights).
pub fn block_stack(units: usize, width: usize) -> LayerStack<Types> {
    let stack = LayerStack::new(
        block(1, width),
        (2..units as u64).map(|u| block(u, width)).collect(),
        block(units as u64, width),
    );
    stack.materialize();
    stack
}

/// `len` rows of `W` features from seed 42 with 4 classes (from the signs of
/// the first three features), the same in every process.
pub fn four_class_rows<const W: usize>(
    len: usize,
) -> burn::data::dataset::InMemDataset<([f32; W], i64)> {
    let values = numbers(42, len * W);
    burn::data::dataset::InMemDataset::new(
        values
            .chunks_exact(W)
            .map(|x| {
                let x: [f32; W] = x.try_into().unwrap();
                (x, i64::from(x[0] + x[1] > 0.0) + 2 * i64::from(x[2] > 0.3))
            })
            .collect(),
    )
}

/// Batches `(features, label)` rows on a device: inputs `[n, W]`, labels `[n]`.
#[derive(Clone, Copy, Debug)]
pub struct Rows;

impl<const W: usize>
    burn::data::dataloader::batcher::Batcher<B, ([f32; W], i64), (Tensor<B, 2>, Tensor<B, 1, Int>)>
    for Rows
{
    fn batch(
        &self,
        items: Vec<([f32; W], i64)>,
        device: &Device<B>,
    ) -> (Tensor<B, 2>, Tensor<B, 1, Int>) {
        let n = items.len();
        let x: Vec<f32> = items.iter().flat_map(|(x, _)| *x).collect();
        let y: Vec<i64> = items.iter().map(|(_, y)| *y).collect();
        (
            Tensor::<B, 1>::from_data(TensorData::new(x, [n * W]), device).reshape([n, W]),
            Tensor::from_data(TensorData::new(y, [n]), device),
        )
    }
}

/// The features and labels of indexed rows `(index, features, label)` as a
/// batch on `device`.
pub fn rows_batch<const W: usize>(
    items: &[(usize, [f32; W], i64)],
    device: &Device<B>,
) -> (Tensor<B, 2>, Tensor<B, 1, Int>) {
    let x: Vec<f32> = items.iter().flat_map(|(_, x, _)| *x).collect();
    let y: Vec<i64> = items.iter().map(|(_, _, y)| *y).collect();
    let n = items.len();
    (
        Tensor::<B, 1>::from_data(TensorData::new(x, [n * W]), device).reshape([n, W]),
        Tensor::from_data(TensorData::new(y, [n]), device),
    )
}

/// A unit that is one linear map (a classifier, or any dense layer).
#[derive(burn::module::Module, Debug)]
pub struct Head<B: Backend> {
    pub linear: Linear<B>,
}

impl<B: Backend> Head<B> {
    pub fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        self.linear.forward(x)
    }
}

burn_freeze::unit!(Head<B>: Tensor<B, 2> => Tensor<B, 2>);

/// `weights` as little-endian bytes (what a rank writes for the test).
pub fn to_bytes(weights: &[f32]) -> Vec<u8> {
    weights.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// The weights [`to_bytes`] wrote.
pub fn from_bytes(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// The largest difference between `a` and `b`, relative to `b`'s largest
/// value (at least 1).
pub fn difference(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let worst = a
        .iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max);
    worst / b.iter().fold(1.0f32, |m, v| m.max(v.abs()))
}

/// Every weight of `stack`, unit after unit, in one list.
pub fn flat_weights<S: StackTypes>(stack: &LayerStack<S>) -> Vec<f32> {
    let mut flat = Vec::new();
    let mut flatten = |params: Vec<TensorData>| {
        for data in params {
            flat.extend(data.convert::<f32>().to_vec::<f32>().unwrap());
        }
    };
    flatten(weights::<S::Backend, _>(stack.first()));
    stack
        .middle()
        .iter()
        .for_each(|u| flatten(weights::<S::Backend, _>(u)));
    flatten(weights::<S::Backend, _>(stack.last()));
    flat
}

/// Waits for `child` at most `bound` (then kills it); its status and stderr.
pub fn finish(
    mut child: std::process::Child,
    bound: std::time::Duration,
) -> (Option<std::process::ExitStatus>, String) {
    use std::io::Read;
    let deadline = std::time::Instant::now() + bound;
    let status = loop {
        match child.try_wait().unwrap() {
            Some(status) => break Some(status),
            None if std::time::Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            None => std::thread::sleep(std::time::Duration::from_millis(20)),
        }
    };
    let mut stderr = String::new();
    let _ = child.stderr.take().unwrap().read_to_string(&mut stderr);
    (status, stderr)
}

/// What installs `mpirun` (the MPI tests fail, not skip, without it).
pub const INSTALL_MPI: &str = "apt-get install -y libopenmpi-dev openmpi-bin libclang-dev";

/// Fails the test, naming the install line, when `mpirun` is not on PATH.
pub fn require_mpirun() {
    let found = std::process::Command::new("mpirun")
        .arg("--version")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        found,
        "this test runs its processes under mpirun, which is not on PATH: install OpenMPI ({INSTALL_MPI})"
    );
}

/// Runs this test binary's test `test` as `processes` MPI ranks on this
/// machine (`mpirun --oversubscribe`, allowed as root), each with `vars`
/// set; stdout discarded, stderr piped (read it with [`finish`]).
///
/// With `recovery` (`--enable-recovery`), a rank that exits does not take
/// the others down at once: they report it (the watchdog) and end the job
/// themselves; mpirun's exit status then says nothing of theirs.
pub fn mpirun(
    test: &str,
    processes: usize,
    recovery: bool,
    vars: &[(&str, String)],
) -> std::process::Child {
    require_mpirun();
    let mut command = std::process::Command::new("mpirun");
    // Unbound: OpenMPI binds each rank of a job of 2 or fewer to one core,
    // and a rank runs a thread per replica.
    command.args([
        "-np",
        &processes.to_string(),
        "--oversubscribe",
        "--bind-to",
        "none",
    ]);
    if recovery {
        command.arg("--enable-recovery");
    }
    command
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
    for (name, value) in vars {
        command.args(["-x", name]).env(name, value);
    }
    command
        .arg(std::env::current_exe().expect("the test binary"))
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawning mpirun")
}

/// The base of the jobs that run as ranks: batches of `batch`, Adam's
/// learning rate 1e-2, parameter costs (frozen units a third), 2
/// micro-batches per replica, each step bounded at a minute.
pub fn two_micro_batch_config(batch: BatchPolicy) -> TrainerConfig {
    TrainerConfig::new()
        .with_batch(batch)
        .with_lr(1e-2)
        .with_costs(CostModel::Parameters {
            frozen_factor: 1.0 / 3.0,
        })
        .with_replicas(
            ReplicaConfig::new()
                .with_timeout_ms(60_000)
                .with_pipeline(PipelineConfig::new().with_micro_batches(Some(2))),
        )
}
