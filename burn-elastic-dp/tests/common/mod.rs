//! What the trainer's test files share: the backend, a user's own residual
//! unit, and the loss.

#![allow(dead_code)] // each test binary uses a part

use burn::backend::Autodiff;
use burn::nn::Linear;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::prelude::*;
use burn_freeze::StackMarker;

/// The backend the tests run on: Flex, or LibTorch on the CPU with the
/// `test-tch` feature (`.ci/tch`).
#[cfg(not(feature = "test-tch"))]
pub type Inner = burn::backend::Flex;
#[cfg(feature = "test-tch")]
pub type Inner = burn::backend::LibTorch;
pub type B = Autodiff<Inner>;

/// A user's own unit: a residual block (the last one is the classifier, as
/// wide as the blocks so that every unit costs the same).
#[derive(Module, Debug)]
pub struct Block<B: Backend> {
    pub linear: Linear<B>,
}

impl<B: Backend> Block<B> {
    pub fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        x.clone() + self.linear.forward(x).tanh()
    }
}

burn_freeze::unit!(Block<B>: Tensor<B, 2> => Tensor<B, 2>);

/// A stack of blocks only.
pub type Types = StackMarker<B, Block<B>, Block<B>, Block<B>>;

pub fn loss(logits: Tensor<B, 2>, labels: Tensor<B, 1, Int>) -> Tensor<B, 1> {
    CrossEntropyLossConfig::new()
        .init(&logits.device())
        .forward(logits, labels)
}
