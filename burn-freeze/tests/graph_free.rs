//! A frozen prefix records no autodiff graph, gets no gradient and no
//! optimizer state, and runs without dropout.

mod common;

use burn::module::{AutodiffModule, Module, list_param_ids};
use burn::nn::loss::CrossEntropyLossConfig;
use burn::optim::{AdamConfig, GradientsParams, Optimizer};
use burn::prelude::*;
use burn_freeze::FreezeFront;
use burn_freeze::plumbing::{Flow, retain_optimizer_state};
use burn_freeze::{FreezableStack, TrainableUnits, Unit};
use common::*;

fn loss(logits: Tensor<B, 2>, labels: Tensor<B, 1, Int>) -> Tensor<B, 1> {
    CrossEntropyLossConfig::new()
        .init(&Default::default())
        .forward(logits, labels)
}

#[test]
fn a_frozen_prefix_adds_nothing_to_the_graph() {
    let ids: Vec<u64> = (0..8).collect();
    let (x, y) = batch(&ids, 4);
    for frozen in [0, 2, 4, 6] {
        let mut stack = FreezableStack::new(stack(6, 0.0, 1));
        stack.freeze_to(frozen).unwrap();
        let depth = graph_depth(loss(stack.forward(x.clone()), y.clone()));

        // The same trainable units run by hand on a fresh leaf: the graph a
        // step needs when the frozen units contribute nothing.
        let (first, middle, last) = stack.trainable().clone();
        let hidden = match first {
            Some(first) => first.forward(x.clone()),
            None => {
                let h = stack
                    .frozen()
                    .forward(Flow::Input(x.clone().inner()))
                    .expect_hidden(frozen);
                Tensor::<B, 3>::from_inner(h)
            }
        };
        let hidden = middle.iter().fold(hidden, |h, u| u.forward(h));
        let expected = graph_depth(loss(last.unwrap().forward(hidden), y.clone()));
        assert_eq!(depth, expected, "{frozen} frozen units");

        if frozen > 0 {
            // Each unfrozen unit adds steps: the frozen step is strictly shallower.
            let full = stack.clone().into_layer_stack();
            let unfrozen = graph_depth(loss(full.forward(x.clone()), y.clone()));
            assert!(
                depth < unfrozen,
                "{frozen} frozen: depth {depth}, unfrozen {unfrozen}"
            );
            // Burn's no_grad() on the same units still records their steps.
            let (first, middle, last) = full.into_parts();
            let first = first.no_grad();
            let middle: Vec<_> = middle
                .into_iter()
                .enumerate()
                .map(|(i, u)| if i + 1 < frozen { u.no_grad() } else { u })
                .collect();
            let h = middle
                .iter()
                .fold(first.forward(x.clone()), |h, u| u.forward(h));
            let no_grad = graph_depth(loss(last.forward(h), y.clone()));
            assert!(no_grad > depth, "no_grad {no_grad} vs frozen {depth}");
        }
    }
}

#[test]
fn the_frozen_output_enters_autodiff_as_a_leaf() {
    let (x, _) = batch(&[1, 2, 3], 4);
    let mut stack = FreezableStack::new(stack(4, 0.0, 2));
    stack.freeze_to(3).unwrap();
    let h = stack
        .frozen()
        .forward(Flow::Input(x.inner()))
        .expect_hidden(3);
    assert_eq!(graph_depth(Tensor::<B, 3>::from_inner(h)), 0);
}

#[test]
fn frozen_parameters_get_no_gradient_and_no_optimizer_state() {
    let (x, y) = batch(&(0..8).collect::<Vec<_>>(), 4);
    let original = stack(4, 0.0, 3);
    let reference = original.clone(); // same parameter tensors, on autodiff

    // Control: unfrozen, unit 1 gets a gradient.
    let mut raw = loss(original.forward(x.clone()), y.clone()).backward();
    assert!(!GradientsParams::from_module(&mut raw, &reference.middle()[0]).is_empty());

    let mut stack = FreezableStack::new(original);
    stack.freeze_to(3).unwrap(); // units 0, 1, 2
    let mut raw = loss(stack.forward(x.clone()), y.clone()).backward();
    assert_eq!(
        GradientsParams::from_module(&mut raw, reference.first()).len(),
        0
    );
    assert_eq!(
        GradientsParams::from_module(&mut raw, &reference.middle()[0]).len(),
        0
    );
    assert_eq!(
        GradientsParams::from_module(&mut raw, &reference.middle()[1]).len(),
        0
    );
    let grads = stack.gradients(raw);
    assert_eq!(grads.len(), list_param_ids(stack.trainable()).len());

    // The optimizer holds state for trainable parameters only.
    let mut optim = AdamConfig::new().init::<B, TrainableUnits<Types>>();
    stack.map_trainable(|active| optim.step(1e-2, active, grads));
    let record = optim.to_record();
    let frozen_ids: Vec<_> = list_param_ids(&stack.frozen().middle().to_vec())
        .into_iter()
        .chain(list_param_ids(stack.frozen().first().unwrap()))
        .collect();
    assert_eq!(record.len(), list_param_ids(stack.trainable()).len());
    assert!(frozen_ids.iter().all(|id| !record.contains_key(id)));

    // Moving the front up: the newly frozen unit's state is dropped.
    let newly = list_param_ids(&stack.trainable().1[0]);
    stack.freeze_to(4).unwrap();
    assert!(newly.iter().all(|id| optim.to_record().contains_key(id)));
    let optim = retain_optimizer_state(optim, stack.trainable());
    let record = optim.to_record();
    assert!(newly.iter().all(|id| !record.contains_key(id)));
    assert_eq!(record.len(), list_param_ids(stack.trainable()).len());
}

#[test]
fn dropout_is_off_in_frozen_units() {
    let (x, _) = batch(&(0..16).collect::<Vec<_>>(), 8);
    let layers = stack(3, 0.5, 4);
    // Dropout-free reference: the whole stack on the inner backend.
    let xi = x.clone().inner();
    let h = layers
        .middle()
        .iter()
        .fold(layers.first().valid().run(xi), |h, u| u.valid().run(h));
    let expected = layers.last().valid().run(h);

    // Trained (unfrozen), dropout is on: the output differs.
    let trained = layers.forward(x.clone()).inner();
    assert!(
        !trained
            .clone()
            .all_close(expected.clone(), Some(1e-4), Some(1e-4))
    );

    // Frozen whole, twice: deterministic and equal to the dropout-free output.
    let mut stack = FreezableStack::new(layers);
    stack.freeze_to(stack.num_units()).unwrap();
    for _ in 0..2 {
        let out = stack.forward(x.clone()).inner();
        out.into_data()
            .assert_eq(&expected.clone().into_data(), true);
    }
}

#[test]
fn unfreezing_makes_units_train_again() {
    let (x, y) = batch(&(0..8).collect::<Vec<_>>(), 4);
    let mut stack = FreezableStack::new(stack(4, 0.0, 5));
    let all = list_param_ids(stack.trainable()).len();
    stack.freeze_to(6).unwrap();
    assert_eq!(list_param_ids(stack.trainable()).len(), 0);
    stack.unfreeze_to(2).unwrap();
    assert_eq!(stack.front(), 2);
    assert!(stack.is_frozen(1) && !stack.is_frozen(2));
    let grads = stack.gradients(loss(stack.forward(x), y).backward());
    assert_eq!(grads.len(), list_param_ids(stack.trainable()).len());
    assert!(!grads.is_empty() && grads.len() < all);
    assert_eq!(stack.into_layer_stack().num_units(), 6);
}

/// The tests run on the backend that `test-tch` selects (`.ci/tch`), on the CPU.
#[test]
fn tests_run_on_the_selected_backend() {
    assert_eq!(
        <common::B as Backend>::name(&Default::default()),
        common::BACKEND_NAME
    );
}
