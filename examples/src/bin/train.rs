//! The main job: train a model on the chosen backend and print the loss and
//! held-out accuracy per epoch, plainly or as a pipeline whose frozen prefix
//! grows.
//!
//! ```text
//! cargo run --release -p examples --bin train            # tiny ViT, generated images
//! cargo run --release -p examples --bin train -- --model bert --epochs 3
//! # a 4-stage pipeline whose frozen prefix grows each epoch (alpha = 1/3)
//! cargo run --release -p examples --bin train -- --stages 4 --freeze-alpha 0.33
//! ```

use std::time::Instant;

use burn::nn::loss::CrossEntropyLossConfig;
use burn::optim::{AdamConfig, Optimizer};
use burn::prelude::*;
use burn_freeze::{
    AutoFreeze, AutodiffActivation, FixedSchedule, FreezableStack, IntoLayerStack, LayerMap,
    LayerStack, StackTypes,
};
use clap::{Parser, ValueEnum};
use examples::backend::{self, Train};
use examples::elastic::{ElasticError, ElasticRun, accuracy, train_elastic};
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

#[derive(Debug, Parser)]
#[command(about = "Train a tiny transformer on generated data and print the loss per epoch")]
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
    /// Optimizer steps per epoch.
    #[arg(long, default_value_t = 40, value_parser = clap::value_parser!(u32).range(1..))]
    steps: u32,
    /// Samples per step.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..=4096))]
    batch_size: u32,
    /// Adam learning rate, in (0, 1].
    #[arg(long, default_value_t = 3e-3, value_parser = learning_rate)]
    lr: f64,
    /// Seed of the generated data.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Number of classes (ViT only; BERT's task has 2).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(2..=1000))]
    classes: u32,
    /// Pipeline stages (one device each; on CPU they share the one device).
    /// With more than 1, or with --freeze-alpha, training runs as a pipeline.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    stages: u32,
    /// Micro-batches per step in a pipeline (default: the paper's choice for K).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=4096))]
    micro_batches: Option<u32>,
    /// Freeze layers with the alpha schedule, once per epoch, compressing the
    /// pipeline as the active part shrinks; alpha in (0, 1).
    #[arg(long, value_parser = alpha)]
    freeze_alpha: Option<f64>,
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

/// Trains any model's layer stack: plainly (one device, nothing frozen) or
/// through the freeze-and-compress pipeline loop. `batch(index, size)` gives
/// a batch of the task; `layers` is the model's block count (two units each,
/// after unit 0).
fn train<S>(
    stack: LayerStack<S>,
    layers: usize,
    batch: impl Fn(usize, usize) -> (S::Input, Tensor<Train, 1, Int>),
    args: &Args,
) -> Result<(), ElasticError>
where
    S: StackTypes<Backend = Train, Output = Tensor<Train, 2>>,
{
    let device = backend::device(0);
    let loss_fn = CrossEntropyLossConfig::new().init(&device);
    let loss = |logits, labels| loss_fn.forward(logits, labels);
    let (epochs, steps, batch_size) = (
        args.epochs as usize,
        args.steps as usize,
        args.batch_size as usize,
    );
    let held_out = batch(usize::MAX / 2, 256);
    let params: usize = stack.unit_params().iter().sum();
    println!(
        "training tiny {:?} ({params} parameters, {} units) on {}: {epochs} epochs x {steps} steps x {batch_size} samples{}",
        args.model,
        stack.num_units(),
        backend::NAME,
        if args.stages > 1 || args.freeze_alpha.is_some() {
            format!(
                ", as a pipeline of {} stages{}",
                args.stages,
                args.freeze_alpha
                    .map_or(String::new(), |a| format!(", freezing with alpha {a}"))
            )
        } else {
            String::new()
        }
    );
    if args.stages > 1 || args.freeze_alpha.is_some() {
        let map = LayerMap::uniform(1, 2, layers, stack.num_units())?;
        // Without --freeze-alpha nothing freezes: a schedule of 0 layers.
        let policy = match args.freeze_alpha {
            Some(alpha) => FixedSchedule::alpha(layers, alpha),
            None => FixedSchedule::Fronts(vec![0]),
        };
        let run = ElasticRun {
            stages: args.stages as usize,
            micro_batches: args.micro_batches.map(|m| m as usize),
            epochs,
            steps,
            lr: args.lr,
        };
        let trained = train_elastic(
            stack,
            &run,
            AutoFreeze::new(policy, map),
            |step| batch(step, batch_size),
            held_out.clone(),
            loss,
        )?;
        let (input, labels) = held_out;
        let evaluated = FreezableStack::new(trained).forward_inner(input.inner());
        println!(
            "held-out accuracy {:.1}%",
            100.0 * accuracy(evaluated, labels.inner())
        );
        return Ok(());
    }
    let mut stack = FreezableStack::new(stack);
    let mut optim = AdamConfig::new().init::<Train, burn_freeze::TrainableUnits<S>>();
    let bar = ProgressBar::new((epochs * steps) as u64).with_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} steps {msg}").expect("valid template"),
    );
    for epoch in 0..epochs {
        let start = Instant::now();
        let mut total = 0.0;
        for step in 0..steps {
            let (input, labels) = batch(epoch * steps + step, batch_size);
            let loss = loss(stack.forward(input), labels);
            let value = loss.clone().into_scalar().elem::<f32>();
            total += value;
            let grads = stack.gradients(loss.backward());
            stack.map_trainable(|units| optim.step(args.lr, units, grads));
            bar.inc(1);
            bar.set_message(format!("loss {value:.4}"));
        }
        let (input, labels) = held_out.clone();
        let held_out_accuracy = accuracy(stack.forward_inner(input.inner()), labels.inner());
        bar.suspend(|| {
            println!(
                "epoch {epoch}: mean loss {:.4}, held-out accuracy {:.1}%, {:.2}s",
                total / steps as f32,
                100.0 * held_out_accuracy,
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
    let device = backend::device(0);
    let layers = args.layers as usize;
    let result = match args.model {
        ModelKind::Vit => {
            let classes = args.classes as usize;
            let task = BandImages::new(classes, 3, 16, args.seed);
            let model = VitConfig::tiny(classes)
                .with_layers(layers)
                .init::<Train>(&device);
            train(
                model.into_layer_stack(),
                layers,
                |i, n| task.batch(i, n, &device),
                &args,
            )
        }
        ModelKind::Bert => {
            let task = MajorityTokens::new(64, 5, 15, args.seed);
            let model = BertConfig::tiny(2)
                .with_layers(layers)
                .init::<Train>(&device);
            train(
                model.into_layer_stack(),
                layers,
                |i, n| task.batch(i, n, &device),
                &args,
            )
        }
    };
    if let Err(error) = result {
        eprintln!("training failed: {error}");
        std::process::exit(1);
    }
}
