//! PipeTransformer through burn-train: a tiny ViT trained with
//! `SupervisedTraining` and `PipeTransformerStrategy` on generated images
//! (each image's class is its bright band), accuracy and loss on the
//! validation split, burn-train's dashboard on a terminal and its plain
//! lines otherwise.
//!
//! ```text
//! cargo run --release -p examples --example learner
//! cargo run --release -p examples --example learner -- --size ci --output-dir target/learner-ci
//! ```
//!
//! Copied alone, it needs `burn` (features `autodiff`, `flex`, `train` and,
//! for the dashboard, `tui`), `burn-freeze`, `burn-elastic-dp` (feature
//! `burn-train`), `pipetransformer-models` (feature `burn-train`; named
//! `models` in this package) and `clap` (feature `derive`).

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use burn::backend::{Autodiff, Flex};
use burn::data::dataloader::DataLoaderBuilder;
use burn::data::dataset::InMemDataset;
use burn::lr_scheduler::cosine::CosineAnnealingLrSchedulerConfig;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::optim::AdamConfig;
use burn::prelude::*;
use burn::train::metric::{AccuracyMetric, LearningRateMetric, LossMetric};
use burn::train::{Learner, SupervisedTraining, TrainingStrategy};
use burn_elastic_dp::burn_train::PipeTransformerStrategy;
use burn_elastic_dp::{BatchPolicy, FreezeRule, LayerSpec, TrainerConfig};
use burn_freeze::{EvidenceConfig, TypesOf};
use clap::{Parser, ValueEnum};
use models::synthetic::BandImages;
use models::vit::{Vit, VitConfig};

/// The CPU backend with autodiff; every logical device is the one CPU.
type Train = Autodiff<Flex>;

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Size {
    /// Seconds: 4 blocks, 2048 training images, 2 epochs (what CI runs).
    Ci,
    /// 8 blocks, 2048 training images, 6 epochs.
    Default,
}

#[derive(Debug, Parser)]
#[command(
    version,
    about = "A tiny ViT trained through burn-train's SupervisedTraining with PipeTransformer (freezing, pipelining, replicas, caching)"
)]
struct Args {
    /// Preset sizes.
    #[arg(long, value_enum, default_value = "default")]
    size: Size,
    /// Logical devices, in 1..=64.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=64))]
    devices: u32,
    /// The most of the active blocks one freeze decision takes, in (0, 1)
    /// (the default rule freezes on evidence: a held-out loss that has
    /// learned and stopped improving).
    #[arg(long, default_value_t = 0.5, value_parser = |t: &str| number_in(t, |a| a > 0.0 && a < 1.0, "a number in (0, 1)"))]
    freeze_alpha: f64,
    /// Peak learning rate (cosine-annealed over the run), in (0, 1].
    #[arg(long, default_value_t = 3e-3, value_parser = |t: &str| number_in(t, |a| a > 0.0 && a <= 1.0, "a number in (0, 1]"))]
    lr: f64,
    /// burn-train's directory: its logs, metrics per epoch and checkpoints.
    #[arg(long, default_value = "target/learner")]
    output_dir: PathBuf,
    /// Seeds the weights, the generated images and the sample order.
    #[arg(long, default_value_t = 42)]
    seed: u64,
}

/// `text` as a number that `accepts` takes, or a one-line error naming
/// what was `expected`.
fn number_in(text: &str, accepts: impl Fn(f64) -> bool, expected: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(value) if accepts(value) => Ok(value),
        _ => Err(format!("expected {expected}, got {text}")),
    }
}

/// (blocks, training images, epochs) of a size.
fn preset(size: Size) -> (usize, usize, usize) {
    match size {
        Size::Ci => (4, 2048, 2),
        Size::Default => (8, 2048, 6),
    }
}

const BATCH: usize = 32;
const VALID: usize = 256;

fn main() -> ExitCode {
    let args = match Args::try_parse() {
        Ok(args) => args,
        Err(e) if !e.use_stderr() => e.exit(),
        Err(e) => {
            eprintln!(
                "{}",
                e.to_string().lines().next().unwrap_or("bad arguments")
            );
            return ExitCode::from(2);
        }
    };
    if let Err(e) = std::fs::create_dir_all(&args.output_dir) {
        eprintln!("error: cannot make {}: {e}", args.output_dir.display());
        return ExitCode::from(1);
    }
    match run(&args) {
        Ok(accuracy) => {
            println!(
                "validation accuracy {:.1}% on {VALID} images",
                100.0 * accuracy
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(1)
        }
    }
}

fn run(args: &Args) -> Result<f64, Box<dyn std::error::Error>> {
    let (blocks, samples, epochs) = preset(args.size);
    let device = Default::default();
    <Train as Backend>::seed(&device, args.seed);
    let devices = vec![device; args.devices as usize];
    let task = BandImages::new(4, 3, 16, args.seed);
    let ids = |range: std::ops::Range<usize>| InMemDataset::new(range.collect::<Vec<usize>>());
    let valid_ids = 1_000_000..1_000_000 + VALID;

    let cross_entropy = CrossEntropyLossConfig::new().init(&device);
    let strategy = Arc::new(
        PipeTransformerStrategy::<TypesOf<Vit<Train>>, usize, _, _>::new(
            TrainerConfig::new()
                .with_freeze(FreezeRule::Evidence {
                    rule: EvidenceConfig::new().with_alpha(args.freeze_alpha),
                })
                .with_layers(LayerSpec::Uniform {
                    offset: 1,
                    per_layer: 2,
                    layers: blocks,
                })
                .with_batch(BatchPolicy::FixedGlobal { batch: BATCH })
                .with_seed(args.seed)
                .with_output_dir(Some(args.output_dir.join("pipetransformer"))),
            devices,
            ids(0..samples),
            task.clone(),
            || AdamConfig::new().init(),
            move |logits, labels| cross_entropy.forward(logits, labels),
        )?,
    );
    let steps = epochs * samples.div_ceil(BATCH);
    let scheduler = CosineAnnealingLrSchedulerConfig::new(args.lr, steps).init()?;
    let training = SupervisedTraining::new(
        &args.output_dir,
        DataLoaderBuilder::new(task.clone())
            .batch_size(BATCH)
            .build(ids(0..samples)),
        DataLoaderBuilder::new(task.clone())
            .batch_size(BATCH)
            .build(ids(valid_ids.clone())),
    )
    .metrics((AccuracyMetric::new(), LossMetric::new()))
    .metric_train_numeric(LearningRateMetric::new())
    .num_epochs(epochs)
    .summary()
    .with_training_strategy(TrainingStrategy::Custom(strategy.clone()));
    let vit = VitConfig::tiny(4)
        .with_layers(blocks)
        .init::<Train>(&device);
    let result = training.launch(Learner::new(vit, AdamConfig::new().init(), scheduler));
    if let Some(error) = strategy.take_error() {
        return Err(error.into());
    }
    let ids: Vec<usize> = valid_ids.collect();
    let (images, labels) = task.samples(&ids, &device);
    let predicted = result.model.forward(images).argmax(1).flatten::<1>(0, 1);
    let correct = predicted
        .equal(labels)
        .int()
        .sum()
        .into_scalar()
        .elem::<i64>();
    Ok(correct as f64 / VALID as f64)
}
