//! The freeze front and AutoCache on the workspace's ViT and BERT tiny presets.

mod common;

use burn::nn::loss::CrossEntropyLossConfig;
use burn::optim::{AdamConfig, Optimizer};
use burn::prelude::*;
use burn_freeze::CacheHolder;
use burn_freeze::FreezeFront;
use burn_freeze::{
    ActivationCache, CacheConfig, Cacheable, FreezableStack, InnerHidden, InnerInput,
    IntoLayerStack, LayerMap, StackOf, StackTypes,
};
use common::{B, Inner, graph_depth};
use pipetransformer_models::bert::{Bert, BertConfig};
use pipetransformer_models::synthetic::{BandImages, MajorityTokens};
use pipetransformer_models::vit::{Vit, VitConfig};

#[test]
fn vit_frozen_blocks_give_the_same_output_with_a_shallower_graph() {
    let device = Default::default();
    let config = VitConfig::tiny(4);
    let stack = config.init::<B>(&device).into_layer_stack();
    let map = LayerMap::uniform(1, 2, config.layers, stack.num_units()).unwrap();
    let (images, _) = BandImages::new(4, 3, 16, 1).batch::<B>(0, 4, &device);
    let full = stack.forward(images.clone());
    let full_depth = graph_depth(full.clone());
    let mut frozen = FreezableStack::new(stack);
    frozen.freeze_to(map.unit_front(config.layers)).unwrap(); // embedding + all blocks
    let out = frozen.forward(images);
    out.clone()
        .inner()
        .into_data()
        .assert_approx_eq::<f32>(&full.inner().into_data(), Default::default());
    let depth = graph_depth(out);
    assert!(
        depth < full_depth / 4,
        "frozen depth {depth}, unfrozen {full_depth}"
    );
}

#[test]
fn bert_frozen_blocks_give_the_same_output() {
    let device = Default::default();
    let config = BertConfig::tiny(2);
    let stack = config.init::<B>(&device).into_layer_stack();
    let (input, _) = MajorityTokens::new(64, 5, 15, 2).batch::<B>(0, 4, &device);
    let full = stack.forward(input.clone());
    let mut frozen = FreezableStack::new(stack);
    frozen.freeze_to(3).unwrap();
    let out = frozen.forward(input);
    out.clone()
        .inner()
        .into_data()
        .assert_approx_eq::<f32>(&full.clone().inner().into_data(), Default::default());
    assert!(graph_depth(out) < graph_depth(full));
}

/// Trains `stack` with Adam over 3 batches of 8 samples per epoch, moving
/// the front to `fronts[epoch]` before each epoch, through the cache when
/// `cached`; the loss of every step.
fn train_with_fronts<S>(
    stack: &mut FreezableStack<S>,
    fronts: &[usize],
    batch: impl Fn(usize) -> (S::Input, Tensor<B, 1, Int>),
    cached: bool,
) -> Vec<f32>
where
    S: StackTypes<Backend = B, Output = Tensor<B, 2>>,
    InnerInput<S>: Cacheable<Inner>,
    InnerHidden<S>: Cacheable<Inner>,
{
    let device = Default::default();
    let loss_fn = CrossEntropyLossConfig::new().init(&device);
    let mut optim = AdamConfig::new().init();
    let mut losses = Vec::new();
    for (epoch, &front) in fronts.iter().enumerate() {
        stack.freeze_to(front).unwrap();
        for b in 0..3 {
            let index = (b + epoch) % 3;
            let (input, labels) = batch(index);
            let ids: Vec<u64> = (0..8).map(|i| (index * 8 + i) as u64).collect();
            let logits = if cached {
                stack.forward_cached(&ids, input).unwrap()
            } else {
                stack.forward(input)
            };
            let loss = loss_fn.forward(logits, labels);
            losses.push(loss.clone().into_scalar());
            let grads = stack.gradients(loss.backward());
            stack.map_trainable(|a| optim.step(1e-3, a, grads));
        }
    }
    losses
}

#[test]
fn vit_training_with_the_cache_gives_the_same_losses() {
    let device = Default::default();
    let stack: StackOf<Vit<B>> = VitConfig::tiny(4).init::<B>(&device).into_layer_stack();
    // Burn initialises parameters on first use: do it before cloning, so both
    // runs share the weights.
    let _ = stack.forward(BandImages::new(4, 3, 16, 3).batch::<B>(0, 1, &device).0);
    let task = BandImages::new(4, 3, 16, 3);
    let batch = |index| task.batch::<B>(index, 8, &device);
    let fronts = [0, 3, 5, 5];
    // Each run starts from fresh parameter leaves (same weights and ids):
    // Burn 0.21's autodiff can drop a gradient of a leaf that an earlier
    // backward pass consumed while another thread runs a backward pass
    // (tracel-ai/burn#5573), and the test harness runs tests on threads.
    let expected = train_with_fronts(
        &mut FreezableStack::new(stack.clone().fork(&device)),
        &fronts,
        batch,
        false,
    );
    let dir = tempfile::tempdir().unwrap();
    let mut cached = FreezableStack::new(stack.fork(&device));
    // Memory for half the samples; the rest spills to disk.
    let per_sample = 17 * 32 * 4;
    cached.attach_cache(
        ActivationCache::new(
            CacheConfig::new(12 * per_sample).with_spill_dir(Some(dir.path().into())),
        )
        .unwrap(),
    );
    let losses = train_with_fronts(&mut cached, &fronts, batch, true);
    for (step, (a, b)) in losses.iter().zip(&expected).enumerate() {
        assert!((a - b).abs() <= 1e-5, "step {step}: cached {a}, plain {b}");
    }
    let stats = cached.cache().unwrap().stats();
    assert!(
        stats.hits > 0 && stats.partial_hits > 0 && stats.disk_entries > 0,
        "{stats:?}"
    );
}

#[test]
fn bert_training_with_the_cache_gives_the_same_losses() {
    let device = Default::default();
    let task = MajorityTokens::new(64, 5, 15, 4);
    let stack: StackOf<Bert<B>> = BertConfig::tiny(2).init::<B>(&device).into_layer_stack();
    let _ = stack.forward(task.batch::<B>(0, 1, &device).0);
    let batch = |index| task.batch::<B>(index, 8, &device);
    let fronts = [0, 1, 3, 3];
    // Each run starts from fresh parameter leaves (same weights and ids):
    // Burn 0.21's autodiff can drop a gradient of a leaf that an earlier
    // backward pass consumed while another thread runs a backward pass
    // (tracel-ai/burn#5573), and the test harness runs tests on threads.
    let expected = train_with_fronts(
        &mut FreezableStack::new(stack.clone().fork(&device)),
        &fronts,
        batch,
        false,
    );
    let dir = tempfile::tempdir().unwrap();
    let mut cached = FreezableStack::new(stack.fork(&device));
    // Room in memory for a few samples only: the rest, padding masks
    // included, goes through files on disk.
    cached.attach_cache(
        ActivationCache::new(
            CacheConfig::new(6 * 17 * 32 * 4).with_spill_dir(Some(dir.path().into())),
        )
        .unwrap(),
    );
    let losses = train_with_fronts(&mut cached, &fronts, batch, true);
    for (step, (a, b)) in losses.iter().zip(&expected).enumerate() {
        assert!((a - b).abs() <= 1e-5, "step {step}: cached {a}, plain {b}");
    }
    let stats = cached.cache().unwrap().stats();
    assert!(
        stats.hits > 0 && stats.partial_hits > 0 && stats.disk_entries > 0,
        "{stats:?}"
    );
}
