//! The position-wise feed-forward network of a transformer block.

use burn::nn::{Dropout, DropoutConfig, Gelu, Linear, LinearConfig};
use burn::prelude::*;

/// `dropout(fc2(gelu(fc1(x))))`: the MLP of a transformer block, without its
/// residual connection or norm (the units around it add those).
#[derive(Module, Debug)]
pub struct FeedForward<B: Backend> {
    /// Hidden to intermediate size.
    pub fc1: Linear<B>,
    /// Intermediate to hidden size.
    pub fc2: Linear<B>,
    gelu: Gelu,
    dropout: Dropout,
}

impl<B: Backend> FeedForward<B> {
    /// A feed-forward network `hidden -> intermediate -> hidden`.
    pub fn new(hidden: usize, intermediate: usize, dropout: f64, device: &B::Device) -> Self {
        Self {
            fc1: LinearConfig::new(hidden, intermediate).init(device),
            fc2: LinearConfig::new(intermediate, hidden).init(device),
            gelu: Gelu::new(),
            dropout: DropoutConfig::new(dropout).init(),
        }
    }

    /// Applies the network to `[batch, tokens, hidden]`.
    pub fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        let x = self.gelu.forward(self.fc1.forward(x));
        self.dropout.forward(self.fc2.forward(x))
    }
}
