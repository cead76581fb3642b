//! ViT's partition units: patch embedding, pre-norm attention, pre-norm MLP,
//! final norm and classification head.

use burn::module::{Initializer, Param};
use burn::nn::attention::{MhaInput, MultiHeadAttention, MultiHeadAttentionConfig};
use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::nn::{Dropout, DropoutConfig, LayerNorm, LayerNormConfig, Linear, LinearConfig};
use burn::prelude::*;

use super::config::VitConfig;
use crate::feed_forward::FeedForward;

/// Unit 0: cuts an image into patches, projects them, prepends the class token
/// and adds learned positions. `[batch, channels, size, size] -> [batch, 1 + patches, hidden]`.
#[derive(Module, Debug)]
pub struct PatchEmbedding<B: Backend> {
    /// Patch projection (a convolution with stride = kernel = patch size).
    pub projection: Conv2d<B>,
    /// Learned class token, `[1, 1, hidden]`.
    pub class_token: Param<Tensor<B, 3>>,
    /// Learned position embeddings, `[1, 1 + patches, hidden]`.
    pub positions: Param<Tensor<B, 3>>,
    dropout: Dropout,
}

impl<B: Backend> PatchEmbedding<B> {
    pub(crate) fn new(config: &VitConfig, device: &B::Device) -> Self {
        let normal = Initializer::Normal {
            mean: 0.0,
            std: 0.02,
        };
        Self {
            projection: Conv2dConfig::new(
                [config.channels, config.hidden],
                [config.patch_size, config.patch_size],
            )
            .with_stride([config.patch_size, config.patch_size])
            .init(device),
            class_token: normal.init([1, 1, config.hidden], device),
            positions: normal.init([1, 1 + config.num_patches(), config.hidden], device),
            dropout: DropoutConfig::new(config.dropout).init(),
        }
    }

    /// Embeds a batch of images.
    ///
    /// # Panics
    /// When the images do not have the configured channels and size.
    pub fn forward(&self, images: Tensor<B, 4>) -> Tensor<B, 3> {
        let patches = self.projection.forward(images);
        let [batch, hidden, rows, cols] = patches.dims();
        let [_, tokens, _] = self.positions.dims();
        assert_eq!(
            rows * cols + 1,
            tokens,
            "ViT input has {} patches, the model was built for {}",
            rows * cols,
            tokens - 1
        );
        let patches = patches
            .reshape([batch, hidden, rows * cols])
            .swap_dims(1, 2);
        let class_token = self.class_token.val().repeat_dim(0, batch);
        let x = Tensor::cat(vec![class_token, patches], 1) + self.positions.val();
        self.dropout.forward(x)
    }
}

/// Pre-norm attention sub-layer: `x + dropout(attention(norm(x)))`.
#[derive(Module, Debug)]
pub struct PreNormAttention<B: Backend> {
    /// Norm before attention.
    pub norm: LayerNorm<B>,
    /// Multi-head self-attention.
    pub attention: MultiHeadAttention<B>,
    dropout: Dropout,
}

impl<B: Backend> PreNormAttention<B> {
    pub(crate) fn new(config: &VitConfig, device: &B::Device) -> Self {
        Self {
            norm: LayerNormConfig::new(config.hidden)
                .with_epsilon(config.layer_norm_eps)
                .init(device),
            attention: MultiHeadAttentionConfig::new(config.hidden, config.heads)
                .with_dropout(config.dropout)
                .init(device),
            dropout: DropoutConfig::new(config.dropout).init(),
        }
    }

    /// `[batch, tokens, hidden] -> [batch, tokens, hidden]`.
    pub fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        let normed = self.norm.forward(x.clone());
        let attended = self.attention.forward(MhaInput::self_attn(normed)).context;
        x + self.dropout.forward(attended)
    }
}

/// Pre-norm MLP sub-layer: `x + mlp(norm(x))`.
#[derive(Module, Debug)]
pub struct PreNormMlp<B: Backend> {
    /// Norm before the MLP.
    pub norm: LayerNorm<B>,
    /// The MLP.
    pub mlp: FeedForward<B>,
}

impl<B: Backend> PreNormMlp<B> {
    pub(crate) fn new(config: &VitConfig, device: &B::Device) -> Self {
        Self {
            norm: LayerNormConfig::new(config.hidden)
                .with_epsilon(config.layer_norm_eps)
                .init(device),
            mlp: FeedForward::new(config.hidden, config.mlp_dim, config.dropout, device),
        }
    }

    /// `[batch, tokens, hidden] -> [batch, tokens, hidden]`.
    pub fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        x.clone() + self.mlp.forward(self.norm.forward(x))
    }
}

/// Last unit: the class token's final state through a linear classifier.
/// `[batch, tokens, hidden] -> [batch, classes]`.
#[derive(Module, Debug)]
pub struct VitHead<B: Backend> {
    /// Linear classifier.
    pub linear: Linear<B>,
}

impl<B: Backend> VitHead<B> {
    pub(crate) fn new(config: &VitConfig, device: &B::Device) -> Self {
        Self {
            linear: LinearConfig::new(config.hidden, config.num_classes).init(device),
        }
    }

    /// Logits from the class token.
    pub fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 2> {
        let [batch, _, hidden] = x.dims();
        let class_token = x.narrow(1, 0, 1).reshape([batch, hidden]);
        self.linear.forward(class_token)
    }
}

/// A middle unit of ViT's layer stack.
#[derive(Module, Debug)]
pub enum VitUnit<B: Backend> {
    /// Attention sub-layer of a block.
    Attention(PreNormAttention<B>),
    /// MLP sub-layer of a block.
    Mlp(PreNormMlp<B>),
    /// Norm after the last block.
    Norm(LayerNorm<B>),
}

impl<B: Backend> VitUnit<B> {
    /// `[batch, tokens, hidden] -> [batch, tokens, hidden]`.
    pub fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        match self {
            Self::Attention(unit) => unit.forward(x),
            Self::Mlp(unit) => unit.forward(x),
            Self::Norm(norm) => norm.forward(x),
        }
    }

    /// What kind of unit this is, in words.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Attention(_) => "attention",
            Self::Mlp(_) => "mlp",
            Self::Norm(_) => "norm",
        }
    }
}

// One forward per unit, for training and for frozen execution.
burn_freeze::unit!(PatchEmbedding<B>: Tensor<B, 4> => Tensor<B, 3>);
burn_freeze::unit!(VitUnit<B>: Tensor<B, 3> => Tensor<B, 3>);
burn_freeze::unit!(VitHead<B>: Tensor<B, 3> => Tensor<B, 2>);
