//! `PipeTransformerStrategy` against burn-train's own single-device loop:
//! with nothing frozen and one device, the same batches and the same LR
//! scheduler give the same loss at every step and the same final weights
//! (1e-5). Then the strategy freezes, reports each step and validates.

#![cfg(feature = "burn-train")]

mod common;

use std::sync::{Arc, Mutex};

use burn::data::dataloader::DataLoaderBuilder;
use burn::data::dataloader::batcher::Batcher;
use burn::data::dataset::InMemDataset;
use burn::lr_scheduler::linear::LinearLrSchedulerConfig;
use burn::module::{AutodiffModule, ModuleVisitor, Param};
use burn::optim::AdamConfig;
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;
use burn::train::metric::{Adaptor, ItemLazy, Metric, MetricMetadata, MetricName, SerializedEntry};
use burn::train::{
    InferenceStep, Learner, SupervisedTraining, TrainOutput, TrainStep, TrainingStrategy,
};
use burn_elastic_dp::burn_train::{FromTrainStep, PipeTransformerStrategy, StepInfo};
use burn_elastic_dp::{BatchPolicy, CostModel, FreezeRule, Parts, ReplicaConfig, TrainerConfig};
use burn_freeze::{IntoLayerStack, LayerStack, StackError};
use burn_pipe::PipelineConfig;
use common::{B, Block, Types, block, numbers};

const WIDTH: usize = 6;
const SAMPLES: usize = 32;
const BATCH: usize = 8;
const EPOCHS: usize = 2;

/// A user's model: a first block, middle blocks, a last block.
#[derive(Module, Debug)]
struct Net<B: Backend> {
    first: Block<B>,
    middle: Vec<Block<B>>,
    last: Block<B>,
}

impl<B: Backend> Net<B> {
    fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        let x = self.first.forward(x);
        let x = self.middle.iter().fold(x, |x, b| b.forward(x));
        self.last.forward(x)
    }
}

impl IntoLayerStack for Net<B> {
    type Types = Types;

    fn into_layer_stack(self) -> LayerStack<Types> {
        LayerStack::new(self.first, self.middle, self.last)
    }

    fn from_layer_stack(stack: LayerStack<Types>) -> Result<Self, StackError> {
        let (first, middle, last) = stack.into_parts();
        Ok(Self {
            first,
            middle,
            last,
        })
    }
}

/// A step's loss: what the recording metric reads.
struct StepLoss<B: Backend>(Tensor<B, 1>);

impl<B: Backend> ItemLazy for StepLoss<B> {
    type ItemSync = f64;

    fn sync(self) -> f64 {
        self.0.into_scalar().elem::<f64>()
    }
}

/// Each step's loss, in order, into a shared list.
#[derive(Clone, Default)]
struct Losses(Arc<Mutex<Vec<f64>>>);

struct LossValue(f64);
impl Adaptor<LossValue> for f64 {
    fn adapt(&self) -> LossValue {
        LossValue(*self)
    }
}

impl Metric for Losses {
    type Input = LossValue;

    fn name(&self) -> MetricName {
        Arc::new("recorded loss".to_string())
    }

    fn update(&mut self, item: &LossValue, _metadata: &MetricMetadata) -> SerializedEntry {
        self.0.lock().unwrap().push(item.0);
        SerializedEntry::new(item.0.to_string(), item.0.to_string())
    }

    fn clear(&mut self) {}
}

fn cross_entropy<B: Backend>(logits: Tensor<B, 2>, labels: Tensor<B, 1, Int>) -> Tensor<B, 1> {
    burn::nn::loss::CrossEntropyLossConfig::new()
        .init(&logits.device())
        .forward(logits, labels)
}

impl<Ba: AutodiffBackend> TrainStep for Net<Ba> {
    type Input = (Tensor<Ba, 2>, Tensor<Ba, 1, Int>);
    type Output = StepLoss<Ba>;

    fn step(&self, (x, y): Self::Input) -> TrainOutput<StepLoss<Ba>> {
        let loss = cross_entropy(self.forward(x), y);
        TrainOutput::new(self, loss.backward(), StepLoss(loss))
    }
}

impl<Ba: Backend> InferenceStep for Net<Ba> {
    type Input = (Tensor<Ba, 2>, Tensor<Ba, 1, Int>);
    type Output = StepLoss<Ba>;

    fn step(&self, (x, y): Self::Input) -> StepLoss<Ba> {
        StepLoss(cross_entropy(self.forward(x), y))
    }
}

/// The strategy's item: the step's loss.
impl<Ba: Backend> FromTrainStep<Ba, Tensor<Ba, 2>, Tensor<Ba, 1, Int>> for StepLoss<Ba> {
    fn from_train_step(
        info: &StepInfo,
        _parts: Vec<(Tensor<Ba, 2>, Tensor<Ba, 1, Int>)>,
        device: &Ba::Device,
    ) -> Self {
        StepLoss(Tensor::from_floats([info.loss], device))
    }
}

type Item = (usize, Vec<f32>, i64);

/// Rows, recording which samples each batch held.
#[derive(Clone, Default)]
struct Rows(Arc<Mutex<Vec<Vec<usize>>>>);

impl<Ba: Backend> Batcher<Ba, Item, (Tensor<Ba, 2>, Tensor<Ba, 1, Int>)> for Rows {
    fn batch(&self, items: Vec<Item>, device: &Ba::Device) -> (Tensor<Ba, 2>, Tensor<Ba, 1, Int>) {
        self.0
            .lock()
            .unwrap()
            .push(items.iter().map(|i| i.0).collect());
        let n = items.len();
        let x: Vec<f32> = items.iter().flat_map(|i| i.1.clone()).collect();
        let y: Vec<i64> = items.iter().map(|i| i.2).collect();
        (
            Tensor::<Ba, 1>::from_data(TensorData::new(x, [n * WIDTH]), device).reshape([n, WIDTH]),
            Tensor::from_data(TensorData::new(y, [n]), device),
        )
    }
}

fn items() -> Vec<Item> {
    let x = numbers(21, SAMPLES * WIDTH);
    (0..SAMPLES)
        .map(|i| {
            let row = x[i * WIDTH..(i + 1) * WIDTH].to_vec();
            (
                i,
                row.clone(),
                i64::from(row[0] > 0.0) + 2 * i64::from(row[1] > 0.2),
            )
        })
        .collect()
}

fn net() -> Net<B> {
    let net = Net {
        first: block(31, WIDTH),
        middle: (0..3).map(|u| block(32 + u, WIDTH)).collect(),
        last: block(40, WIDTH),
    };
    // Read once: Burn initialises lazily (see burn-freeze's docs).
    let _ = net.forward(Tensor::zeros([1, WIDTH], &Default::default()));
    net
}

fn scheduler() -> burn::lr_scheduler::linear::LinearLrScheduler {
    LinearLrSchedulerConfig::new(2e-2, 2e-3, EPOCHS * SAMPLES / BATCH)
        .init()
        .unwrap()
}

struct Collect(Vec<f32>);
impl<Ba: Backend> ModuleVisitor<Ba> for Collect {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<Ba, D>>) {
        self.0
            .extend(param.val().to_data().to_vec::<f32>().unwrap());
    }
}

fn weights<M: Module<Ba>, Ba: Backend>(model: &M) -> Vec<f32> {
    let mut collect = Collect(Vec::new());
    model.visit(&mut collect);
    collect.0
}

fn dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("burn-train-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// One device, one stage, nothing frozen, one micro-batch.
fn plain_config() -> TrainerConfig {
    TrainerConfig::new()
        .with_parts(Parts::new().with_freeze(false))
        .with_stages(Some(1))
        .with_batch(BatchPolicy::FixedGlobal { batch: BATCH })
        .with_costs(CostModel::Parameters { frozen_factor: 1.0 })
        .with_replicas(
            ReplicaConfig::new().with_pipeline(PipelineConfig::new().with_micro_batches(Some(1))),
        )
        .with_seed(4)
}

/// The stages' optimizer.
type Adam = burn::optim::adaptor::OptimizerAdaptor<
    burn::optim::Adam,
    burn_freeze::TrainableUnits<Types>,
    B,
>;
/// The strategy of these tests.
type Strategy = PipeTransformerStrategy<Types, Item, Adam, Tensor<B, 1, Int>>;

/// The strategy on the test's rows, batched by `batcher`, with Adam.
fn strategy(
    config: TrainerConfig,
    devices: Vec<Device<B>>,
    batcher: Rows,
) -> Result<Strategy, burn_elastic_dp::TrainerError> {
    Strategy::new(
        config,
        devices,
        InMemDataset::new(items()),
        batcher,
        || AdamConfig::new().init(),
        cross_entropy::<B>,
    )
}

/// The inner backend, which validation runs on.
type Inner = <B as AutodiffBackend>::InnerBackend;
/// burn-train's validation loader of rows.
type ValidLoader =
    Arc<dyn burn::data::dataloader::DataLoader<Inner, (Tensor<Inner, 2>, Tensor<Inner, 1, Int>)>>;

fn valid_loader() -> ValidLoader {
    DataLoaderBuilder::new(Rows::default())
        .batch_size(BATCH)
        .build(InMemDataset::new(items()[..BATCH].to_vec()))
}

#[test]
fn the_strategy_unfrozen_on_one_device_equals_burn_trains_own_loop() {
    let device: Device<B> = Default::default();
    // PipeTransformer through burn-train.
    let recorded = Rows::default();
    let strategy = PipeTransformerStrategy::<Types, Item, _, _>::new(
        plain_config(),
        vec![device],
        InMemDataset::new(items()),
        recorded.clone(),
        || AdamConfig::new().init(),
        cross_entropy::<B>,
    )
    .unwrap();
    let strategy = Arc::new(strategy);
    let losses = Losses::default();
    let out = dir("strategy");
    let unused_train = DataLoaderBuilder::new(Rows::default())
        .batch_size(BATCH)
        .build(InMemDataset::new(items()));
    let result = SupervisedTraining::new(&out, unused_train, valid_loader())
        .metric_train(losses.clone())
        .num_epochs(EPOCHS)
        .with_application_logger(None)
        .with_training_strategy(TrainingStrategy::Custom(strategy.clone()))
        .launch(Learner::new(net(), AdamConfig::new().init(), scheduler()));
    assert!(strategy.take_error().is_none());
    let pipelined = losses.0.lock().unwrap().clone();
    let batches = recorded.0.lock().unwrap().clone();
    assert_eq!(batches.len(), EPOCHS * SAMPLES / BATCH);

    // burn-train's own loop on the same batches: the strategy's epochs, in
    // its order, as one epoch of a loader that does not shuffle.
    let all = items();
    let in_order: Vec<Item> = batches.iter().flatten().map(|&i| all[i].clone()).collect();
    let train = DataLoaderBuilder::new(Rows::default())
        .batch_size(BATCH)
        .build(InMemDataset::new(in_order));
    let losses = Losses::default();
    let reference = SupervisedTraining::new(dir("reference"), train, valid_loader())
        .metric_train(losses.clone())
        .num_epochs(1)
        .with_application_logger(None)
        .launch(Learner::new(net(), AdamConfig::new().init(), scheduler()));
    let plain = losses.0.lock().unwrap().clone();

    assert_eq!(pipelined.len(), batches.len(), "a loss per step");
    assert_eq!(plain.len(), batches.len());
    for (step, (a, b)) in pipelined.iter().zip(&plain).enumerate() {
        assert!(
            (a - b).abs() <= 1e-5 * b.abs().max(1.0),
            "step {step}: {a} against burn-train's {b}"
        );
    }
    let (a, b) = (weights(&result.model), weights(&reference.model));
    let worst = a
        .iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0f32, f32::max);
    assert!(worst <= 1e-5, "weights differ by {worst}");
    // The weights moved: this compared training, not two copies of the start.
    let start = weights(&net().valid());
    assert!(a.iter().zip(&start).any(|(x, y)| (x - y).abs() > 1e-3));
    let _ = std::fs::remove_dir_all(out);
}

#[test]
fn the_strategy_freezes_and_a_bad_configuration_is_refused() {
    let device: Device<B> = Default::default();
    // Checked before any work: 3 stages on 2 devices.
    let refused = strategy(
        plain_config().with_stages(Some(3)),
        vec![device; 2],
        Rows::default(),
    );
    let message = refused.err().expect("refused").to_string();
    assert!(message.contains("stages"), "{message}");
    // Frozen after epoch 0: blocks 0 and 1 (units 0..2).
    let out = dir("freezing");
    let config = plain_config()
        .with_parts(Parts::new())
        .with_freeze(FreezeRule::Fronts { layers: vec![0, 2] })
        .with_output_dir(Some(out.join("trainer")));
    let strategy = Arc::new(strategy(config, vec![device], Rows::default()).unwrap());
    let train = DataLoaderBuilder::new(Rows::default())
        .batch_size(BATCH)
        .build(InMemDataset::new(items()));
    let start = net();
    let result = SupervisedTraining::new(&out, train, valid_loader())
        .metric_train(Losses::default())
        .num_epochs(EPOCHS)
        .with_application_logger(None)
        .with_training_strategy(TrainingStrategy::Custom(strategy.clone()))
        .launch(Learner::new(
            start.clone(),
            AdamConfig::new().init(),
            scheduler(),
        ));
    assert!(strategy.take_error().is_none());
    // The front moved to 2 units after epoch 0, as the trainer logged.
    let transitions = std::fs::read_to_string(out.join("trainer/transitions.jsonl")).unwrap();
    assert_eq!(transitions.lines().count(), 1, "{transitions}");
    assert!(transitions.contains("\"front\":[0,2]"), "{transitions}");
    // The weights came back into the learner: the model trained.
    let trained = result.model;
    assert_ne!(weights(&trained.last), weights(&start.last.valid()));
    let _ = std::fs::remove_dir_all(out);
}

/// Runs the freezing strategy through burn-train for epochs up to
/// `epochs`, from burn-train's checkpoint `resume_from` when given; the
/// losses of its steps and the trained weights.
fn checkpointed_run(
    dir: &std::path::Path,
    epochs: usize,
    resume_from: Option<usize>,
) -> (Vec<f64>, Vec<f32>) {
    let device: Device<B> = Default::default();
    let config = plain_config()
        .with_parts(Parts::new())
        .with_freeze(FreezeRule::Fronts { layers: vec![0, 2] })
        .with_checkpoint(Some(burn_elastic_dp::CheckpointConfig::new(
            dir.join("trainer"),
        )));
    let strategy = Arc::new(strategy(config, vec![device], Rows::default()).unwrap());
    let losses = Losses::default();
    let train = DataLoaderBuilder::new(Rows::default())
        .batch_size(BATCH)
        .build(InMemDataset::new(items()));
    let mut training = SupervisedTraining::new(dir, train, valid_loader())
        .metric_train(losses.clone())
        .num_epochs(epochs)
        .with_application_logger(None)
        .with_file_checkpointer(burn::record::CompactRecorder::new())
        .with_training_strategy(TrainingStrategy::Custom(strategy.clone()));
    if let Some(epoch) = resume_from {
        training = training.checkpoint(epoch);
    }
    let result = training.launch(Learner::new(net(), AdamConfig::new().init(), scheduler()));
    assert!(strategy.take_error().is_none());
    let losses = losses.0.lock().unwrap().clone();
    (losses, weights(&result.model))
}

#[test]
fn a_run_resumed_through_burn_trains_checkpoint_goes_on_as_one_never_stopped() {
    let straight = dir("straight");
    let (all_losses, all_weights) = checkpointed_run(&straight, EPOCHS, None);
    let stopped = dir("stopped");
    let (first, _) = checkpointed_run(&stopped, 1, None);
    // burn-train restores its learner (and LR scheduler) from epoch 1; the
    // strategy resumes the trainer from its own checkpoint: the front that
    // moved after epoch 1, the optimizer state of every stage.
    let (second, resumed_weights) = checkpointed_run(&stopped, EPOCHS, Some(1));
    let steps = SAMPLES / BATCH;
    assert_eq!(first.len(), steps);
    assert_eq!(second.len(), steps);
    let resumed: Vec<f64> = first.iter().chain(&second).copied().collect();
    assert_eq!(resumed, all_losses, "losses step by step");
    assert_eq!(resumed_weights, all_weights);
    let _ = std::fs::remove_dir_all(straight);
    let _ = std::fs::remove_dir_all(stopped);
}
