//! Bad input gives a clear error and changes nothing.

mod common;

use burn_freeze::CacheHolder;
use burn_freeze::FreezeFront;
use burn_freeze::{
    ActivationCache, CacheConfig, CacheError, FreezableStack, FreezeError, LayerMap,
};
use common::*;

#[test]
fn a_front_beyond_the_stack_is_refused() {
    let mut stack = FreezableStack::new(stack(3, 0.0, 30));
    stack.freeze_to(2).unwrap();
    let error = stack.freeze_to(6).unwrap_err();
    assert_eq!(
        error,
        FreezeError::BeyondStack {
            requested: 6,
            len: 5
        }
    );
    assert_eq!(
        error.to_string(),
        "cannot freeze 6 units: the stack has only 5"
    );
    assert_eq!(stack.front(), 2);
    assert!(matches!(
        common::stack(3, 0.0, 30).freeze_to(9),
        Err(FreezeError::BeyondStack { .. })
    ));
    assert!(matches!(
        LayerMap::uniform(1, 2, 3, 5),
        Err(FreezeError::MapBeyondStack { .. })
    ));
    assert!(
        LayerMap::uniform(1, 2, 2, 5)
            .unwrap()
            .try_unit_front(3)
            .is_err()
    );
}

#[test]
fn the_front_only_moves_up_unless_unfrozen_explicitly() {
    let mut stack = FreezableStack::new(stack(3, 0.0, 31));
    stack.freeze_to(3).unwrap();
    assert_eq!(
        stack.freeze_to(1),
        Err(FreezeError::WouldUnfreeze {
            frozen: 3,
            requested: 1
        })
    );
    assert_eq!(
        stack.unfreeze_to(4),
        Err(FreezeError::WouldFreeze {
            frozen: 3,
            requested: 4
        })
    );
    assert_eq!(stack.front(), 3);
    stack.unfreeze_to(1).unwrap();
    assert_eq!(stack.front(), 1);
}

#[test]
fn an_unwritable_cache_directory_is_refused() {
    let file = tempfile::NamedTempFile::new().unwrap();
    let under_a_file = file.path().join("cache");
    let error = ActivationCache::<Inner, burn::tensor::Tensor<Inner, 3>>::new(
        CacheConfig::new(0).with_spill_dir(Some(under_a_file.clone())),
    )
    .unwrap_err();
    assert!(
        matches!(&error, CacheError::UnwritableDirectory { path, .. } if *path == under_a_file)
    );
    assert!(error.to_string().contains("not writable"), "{error}");
}

#[test]
fn a_sample_seen_again_with_another_shape_is_refused() {
    let mut stack = FreezableStack::new(stack(3, 0.0, 32));
    stack.attach_cache(ActivationCache::new(CacheConfig::new(1 << 20)).unwrap());
    stack.freeze_to(2).unwrap();
    let (x, _) = batch(&[1, 2, 3], 4);
    stack.forward_cached(&[1, 2, 3], x).unwrap();
    let before = stack.cache().unwrap().stats();

    // Sample 2 comes back with 6 tokens instead of 4.
    let (x, _) = batch(&[2, 7], 6);
    let error = stack.forward_cached(&[2, 7], x).unwrap_err();
    assert!(
        matches!(&error, CacheError::ShapeMismatch { sample: 2, cached, found }
            if cached == &vec![vec![1, 4, INPUT]] && found == &vec![vec![1, 6, INPUT]]),
        "{error:?}"
    );
    assert!(error.to_string().contains("sample 2"), "{error}");
    assert_eq!(stack.cache().unwrap().stats(), before, "nothing changed");
    assert_eq!(stack.cache().unwrap().len(), 3);

    // Ids that do not fit the batch.
    let (x, _) = batch(&[1, 2], 4);
    assert!(matches!(
        stack.forward_cached(&[1], x.clone()),
        Err(CacheError::IdCount { batch: 2, ids: 1 })
    ));
    assert!(matches!(
        stack.forward_cached(&[1, 1], x),
        Err(CacheError::DuplicateId(1))
    ));
}
