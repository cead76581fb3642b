//! The BERT classifier and its split into partition units.

use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;
use burn_freeze::{IntoLayerStack, LayerStack, StackError, StackMarker};

use super::activation::{BertHidden, BertInput};
use super::config::BertConfig;
use super::units::{BertEmbeddings, BertHead, BertUnit, PostNormAttention, PostNormFeedForward};

/// One post-norm transformer block: an attention unit then a feed-forward unit.
#[derive(Module, Debug)]
pub struct BertBlock<B: Backend> {
    /// Attention sub-layer.
    pub attention: PostNormAttention<B>,
    /// Feed-forward sub-layer.
    pub feed_forward: PostNormFeedForward<B>,
}

/// BERT sequence classifier (Devlin et al., 2019).
///
/// As a layer stack it has `2 * layers + 2` units: the embeddings, an attention
/// and a feed-forward unit per block, and the head (pooler and classifier).
///
/// ```
/// use burn::backend::{Autodiff, Flex};
/// use burn_freeze::IntoLayerStack;
/// use pipetransformer_models::bert::{BertConfig, BertInput};
///
/// type B = Autodiff<Flex>;
/// let device = Default::default();
/// let bert = BertConfig::tiny(3).init::<B>(&device);
/// let input = BertInput::from_token_ids(&[vec![1, 5, 9], vec![1, 4]], 0, &device);
/// assert_eq!(bert.forward(input.clone()).dims(), [2, 3]);
/// assert_eq!(bert.into_layer_stack().forward(input).dims(), [2, 3]);
/// ```
#[derive(Module, Debug)]
pub struct Bert<B: Backend> {
    /// Unit 0.
    pub embeddings: BertEmbeddings<B>,
    /// Transformer blocks.
    pub blocks: Vec<BertBlock<B>>,
    /// Pooler and classifier.
    pub head: BertHead<B>,
}

impl<B: Backend> Bert<B> {
    pub(crate) fn new(config: &BertConfig, device: &B::Device) -> Self {
        Self {
            embeddings: BertEmbeddings::new(config, device),
            blocks: (0..config.layers)
                .map(|_| BertBlock {
                    attention: PostNormAttention::new(config, device),
                    feed_forward: PostNormFeedForward::new(config, device),
                })
                .collect(),
            head: BertHead::new(config, device),
        }
    }

    /// Final hidden states `[batch, seq, hidden]` with the padding mask.
    pub fn encode(&self, input: BertInput<B>) -> BertHidden<B> {
        let mut x = self.embeddings.forward(input);
        for block in &self.blocks {
            x = block.feed_forward.forward(block.attention.forward(x));
        }
        x
    }

    /// Class logits `[batch, classes]`.
    pub fn forward(&self, input: BertInput<B>) -> Tensor<B, 2> {
        self.head.forward(self.encode(input))
    }
}

/// The types of BERT's layer stack: embeddings, then attention and
/// feed-forward units, then the pooler and classifier.
pub type BertTypes<B> = StackMarker<B, BertEmbeddings<B>, BertUnit<B>, BertHead<B>>;

impl<B: AutodiffBackend> IntoLayerStack for Bert<B> {
    type Types = BertTypes<B>;

    fn into_layer_stack(self) -> LayerStack<BertTypes<B>> {
        let middle = self
            .blocks
            .into_iter()
            .flat_map(|block| {
                [
                    BertUnit::Attention(block.attention),
                    BertUnit::FeedForward(block.feed_forward),
                ]
            })
            .collect();
        LayerStack::new(self.embeddings, middle, self.head)
    }

    fn from_layer_stack(stack: LayerStack<BertTypes<B>>) -> Result<Self, StackError> {
        let found = stack.num_units();
        let (embeddings, middle, head) = stack.into_parts();
        if middle.len() % 2 != 0 {
            return Err(StackError::WrongLength {
                found,
                expected_description: "2 * layers + 2 units".into(),
            });
        }
        let mut blocks = Vec::with_capacity(middle.len() / 2);
        let mut units = middle.into_iter();
        let mut index = 1;
        while let (Some(first), Some(second)) = (units.next(), units.next()) {
            match (first, second) {
                (BertUnit::Attention(attention), BertUnit::FeedForward(feed_forward)) => blocks
                    .push(BertBlock {
                        attention,
                        feed_forward,
                    }),
                (BertUnit::Attention(_), other) => {
                    return Err(StackError::UnexpectedUnit {
                        index: index + 1,
                        expected: "feed-forward",
                        found: other.kind(),
                    });
                }
                (other, _) => {
                    return Err(StackError::UnexpectedUnit {
                        index,
                        expected: "attention",
                        found: other.kind(),
                    });
                }
            }
            index += 2;
        }
        Ok(Self {
            embeddings,
            blocks,
            head,
        })
    }
}

impl BertConfig {
    /// Builds the model with freshly initialised weights.
    ///
    /// # Panics
    /// When [`validate`](BertConfig::validate) fails.
    pub fn init<B: Backend>(&self, device: &B::Device) -> Bert<B> {
        if let Err(reason) = self.validate() {
            panic!("invalid BERT configuration: {reason}");
        }
        Bert::new(self, device)
    }
}
