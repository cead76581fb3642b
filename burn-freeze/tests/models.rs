//! The freeze front and AutoCache on the workspace's ViT and BERT tiny presets.

mod common;

use burn::nn::loss::CrossEntropyLossConfig;
use burn::optim::{AdamConfig, Optimizer};
use burn_freeze::{
    ActivationCache, CacheConfig, FreezableStack, IntoLayerStack, LayerMap, StackOf,
};
use common::{B, graph_depth};
use models::bert::{Bert, BertConfig};
use models::synthetic::{BandImages, MajorityTokens};
use models::vit::{Vit, VitConfig};

#[test]
fn vit_frozen_blocks_give_the_same_output_with_a_shallower_graph() {
    let device = Default::default();
    let config = VitConfig::tiny(4);
    let stack = config.init::<B>(&device).into_layer_stack();
    let map = LayerMap::uniform(1, 2, config.layers, stack.len()).unwrap();
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

fn train_vit(
    stack: &mut FreezableStack<
        B,
        <Vit<B> as IntoLayerStack<B>>::First,
        <Vit<B> as IntoLayerStack<B>>::Middle,
        <Vit<B> as IntoLayerStack<B>>::Last,
    >,
    cached: bool,
) -> Vec<f32> {
    let device = Default::default();
    let task = BandImages::new(4, 3, 16, 3);
    let loss_fn = CrossEntropyLossConfig::new().init(&device);
    let mut optim = AdamConfig::new().init();
    let mut losses = Vec::new();
    for (epoch, front) in [0, 3, 5, 5].into_iter().enumerate() {
        stack.freeze_to(front).unwrap();
        for b in 0..3 {
            let index = (b + epoch) % 3;
            let (images, labels) = task.batch::<B>(index, 8, &device);
            let ids: Vec<u64> = (0..8).map(|i| (index * 8 + i) as u64).collect();
            let logits = if cached {
                stack.forward_cached(&ids, images).unwrap()
            } else {
                stack.forward(images)
            };
            let loss = loss_fn.forward(logits, labels);
            losses.push(loss.clone().into_scalar());
            let grads = stack.gradients(loss.backward());
            stack.map_active(|a| optim.step(1e-3, a, grads));
        }
    }
    losses
}

#[test]
fn vit_training_with_the_cache_gives_the_same_losses() {
    let device = Default::default();
    let stack: StackOf<B, Vit<B>> = VitConfig::tiny(4).init::<B>(&device).into_layer_stack();
    // Burn initialises parameters on first use: do it before cloning, so both
    // runs share the weights.
    let _ = stack.forward(BandImages::new(4, 3, 16, 3).batch::<B>(0, 1, &device).0);
    let expected = train_vit(&mut FreezableStack::new(stack.clone()), false);
    let dir = tempfile::tempdir().unwrap();
    let mut cached = FreezableStack::new(stack);
    // Memory for half the samples; the rest spills to disk.
    let per_sample = 17 * 32 * 4;
    cached.attach_cache(
        ActivationCache::new(
            CacheConfig::new(12 * per_sample).with_spill_dir(Some(dir.path().into())),
        )
        .unwrap(),
    );
    let losses = train_vit(&mut cached, true);
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
    let stack: StackOf<B, Bert<B>> = BertConfig::tiny(2).init::<B>(&device).into_layer_stack();
    let _ = stack.forward(task.batch::<B>(0, 1, &device).0);
    let run = |stack: &mut FreezableStack<_, _, _, _>, cached: bool| {
        let loss_fn = CrossEntropyLossConfig::new().init(&device);
        let mut optim = AdamConfig::new().init();
        let mut losses = Vec::new();
        for (epoch, front) in [0, 1, 3, 3].into_iter().enumerate() {
            stack.freeze_to(front).unwrap();
            for b in 0..3 {
                let index = (b + epoch) % 3;
                let (input, labels) = task.batch::<B>(index, 8, &device);
                let ids: Vec<u64> = (0..8).map(|i| (index * 8 + i) as u64).collect();
                let logits = if cached {
                    stack.forward_cached(&ids, input).unwrap()
                } else {
                    stack.forward(input)
                };
                let loss = loss_fn.forward(logits, labels);
                losses.push(loss.clone().into_scalar());
                let grads = stack.gradients(loss.backward());
                stack.map_active(|a| optim.step(1e-3, a, grads));
            }
        }
        losses
    };
    let expected = run(&mut FreezableStack::new(stack.clone()), false);
    let dir = tempfile::tempdir().unwrap();
    let mut cached = FreezableStack::new(stack);
    // Room in memory for a few samples only: the rest, padding masks
    // included, goes through files on disk.
    cached.attach_cache(
        ActivationCache::new(
            CacheConfig::new(6 * 17 * 32 * 4).with_spill_dir(Some(dir.path().into())),
        )
        .unwrap(),
    );
    let losses = run(&mut cached, true);
    for (step, (a, b)) in losses.iter().zip(&expected).enumerate() {
        assert!((a - b).abs() <= 1e-5, "step {step}: cached {a}, plain {b}");
    }
    let stats = cached.cache().unwrap().stats();
    assert!(
        stats.hits > 0 && stats.partial_hits > 0 && stats.disk_entries > 0,
        "{stats:?}"
    );
}
