//! A pipelined step gives the loss and parameter gradients of plain training
//! on the same batch, for every number of stages, several micro-batch counts
//! (even and uneven) and both schedules: for each gradient tensor, the largest
//! absolute difference is at most 1e-5 times that tensor's largest magnitude
//! (gradients that are zero in exact arithmetic must stay near zero; see
//! `CompareGrads`).

mod common;

use burn::module::{AutodiffModule, Module};
use burn::nn::loss::CrossEntropyLossConfig;
use burn::optim::{GradientsParams, SgdConfig};
use burn::prelude::*;
use burn_freeze::FreezeFront;
use burn_freeze::{Activation, IntoLayerStack, LayerStack, StackTypes};
use burn_pipe::StepOptions;
use burn_pipe::balance::unit_param_costs;
use burn_pipe::{PipelineConfig, Schedule, balance_exact};
use common::{B, CompareGrads, MaxGrad, user_batch, user_stack};
use pipetransformer_models::bert::BertConfig;
use pipetransformer_models::synthetic::{BandImages, MajorityTokens};
use pipetransformer_models::vit::VitConfig;

const TOLERANCE: f32 = 1e-5;

/// For every K and M in `micro_batches` and both schedules, checks the
/// pipelined loss and gradients against `plain_loss` and `plain_grads`.
fn check_all_partitions<S, T>(
    stack: &LayerStack<S>,
    input: S::Input,
    targets: T,
    plain_loss: f32,
    plain_grads: &GradientsParams,
    micro_batches: &[usize],
) where
    S: StackTypes<Backend = B, Output = Tensor<B, 2>>,
    T: Activation<B> + Clone,
    Tensor<B, 1, Int>: From<T>,
{
    let device = Default::default();
    let loss_fn = CrossEntropyLossConfig::new().init(&device);
    let costs = unit_param_costs(stack);
    let mut max = MaxGrad {
        grads: plain_grads,
        max: 0.0,
    };
    stack.first().visit(&mut max);
    stack.middle().iter().for_each(|unit| unit.visit(&mut max));
    stack.last().visit(&mut max);
    let zero_below = 1e-6 * max.max;
    let mut runs = 0;
    for stages in 1..=stack.num_units() {
        let balance = balance_exact(&costs, stages);
        for &m in micro_batches {
            for schedule in [Schedule::GPipe, Schedule::OneFOneB] {
                let config = PipelineConfig::new()
                    .with_schedule(schedule)
                    .with_micro_batches(Some(m));
                let mut pipeline = config
                    .with_balance(Some(balance.to_vec()))
                    .init(stack.clone(), vec![device; stages], || {
                        SgdConfig::new().init()
                    })
                    .unwrap();
                let report = pipeline
                    .forward_backward(
                        input.clone(),
                        targets.clone(),
                        |logits, t: T| loss_fn.forward(logits, t.into()),
                        StepOptions::new(),
                    )
                    .unwrap();
                let what = format!("K={stages} {balance:?} M={m} {schedule:?}");
                assert!(
                    (report.loss - plain_loss).abs() <= TOLERANCE * plain_loss.abs().max(1.0),
                    "{what}: loss {} vs plain {plain_loss}",
                    report.loss
                );
                let mut compared = 0;
                for s in 0..stages {
                    let grads = pipeline.gradients(s).expect("gradients after a pass");
                    let mut compare = CompareGrads::new(grads, plain_grads, zero_below);
                    pipeline.stage(s).trainable().visit(&mut compare);
                    assert!(
                        compare.missing.is_empty(),
                        "{what}: stage {s} lacks gradients: {} of {} (pipeline has {}, plain {})",
                        compare.missing.len(),
                        compare.missing.len() + compare.compared,
                        grads.len(),
                        plain_grads.len()
                    );
                    assert!(
                        compare.worst <= TOLERANCE,
                        "{what}: stage {s} differs by {}",
                        compare.worst
                    );
                    assert!(
                        compare.not_zero.is_empty(),
                        "{what}: stage {s}: {:?} should be zero",
                        compare.not_zero
                    );
                    compared += compare.compared;
                }
                assert!(compared > 0, "{what}: compared no gradient");
                runs += 1;
            }
        }
    }
    assert_eq!(runs, stack.num_units() * micro_batches.len() * 2);
}

#[test]
fn tiny_vit_pipelined_gradients_equal_plain_gradients() {
    let device = Default::default();
    let vit = VitConfig::tiny(4).init::<B>(&device);
    let (images, labels) = BandImages::new(4, 3, 16, 5).batch::<B>(0, 10, &device);
    let loss = CrossEntropyLossConfig::new()
        .init(&device)
        .forward(vit.forward(images.clone()), labels.clone());
    let plain_loss = loss.clone().into_scalar();
    let plain_grads = GradientsParams::from_grads(loss.backward(), &vit);
    let stack = vit.into_layer_stack();
    check_all_partitions(
        &stack,
        images,
        labels,
        plain_loss,
        &plain_grads,
        &[1, 3, 4, 10],
    );
}

#[test]
fn tiny_bert_pipelined_gradients_equal_plain_gradients() {
    let device = Default::default();
    let bert = BertConfig::tiny(2).init::<B>(&device);
    let (input, labels) = MajorityTokens::new(64, 3, 11, 6).batch::<B>(0, 9, &device);
    let loss = CrossEntropyLossConfig::new()
        .init(&device)
        .forward(bert.forward(input.clone()), labels.clone());
    let plain_loss = loss.clone().into_scalar();
    let plain_grads = GradientsParams::from_grads(loss.backward(), &bert);
    let stack = bert.into_layer_stack();
    check_all_partitions(&stack, input, labels, plain_loss, &plain_grads, &[1, 2, 4]);
}

#[test]
fn user_stack_pipelined_gradients_equal_plain_gradients() {
    let stack = user_stack(6, 16, 3, 3);
    let (x, labels) = user_batch(1, 11, 6, 3);
    let device = Default::default();
    let loss = CrossEntropyLossConfig::new()
        .init(&device)
        .forward(stack.forward(x.clone()), labels.clone());
    let plain_loss = loss.clone().into_scalar();
    let mut grads = loss.backward();
    // Gradients of every unit, gathered the way plain training would.
    let (first, middle, last) = stack.clone().into_parts();
    let mut plain_grads = GradientsParams::from_module(&mut grads, &first);
    for unit in &middle {
        let unit_grads = GradientsParams::from_module(&mut grads, unit);
        merge(&mut plain_grads, unit_grads, unit);
    }
    let last_grads = GradientsParams::from_module(&mut grads, &last);
    merge(&mut plain_grads, last_grads, &last);
    check_all_partitions(&stack, x, labels, plain_loss, &plain_grads, &[1, 2, 5, 11]);
}

/// Moves every gradient of `module`'s parameters from `from` into `into`.
fn merge<Mo: AutodiffModule<B>>(
    into: &mut GradientsParams,
    mut from: GradientsParams,
    module: &Mo,
) {
    struct Move<'a> {
        into: &'a mut GradientsParams,
        from: &'a mut GradientsParams,
    }
    impl burn::module::ModuleVisitor<B> for Move<'_> {
        fn visit_float<const D: usize>(&mut self, param: &burn::module::Param<Tensor<B, D>>) {
            if let Some(grad) = self.from.remove::<common::Inner, D>(param.id) {
                self.into.register::<common::Inner, D>(param.id, grad);
            }
        }
    }
    module.visit(&mut Move {
        into,
        from: &mut from,
    });
}

#[test]
fn evaluation_forward_equals_the_model_forward() {
    let device = Default::default();
    let vit = common::materialize(VitConfig::tiny(4).init::<B>(&device));
    let (images, _) = BandImages::new(4, 3, 16, 7).batch::<B>(0, 6, &device);
    let expected = vit.valid().forward(images.clone().inner());
    for (balance, front) in [
        (vec![7], 0),
        (vec![2, 3, 2], 0),
        (vec![3, 2, 2], 3),
        (vec![1, 1, 5], 4),
    ] {
        let mut pipeline = PipelineConfig::new()
            .with_balance(Some(balance.to_vec()))
            .init(
                vit.clone().into_layer_stack(),
                vec![device; balance.len()],
                || SgdConfig::new().init(),
            )
            .unwrap();
        pipeline.freeze_to(front).unwrap();
        let actual = pipeline.forward_inner(images.clone().inner());
        assert!(
            common::relative_diff(actual, expected.clone()) <= TOLERANCE,
            "{balance:?} front {front}"
        );
    }
}

/// The tests run on the backend that `test-tch` selects (`.ci/tch`), on the CPU.
#[test]
fn tests_run_on_the_selected_backend() {
    assert_eq!(
        <common::B as Backend>::name(&Default::default()),
        common::BACKEND_NAME
    );
}
