//! Running a model's partition units in sequence gives the model's own forward,
//! and a model rebuilt from its units is the same model.

mod common;

use burn::prelude::*;
use burn_freeze::{IntoLayerStack, LayerStack, StackError};
use common::{B, relative_max_diff};
use pipetransformer_models::bert::{Bert, BertConfig, BertUnit};
use pipetransformer_models::synthetic::{BandImages, MajorityTokens};
use pipetransformer_models::vit::{Vit, VitConfig, VitUnit};

#[test]
fn vit_units_in_sequence_match_the_model_forward() {
    let device = Default::default();
    let config = VitConfig::tiny(4).with_layers(3);
    let vit = config.init::<B>(&device);
    let (images, _) = BandImages::new(4, 3, 16, 1).batch::<B>(0, 5, &device);

    let expected = vit.forward(images.clone());
    let stack = vit.into_layer_stack();
    assert_eq!(stack.num_units(), config.num_units());
    let actual = stack.forward(images.clone());
    assert!(relative_max_diff(actual, expected.clone()) <= 1e-5);

    let rebuilt = Vit::from_layer_stack(stack).expect("a ViT's own units rebuild it");
    assert!(relative_max_diff(rebuilt.forward(images), expected) <= 1e-5);
}

#[test]
fn bert_units_in_sequence_match_the_model_forward_with_padding() {
    let device = Default::default();
    let config = BertConfig::tiny(3).with_layers(3);
    let bert = config.init::<B>(&device);
    let (input, _) = MajorityTokens::new(64, 3, 12, 2).batch::<B>(0, 6, &device);
    let padded = input
        .padding
        .clone()
        .int()
        .sum()
        .into_scalar()
        .elem::<i64>();
    assert!(padded > 0, "the batch should contain padding");

    let expected = bert.forward(input.clone());
    let stack = bert.into_layer_stack();
    assert_eq!(stack.num_units(), config.num_units());
    let actual = stack.forward(input.clone());
    assert!(relative_max_diff(actual, expected.clone()) <= 1e-5);

    let rebuilt = Bert::from_layer_stack(stack).expect("a BERT's own units rebuild it");
    assert!(relative_max_diff(rebuilt.forward(input), expected) <= 1e-5);
}

#[test]
fn bert_padding_does_not_change_the_real_tokens_result() {
    // The same sequence alone and padded inside a batch gives the same logits.
    let device = Default::default();
    let bert = BertConfig::tiny(2).init::<B>(&device);
    let short = vec![1, 7, 9, 20];
    let long = vec![1, 3, 4, 5, 6, 8, 10, 11];
    let alone = bert.forward(pipetransformer_models::bert::BertInput::from_token_ids(
        std::slice::from_ref(&short),
        0,
        &device,
    ));
    let batched = bert.forward(pipetransformer_models::bert::BertInput::from_token_ids(
        &[short, long],
        0,
        &device,
    ));
    assert!(relative_max_diff(batched.narrow(0, 0, 1), alone) <= 1e-5);
}

#[test]
fn a_stack_in_the_wrong_order_is_refused_with_the_unit_named() {
    let device = Default::default();
    let (embedding, mut middle, head) = VitConfig::tiny(2)
        .init::<B>(&device)
        .into_layer_stack()
        .into_parts();
    middle.swap(0, 1); // mlp before attention
    let error = Vit::from_layer_stack(LayerStack::new(embedding, middle, head)).unwrap_err();
    assert_eq!(
        error,
        StackError::UnexpectedUnit {
            index: 1,
            expected: "attention",
            found: "mlp"
        }
    );

    let (embeddings, mut middle, head) = BertConfig::tiny(2)
        .init::<B>(&device)
        .into_layer_stack()
        .into_parts();
    middle.pop();
    let error = Bert::from_layer_stack(LayerStack::new(embeddings, middle, head)).unwrap_err();
    assert!(
        matches!(error, StackError::WrongLength { found: 5, .. }),
        "{error}"
    );
}

#[test]
fn unit_kinds_follow_pipetransformer_order() {
    let device = Default::default();
    let vit = VitConfig::tiny(2).init::<B>(&device).into_layer_stack();
    let kinds: Vec<_> = vit.middle().iter().map(VitUnit::kind).collect();
    assert_eq!(kinds, ["attention", "mlp", "attention", "mlp", "norm"]);
    let bert = BertConfig::tiny(2).init::<B>(&device).into_layer_stack();
    let kinds: Vec<_> = bert.middle().iter().map(BertUnit::kind).collect();
    assert_eq!(
        kinds,
        ["attention", "feed-forward", "attention", "feed-forward"]
    );
}

/// The tests run on the backend that `test-tch` selects (`.ci/tch`), on the CPU.
#[test]
fn tests_run_on_the_selected_backend() {
    assert_eq!(
        <common::B as Backend>::name(&Default::default()),
        common::BACKEND_NAME
    );
}
