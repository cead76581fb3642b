//! The main job: train a model on the chosen backend and print the loss per epoch.
//!
//! ```text
//! cargo run --release -p examples --bin train            # tiny ViT, generated images
//! cargo run --release -p examples --bin train -- --model bert --epochs 3
//! # a 4-stage pipeline whose frozen prefix grows each epoch (alpha = 1/3)
//! cargo run --release -p examples --bin train -- --stages 4 --freeze-alpha 0.33
//! ```

use std::time::Instant;

use burn::module::AutodiffModule;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::optim::{AdamConfig, GradientsParams, Optimizer};
use burn::prelude::*;
use burn_freeze::IntoLayerStack;
use clap::{Parser, ValueEnum};
use examples::backend::{self, Train};
use examples::elastic::{ElasticRun, train_elastic};
use indicatif::{ProgressBar, ProgressStyle};
use models::bert::{Bert, BertConfig};
use models::synthetic::{BandImages, MajorityTokens};
use models::vit::{Vit, VitConfig};

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
    /// Number of epochs.
    #[arg(long, default_value_t = 5)]
    epochs: usize,
    /// Optimizer steps per epoch.
    #[arg(long, default_value_t = 40)]
    steps: usize,
    /// Samples per step.
    #[arg(long, default_value_t = 32)]
    batch_size: usize,
    /// Adam learning rate.
    #[arg(long, default_value_t = 3e-3)]
    lr: f64,
    /// Seed of the generated data.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Number of classes (ViT only; BERT's task has 2).
    #[arg(long, default_value_t = 4)]
    classes: usize,
    /// Pipeline stages (one device each; on CPU they share the one device).
    /// With more than 1, or with --freeze-alpha, training runs as a pipeline.
    #[arg(long, default_value_t = 1)]
    stages: usize,
    /// Micro-batches per step in a pipeline (default: the paper's choice for K).
    #[arg(long)]
    micro_batches: Option<usize>,
    /// Freeze layers with the alpha schedule, once per epoch, compressing the
    /// pipeline as the active part shrinks.
    #[arg(long)]
    freeze_alpha: Option<f64>,
}

/// A model and its generated task, behind one interface for the loop below.
enum Job {
    Vit(Vit<Train>, BandImages),
    Bert(Bert<Train>, MajorityTokens),
}

impl Job {
    /// Logits and labels of batch `index`, on the autodiff backend.
    fn step(
        &self,
        index: usize,
        batch: usize,
        device: &Device<Train>,
    ) -> (Tensor<Train, 2>, Tensor<Train, 1, Int>) {
        match self {
            Job::Vit(model, task) => {
                let (images, labels) = task.batch(index, batch, device);
                (model.forward(images), labels)
            }
            Job::Bert(model, task) => {
                let (input, labels) = task.batch(index, batch, device);
                (model.forward(input), labels)
            }
        }
    }

    /// Accuracy on a held-out batch, without autodiff.
    fn accuracy(&self, batch: usize, device: &Device<Train>) -> f32 {
        let held_out = usize::MAX / 2;
        let (predicted, labels) = match self {
            Job::Vit(model, task) => {
                let (images, labels) = task.batch::<Train>(held_out, batch, device);
                (model.valid().forward(images.inner()), labels.inner())
            }
            Job::Bert(model, task) => {
                let (input, labels) = task.batch::<backend::Inner>(held_out, batch, device);
                (model.valid().forward(input), labels)
            }
        };
        let correct = predicted
            .argmax(1)
            .flatten::<1>(0, 1)
            .equal(labels)
            .int()
            .sum()
            .into_scalar()
            .elem::<i64>();
        correct as f32 / batch as f32
    }

    fn num_params(&self) -> usize {
        match self {
            Job::Vit(model, _) => model.num_params(),
            Job::Bert(model, _) => model.num_params(),
        }
    }
}

/// Trains through `examples::elastic` (a pipeline, optionally freezing) and
/// prints the held-out accuracy of the result.
fn main_pipelined(args: &Args) -> Result<(), examples::elastic::ElasticError> {
    let device = backend::device(0);
    let loss_fn = CrossEntropyLossConfig::new().init(&device);
    let loss = |logits, labels| loss_fn.forward(logits, labels);
    let run = |layers| ElasticRun {
        stages: args.stages,
        micro_batches: args.micro_batches,
        freeze_alpha: args.freeze_alpha,
        layers,
        epochs: args.epochs,
        steps: args.steps,
        lr: args.lr,
    };
    println!(
        "training tiny {:?} on {} as a pipeline of {} stages{}",
        args.model,
        backend::NAME,
        args.stages,
        args.freeze_alpha
            .map_or(String::new(), |a| format!(", freezing with alpha {a}"))
    );
    let job = match args.model {
        ModelKind::Vit => {
            let config = VitConfig::tiny(args.classes).with_layers(4);
            let task = BandImages::new(args.classes, 3, 16, args.seed);
            let stack = config.init::<Train>(&device).into_layer_stack();
            let held_out = task.batch(usize::MAX / 2, 256, &device);
            let trained = train_elastic(
                stack,
                &run(config.layers),
                |i| task.batch(i, args.batch_size, &device),
                held_out,
                loss,
            )?;
            Job::Vit(
                Vit::from_layer_stack(trained).expect("the pipeline returns every unit"),
                task,
            )
        }
        ModelKind::Bert => {
            let config = BertConfig::tiny(2).with_layers(4);
            let task = MajorityTokens::new(64, 5, 15, args.seed);
            let stack = config.init::<Train>(&device).into_layer_stack();
            let held_out = task.batch(usize::MAX / 2, 256, &device);
            let trained = train_elastic(
                stack,
                &run(config.layers),
                |i| task.batch(i, args.batch_size, &device),
                held_out,
                loss,
            )?;
            Job::Bert(
                Bert::from_layer_stack(trained).expect("the pipeline returns every unit"),
                task,
            )
        }
    };
    println!(
        "held-out accuracy {:.1}%",
        100.0 * job.accuracy(256, &device)
    );
    Ok(())
}

fn main() {
    examples::init_logging();
    let args = Args::parse();
    if args.stages != 1 || args.freeze_alpha.is_some() {
        if let Err(error) = main_pipelined(&args) {
            eprintln!("training failed: {error}");
            std::process::exit(1);
        }
        return;
    }
    let device = backend::device(0);
    let mut job = match args.model {
        ModelKind::Vit => Job::Vit(
            VitConfig::tiny(args.classes).init(&device),
            BandImages::new(args.classes, 3, 16, args.seed),
        ),
        ModelKind::Bert => Job::Bert(
            BertConfig::tiny(2).init(&device),
            MajorityTokens::new(64, 5, 15, args.seed),
        ),
    };
    println!(
        "training tiny {:?} ({} parameters) on {}: {} epochs x {} steps x {} samples",
        args.model,
        job.num_params(),
        backend::NAME,
        args.epochs,
        args.steps,
        args.batch_size
    );
    let loss_fn = CrossEntropyLossConfig::new().init(&device);
    let mut vit_optim = AdamConfig::new().init::<Train, Vit<Train>>();
    let mut bert_optim = AdamConfig::new().init::<Train, Bert<Train>>();
    let bar = ProgressBar::new((args.epochs * args.steps) as u64).with_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} steps {msg}").expect("valid template"),
    );
    for epoch in 0..args.epochs {
        let start = Instant::now();
        let mut total = 0.0;
        for step in 0..args.steps {
            let (logits, labels) = job.step(epoch * args.steps + step, args.batch_size, &device);
            let loss = loss_fn.forward(logits, labels);
            let value = loss.clone().into_scalar().elem::<f32>();
            total += value;
            let grads = loss.backward();
            job = match job {
                Job::Vit(model, task) => {
                    let grads = GradientsParams::from_grads(grads, &model);
                    Job::Vit(vit_optim.step(args.lr, model, grads), task)
                }
                Job::Bert(model, task) => {
                    let grads = GradientsParams::from_grads(grads, &model);
                    Job::Bert(bert_optim.step(args.lr, model, grads), task)
                }
            };
            bar.inc(1);
            bar.set_message(format!("loss {value:.4}"));
        }
        let accuracy = job.accuracy(256, &device);
        bar.suspend(|| {
            println!(
                "epoch {epoch}: mean loss {:.4}, held-out accuracy {:.1}%, {:.2}s",
                total / args.steps as f32,
                100.0 * accuracy,
                start.elapsed().as_secs_f64()
            )
        });
    }
    bar.finish_and_clear();
}
