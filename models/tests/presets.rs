//! Every preset builds, has the published parameter count, and gives logits of
//! the right shape. The big presets run one small batch on the tests' inner
//! backend (no autodiff).

mod common;

use burn::prelude::*;
use pipetransformer_models::bert::{BertConfig, BertInput};
use pipetransformer_models::vit::VitConfig;

use common::Inner;

fn bert_logits_shape(config: &BertConfig) -> ([usize; 2], usize) {
    let device = Default::default();
    let bert = config.init::<Inner>(&device);
    let input = BertInput::from_token_ids(&[vec![1, 2, 3, 4, 5], vec![1, 2, 3]], 0, &device);
    let classifier = config.hidden * config.num_classes + config.num_classes;
    (bert.forward(input).dims(), bert.num_params() - classifier)
}

#[test]
fn vit_b16_has_86_6m_parameters_and_classifies_224px_images() {
    let config = VitConfig::vit_b16(1000);
    assert_eq!(config.num_units(), 27);
    let vit = config.init::<Inner>(&Default::default());
    // timm's vit_base_patch16_224: 86,567,656 parameters.
    assert_eq!(vit.num_params(), 86_567_656);
    let images = Tensor::<Inner, 4>::zeros([1, 3, 224, 224], &Default::default());
    assert_eq!(vit.forward(images).dims(), [1, 1000]);
}

#[test]
fn tiny_vit_classifies_16px_images() {
    let config = VitConfig::tiny(7);
    let vit = config.init::<Inner>(&Default::default());
    let images = Tensor::<Inner, 4>::zeros([3, 3, 16, 16], &Default::default());
    assert_eq!(vit.forward(images).dims(), [3, 7]);
}

#[test]
fn bert_base_has_109_5m_parameters_before_its_classifier() {
    let config = BertConfig::base(2);
    assert_eq!(config.num_units(), 26);
    let (shape, params) = bert_logits_shape(&config);
    assert_eq!(shape, [2, 2]);
    // Hugging Face bert-base-uncased (BertModel, with pooler): 109,482,240.
    assert_eq!(params, 109_482_240);
}

#[test]
fn minilm_l6_h384_has_22_7m_parameters_before_its_classifier() {
    let config = BertConfig::minilm_l6_h384(3);
    assert_eq!(config.num_units(), 14);
    let (shape, params) = bert_logits_shape(&config);
    assert_eq!(shape, [2, 3]);
    // sentence-transformers/all-MiniLM-L6-v2 (BertModel, with pooler): 22,713,216.
    assert_eq!(params, 22_713_216);
}

#[test]
fn tiny_bert_classifies_token_sequences() {
    let (shape, _) = bert_logits_shape(&BertConfig::tiny(5));
    assert_eq!(shape, [2, 5]);
}

#[test]
fn invalid_configs_are_explained() {
    let error = VitConfig::tiny(2)
        .with_patch_size(5)
        .validate()
        .unwrap_err();
    assert!(error.contains("patch_size 5"), "{error}");
    let error = BertConfig::tiny(2).with_heads(5).validate().unwrap_err();
    assert!(error.contains("heads 5"), "{error}");
}

#[test]
#[should_panic(expected = "longer than the 64 positions")]
fn bert_refuses_sequences_longer_than_its_positions() {
    let device = Default::default();
    let bert = BertConfig::tiny(2).init::<Inner>(&device);
    let long: Vec<u32> = (0..65).map(|i| 2 + i % 60).collect();
    bert.forward(BertInput::from_token_ids(&[long], 0, &device));
}
