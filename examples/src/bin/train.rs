//! The main job: train a model on the chosen backend, plainly on one device
//! or through PipeTransformer's trainer (`burn_elastic_dp::Trainer`), and
//! print the loss, held-out accuracy and the run's shape per epoch.
//!
//! ```text
//! cargo run --release -p examples --bin train            # tiny ViT, generated images, plain
//! cargo run --release -p examples --bin train -- --model bert --epochs 3
//! # PipeTransformer over 4 devices (logical on CPU), alpha = 1/3: the frozen
//! # prefix grows each epoch, the pipeline shortens, replicas fill the devices
//! cargo run --release -p examples --bin train -- --devices 4 --freeze-alpha 0.33
//! ```

use std::path::PathBuf;
use std::time::Instant;

use burn::data::dataloader::batcher::Batcher;
use burn::data::dataset::Dataset;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::optim::{AdamConfig, Optimizer};
use burn::prelude::*;
use burn_elastic_dp::{
    BatchPolicy, CostModel, FreezeRule, LayerSpec, Parts, ReplicaConfig, TrainerConfig,
    TrainerError,
};
use burn_freeze::{
    AutodiffActivation, Cacheable, FreezableStack, InnerBackendOf, InnerHidden, InnerInput,
    IntoLayerStack, LayerStack, StackTypes,
};
use burn_pipe::PipelineConfig;
use clap::{Parser, ValueEnum};
use examples::backend::{self, Train};
use examples::task::{TaskBatcher, accuracy, indices};
use indicatif::{ProgressBar, ProgressStyle};
use models::bert::BertConfig;
use models::synthetic::{BandImages, MajorityTokens};
use models::vit::VitConfig;

#[derive(Debug, Clone, Copy, ValueEnum)]
enum ModelKind {
    /// Tiny ViT on images whose class is a bright band.
    Vit,
    /// Tiny BERT on sequences labelled by their majority half of the vocabulary.
    Bert,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Rule {
    /// The alpha closed form, once per epoch (needs no gradient statistics).
    Schedule,
    /// The paper's AutoFreeze: the alpha bound and the argmin of the epoch's
    /// per-layer gradient norms, once per epoch.
    Argmin,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Costs {
    /// Each unit's forward and backward time, measured on the first batch.
    Profiled,
    /// Parameter counts.
    Params,
}

#[derive(Debug, Parser)]
#[command(
    about = "Train a tiny transformer on generated data: plainly, or with PipeTransformer (freeze, pipeline, replicas, cache)"
)]
struct Args {
    /// Which model and generated task.
    #[arg(long, value_enum, default_value = "vit")]
    model: ModelKind,
    /// Transformer layers (blocks) of the model.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=48))]
    layers: u32,
    /// Number of epochs.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..))]
    epochs: u32,
    /// Optimizer steps per epoch at the starting replica count (the
    /// dataset holds steps x batch-size samples).
    #[arg(long, default_value_t = 40, value_parser = clap::value_parser!(u32).range(1..))]
    steps: u32,
    /// Samples per step (the global batch, over all replicas).
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..=4096))]
    batch_size: u32,
    /// Adam learning rate, in (0, 1].
    #[arg(long, default_value_t = 3e-3, value_parser = learning_rate)]
    lr: f64,
    /// Seed of the generated data and of the sample order.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Number of classes (ViT only; BERT's task has 2).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(2..=16))]
    classes: u32,
    /// Devices (GPUs; on CPU, logical devices sharing the one CPU). With
    /// more than 1, or with --freeze-alpha, PipeTransformer's trainer runs.
    /// Default: --stages.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=64))]
    devices: Option<u32>,
    /// Pipeline stages at the start (default: every device).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=64))]
    stages: Option<u32>,
    /// Micro-batches per step and replica (default: the paper's choice for K).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=4096))]
    micro_batches: Option<u32>,
    /// Freeze layers as they converge; alpha in (0, 1) bounds the share of
    /// the remaining layers frozen per epoch.
    #[arg(long, value_parser = alpha)]
    freeze_alpha: Option<f64>,
    /// How the front moves.
    #[arg(long, value_enum, default_value = "schedule")]
    freeze_rule: Rule,
    /// AutoPipe's unit costs.
    #[arg(long, value_enum, default_value = "profiled")]
    costs: Costs,
    /// Keep the pipeline's length (no AutoPipe).
    #[arg(long)]
    no_pipe: bool,
    /// Keep the replica count (no AutoDP).
    #[arg(long)]
    no_dp: bool,
    /// Recompute the frozen prefix every step (no AutoCache).
    #[arg(long)]
    no_cache: bool,
    /// Directory for transitions.jsonl and epochs.jsonl.
    #[arg(long)]
    output_dir: Option<PathBuf>,
}

fn learning_rate(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(lr) if lr > 0.0 && lr <= 1.0 => Ok(lr),
        _ => Err(format!("expected a learning rate in (0, 1], got {text}")),
    }
}

fn alpha(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(a) if a > 0.0 && a < 1.0 => Ok(a),
        _ => Err(format!("expected alpha in (0, 1), got {text}")),
    }
}

impl Args {
    fn devices(&self) -> usize {
        self.devices.or(self.stages).unwrap_or(1) as usize
    }

    fn pipetransformer(&self) -> bool {
        self.devices() > 1 || self.freeze_alpha.is_some()
    }

    /// The trainer's configuration for a model of `layers` blocks.
    fn trainer_config(&self, layers: usize) -> TrainerConfig {
        let freeze = match (self.freeze_alpha, self.freeze_rule) {
            (None, _) => FreezeRule::Fronts { layers: vec![0] },
            (Some(alpha), Rule::Schedule) => FreezeRule::AlphaSchedule { alpha },
            (Some(alpha), Rule::Argmin) => FreezeRule::AlphaArgmin { alpha },
        };
        TrainerConfig::new()
            .with_parts(
                Parts::new()
                    .with_freeze(self.freeze_alpha.is_some())
                    .with_pipe(!self.no_pipe)
                    .with_dp(!self.no_dp)
                    .with_cache(!self.no_cache),
            )
            .with_freeze(freeze)
            .with_layers(LayerSpec::Uniform {
                offset: 1,
                per_layer: 2,
                layers,
            })
            .with_stages(self.stages.map(|s| s as usize))
            .with_batch(BatchPolicy::FixedGlobal {
                batch: self.batch_size as usize,
            })
            .with_lr(self.lr)
            .with_costs(match self.costs {
                Costs::Profiled => CostModel::Profiled { repeats: 3 },
                Costs::Params => CostModel::Parameters {
                    frozen_factor: 1.0 / 3.0,
                },
            })
            .with_replicas(ReplicaConfig::new().with_pipeline(
                PipelineConfig::new().with_micro_batches(self.micro_batches.map(|m| m as usize)),
            ))
            .with_seed(self.seed)
            .with_output_dir(self.output_dir.clone())
    }
}

/// Why the job stopped: a configuration the trainer refused (exit code 2,
/// like a bad flag) or a failure while training (exit code 1).
fn exit_code(error: &TrainerError) -> i32 {
    match error {
        TrainerError::InvalidConfig { .. }
        | TrainerError::BatchTooSmall { .. }
        | TrainerError::TooManyStages { .. } => 2,
        _ => 1,
    }
}

/// Trains any model's layer stack on the generated task behind `batcher`:
/// plainly (one device, nothing frozen) or through PipeTransformer's
/// trainer. `layers` is the model's block count (two units each, after
/// unit 0).
fn train<S, Bt>(
    stack: LayerStack<S>,
    layers: usize,
    batcher: Bt,
    args: &Args,
) -> Result<(), TrainerError>
where
    S: StackTypes<Backend = Train, Output = Tensor<Train, 2>>,
    Bt: Batcher<Train, usize, (S::Input, Tensor<Train, 1, Int>)>,
    InnerInput<S>: Cacheable<InnerBackendOf<S>>,
    InnerHidden<S>: Cacheable<InnerBackendOf<S>>,
{
    let device = backend::device(0);
    let loss_fn = CrossEntropyLossConfig::new().init(&device);
    let loss = |logits, labels| loss_fn.forward(logits, labels);
    let (epochs, batch_size) = (args.epochs as usize, args.batch_size as usize);
    let samples = args.steps as usize * batch_size;
    let data = indices(samples);
    // Held-out samples: indices past the training set's.
    let held_out: Vec<usize> = (samples..samples + 256).collect();
    let (held_x, held_y) = batcher.batch(held_out, &device);
    let evaluate = |output: Tensor<backend::Inner, 2>| accuracy(output, held_y.clone().inner());
    let params: usize = stack.unit_params().iter().sum();
    println!(
        "training tiny {:?} ({params} parameters, {} units) on {}: {epochs} epochs x {samples} samples, batch {batch_size}",
        args.model,
        stack.num_units(),
        backend::NAME,
    );
    if args.pipetransformer() {
        let devices: Vec<_> = (0..args.devices()).map(backend::device).collect();
        let config = args.trainer_config(layers);
        println!(
            "PipeTransformer on {} devices{}: F = frozen layers, K = pipeline stages, R = replicas, M = micro-batches per replica, balance = units per stage",
            devices.len(),
            args.freeze_alpha
                .map_or(", nothing frozen".to_string(), |a| format!(
                    ", freezing with alpha {a}"
                )),
        );
        let mut trainer = config.init(stack, devices, || AdamConfig::new().init())?;
        for _ in 0..epochs {
            let report = trainer.fit_epoch(&data, &batcher, loss)?;
            let held_out = evaluate(trainer.forward_inner(held_x.clone().inner()));
            let transitions: Vec<String> = report
                .transitions
                .iter()
                .map(|t| {
                    format!(
                        "K {}->{}, R {}->{} in {:.1} ms",
                        t.stages.0, t.stages.1, t.replicas.0, t.replicas.1, t.millis
                    )
                })
                .collect();
            println!(
                "epoch {}: loss {:.4}, held-out accuracy {:.1}%, F={} (front {}/{} units), K={} {:?}, R={}, M={}, {:.0} samples/s, {:.2}s{}",
                report.epoch,
                report.loss,
                100.0 * held_out,
                report.frozen_layers,
                report.front,
                trainer.to_layer_stack().num_units(),
                report.stages,
                report.balance,
                report.replicas,
                report.micro_batches,
                report.samples_per_second,
                report.seconds,
                if transitions.is_empty() {
                    String::new()
                } else {
                    format!("; transition: {}", transitions.join("; "))
                }
            );
        }
        return Ok(());
    }
    let mut stack = FreezableStack::new(stack);
    let mut optim = AdamConfig::new().init::<Train, burn_freeze::TrainableUnits<S>>();
    let bar = ProgressBar::new((epochs * args.steps as usize) as u64).with_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} steps {msg}").expect("valid template"),
    );
    let mut sampler = burn_elastic_dp::ElasticSampler::new(
        data.len(),
        BatchPolicy::FixedGlobal { batch: batch_size },
        args.seed,
    )?;
    for epoch in 0..epochs {
        let start = Instant::now();
        let mut total = 0.0;
        if epoch > 0 {
            sampler.start_epoch();
        }
        while let Some(items) = sampler.next_items(&data, 1) {
            let n = items.len();
            let (input, labels) = batcher.batch(items, &device);
            let loss = loss(stack.forward(input), labels);
            let value = loss.clone().into_scalar().elem::<f32>();
            total += f64::from(value) * n as f64;
            let grads = stack.gradients(loss.backward());
            stack.map_trainable(|units| optim.step(args.lr, units, grads));
            bar.inc(1);
            bar.set_message(format!("loss {value:.4}"));
        }
        let held_out = evaluate(stack.forward_inner(held_x.clone().inner()));
        bar.suspend(|| {
            println!(
                "epoch {epoch}: loss {:.4}, held-out accuracy {:.1}%, {:.2}s",
                total / samples as f64,
                100.0 * held_out,
                start.elapsed().as_secs_f64()
            )
        });
    }
    bar.finish_and_clear();
    Ok(())
}

fn main() {
    examples::init_logging();
    let args = Args::parse();
    if let (Some(stages), Some(devices)) = (args.stages, args.devices)
        && stages > devices
    {
        eprintln!(
            "error: --stages {stages} exceeds --devices {devices}: at most one stage per device"
        );
        std::process::exit(2);
    }
    let device = backend::device(0);
    let layers = args.layers as usize;
    let result = match args.model {
        ModelKind::Vit => {
            let classes = args.classes as usize;
            let task = BandImages::new(classes, 3, 16, args.seed);
            let model = VitConfig::tiny(classes)
                .with_layers(layers)
                .init::<Train>(&device);
            train(model.into_layer_stack(), layers, TaskBatcher(task), &args)
        }
        ModelKind::Bert => {
            let task = MajorityTokens::new(64, 5, 15, args.seed);
            let model = BertConfig::tiny(2)
                .with_layers(layers)
                .init::<Train>(&device);
            train(model.into_layer_stack(), layers, TaskBatcher(task), &args)
        }
    };
    if let Err(error) = result {
        eprintln!("error: {error}");
        std::process::exit(exit_code(&error));
    }
}
