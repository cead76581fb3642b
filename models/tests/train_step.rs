//! burn-train's `TrainStep` and `InferenceStep` for ViT and BERT (feature
//! `burn-train`, on for this crate's tests): the step's loss is the
//! cross-entropy of the model's own forward, and its gradients are those of
//! that loss, parameter by parameter; inference gives the same loss.

use burn::backend::{Autodiff, Flex};
use burn::module::{AutodiffModule, ModuleVisitor, Param};
use burn::nn::loss::CrossEntropyLossConfig;
use burn::optim::GradientsParams;
use burn::prelude::*;
use burn::train::{InferenceStep, TrainStep};
use pipetransformer_models::bert::BertConfig;
use pipetransformer_models::synthetic::{BandImages, MajorityTokens};
use pipetransformer_models::vit::VitConfig;

type B = Autodiff<Flex>;

fn loss_of(logits: Tensor<B, 2>, labels: Tensor<B, 1, Int>) -> Tensor<B, 1> {
    CrossEntropyLossConfig::new()
        .init(&logits.device())
        .forward(logits, labels)
}

/// Compares, parameter by parameter, the step's gradients with the
/// reference ones; counts the parameters.
struct SameGradients<'a>(&'a GradientsParams, &'a GradientsParams, usize);
impl ModuleVisitor<B> for SameGradients<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let step = self
            .0
            .get::<Flex, D>(param.id)
            .expect("the step has every gradient");
        let reference = self.1.get::<Flex, D>(param.id).expect("a gradient");
        step.into_data().assert_approx_eq::<f32>(
            &reference.into_data(),
            burn::tensor::Tolerance::absolute(1e-6),
        );
        self.2 += 1;
    }
}

fn assert_same_gradients<M: AutodiffModule<B>>(
    model: &M,
    step: &GradientsParams,
    loss: Tensor<B, 1>,
) {
    let reference = GradientsParams::from_grads(loss.backward(), model);
    let mut visitor = SameGradients(step, &reference, 0);
    model.visit(&mut visitor);
    assert!(visitor.2 > 10, "{} parameters compared", visitor.2);
}

#[test]
fn vit_steps_train_and_infer_on_its_own_forward() {
    let device = Default::default();
    let vit = VitConfig::tiny(4).init::<B>(&device);
    let (images, labels) =
        BandImages::new(4, 3, 16, 3).samples::<B>(&(0..16).collect::<Vec<_>>(), &device);
    let reference = loss_of(vit.forward(images.clone()), labels.clone());
    let expected = reference.clone().into_scalar();
    let out = TrainStep::step(&vit, (images.clone(), labels.clone()));
    assert!((out.item.loss.clone().into_scalar() - expected).abs() < 1e-6);
    assert_eq!(out.item.output.dims(), [16, 4]);
    assert_same_gradients(&vit, &out.grads, reference);
    let valid = InferenceStep::step(&vit.valid(), (images.inner(), labels.inner()));
    assert!((valid.loss.into_scalar() - expected).abs() < 1e-5);
}

#[test]
fn bert_steps_train_and_infer_on_its_own_forward() {
    let device = Default::default();
    let bert = BertConfig::tiny(2).init::<B>(&device);
    let (input, labels) =
        MajorityTokens::new(64, 5, 11, 3).samples::<B>(&(0..16).collect::<Vec<_>>(), &device);
    let reference = loss_of(bert.forward(input.clone()), labels.clone());
    let expected = reference.clone().into_scalar();
    let out = TrainStep::step(&bert, (input.clone(), labels.clone()));
    assert!((out.item.loss.into_scalar() - expected).abs() < 1e-6);
    assert_same_gradients(&bert, &out.grads, reference);
    let inner = pipetransformer_models::bert::BertInput {
        tokens: input.tokens.inner(),
        token_types: input.token_types.inner(),
        padding: input.padding.inner(),
    };
    let valid = InferenceStep::step(&bert.valid(), (inner, labels.inner()));
    assert_eq!(valid.output.dims(), [16, 2]);
}
