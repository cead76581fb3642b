//! The elastic sampler gives every sample exactly once per epoch whatever
//! the replica count, also when it changes mid-epoch, under both batch
//! policies.

use burn::data::dataset::InMemDataset;
use burn_elastic_dp::{BatchPolicy, ElasticError, ElasticSampler};

/// Replica counts that change every step, from a fixed sequence.
fn replicas(step: usize) -> usize {
    [1, 2, 4, 3, 1, 8, 2][step % 7]
}

#[test]
fn every_sample_once_per_epoch_whatever_the_replica_count() {
    for policy in [
        BatchPolicy::FixedGlobal { batch: 6 },
        BatchPolicy::PerReplica { batch: 3 },
    ] {
        let mut sampler = ElasticSampler::new(97, policy, 11).unwrap();
        let mut orders = Vec::new();
        for epoch in 0..3 {
            let mut seen = Vec::new();
            let mut step = 0;
            while let Some(batch) = sampler.next_batch(replicas(step)) {
                let expected = policy.global_batch(replicas(step));
                assert!(
                    batch.len() == expected || sampler.remaining() == 0,
                    "{policy:?} epoch {epoch} step {step}: {} samples, expected {expected}",
                    batch.len()
                );
                seen.extend(batch);
                step += 1;
            }
            orders.push(seen.clone());
            seen.sort_unstable();
            assert_eq!(
                seen,
                (0..97).collect::<Vec<_>>(),
                "{policy:?} epoch {epoch}"
            );
            sampler.start_epoch();
        }
        assert_ne!(orders[0], orders[1], "every epoch is shuffled anew");
        // The order depends on the seed and the epoch only, not on the
        // replica counts.
        let mut again = ElasticSampler::new(97, policy, 11).unwrap();
        let mut first = Vec::new();
        while let Some(batch) = again.next_batch(1) {
            first.extend(batch);
        }
        assert_eq!(first, orders[0]);
    }
}

#[test]
fn items_come_from_the_dataset() {
    let dataset = InMemDataset::new((0..10).map(|i| i * 100).collect::<Vec<u32>>());
    let mut sampler = ElasticSampler::new(10, BatchPolicy::FixedGlobal { batch: 4 }, 3).unwrap();
    let mut items = Vec::new();
    while let Some(batch) = sampler.next_items(&dataset, 2).unwrap() {
        items.extend(batch);
    }
    items.sort_unstable();
    assert_eq!(items, (0..10).map(|i| i * 100).collect::<Vec<u32>>());
}

#[test]
fn a_dataset_shorter_than_the_sampler_is_an_error_not_a_panic() {
    let dataset = InMemDataset::new((0..6).collect::<Vec<u32>>());
    let mut sampler = ElasticSampler::new(10, BatchPolicy::FixedGlobal { batch: 10 }, 3).unwrap();
    match sampler.next_items(&dataset, 1) {
        Err(error @ burn_elastic_dp::ElasticError::MissingItem { index, len: 6 }) => {
            assert!(index >= 6, "{error}");
            assert!(error.to_string().contains("it holds 6"), "{error}");
        }
        other => panic!("expected MissingItem, got {other:?}"),
    }
}

#[test]
fn bad_sampler_configurations_are_refused() {
    assert!(matches!(
        ElasticSampler::new(0, BatchPolicy::FixedGlobal { batch: 4 }, 0),
        Err(ElasticError::Sampler(_))
    ));
    let error = ElasticSampler::new(5, BatchPolicy::PerReplica { batch: 0 }, 0).unwrap_err();
    assert!(error.to_string().contains("at least 1"), "{error}");
}
