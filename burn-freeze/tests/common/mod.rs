//! A small layer stack of the test's own (not one of the workspace's models),
//! and helpers shared by the tests.
#![allow(dead_code, unused_imports)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use burn::module::Module;
use burn::nn::{Dropout, DropoutConfig, Linear, LinearConfig};
use burn::prelude::*;
use burn::tensor::TensorPrimitive;
use burn::tensor::backend::AutodiffBackend;
use burn_freeze::testing::xorshift;
use burn_freeze::{InnerOf, LayerStack, StackMarker, Unit};

pub use burn_freeze::testing::{bit_identical, weights};

burn_freeze::test_backend!();

/// Unit 0: `[batch, tokens, input] -> [batch, tokens, hidden]`.
#[derive(Module, Debug)]
pub struct Embed<B: Backend> {
    pub linear: Linear<B>,
}

/// Middle unit: `x + dropout(tanh(linear(x)))`, counting the samples its
/// inner-backend forward sees.
#[derive(Module, Debug)]
pub struct Block<B: Backend> {
    pub linear: Linear<B>,
    dropout: Dropout,
    #[module(skip)]
    pub inner_samples: Arc<AtomicUsize>,
}

/// Last unit: mean over tokens, then a linear classifier.
#[derive(Module, Debug)]
pub struct Head<B: Backend> {
    pub linear: Linear<B>,
}

impl<B: Backend> Embed<B> {
    pub fn run(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        self.linear.forward(x)
    }
}

impl<B: Backend> Block<B> {
    pub fn run(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        x.clone() + self.dropout.forward(self.linear.forward(x).tanh())
    }
    pub fn inner_samples(&self) -> usize {
        self.inner_samples.load(Ordering::SeqCst)
    }
}

impl<B: Backend> Head<B> {
    pub fn run(&self, x: Tensor<B, 3>) -> Tensor<B, 2> {
        self.linear.forward(x.mean_dim(1).squeeze_dim(1))
    }
}

// Embed and Head: one forward for both backends, through the macro.
burn_freeze::unit!(Embed<B>: Tensor<B, 3> => Tensor<B, 3>, via run);
burn_freeze::unit!(Head<B>: Tensor<B, 3> => Tensor<B, 2>, via run);

// Block by hand: its frozen forward also counts the samples it sees.
impl<B: AutodiffBackend> Unit<B> for Block<B> {
    type Input = Tensor<B, 3>;
    type Output = Tensor<B, 3>;
    fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        self.run(x)
    }
    fn forward_inner(
        u: &Block<B::InnerBackend>,
        x: InnerOf<B, Tensor<B, 3>>,
    ) -> InnerOf<B, Tensor<B, 3>> {
        u.inner_samples.fetch_add(x.dims()[0], Ordering::SeqCst);
        u.run(x)
    }
}

pub type Types = StackMarker<B, Embed<B>, Block<B>, Head<B>>;
pub type Stack = LayerStack<Types>;

pub const INPUT: usize = 5;
pub const HIDDEN: usize = 16;
pub const CLASSES: usize = 3;

/// `blocks` middle units (so `blocks + 2` units), with dropout probability `dropout`.
pub fn stack(blocks: usize, dropout: f64, seed: u64) -> Stack {
    B::seed(&Default::default(), seed);
    let device = Default::default();
    let stack = LayerStack::new(
        Embed {
            linear: LinearConfig::new(INPUT, HIDDEN).init(&device),
        },
        (0..blocks)
            .map(|_| Block {
                linear: LinearConfig::new(HIDDEN, HIDDEN).init(&device),
                dropout: DropoutConfig::new(dropout).init(),
                inner_samples: Arc::new(AtomicUsize::new(0)),
            })
            .collect(),
        Head {
            linear: LinearConfig::new(HIDDEN, CLASSES).init(&device),
        },
    );
    // Burn initialises parameters lazily, on first use; do it now, in order, so
    // the weights follow from the seed and clones share them.
    weights::<B, _>(stack.first());
    stack.middle().iter().for_each(|u| drop(weights::<B, _>(u)));
    weights::<B, _>(stack.last());
    stack
}

/// Sample `id`'s input `[1, tokens, INPUT]` and label: a pure function of the id.
pub fn sample(id: u64, tokens: usize) -> (Vec<f32>, i64) {
    let mut state = id.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03;
    let mut values = Vec::with_capacity(tokens * INPUT);
    for _ in 0..tokens * INPUT {
        values.push(xorshift(&mut state) - 0.5);
    }
    let label = (values.iter().take(INPUT).sum::<f32>() > 0.0) as i64 + (id % 2) as i64;
    (values, label)
}

/// The batch of the given sample ids, `tokens` tokens each.
pub fn batch(ids: &[u64], tokens: usize) -> (Tensor<B, 3>, Tensor<B, 1, Int>) {
    let device = Default::default();
    let mut values = Vec::new();
    let mut labels = Vec::new();
    for &id in ids {
        let (v, l) = sample(id, tokens);
        values.extend(v);
        labels.push(l);
    }
    let x = Tensor::<B, 1>::from_data(
        TensorData::new(values, [ids.len() * tokens * INPUT]),
        &device,
    )
    .reshape([ids.len(), tokens, INPUT]);
    let y = Tensor::from_data(TensorData::new(labels, [ids.len()]), &device);
    (x, y)
}

/// Depth of the autodiff graph behind `tensor`: 0 for a leaf, else one more
/// than its deepest parent. Burn's graph of a chain of ops is as deep as the
/// chain is long, so this counts the recorded steps on the longest path.
pub fn graph_depth<const D: usize>(tensor: Tensor<B, D>) -> usize {
    match tensor.into_primitive() {
        TensorPrimitive::Float(t) => t.node.order,
        TensorPrimitive::QFloat(_) => unreachable!("float tensors only"),
    }
}
