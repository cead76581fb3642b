//! A pipeline's front moves down (thaw): frozen up, trained, thawed below
//! where it was, trained and frozen again, through the AutoCache, the
//! pipeline trains as plain Burn with the same fronts applied by hand
//! (fresh optimizer state for thawed units); an unfreeze above the front or
//! with gradients pending is refused and changes nothing.

mod common;

use burn::nn::loss::CrossEntropyLossConfig;
use burn::optim::AdamConfig;
use burn_freeze::CacheHolder;
use burn_freeze::testing::{PlainFronts, weights};
use burn_freeze::{
    ActivationCache, CacheConfig, FreezeError, FreezeFront, LayerStack, ParamStates, TrainableUnits,
};
use burn_pipe::StepOptions;
use burn_pipe::{PipeError, Pipeline, PipelineConfig};
use common::{B, UserTypes, user_batch, user_stack};

const LR: f64 = 1e-2;
const BATCH: usize = 8;

/// The 6 units of the user stack on 3 stages of 3, 2 and 1 units, 2
/// micro-batches, Adam.
fn pipeline(
    stack: LayerStack<UserTypes>,
) -> Pipeline<
    UserTypes,
    impl burn::optim::Optimizer<TrainableUnits<UserTypes>, B, Record: ParamStates>,
> {
    PipelineConfig::new()
        .with_micro_batches(Some(2))
        .with_balance(Some(vec![3, 2, 1]))
        .init(stack, vec![Default::default(); 3], || {
            AdamConfig::new().init()
        })
        .unwrap()
}

/// Largest absolute difference between two stacks' weights.
fn worst(a: &LayerStack<UserTypes>, b: &LayerStack<UserTypes>) -> f32 {
    let all = |s: &LayerStack<UserTypes>| {
        let mut all = weights::<B, _>(s.first());
        s.middle()
            .iter()
            .for_each(|u| all.extend(weights::<B, _>(u)));
        all.extend(weights::<B, _>(s.last()));
        all
    };
    let (a, b) = (all(a), all(b));
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(&b)
        .flat_map(|(x, y)| {
            let (x, y) = (x.to_vec::<f32>().unwrap(), y.to_vec::<f32>().unwrap());
            x.into_iter()
                .zip(y)
                .map(|(x, y)| (x - y).abs())
                .collect::<Vec<_>>()
        })
        .fold(0.0, f32::max)
}

#[test]
fn freezing_up_then_thawing_through_the_cache_trains_as_plain_burn() {
    let device = Default::default();
    let loss_fn = CrossEntropyLossConfig::new().init(&device);
    let base = user_stack(6, 8, 3, 3);
    let mut pipe = pipeline(base.clone());
    pipe.attach_cache(ActivationCache::new(CacheConfig::new(64 << 20)).unwrap());
    let mut plain = PlainFronts::new(base.clone(), AdamConfig::new().init());
    // Up to 3 (stage 0 frozen and cached), down to 1 (units 1 and 2 train
    // again, so the cached outputs of unit 2 go stale), up to 3 again (a
    // stale entry served here would differ from plain), down to 2.
    let fronts = [0usize, 3, 1, 3, 2];
    for (epoch, &front) in fronts.iter().enumerate() {
        if front >= pipe.front() {
            pipe.freeze_to(front).unwrap();
        } else {
            let before = pipe.cache().unwrap().len();
            pipe.unfreeze_to(front).unwrap();
            let after = pipe.cache().unwrap().len();
            // Epoch 2: every entry (front 3) is stale; epoch 4: the front-3
            // entries are, the front-1 ones stay valid.
            assert!(
                after < before,
                "epoch {epoch}: {before} entries, {after} after the thaw"
            );
            if epoch == 2 {
                assert_eq!(after, 0, "epoch {epoch}: entries above {front} dropped");
            }
        }
        plain.set_front(front);
        // The same two batches twice every epoch: the cache serves them.
        for b in [0u64, 1, 0, 1] {
            let (x, y) = user_batch(b, BATCH, 6, 3);
            let ids: Vec<u64> = (0..BATCH as u64).map(|i| b * 100 + i).collect();
            let loss = |l, t| loss_fn.forward(l, t);
            let start = pipe.serve_prefix(&ids, x.clone()).unwrap();
            let report = pipe
                .forward_backward(start, y.clone(), loss, StepOptions::new())
                .unwrap();
            pipe.step(LR).unwrap();
            let expected = plain.step(LR, x, |logits| loss_fn.forward(logits, y));
            assert!(
                (report.loss - expected).abs() <= 1e-6,
                "epoch {epoch}, batch {b}: {} against {expected}",
                report.loss
            );
        }
    }
    assert!(pipe.cache().unwrap().stats().hits > 0, "the cache served");
    let diff = worst(&pipe.to_layer_stack(), &plain.to_layer_stack());
    assert!(diff <= 1e-6, "weights differ by {diff}");
    assert!(
        worst(&pipe.to_layer_stack(), &base) > 1e-3,
        "training moved the weights"
    );
}

#[test]
fn an_unfreeze_above_the_front_or_with_gradients_pending_is_refused() {
    let device = Default::default();
    let loss_fn = CrossEntropyLossConfig::new().init(&device);
    let mut pipe = pipeline(user_stack(6, 8, 3, 3));
    pipe.freeze_to(4).unwrap();
    let balance = pipe.balance();
    let trainable: Vec<usize> = (0..3).map(|s| pipe.stage(s).num_trainable()).collect();
    match FreezeFront::unfreeze_to(&mut pipe, 5) {
        Err(PipeError::Freeze(FreezeError::WouldFreeze {
            frozen: 4,
            requested: 5,
        })) => {}
        other => panic!("expected WouldFreeze, got {other:?}"),
    }
    assert_eq!(pipe.front(), 4);
    let (x, y) = user_batch(7, BATCH, 6, 3);
    pipe.forward_backward(x, y, |l, t| loss_fn.forward(l, t), StepOptions::new())
        .unwrap();
    assert!(matches!(
        pipe.unfreeze_to(1),
        Err(PipeError::GradientsPending("unfreeze_to"))
    ));
    assert_eq!(pipe.front(), 4);
    assert_eq!(pipe.balance(), balance);
    let after: Vec<usize> = (0..3).map(|s| pipe.stage(s).num_trainable()).collect();
    assert_eq!(after, trainable);
    assert!(
        pipe.gradients(2).is_some(),
        "the pending gradients are kept"
    );
    // Once stepped, the thaw goes through: each unit on the stage that holds it.
    pipe.step(LR).unwrap();
    pipe.unfreeze_to(1).unwrap();
    let after: Vec<usize> = (0..3).map(|s| pipe.stage(s).num_trainable()).collect();
    assert_eq!(after, vec![2, 2, 1]);
    assert_eq!(pipe.balance(), balance);
}
