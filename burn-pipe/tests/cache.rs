//! AutoCache in a pipeline: stage 0's frozen units served from the cache
//! give the losses and weights of the uncached pipeline, step for step, as
//! the front moves.

mod common;

use burn::nn::loss::CrossEntropyLossConfig;
use burn::optim::SgdConfig;
use burn::optim::momentum::MomentumConfig;
use burn_freeze::CacheHolder;
use burn_freeze::FreezeFront;
use burn_freeze::{
    ActivationCache, CacheConfig, CacheError, IntoLayerStack, ParamStates, TrainableUnits,
};
use burn_pipe::StepOptions;
use burn_pipe::{PipeError, Pipeline, PipelineConfig};
use common::{B, Weights};
use pipetransformer_models::synthetic::BandImages;
use pipetransformer_models::vit::{Vit, VitConfig, VitTypes};

/// The 11 units of a 4-layer tiny ViT on 2 stages of 5 and 6 units, 2
/// micro-batches, SGD with momentum.
fn two_stages(
    vit: Vit<B>,
) -> Pipeline<
    VitTypes<B>,
    impl burn::optim::Optimizer<TrainableUnits<VitTypes<B>>, B, Record: ParamStates>,
> {
    let sgd = || {
        SgdConfig::new()
            .with_momentum(Some(MomentumConfig::new()))
            .init()
    };
    PipelineConfig::new()
        .with_micro_batches(Some(2))
        .with_balance(Some(vec![5, 6]))
        .init(vit.into_layer_stack(), vec![Default::default(); 2], sgd)
        .unwrap()
}

/// Trains a 2-stage pipeline of a tiny ViT over 3 batches of 8 per epoch,
/// moving the front to `fronts[epoch]` first, through the cache when
/// `cached`; the loss of every step and the trained model.
fn train(
    vit: Vit<B>,
    fronts: &[usize],
    cached: bool,
) -> (Vec<f32>, Vit<B>, Option<burn_freeze::CacheStats>) {
    let device = Default::default();
    let task = BandImages::new(4, 3, 16, 31);
    let loss_fn = CrossEntropyLossConfig::new().init(&device);
    let mut pipeline = two_stages(vit);
    if cached {
        pipeline.attach_cache(ActivationCache::new(CacheConfig::new(64 << 20)).unwrap());
    }
    let mut losses = Vec::new();
    for (epoch, &front) in fronts.iter().enumerate() {
        pipeline.freeze_to(front).unwrap();
        for b in 0..3 {
            let index = (b + epoch) % 3;
            let (images, labels) = task.batch::<B>(index, 8, &device);
            let ids: Vec<u64> = (0..8).map(|i| (index * 8 + i) as u64).collect();
            let loss = |l, t| loss_fn.forward(l, t);
            let report = if cached {
                let start = pipeline.serve_prefix(&ids, images).unwrap();
                (pipeline.forward_backward(start, labels, loss, StepOptions::new())).unwrap()
            } else {
                pipeline
                    .forward_backward(images, labels, loss, StepOptions::new())
                    .unwrap()
            };
            pipeline.step(0.05).unwrap();
            losses.push(report.loss);
        }
    }
    let stats = pipeline.cache().map(|c| c.stats());
    (
        losses,
        Vit::from_layer_stack(pipeline.into_layer_stack()).unwrap(),
        stats,
    )
}

#[test]
fn a_cached_pipeline_trains_as_the_uncached_one() {
    let device = Default::default();
    let vit = VitConfig::tiny(4).with_layers(4).init::<B>(&device);
    // Read the weights before cloning: Burn initialises them lazily.
    let _ = vit.forward(BandImages::new(4, 3, 16, 31).batch::<B>(0, 1, &device).0);
    // Fronts 0, 3 and 5: within stage 0 (units 0..5), then all of it.
    let fronts = [0, 3, 3, 5, 5];
    let (expected, plain, _) = train(vit.clone(), &fronts, false);
    let (losses, cached, stats) = train(vit, &fronts, true);
    for (step, (a, b)) in losses.iter().zip(&expected).enumerate() {
        assert!(
            (a - b).abs() <= 1e-5 * b.abs().max(1.0),
            "step {step}: cached {a}, plain {b}"
        );
    }
    let diff = Weights::of(&cached.head).relative_diff(&Weights::of(&plain.head));
    assert!(diff <= 1e-5, "heads differ by {diff}");
    let stats = stats.unwrap();
    // Epoch 2 meets every sample again at front 3 (hits); epoch 3 at front 5
    // starts from the front-3 entries (partial hits).
    assert!(
        stats.hits > 0 && stats.partial_hits > 0 && stats.misses > 0,
        "{stats:?}"
    );
}

#[test]
fn bad_sample_ids_change_nothing() {
    let device = Default::default();
    let mut pipeline = two_stages(VitConfig::tiny(4).with_layers(4).init::<B>(&device));
    pipeline.attach_cache(ActivationCache::new(CacheConfig::new(1 << 20)).unwrap());
    pipeline.freeze_to(3).unwrap();
    let (images, _) = BandImages::new(4, 3, 16, 32).batch::<B>(0, 4, &device);
    let error = pipeline
        .serve_prefix(&[1, 2, 2, 3], images.clone())
        .map(|_| ())
        .unwrap_err();
    assert!(matches!(error, CacheError::DuplicateId(2)), "{error}");
    let error = pipeline
        .serve_prefix(&[1, 2], images)
        .map(|_| ())
        .unwrap_err();
    assert!(
        matches!(error, CacheError::IdCount { batch: 4, ids: 2 }),
        "{error}"
    );
    assert!(pipeline.gradients(0).is_none() && pipeline.gradients(1).is_none());
    assert_eq!(pipeline.cache().unwrap().len(), 0);
}

#[test]
fn a_batch_enters_only_after_frozen_units_of_stage_zero() {
    use burn_freeze::plumbing::{BatchStart, Flow};
    let device = Default::default();
    let vit = VitConfig::tiny(4).with_layers(4).init::<B>(&device);
    let mut pipeline = two_stages(vit);
    pipeline.freeze_to(3).unwrap();
    let (images, labels) = BandImages::new(4, 3, 16, 33).batch::<B>(0, 4, &device);
    let loss_fn = CrossEntropyLossConfig::new().init(&device);
    // The output of units 0..3, computed outside the pipeline's pass.
    let input = Flow::Input(images.clone().inner());
    let Flow::Hidden(hidden) = pipeline.stage(0).frozen().forward_units(input, 0, 3) else {
        unreachable!("units 0..3 end in a hidden state")
    };
    for entry in [0, 4, 11] {
        let start = BatchStart::Hidden {
            entry,
            hidden: hidden.clone(),
        };
        let error = pipeline
            .forward_backward(
                start,
                labels.clone(),
                |l, t| loss_fn.forward(l, t),
                StepOptions::new(),
            )
            .unwrap_err();
        assert!(matches!(error, PipeError::BadEntry { .. }), "{error}");
    }
    assert!(pipeline.gradients(0).is_none() && pipeline.gradients(1).is_none());
    // Entering at 3 gives the loss of the whole batch from the input.
    let start = BatchStart::Hidden { entry: 3, hidden };
    let from = pipeline
        .forward_backward(
            start,
            labels.clone(),
            |l, t| loss_fn.forward(l, t),
            StepOptions::new(),
        )
        .unwrap();
    pipeline.clear_gradients();
    let whole = pipeline
        .forward_backward(
            images,
            labels,
            |l, t| loss_fn.forward(l, t),
            StepOptions::new(),
        )
        .unwrap();
    assert!(
        (from.loss - whole.loss).abs() <= 1e-6,
        "{} against {}",
        from.loss,
        whole.loss
    );
}
