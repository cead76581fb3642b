//! What the thaw tests share (one process and under mpirun): a schedule of
//! fronts that goes up and then down, its run's configuration, a batcher
//! that records each batch's samples, and plain Burn with the same fronts
//! applied by hand.

use std::sync::{Arc, Mutex};

use burn::data::dataloader::batcher::Batcher;
use burn::data::dataset::{Dataset, InMemDataset};
use burn::optim::AdamConfig;
use burn::prelude::*;
use burn_elastic_dp::{BatchPolicy, CostModel, FreezeRule, ReplicaConfig, TrainerConfig};
use burn_freeze::testing::PlainFronts;
use burn_pipe::PipelineConfig;

use super::{B, block_stack, flat_weights, four_class_rows, loss, rows_batch};

pub const WIDTH: usize = 8;
pub const UNITS: usize = 6;
pub const SAMPLES: usize = 64;
pub const LR: f64 = 1e-2;
/// Per-unit layers frozen in epochs 0..5: up, down past where it was, up.
pub const FRONTS: [usize; 5] = [0, 2, 3, 1, 2];

/// A sample: its index, features and label.
pub type Item = (usize, [f32; WIDTH], i64);

pub fn dataset() -> InMemDataset<Item> {
    let rows: Vec<_> = four_class_rows::<WIDTH>(SAMPLES).iter().collect();
    InMemDataset::new(
        rows.into_iter()
            .enumerate()
            .map(|(i, (x, y))| (i, x, y))
            .collect(),
    )
}

/// Makes batches, recording which samples each held; panics (a crash
/// between two steps) on its `crash_at`-th call (1-based; 0: never).
#[derive(Clone, Default)]
pub struct Recording {
    pub batches: Arc<Mutex<Vec<Vec<usize>>>>,
    pub crash_at: usize,
}

pub fn make_batch(items: &[Item], device: &Device<B>) -> (Tensor<B, 2>, Tensor<B, 1, Int>) {
    rows_batch(items, device)
}

impl Batcher<B, Item, (Tensor<B, 2>, Tensor<B, 1, Int>)> for Recording {
    fn batch(&self, items: Vec<Item>, device: &Device<B>) -> (Tensor<B, 2>, Tensor<B, 1, Int>) {
        let calls = {
            let mut batches = self.batches.lock().unwrap();
            batches.push(items.iter().map(|(i, _, _)| *i).collect());
            batches.len()
        };
        assert!(
            calls != self.crash_at,
            "simulated crash before step {calls}"
        );
        make_batch(&items, device)
    }
}

/// Every part on (the cache included), the paper's start of 4 stages on 4
/// devices, parameter-count costs, 2 micro-batches, a global batch of 16:
/// K, R go 4, 1 -> 2, 2 -> 2, 2 -> 4, 1 (the thaw) -> 2, 2. At most two
/// replicas, so the replicas' sums are bit for bit the same in every run.
pub fn config() -> TrainerConfig {
    TrainerConfig::new()
        .with_stages(Some(4))
        .with_freeze(FreezeRule::Fronts {
            layers: FRONTS.to_vec(),
        })
        .with_batch(BatchPolicy::FixedGlobal { batch: 16 })
        .with_lr(LR)
        .with_costs(CostModel::Parameters {
            frozen_factor: 1.0 / 3.0,
        })
        .with_replicas(
            ReplicaConfig::new().with_pipeline(PipelineConfig::new().with_micro_batches(Some(2))),
        )
        .with_seed(5)
}

pub fn tempdir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "burn-elastic-dp-thaw-{name}-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// Largest |a - b| over every weight.
pub fn worst(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Plain Burn on one device over `batches` (per epoch), each epoch with
/// its unit front of [`FRONTS`] applied by hand; the final weights and each
/// epoch's mean loss.
pub fn plain(batches: &[Vec<Vec<usize>>]) -> (Vec<f32>, Vec<f64>) {
    let device: Device<B> = Default::default();
    let items: Vec<Item> = dataset().iter().collect();
    let mut plain = PlainFronts::new(block_stack(UNITS, WIDTH), AdamConfig::new().init());
    let mut losses = Vec::new();
    for (epoch, batches) in batches.iter().enumerate() {
        plain.set_front(FRONTS[epoch]);
        let (mut total, mut samples) = (0.0, 0);
        for indices in batches {
            let chosen: Vec<Item> = indices.iter().map(|&i| items[i]).collect();
            let (x, y) = make_batch(&chosen, &device);
            let loss = plain.step(LR, x, |logits| loss(logits, y));
            total += f64::from(loss) * indices.len() as f64;
            samples += indices.len();
        }
        losses.push(total / samples as f64);
    }
    (flat_weights(&plain.to_layer_stack()), losses)
}
