//! PipeTransformer in one file: a tiny ViT trained on generated images over 4
//! logical devices (one CPU) while AutoFreeze freezes its converged bottom
//! blocks, AutoPipe packs the rest into fewer stages and AutoDP runs more
//! replicas on the devices freed. Prints F (frozen blocks), K (stages) and R
//! (replicas) per epoch, then the same run without freezing beside it; fails
//! if nothing froze. `cargo run -p examples --example quickstart`. Copied alone, it needs `burn` (features `autodiff`,
//! `flex`), `burn-freeze`, `burn-elastic-dp` and `pipetransformer-models`.

use burn::backend::{Autodiff, Flex};
use burn::data::dataset::InMemDataset;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::optim::AdamConfig;
use burn::prelude::*;
use burn_elastic_dp::{BatchPolicy, CostModel, FreezeRule, LayerSpec, Parts, TrainerConfig};
use burn_freeze::{EvidenceConfig, IntoLayerStack};
use models::synthetic::BandImages; // `models` is pipetransformer_models
use models::vit::{Vit, VitConfig};
use std::process::ExitCode;

/// The CPU backend, with autodiff.
type B = Autodiff<Flex>;
const SEED: u64 = 42;
const DEVICES: usize = 4;
const BLOCKS: usize = 4;

fn main() -> ExitCode {
    let Err(error) = train() else {
        return ExitCode::SUCCESS;
    };
    eprintln!("error: {error}");
    ExitCode::FAILURE
}

/// Trains with PipeTransformer, then without freezing, and compares.
fn train() -> Result<(), Box<dyn std::error::Error>> {
    let (seconds, accuracy) = run(Parts::new(), true)?;
    let (plain_seconds, plain_accuracy) = run(Parts::new().with_freeze(false), false)?;
    println!(
        "PipeTransformer {seconds:.2} s, {accuracy:.1}%; the same pipeline without freezing \
         {plain_seconds:.2} s, {plain_accuracy:.1}%: {:.2}x the speed",
        plain_seconds / seconds
    );
    Ok(())
}

/// Trains 10 epochs with `parts` (printing each epoch's shape where `print`),
/// then tests the model: the training seconds and the accuracy.
fn run(parts: Parts, print: bool) -> Result<(f64, f64), Box<dyn std::error::Error>> {
    let device = Default::default();
    B::seed(&device, SEED);
    let task = BandImages::new(4, 3, 16, SEED); // the class: which band is bright
    let images = InMemDataset::new((0..512).collect::<Vec<usize>>());
    // Units: embedding, (attention, MLP) per block, norm, head; F counts blocks.
    let vit = VitConfig::tiny(4).with_layers(BLOCKS).init::<B>(&device);
    let blocks = LayerSpec::Uniform {
        offset: 1,
        per_layer: 2,
        layers: BLOCKS,
    };
    // The default rule: a bottom block whose share of the loss's decrease is small freezes.
    let evidence = EvidenceConfig::new();
    let cross_entropy = CrossEntropyLossConfig::new().init(&device);
    let mut trainer = TrainerConfig::new()
        .with_freeze(FreezeRule::Evidence { rule: evidence })
        .with_parts(parts)
        .with_layers(blocks)
        .with_stages(Some(DEVICES)) // the paper's start: one 4-stage pipeline
        .with_batch(BatchPolicy::FixedGlobal { batch: 32 })
        .with_costs(CostModel::Parameters { frozen_factor: 0.3 }) // not timed: deterministic
        .with_lr(3e-3)
        .with_seed(SEED)
        .init(
            vit.into_layer_stack(),
            vec![device; DEVICES], // the one CPU, given 4 times
            || AdamConfig::new().init(),
            move |logits, labels| cross_entropy.forward(logits, labels),
        )?;
    if print {
        println!("epoch  loss  F/{BLOCKS}  K  R");
    }
    let mut seconds = 0.0;
    for _ in 0..10 {
        let e = trainer.fit_epoch(&images, &task)?;
        let (epoch, loss, f, k, r) = (e.epoch, e.loss, e.frozen_layers, e.stages, e.replicas);
        seconds += e.seconds;
        if print {
            println!("{epoch:>5} {loss:.3} {f:>4} {k:>2} {r:>2}");
        }
    }
    if parts.freeze && trainer.front() == 0 {
        return Err("AutoFreeze froze nothing in this run".into());
    }
    let vit = Vit::from_layer_stack(trainer.into_layer_stack()?)?;
    let (test, labels) = task.samples::<B>(&(10_000..10_256).collect::<Vec<_>>(), &device);
    let predicted = vit.forward(test).argmax(1).flatten::<1>(0, 1);
    let correct: f64 = predicted.equal(labels).int().sum().into_scalar().elem();
    Ok((seconds, correct / 2.56))
}
