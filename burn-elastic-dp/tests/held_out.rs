//! The freeze rule's held-out loss: samples carved out of the training data
//! by default, or a user's validation batch, with which every training
//! sample is trained on and the rule still reads its loss.

mod common;

use burn::optim::AdamConfig;
use burn::prelude::*;
use burn_elastic_dp::{BatchPolicy, FreezeRule, TrainerConfig, TrainerError};
use burn_freeze::EvidenceConfig;
use common::{B, Rows, block_stack, four_class_rows, loss};

const UNITS: usize = 6;
const WIDTH: usize = 8;
const SAMPLES: usize = 64;

/// Evidence on every step's held-out loss, quick to call a plateau (any
/// learning so far, and a step that improved less than nearly all of it),
/// so that a rule that reads losses freezes within two epochs.
fn config(held_out: Option<usize>) -> TrainerConfig {
    let rule = EvidenceConfig::new()
        .with_every_steps(Some(2))
        .with_signal(None)
        .with_patience(1)
        .with_learned_drop(0.0)
        .with_plateau_below(0.99);
    TrainerConfig::new()
        .with_freeze(FreezeRule::Evidence { rule })
        .with_stages(Some(1))
        .with_batch(BatchPolicy::FixedGlobal { batch: 8 })
        .with_lr(3e-3)
        .with_seed(5)
        .with_held_out(held_out)
}

/// Two epochs on `SAMPLES` rows with `validation` as the rule's batch
/// where given: the samples trained per epoch and the front at the end.
fn train(held_out: Option<usize>, validation: bool) -> (Vec<usize>, usize) {
    let device: Device<B> = Default::default();
    let mut trainer = config(held_out)
        .init(
            block_stack(UNITS, WIDTH),
            vec![device; 2],
            || AdamConfig::new().init(),
            loss,
        )
        .unwrap();
    if validation {
        // Rows past the training ones: the same rule, samples never trained.
        let rows = four_class_rows::<WIDTH>(SAMPLES + 32);
        let items: Vec<_> = (SAMPLES..SAMPLES + 32)
            .map(|i| burn::data::dataset::Dataset::get(&rows, i).unwrap())
            .collect();
        let (x, y) = burn::data::dataloader::batcher::Batcher::batch(&Rows, items, &device);
        trainer.set_validation(x, y).unwrap();
    }
    let data = four_class_rows::<WIDTH>(SAMPLES);
    let samples = (0..2)
        .map(|_| trainer.fit_epoch(&data, &Rows).unwrap().samples)
        .collect();
    (samples, trainer.front())
}

#[test]
fn a_validation_batch_feeds_the_rule_and_every_sample_trains() {
    // The default carve: a sixteenth of the rows never trained, the rule
    // reads their loss and freezes.
    let (carved, carved_front) = train(None, false);
    assert_eq!(carved, vec![SAMPLES - SAMPLES / 16; 2]);
    assert!(carved_front > 0, "the carved samples' loss froze nothing");
    // Nothing carved and no validation batch: every row trains, and the
    // rule, which sees no held-out loss, freezes nothing.
    let (blind, blind_front) = train(Some(0), false);
    assert_eq!(blind, vec![SAMPLES; 2]);
    assert_eq!(blind_front, 0);
    // A validation batch: every row trains and the rule reads its loss.
    let (validated, validated_front) = train(Some(0), true);
    assert_eq!(validated, vec![SAMPLES; 2]);
    assert!(
        validated_front > 0,
        "the validation batch's loss froze nothing"
    );
}

#[test]
fn a_configuration_that_carves_refuses_a_validation_batch() {
    let device: Device<B> = Default::default();
    let batch = || {
        (
            Tensor::<B, 2>::zeros([4, WIDTH], &device),
            Tensor::<B, 1, Int>::zeros([4], &device),
        )
    };
    let init = |config: TrainerConfig| {
        config
            .init(
                block_stack(UNITS, WIDTH),
                vec![device; 2],
                || AdamConfig::new().init(),
                loss,
            )
            .unwrap()
    };
    for held_out in [None, Some(4)] {
        let (x, y) = batch();
        match init(config(held_out)).set_validation(x, y) {
            Err(TrainerError::InvalidConfig {
                field, accepted, ..
            }) => {
                assert_eq!(field, "held_out");
                assert!(accepted.contains("Some(0)"), "{accepted}");
            }
            other => panic!("held_out {held_out:?}: expected a refusal, got {other:?}"),
        }
    }
    // A rule that reads no held-out loss carves nothing: the batch is
    // accepted (and unused).
    let (x, y) = batch();
    let fronts = config(None).with_freeze(FreezeRule::Fronts { layers: vec![0, 2] });
    assert!(init(fronts).set_validation(x, y).is_ok());
}
