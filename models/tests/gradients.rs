//! Every parameter of ViT and BERT receives a gradient from a classification loss.

mod common;

use burn::module::{Module, ModuleVisitor, Param};
use burn::nn::loss::CrossEntropyLossConfig;
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;
use common::B;
use pipetransformer_models::bert::BertConfig;
use pipetransformer_models::synthetic::{BandImages, MajorityTokens};
use pipetransformer_models::vit::VitConfig;

/// Counts float parameters, and those with no gradient or an all-zero one.
struct GradientCheck<'a> {
    grads: &'a <B as AutodiffBackend>::Gradients,
    params: usize,
    missing: usize,
    all_zero: usize,
}

impl ModuleVisitor<B> for GradientCheck<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        self.params += 1;
        match param.val().grad(self.grads) {
            None => self.missing += 1,
            Some(grad) => {
                if grad.abs().max().into_scalar() == 0.0 {
                    self.all_zero += 1;
                }
            }
        }
    }
}

fn check<'a, M: Module<B>>(
    module: &M,
    grads: &'a <B as AutodiffBackend>::Gradients,
) -> GradientCheck<'a> {
    let mut check = GradientCheck {
        grads,
        params: 0,
        missing: 0,
        all_zero: 0,
    };
    module.visit(&mut check);
    check
}

#[test]
fn every_vit_parameter_gets_a_nonzero_gradient() {
    let device = Default::default();
    let vit = VitConfig::tiny(4).init::<B>(&device);
    let (images, labels) = BandImages::new(4, 3, 16, 3).batch::<B>(0, 8, &device);
    let loss = CrossEntropyLossConfig::new()
        .init(&device)
        .forward(vit.forward(images), labels);
    let grads = loss.backward();
    let check = check(&vit, &grads);
    assert!(check.params > 20, "visited {} parameters", check.params);
    assert_eq!((check.missing, check.all_zero), (0, 0));
}

#[test]
fn every_bert_parameter_gets_a_gradient() {
    let device = Default::default();
    let bert = BertConfig::tiny(2).init::<B>(&device);
    let (input, labels) = MajorityTokens::new(64, 3, 9, 4).batch::<B>(0, 8, &device);
    let loss = CrossEntropyLossConfig::new()
        .init(&device)
        .forward(bert.forward(input), labels);
    let grads = loss.backward();
    let check = check(&bert, &grads);
    assert!(check.params > 20, "visited {} parameters", check.params);
    // Rows of unused tokens and positions get a zero gradient, but a gradient.
    assert_eq!(check.missing, 0);
}
