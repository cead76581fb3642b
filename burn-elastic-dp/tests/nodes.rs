//! A replica group across OS processes: two processes on 127.0.0.1, one
//! replica each, train as one pipeline on the whole batches, and stay bit
//! for bit identical; a process that never arrives, dies or stalls ends the
//! step with an error within the bound, never a hang.
//!
//! The test binary runs itself again as the other processes: the variable
//! `ELASTIC_DP_NODE_ROLE` selects what such a child does (see [`child`]).

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use burn::backend::Autodiff;
use burn::module::{Module, ModuleVisitor, Param};
use burn::nn::Linear;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::optim::{AdamConfig, SgdConfig};
use burn::prelude::*;
use burn_elastic_dp::{ElasticError, NodeConfig, ReplicaConfig};
use burn_freeze::{LayerStack, StackMarker};
use burn_pipe::{Pipeline, PipelineConfig};

mod common;

use common::{finish, numbers};

/// The backend the tests run on: Flex, or LibTorch on the CPU with the
/// `test-tch` feature (`.ci/tch`).
#[cfg(not(feature = "test-tch"))]
type Inner = burn::backend::Flex;
#[cfg(feature = "test-tch")]
type Inner = burn::backend::LibTorch;
type B = Autodiff<Inner>;

#[derive(Module, Debug)]
pub struct Dense<B: Backend> {
    linear: Linear<B>,
}

impl<B: Backend> Dense<B> {
    pub fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        x.clone() + self.linear.forward(x).tanh()
    }
}

#[derive(Module, Debug)]
pub struct Head<B: Backend> {
    linear: Linear<B>,
}

impl<B: Backend> Head<B> {
    pub fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        self.linear.forward(x)
    }
}

burn_freeze::unit!(Dense<B>: Tensor<B, 2> => Tensor<B, 2>);
burn_freeze::unit!(Head<B>: Tensor<B, 2> => Tensor<B, 2>);

type Types = StackMarker<B, Dense<B>, Dense<B>, Head<B>>;

const WIDTH: usize = 8;
const CLASSES: usize = 3;
/// Samples per global batch: shards of 4 and 3, so the loss weighting by
/// shard size matters.
const BATCH: usize = 7;
const STEPS: u64 = 4;

fn linear(seed: u64, inputs: usize, outputs: usize) -> Linear<B> {
    let device = Default::default();
    let scale = 1.0 / (inputs as f32).sqrt();
    let weight: Vec<f32> = numbers(seed, inputs * outputs)
        .into_iter()
        .map(|v| v * scale)
        .collect();
    Linear {
        weight: Param::from_tensor(Tensor::from_data(
            TensorData::new(weight, [inputs, outputs]),
            &device,
        )),
        bias: Some(Param::from_tensor(Tensor::from_data(
            TensorData::new(numbers(seed + 1000, outputs), [outputs]),
            &device,
        ))),
    }
}

/// 6 units (5 residual blocks and a head) with the same weights in every process.
fn stack() -> LayerStack<Types> {
    let dense = |seed| Dense {
        linear: linear(seed, WIDTH, WIDTH),
    };
    LayerStack::new(
        dense(1),
        (2..6).map(dense).collect(),
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

/// Every float parameter's values, in visiting order.
struct Collect(Vec<f32>);
impl<Be: Backend> ModuleVisitor<Be> for Collect {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<Be, D>>) {
        self.0.extend(
            param
                .val()
                .to_data()
                .convert::<f32>()
                .to_vec::<f32>()
                .unwrap(),
        );
    }
}

fn weights(stack: &LayerStack<Types>) -> Vec<f32> {
    let mut collect = Collect(Vec::new());
    stack.first().visit(&mut collect);
    stack.middle().iter().for_each(|u| u.visit(&mut collect));
    stack.last().visit(&mut collect);
    collect.0
}

/// A port no one listens on now (the OS picks it).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

fn node(rank: usize, port: u16) -> NodeConfig {
    NodeConfig::new(2, rank, format!("127.0.0.1:{port}"))
        .with_listen(Some(format!("127.0.0.1:{port}")))
}

fn group_config(rank: usize, port: u16, timeout_ms: u64) -> ReplicaConfig {
    ReplicaConfig::new()
        .with_pipeline(pipeline_config())
        .with_timeout_ms(timeout_ms)
        .with_nodes(Some(node(rank, port)))
}

const ROLE: &str = "ELASTIC_DP_NODE_ROLE";

/// What a child process does, by `ELASTIC_DP_NODE_ROLE`:
/// - `train`: joins as `ELASTIC_DP_NODE_RANK` with `ELASTIC_DP_NODE_REPLICAS`
///   replicas, trains `STEPS` steps and writes its weights (little-endian
///   f32) to `ELASTIC_DP_NODE_OUT`;
/// - `die`: joins as rank 1, then exits before the first step;
/// - `stall`: joins as rank 1, then waits until it is killed.
fn child(role: &str) {
    let var = |name: &str| std::env::var(name).unwrap_or_else(|_| panic!("{name} is set"));
    let port: u16 = var("ELASTIC_DP_NODE_PORT").parse().unwrap();
    let device = Default::default();
    if role == "train" {
        let rank: usize = var("ELASTIC_DP_NODE_RANK").parse().unwrap();
        let replicas: usize = var("ELASTIC_DP_NODE_REPLICAS").parse().unwrap();
        // SGD: a gradient off by any factor shows in the weights.
        let mut group = group_config(rank, port, 60_000)
            .init(stack(), vec![vec![device; 2]; replicas], || {
                SgdConfig::new().init()
            })
            .unwrap();
        for step in 0..STEPS {
            let (x, y) = batch(100 + step);
            let report = group.train_step(x, y, loss, 0.5).unwrap();
            assert_eq!(report.shards.len(), replicas);
        }
        let bytes: Vec<u8> = weights(&group.to_layer_stack())
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        std::fs::write(var("ELASTIC_DP_NODE_OUT"), bytes).unwrap();
        return;
    }
    let group = group_config(1, port, 60_000)
        .init(stack(), vec![vec![device; 2]], || AdamConfig::new().init())
        .unwrap();
    if role == "die" {
        std::process::exit(0);
    }
    // "stall": in the group, never stepping, until the parent kills it.
    loop {
        std::thread::park();
        let _ = &group;
    }
}

/// Runs this test binary again as a child with `role`.
fn spawn(test: &str, role: &str, vars: &[(&str, String)]) -> Child {
    let mut command = Command::new(std::env::current_exe().unwrap());
    command
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(ROLE, role)
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    for (name, value) in vars {
        command.env(name, value);
    }
    command.spawn().expect("spawning a child process")
}

/// Runs `f` on a thread and waits at most `bound` for it, so that a hang
/// fails the test instead of blocking CI.
fn within<T: Send + 'static>(bound: Duration, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(bound)
        .unwrap_or_else(|_| panic!("hung: no result within {bound:?}"))
}

#[test]
fn two_processes_train_as_one_pipeline_on_the_whole_batches() {
    const TEST: &str = "two_processes_train_as_one_pipeline_on_the_whole_batches";
    if let Ok(role) = std::env::var(ROLE) {
        return child(&role);
    }
    // One pipeline on the whole batches, in this process.
    let device: Device<B> = Default::default();
    let mut single: Pipeline<Types, _> = pipeline_config()
        .init(stack(), vec![device; 2], || SgdConfig::new().init())
        .unwrap();
    let initial = weights(&single.to_layer_stack());
    for step in 0..STEPS {
        let (x, y) = batch(100 + step);
        single.train_step(x, y, loss, 0.5).unwrap();
    }
    let expected = weights(&single.to_layer_stack());
    // Training moved the weights.
    assert!(initial.iter().zip(&expected).any(|(a, b)| a != b));

    // One replica per process (shards of 4 and 3), then 2 replicas in rank
    // 0 and 1 in rank 1 (shards 3 + 2 and 2: burn-collective inside rank 0).
    for layout in [[1, 1], [2, 1]] {
        let port = free_port();
        let dir = std::env::temp_dir();
        let out = |rank: usize| -> PathBuf {
            dir.join(format!(
                "burn-elastic-dp-nodes-{}-{port}-{rank}.bin",
                std::process::id()
            ))
        };
        let children: Vec<Child> = (0..2)
            .map(|rank| {
                spawn(
                    TEST,
                    "train",
                    &[
                        ("ELASTIC_DP_NODE_RANK", rank.to_string()),
                        ("ELASTIC_DP_NODE_REPLICAS", layout[rank].to_string()),
                        ("ELASTIC_DP_NODE_PORT", port.to_string()),
                        ("ELASTIC_DP_NODE_OUT", out(rank).display().to_string()),
                    ],
                )
            })
            .collect();
        let mut trained = Vec::new();
        for (rank, child) in children.into_iter().enumerate() {
            let (status, stderr) = finish(child, Duration::from_secs(180));
            assert!(
                status.is_some_and(|s| s.success()),
                "{layout:?}: process {rank} failed ({status:?}):\n{stderr}"
            );
            let bytes = std::fs::read(out(rank)).unwrap();
            let _ = std::fs::remove_file(out(rank));
            trained.push(bytes);
        }
        assert!(!trained[0].is_empty());
        assert_eq!(
            trained[0], trained[1],
            "{layout:?}: the two processes' weights differ"
        );
        // The processes trained as the single pipeline did (the same maths;
        // rounding differs with the summation order).
        let actual: Vec<f32> = trained[0]
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(actual.len(), expected.len());
        let worst = actual
            .iter()
            .zip(&expected)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f32::max);
        let scale = expected.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        assert!(
            worst <= 1e-4 * scale.max(1.0),
            "{layout:?}: weights differ by {worst}"
        );
    }
}

#[test]
fn a_process_that_never_arrives_dies_or_stalls_ends_the_step_with_an_error() {
    const TEST: &str = "a_process_that_never_arrives_dies_or_stalls_ends_the_step_with_an_error";
    if let Ok(role) = std::env::var(ROLE) {
        return child(&role);
    }
    let device: Device<B> = Default::default();
    let build = move |rank, port, timeout_ms| {
        group_config(rank, port, timeout_ms)
            .init(stack(), vec![vec![device; 2]], || AdamConfig::new().init())
    };
    let bound = Duration::from_secs(120);

    // Nobody joins the hub; the hub never comes for rank 1.
    let error = within(bound, move || build(0, free_port(), 1_000).err()).unwrap();
    assert!(
        matches!(&error, ElasticError::NodesMissing { missing, waited }
            if missing == &[1] && *waited == Duration::from_millis(1_000)),
        "{error}"
    );
    let error = within(bound, move || build(1, free_port(), 1_000).err()).unwrap();
    assert!(
        matches!(&error, ElasticError::NodesMissing { missing, .. } if missing == &[0]),
        "{error}"
    );

    // Rank 1 joins, then exits before the first step: the step fails
    // naming it, and so does the next (the link stays failed).
    let port = free_port();
    let peer = spawn(TEST, "die", &[("ELASTIC_DP_NODE_PORT", port.to_string())]);
    let (first, second) = within(bound, move || {
        let mut group = build(0, port, 60_000).unwrap();
        let (x, y) = batch(1);
        let first = group
            .train_step(x.clone(), y.clone(), loss, 1e-2)
            .unwrap_err();
        let second = group.train_step(x, y, loss, 1e-2).unwrap_err();
        (first, second)
    });
    let (status, stderr) = finish(peer, bound);
    assert!(status.is_some_and(|s| s.success()), "{stderr}");
    assert!(
        matches!(&first, ElasticError::Node { node: 1, message } if message.contains("closed")),
        "{first}"
    );
    assert!(
        second.to_string().contains("start every process again"),
        "{second}"
    );

    // Rank 1 joins, then never steps: the step ends at its bound, naming it.
    let port = free_port();
    let peer = spawn(TEST, "stall", &[("ELASTIC_DP_NODE_PORT", port.to_string())]);
    let error = within(bound, move || {
        // Up to a minute to join, 1.5 s per step.
        let mut config = group_config(0, port, 1_500);
        config.nodes = config.nodes.map(|n| n.with_join_timeout_ms(Some(60_000)));
        let mut group = config
            .init(stack(), vec![vec![device; 2]], || AdamConfig::new().init())
            .unwrap();
        let (x, y) = batch(2);
        group.train_step(x, y, loss, 1e-2).unwrap_err()
    });
    let _ = finish(peer, Duration::ZERO);
    assert!(
        matches!(&error, ElasticError::NodesMissing { missing, waited }
            if missing == &[1] && *waited == Duration::from_millis(1_500)),
        "{error}"
    );
}
