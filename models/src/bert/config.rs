//! BERT hyper-parameters and presets.

use burn::prelude::*;

use super::pooling::BertPooling;

/// Configuration of a BERT sequence classifier.
///
/// ```
/// use pipetransformer_models::bert::BertConfig;
///
/// let config = BertConfig::minilm_l6_h384(2);
/// assert_eq!((config.layers, config.hidden, config.heads), (6, 384, 12));
/// assert_eq!(config.num_units(), 14);
/// ```
#[derive(Config, Debug, PartialEq)]
pub struct BertConfig {
    /// Size of the word-piece vocabulary.
    #[config(default = 30522)]
    pub vocab_size: usize,
    /// Width of the hidden state.
    #[config(default = 768)]
    pub hidden: usize,
    /// Number of transformer blocks.
    #[config(default = 12)]
    pub layers: usize,
    /// Attention heads per block.
    #[config(default = 12)]
    pub heads: usize,
    /// Width of the feed-forward intermediate layer.
    #[config(default = 3072)]
    pub intermediate: usize,
    /// Longest sequence the position embeddings cover.
    #[config(default = 512)]
    pub max_position: usize,
    /// Number of token types (segments).
    #[config(default = 2)]
    pub type_vocab_size: usize,
    /// Number of output classes of the classification head.
    #[config(default = 2)]
    pub num_classes: usize,
    /// Dropout probability in embeddings, attention, feed-forward and head.
    #[config(default = 0.1)]
    pub dropout: f64,
    /// Epsilon of every layer norm.
    #[config(default = 1e-12)]
    pub layer_norm_eps: f64,
    /// How the head summarises the sequence: BERT's [CLS] pooler (default) or
    /// the mean over real tokens.
    #[config(default = "BertPooling::Cls")]
    pub pooling: BertPooling,
}

impl BertConfig {
    /// BERT-base: 12 blocks of width 768, 12 heads (109.5M parameters without the classifier).
    pub fn base(num_classes: usize) -> Self {
        Self::new().with_num_classes(num_classes)
    }

    /// MiniLM-L6-H384 (the shape of all-MiniLM-L6-v2): 6 blocks of width 384,
    /// 12 heads, intermediate 1536.
    pub fn minilm_l6_h384(num_classes: usize) -> Self {
        Self::new()
            .with_hidden(384)
            .with_layers(6)
            .with_heads(12)
            .with_intermediate(1536)
            .with_num_classes(num_classes)
    }

    /// A tiny BERT for tests and CPU runs: vocabulary 64, 2 blocks of width 32, 4 heads.
    pub fn tiny(num_classes: usize) -> Self {
        Self::new()
            .with_vocab_size(64)
            .with_hidden(32)
            .with_layers(2)
            .with_heads(4)
            .with_intermediate(64)
            .with_max_position(64)
            .with_num_classes(num_classes)
            .with_dropout(0.0)
    }

    /// Number of partition units: embeddings, (attention, feed-forward) per block, head.
    pub fn num_units(&self) -> usize {
        2 * self.layers + 2
    }

    /// Checks that the hyper-parameters fit together.
    pub fn validate(&self) -> Result<(), String> {
        if self.heads == 0 || !self.hidden.is_multiple_of(self.heads) {
            return Err(format!(
                "hidden {} is not a multiple of heads {}",
                self.hidden, self.heads
            ));
        }
        if self.vocab_size == 0 || self.max_position == 0 || self.type_vocab_size == 0 {
            return Err("vocab_size, max_position and type_vocab_size must be at least 1".into());
        }
        if self.num_classes == 0 {
            return Err("num_classes must be at least 1".into());
        }
        Ok(())
    }
}
