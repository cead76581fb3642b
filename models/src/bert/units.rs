//! BERT's partition units: embeddings, post-norm attention, post-norm
//! feed-forward, and the pooler with the classifier.

use burn::nn::attention::{MhaInput, MultiHeadAttention, MultiHeadAttentionConfig};
use burn::nn::{
    Dropout, DropoutConfig, Embedding, EmbeddingConfig, LayerNorm, LayerNormConfig, Linear,
    LinearConfig,
};
use burn::prelude::*;

use super::activation::{BertHidden, BertInput};
use super::config::BertConfig;
use super::pooling::BertPooling;
use crate::feed_forward::FeedForward;

fn layer_norm<B: Backend>(config: &BertConfig, device: &B::Device) -> LayerNorm<B> {
    LayerNormConfig::new(config.hidden)
        .with_epsilon(config.layer_norm_eps)
        .init(device)
}

/// Unit 0: word, position and token-type embeddings, summed and normalised.
#[derive(Module, Debug)]
pub struct BertEmbeddings<B: Backend> {
    /// Word-piece embeddings.
    pub words: Embedding<B>,
    /// Learned absolute positions.
    pub positions: Embedding<B>,
    /// Segment embeddings.
    pub token_types: Embedding<B>,
    /// Norm of the sum.
    pub norm: LayerNorm<B>,
    dropout: Dropout,
}

impl<B: Backend> BertEmbeddings<B> {
    pub(crate) fn new(config: &BertConfig, device: &B::Device) -> Self {
        Self {
            words: EmbeddingConfig::new(config.vocab_size, config.hidden).init(device),
            positions: EmbeddingConfig::new(config.max_position, config.hidden).init(device),
            token_types: EmbeddingConfig::new(config.type_vocab_size, config.hidden).init(device),
            norm: layer_norm(config, device),
            dropout: DropoutConfig::new(config.dropout).init(),
        }
    }

    /// Embeds a batch of token sequences.
    ///
    /// # Panics
    /// When the sequences are longer than the position embeddings.
    pub fn forward(&self, input: BertInput<B>) -> BertHidden<B> {
        let [batch, seq] = input.tokens.dims();
        let [max_position, _] = self.positions.weight.dims();
        assert!(
            seq <= max_position,
            "BERT input of {seq} tokens is longer than the {max_position} positions the model has"
        );
        let device = input.tokens.device();
        let positions = Tensor::<B, 1, Int>::arange(0..seq as i64, &device)
            .reshape([1, seq])
            .repeat_dim(0, batch);
        let states = self.words.forward(input.tokens)
            + self.positions.forward(positions)
            + self.token_types.forward(input.token_types);
        BertHidden {
            states: self.dropout.forward(self.norm.forward(states)),
            padding: input.padding,
        }
    }
}

/// Post-norm attention sub-layer: `norm(x + dropout(attention(x)))`, with
/// padded positions masked out as keys.
#[derive(Module, Debug)]
pub struct PostNormAttention<B: Backend> {
    /// Multi-head self-attention.
    pub attention: MultiHeadAttention<B>,
    /// Norm after the residual sum.
    pub norm: LayerNorm<B>,
    dropout: Dropout,
}

impl<B: Backend> PostNormAttention<B> {
    pub(crate) fn new(config: &BertConfig, device: &B::Device) -> Self {
        Self {
            attention: MultiHeadAttentionConfig::new(config.hidden, config.heads)
                .with_dropout(config.dropout)
                .init(device),
            norm: layer_norm(config, device),
            dropout: DropoutConfig::new(config.dropout).init(),
        }
    }

    /// `[batch, seq, hidden] -> [batch, seq, hidden]`.
    pub fn forward(&self, x: BertHidden<B>) -> BertHidden<B> {
        let input = MhaInput::self_attn(x.states.clone()).mask_pad(x.padding.clone());
        let attended = self.attention.forward(input).context;
        BertHidden {
            states: self.norm.forward(x.states + self.dropout.forward(attended)),
            padding: x.padding,
        }
    }
}

/// Post-norm feed-forward sub-layer: `norm(x + feed_forward(x))`.
#[derive(Module, Debug)]
pub struct PostNormFeedForward<B: Backend> {
    /// Intermediate and output projections.
    pub feed_forward: FeedForward<B>,
    /// Norm after the residual sum.
    pub norm: LayerNorm<B>,
}

impl<B: Backend> PostNormFeedForward<B> {
    pub(crate) fn new(config: &BertConfig, device: &B::Device) -> Self {
        Self {
            feed_forward: FeedForward::new(
                config.hidden,
                config.intermediate,
                config.dropout,
                device,
            ),
            norm: layer_norm(config, device),
        }
    }

    /// `[batch, seq, hidden] -> [batch, seq, hidden]`.
    pub fn forward(&self, x: BertHidden<B>) -> BertHidden<B> {
        let out = self.feed_forward.forward(x.states.clone());
        BertHidden {
            states: self.norm.forward(x.states + out),
            padding: x.padding,
        }
    }
}

/// Last unit: the pooler (`tanh` of a linear map of the first token's state,
/// or the mean over real tokens, see [`BertPooling`]) and a linear
/// classifier. `[batch, seq, hidden] -> [batch, classes]`.
#[derive(Module, Debug)]
pub struct BertHead<B: Backend> {
    /// Pooler projection (used with [`BertPooling::Cls`]).
    pub pooler: Linear<B>,
    /// Classifier on the pooled state.
    pub classifier: Linear<B>,
    dropout: Dropout,
    #[module(skip)]
    pooling: BertPooling,
}

impl<B: Backend> BertHead<B> {
    pub(crate) fn new(config: &BertConfig, device: &B::Device) -> Self {
        Self {
            pooler: LinearConfig::new(config.hidden, config.hidden).init(device),
            classifier: LinearConfig::new(config.hidden, config.num_classes).init(device),
            dropout: DropoutConfig::new(config.dropout).init(),
            pooling: config.pooling,
        }
    }

    /// How this head pools.
    pub fn pooling(&self) -> BertPooling {
        self.pooling
    }

    /// The pooled state, `[batch, hidden]`: the pooler on the first token's
    /// state, or the mean over the real tokens.
    pub fn pool(&self, x: &BertHidden<B>) -> Tensor<B, 2> {
        match self.pooling {
            BertPooling::Cls => {
                let [batch, _, hidden] = x.states.dims();
                let first = x.states.clone().narrow(1, 0, 1).reshape([batch, hidden]);
                self.pooler.forward(first).tanh()
            }
            BertPooling::Mean => x.mean_pool(),
        }
    }

    /// Class logits.
    pub fn forward(&self, x: BertHidden<B>) -> Tensor<B, 2> {
        self.classifier.forward(self.dropout.forward(self.pool(&x)))
    }
}

/// A middle unit of BERT's layer stack.
#[derive(Module, Debug)]
pub enum BertUnit<B: Backend> {
    /// Attention sub-layer of a block.
    Attention(PostNormAttention<B>),
    /// Feed-forward sub-layer of a block.
    FeedForward(PostNormFeedForward<B>),
}

impl<B: Backend> BertUnit<B> {
    /// `[batch, seq, hidden] -> [batch, seq, hidden]`.
    pub fn forward(&self, x: BertHidden<B>) -> BertHidden<B> {
        match self {
            Self::Attention(unit) => unit.forward(x),
            Self::FeedForward(unit) => unit.forward(x),
        }
    }

    /// What kind of unit this is, in words.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Attention(_) => "attention",
            Self::FeedForward(_) => "feed-forward",
        }
    }
}

// One forward per unit, for training and for frozen execution.
burn_freeze::unit!(BertEmbeddings<B>: BertInput<B> => BertHidden<B>);
burn_freeze::unit!(BertUnit<B>: BertHidden<B> => BertHidden<B>);
burn_freeze::unit!(BertHead<B>: BertHidden<B> => Tensor<B, 2>);
