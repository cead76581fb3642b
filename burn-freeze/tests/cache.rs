//! AutoCache: training with the cache gives the losses of training without
//! it; only newly frozen units run; spilling, budgets, failures and unfreezing.

mod common;

use burn::nn::loss::CrossEntropyLossConfig;
use burn::optim::{AdamConfig, Optimizer};
use burn_freeze::CacheHolder;
use burn_freeze::FreezeFront;
use burn_freeze::{ActivationCache, CacheConfig, FreezableStack, TrainableUnits};
use common::*;

const SAMPLES: u64 = 24;
const BATCH: usize = 6;

/// Epoch `epoch`'s batches: every sample once, in an order that changes per epoch.
fn epoch_batches(epoch: usize) -> Vec<Vec<u64>> {
    let mut ids: Vec<u64> = (0..SAMPLES).collect();
    ids.rotate_left((epoch * 7) % SAMPLES as usize);
    if epoch % 2 == 1 {
        ids.reverse();
    }
    ids.chunks(BATCH).map(<[u64]>::to_vec).collect()
}

/// Trains for `fronts.len()` epochs, freezing `fronts[e]` units in epoch `e`;
/// returns every step's loss.
fn train(stack: &mut FreezableStack<Types>, fronts: &[usize], cached: bool) -> Vec<f32> {
    let loss_fn = CrossEntropyLossConfig::new().init(&Default::default());
    let mut optim = AdamConfig::new().init::<B, TrainableUnits<Types>>();
    let mut losses = Vec::new();
    for (epoch, &front) in fronts.iter().enumerate() {
        stack.freeze_to(front).unwrap();
        for ids in epoch_batches(epoch) {
            let (x, y) = batch(&ids, 4);
            let logits = if cached {
                stack.forward_cached(&ids, x).unwrap()
            } else {
                stack.forward(x)
            };
            let loss = loss_fn.forward(logits, y);
            losses.push(loss.clone().into_scalar());
            let grads = stack.gradients(loss.backward());
            stack.map_trainable(|a| optim.step(5e-3, a, grads));
        }
    }
    losses
}

fn assert_same_losses(a: &[f32], b: &[f32]) {
    assert_eq!(a.len(), b.len());
    for (step, (x, y)) in a.iter().zip(b).enumerate() {
        assert!((x - y).abs() <= 1e-5, "step {step}: cached {x}, plain {y}");
    }
}

const FRONTS: [usize; 5] = [0, 2, 2, 4, 5];

#[test]
fn training_with_the_cache_gives_the_same_losses() {
    let base = stack(5, 0.0, 20);
    let expected = train(&mut FreezableStack::new(base.clone()), &FRONTS, false);

    let mut stack = FreezableStack::new(base);
    stack.attach_cache(ActivationCache::new(CacheConfig::new(1 << 30)).unwrap());
    let losses = train(&mut stack, &FRONTS, true);
    assert_same_losses(&losses, &expected);
    let stats = stack.cache().unwrap().stats();
    // Epoch 1 misses every sample, epoch 2 hits every sample, epoch 3 starts
    // from the front-2 entries, epoch 4 from the front-4 ones.
    assert_eq!(stats.misses, SAMPLES);
    assert_eq!(stats.hits, SAMPLES);
    assert_eq!(stats.partial_hits, 2 * SAMPLES);
    // Old fronts are replaced: one entry per sample.
    assert_eq!(stats.memory_entries, SAMPLES as usize);
}

#[test]
fn only_newly_frozen_units_run_when_the_front_grows() {
    let mut stack = FreezableStack::new(stack(5, 0.0, 21));
    stack.attach_cache(ActivationCache::new(CacheConfig::new(1 << 30)).unwrap());
    let counts = |stack: &FreezableStack<Types>| -> Vec<usize> {
        stack
            .frozen()
            .middle()
            .iter()
            .map(|u| u.inner_samples())
            .collect()
    };
    let ids: Vec<u64> = (0..8).collect();
    let (x, _) = batch(&ids, 4);
    stack.freeze_to(3).unwrap(); // units 0, 1, 2: middle units 0 and 1
    stack.forward_cached(&ids, x.clone()).unwrap();
    assert_eq!(counts(&stack), [8, 8]);
    stack.forward_cached(&ids, x.clone()).unwrap();
    assert_eq!(counts(&stack), [8, 8], "a full hit runs no frozen unit");
    stack.freeze_to(5).unwrap(); // middle units 0..4 frozen
    stack.forward_cached(&ids, x.clone()).unwrap();
    assert_eq!(counts(&stack), [8, 8, 8, 8], "only units 3 and 4 ran");
    // A new sample runs the whole prefix, the others nothing.
    let (x2, _) = batch(&[3, 100], 4);
    stack.forward_cached(&[3, 100], x2).unwrap();
    assert_eq!(counts(&stack), [9, 9, 9, 9]);
}

#[test]
fn spilled_entries_are_real_files_removed_when_done() {
    let base = stack(5, 0.0, 22);
    let expected = train(&mut FreezableStack::new(base.clone()), &FRONTS, false);
    let dir = tempfile::tempdir().unwrap();
    let mut stack = FreezableStack::new(base);
    // Room for 5 samples in memory; the rest spills.
    let per_sample = 4 * HIDDEN * 4;
    stack.attach_cache(
        ActivationCache::new(
            CacheConfig::new(5 * per_sample).with_spill_dir(Some(dir.path().into())),
        )
        .unwrap(),
    );
    let losses = train(&mut stack, &FRONTS, true);
    assert_same_losses(&losses, &expected);
    let cache = stack.detach_cache().unwrap();
    let stats = cache.stats();
    assert_eq!(stats.memory_entries, 5);
    assert_eq!(stats.disk_entries, SAMPLES as usize - 5);
    let spill = cache.spill_dir().unwrap().to_path_buf();
    assert!(spill.starts_with(dir.path()));
    assert_eq!(
        std::fs::read_dir(&spill).unwrap().count(),
        stats.disk_entries
    );
    drop(cache);
    assert!(!spill.exists());
    assert!(dir.path().exists(), "the user's directory itself stays");
}

#[test]
fn exhausted_budgets_and_failed_writes_fall_back_to_recomputing() {
    let base = stack(5, 0.0, 23);
    let expected = train(&mut FreezableStack::new(base.clone()), &FRONTS, false);

    // No memory, a disk budget for 3 entries.
    let dir = tempfile::tempdir().unwrap();
    let mut stack = FreezableStack::new(base.clone());
    stack.attach_cache(
        ActivationCache::new(
            CacheConfig::new(0)
                .with_spill_dir(Some(dir.path().into()))
                .with_disk_budget_bytes(Some(3 * 400)),
        )
        .unwrap(),
    );
    assert_same_losses(&train(&mut stack, &FRONTS, true), &expected);
    let stats = stack.cache().unwrap().stats();
    assert!(
        stats.disk_entries >= 1 && stats.disk_bytes <= 3 * 400,
        "{stats:?}"
    );
    assert!(stats.not_cached > 0, "{stats:?}");

    // The spill directory vanishes mid-run (as on a full or lost disk).
    let dir = tempfile::tempdir().unwrap();
    let mut stack = FreezableStack::new(base);
    stack.attach_cache(
        ActivationCache::new(CacheConfig::new(0).with_spill_dir(Some(dir.path().into()))).unwrap(),
    );
    std::fs::remove_dir_all(stack.cache().unwrap().spill_dir().unwrap()).unwrap();
    assert_same_losses(&train(&mut stack, &FRONTS, true), &expected);
    let stats = stack.cache().unwrap().stats();
    assert!(
        stats.disk_errors > 0 && stats.disk_entries == 0,
        "{stats:?}"
    );
}

#[test]
fn an_explicit_unfreeze_drops_what_it_must() {
    let mut stack = FreezableStack::new(stack(5, 0.0, 24));
    stack.attach_cache(ActivationCache::new(CacheConfig::new(1 << 30)).unwrap());
    let ids: Vec<u64> = (0..6).collect();
    let (x, y) = batch(&ids, 4);
    stack.freeze_to(2).unwrap();
    stack.forward_cached(&ids, x.clone()).unwrap();
    stack.freeze_to(5).unwrap();
    stack.forward_cached(&ids, x.clone()).unwrap();
    assert_eq!(stack.cache().unwrap().len(), 6);

    // Unfreeze to 3 and train units 3 and 4: entries past unit 3 are stale.
    stack.unfreeze_to(3).unwrap();
    assert_eq!(stack.cache().unwrap().len(), 0, "front-5 entries dropped");
    let loss_fn = CrossEntropyLossConfig::new().init(&Default::default());
    let mut optim = AdamConfig::new().init::<B, TrainableUnits<Types>>();
    for _ in 0..3 {
        let loss = loss_fn.forward(stack.forward_cached(&ids, x.clone()).unwrap(), y.clone());
        let grads = stack.gradients(loss.backward());
        stack.map_trainable(|a| optim.step(5e-2, a, grads));
    }
    stack.freeze_to(5).unwrap();
    let cached = stack.forward_cached(&ids, x.clone()).unwrap();
    let plain = stack.forward(x);
    cached
        .inner()
        .into_data()
        .assert_approx_eq::<f32>(&plain.inner().into_data(), Default::default());
}

#[test]
fn a_spill_file_rewritten_into_other_parts_is_recomputed_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let mut stack = FreezableStack::new(stack(5, 0.0, 24));
    // Nothing in memory: every entry spills to a file.
    stack.attach_cache(
        ActivationCache::new(CacheConfig::new(0).with_spill_dir(Some(dir.path().into()))).unwrap(),
    );
    let ids: Vec<u64> = (0..6).collect();
    let (x, _) = batch(&ids, 4);
    stack.freeze_to(3).unwrap();
    let expected = stack.forward_cached(&ids, x.clone()).unwrap();
    let spill = stack.cache().unwrap().spill_dir().unwrap().to_path_buf();
    let files: Vec<_> = std::fs::read_dir(&spill).unwrap().flatten().collect();
    assert_eq!(files.len(), ids.len(), "every sample spilled");
    // Each file rewritten in place into a valid encoding of two parts.
    let two = vec![
        burn::tensor::TensorData::new(vec![0.5f32; 4], [4]),
        burn::tensor::TensorData::new(vec![1.5f32; 2], [2]),
    ];
    let bytes = rmp_serde::to_vec(&two).unwrap();
    for file in &files {
        std::fs::write(file.path(), &bytes).unwrap();
    }
    let served = stack.forward_cached(&ids, x).unwrap();
    let stats = stack.cache().unwrap().stats();
    assert_eq!(stats.disk_errors, ids.len() as u64, "{stats:?}");
    let (a, b) = (expected.into_data(), served.into_data());
    a.assert_approx_eq::<f32>(&b, burn::tensor::Tolerance::absolute(1e-6));
}
