//! Activations of several tensors: a tuple (hidden states, mask) passes
//! through a stack's units, splits and joins by the batch, leaves autodiff
//! and comes back, carries its mask through the backward pass, and is
//! cached and rebuilt; a frozen stack with such an activation trains as
//! the same stack trained whole.

use burn::backend::Autodiff;
use burn::module::{Module, Param};
use burn::nn::{Linear, LinearConfig};
use burn::optim::{AdamConfig, GradientsParams, Optimizer};
use burn::prelude::*;
use burn_freeze::FreezeFront;
use burn_freeze::{
    Activation, AutodiffActivation, Cacheable, Differentiable, FreezableStack, LayerStack,
    StackMarker,
};

type Inner = burn::backend::Flex;
type B = Autodiff<Inner>;
/// Hidden states `[batch, 4]` and a mask `[batch]` of the rows that count.
type Hidden<B> = (Tensor<B, 2>, Tensor<B, 1, Bool>);

#[derive(Module, Debug)]
struct Embed<B: Backend> {
    linear: Linear<B>,
}
impl<B: Backend> Embed<B> {
    fn forward(&self, x: Tensor<B, 2>) -> Hidden<B> {
        let mask = x
            .clone()
            .slice([0..x.dims()[0], 0..1])
            .flatten(0, 1)
            .greater_elem(0.0);
        (self.linear.forward(x), mask)
    }
}

#[derive(Module, Debug)]
struct Block<B: Backend> {
    linear: Linear<B>,
}
impl<B: Backend> Block<B> {
    fn forward(&self, (x, mask): Hidden<B>) -> Hidden<B> {
        let keep = mask.clone().float().unsqueeze_dim(1);
        (x.clone() + self.linear.forward(x).tanh() * keep, mask)
    }
}

#[derive(Module, Debug)]
struct Head<B: Backend> {
    linear: Linear<B>,
}
impl<B: Backend> Head<B> {
    fn forward(&self, (x, _mask): Hidden<B>) -> Tensor<B, 2> {
        self.linear.forward(x)
    }
}

burn_freeze::unit!(Embed<B>: Tensor<B, 2> => (Tensor<B, 2>, Tensor<B, 1, Bool>));
burn_freeze::unit!(Block<B>: (Tensor<B, 2>, Tensor<B, 1, Bool>) => (Tensor<B, 2>, Tensor<B, 1, Bool>));
burn_freeze::unit!(Head<B>: (Tensor<B, 2>, Tensor<B, 1, Bool>) => Tensor<B, 2>);

type Types = StackMarker<B, Embed<B>, Block<B>, Head<B>>;

fn input(device: &Device<B>) -> Tensor<B, 2> {
    let values: Vec<f32> = (0..24).map(|i| ((i * 7 % 11) as f32 - 5.0) / 5.0).collect();
    Tensor::from_data(TensorData::new(values, [6, 4]), device)
}

#[test]
fn a_tuple_splits_joins_and_crosses_autodiff() {
    let device = Default::default();
    let hidden: Hidden<B> = (
        input(&device),
        input(&device).sum_dim(1).flatten(0, 1).greater_elem(0.0),
    );
    assert_eq!(hidden.batch_size(), 6);
    let parts = hidden.clone().split_batch(&[2, 4]);
    assert_eq!((parts[0].0.dims(), parts[1].1.dims()), ([2, 4], [4]));
    let joined = <Hidden<B>>::cat_batch(parts);
    joined
        .1
        .clone()
        .into_data()
        .assert_eq(&hidden.1.clone().into_data(), true);
    let back = <Hidden<B>>::from_inner(hidden.clone().inner());
    back.0
        .into_data()
        .assert_eq(&hidden.0.clone().into_data(), true);

    // The float part takes the gradient; the mask comes back unchanged.
    let leaf = hidden.clone().require_grad();
    let loss = (leaf.0.clone() * 3.0).sum();
    let grads = loss.backward();
    let (grad, mask) = leaf.grad(&grads).expect("the states took part");
    grad.into_data().assert_eq(
        &Tensor::<Inner, 2>::full([6, 4], 3.0, &device).into_data(),
        true,
    );
    mask.into_data()
        .assert_eq(&hidden.1.clone().inner().into_data(), true);
    // The seed continues a backward pass: sum(states * grad).
    let seed = hidden.seed((Tensor::ones([6, 4], &device), hidden.1.clone().inner()));
    let expected = hidden.0.clone().sum().into_scalar();
    assert!((seed.into_scalar() - expected).abs() < 1e-5);

    // Cached as its two tensors and rebuilt.
    assert_eq!(hidden.shapes(), vec![vec![6, 4], vec![6]]);
    assert_eq!(hidden.num_bytes(), 6 * 4 * 4 + hidden.1.num_bytes());
    let rebuilt = <Hidden<B> as Cacheable<B>>::from_data(hidden.to_data_parts(), &device);
    rebuilt.0.into_data().assert_eq(&hidden.0.into_data(), true);
}

fn stack(device: &Device<B>) -> LayerStack<Types> {
    let linear = |seed: usize, i: usize, o: usize| {
        let values: Vec<f32> = (0..i * o)
            .map(|k| (((k + seed) * 13 % 17) as f32 - 8.0) / 16.0)
            .collect();
        let mut linear = LinearConfig::new(i, o).init(device);
        linear.weight =
            Param::from_tensor(Tensor::from_data(TensorData::new(values, [i, o]), device));
        linear.bias = Some(Param::from_tensor(Tensor::full(
            [o],
            0.01 * seed as f32,
            device,
        )));
        linear
    };
    let stack = LayerStack::new(
        Embed {
            linear: linear(0, 4, 4),
        },
        (1..4)
            .map(|s| Block {
                linear: linear(s, 4, 4),
            })
            .collect(),
        Head {
            linear: linear(9, 4, 3),
        },
    );
    stack.materialize();
    stack
}

#[test]
fn a_stack_of_tuple_activations_trains_frozen_as_whole() {
    let device = Default::default();
    let labels = Tensor::<B, 1, Int>::from_ints([0, 1, 2, 0, 1, 2], &device);
    let loss = |logits: Tensor<B, 2>| {
        burn::nn::loss::CrossEntropyLossConfig::new()
            .init(&device)
            .forward(logits, labels.clone())
    };
    // Units 0..2 frozen: the rest trains, the frozen prefix runs without a graph.
    let mut frozen = FreezableStack::new(stack(&device));
    frozen.freeze_to(2).unwrap();
    let mut adam = AdamConfig::new().init();
    for _ in 0..3 {
        let l = loss(frozen.forward(input(&device)));
        let grads = frozen.gradients(l.backward());
        frozen.map_trainable(|units| adam.step(1e-2, units, grads));
    }
    // The same steps on the whole model, the first two units' gradients
    // dropped: the same weights.
    let whole = stack(&device);
    let (first, middle, last) = whole.into_parts();
    let mut trainable = (middle[1..].to_vec(), last);
    let (first, block0) = (first, middle[0].clone());
    let mut adam = AdamConfig::new().init();
    for _ in 0..3 {
        let hidden = block0.forward(first.forward(input(&device)));
        let hidden = trainable.0.iter().fold(hidden, |h, b| b.forward(h));
        let l = loss(trainable.1.forward(hidden));
        let grads = GradientsParams::from_grads(l.backward(), &trainable);
        trainable = adam.step(1e-2, trainable, grads);
    }
    let out = frozen.forward(input(&device)).into_data();
    let hidden = block0.forward(first.forward(input(&device)));
    let hidden = trainable.0.iter().fold(hidden, |h, b| b.forward(h));
    out.assert_approx_eq::<f32>(
        &trainable.1.forward(hidden).into_data(),
        burn::tensor::Tolerance::absolute(1e-5),
    );
}
