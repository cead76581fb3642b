//! WordPiece tokenization for BERT with the `tokenizers` crate, from a checkpoint's
//! `tokenizer.json`: batches padded (or truncated) to a common length, with attention masks.

use std::path::{Path, PathBuf};
use std::str::FromStr;

use burn::prelude::*;
use tokenizers::{
    PaddingDirection, PaddingParams, PaddingStrategy, Tokenizer, TruncationDirection,
    TruncationParams, TruncationStrategy,
};

use crate::bert::BertInput;

/// Why tokenization failed.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// `tokenizer.json` is missing or not a valid tokenizer.
    #[error("cannot load tokenizer {path}: {message}")]
    Load {
        /// The file.
        path: PathBuf,
        /// The underlying error, in words.
        message: String,
    },
    /// A tokenizer built in memory is invalid.
    #[error("invalid tokenizer: {0}")]
    Invalid(String),
    /// A special token the batches need is not in the vocabulary.
    #[error("the vocabulary has no `{0}` token")]
    MissingToken(String),
    /// Encoding a batch failed.
    #[error("cannot encode the batch: {0}")]
    Encode(String),
}

/// How a batch is padded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Padding {
    /// To the longest sequence of the batch.
    Longest,
    /// To exactly this many tokens (sequences must not be longer: set a
    /// maximum length too).
    Fixed(usize),
}

/// A batch of encoded texts, all of one length.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EncodedBatch {
    /// Token ids, with `[CLS]` and `[SEP]`, padded.
    pub ids: Vec<Vec<u32>>,
    /// Segment ids.
    pub type_ids: Vec<Vec<u32>>,
    /// 1 for real tokens, 0 for padding.
    pub attention_mask: Vec<Vec<u32>>,
}

impl EncodedBatch {
    /// Number of texts.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// Whether the batch is empty.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// Common length of the sequences.
    pub fn seq_len(&self) -> usize {
        self.ids.first().map_or(0, Vec::len)
    }

    /// The batch as BERT's input on `device`.
    ///
    /// # Panics
    /// When the batch is empty.
    pub fn to_input<B: Backend>(&self, device: &B::Device) -> BertInput<B> {
        assert!(
            !self.is_empty(),
            "cannot make a BERT input of an empty batch"
        );
        let [batch, seq] = [self.len(), self.seq_len()];
        let flat = |rows: &[Vec<u32>]| -> Vec<i64> {
            rows.iter()
                .flatten()
                .map(|&value| i64::from(value))
                .collect()
        };
        let int = |rows: &[Vec<u32>]| {
            Tensor::<B, 1, Int>::from_data(TensorData::new(flat(rows), [batch * seq]), device)
                .reshape([batch, seq])
        };
        let padding: Vec<bool> = self
            .attention_mask
            .iter()
            .flatten()
            .map(|&m| m == 0)
            .collect();
        BertInput {
            tokens: int(&self.ids),
            token_types: int(&self.type_ids),
            padding: Tensor::<B, 1, Bool>::from_data(
                TensorData::new(padding, [batch * seq]),
                device,
            )
            .reshape([batch, seq]),
        }
    }
}

/// A BERT WordPiece tokenizer that always returns rectangular batches.
///
/// Loaded from a checkpoint's `tokenizer.json`, it keeps that file's padding
/// and truncation (all-MiniLM-L6-v2's: pad and truncate to 128); without
/// padding in the file it pads to the longest sequence of each batch.
///
/// ```
/// use burn::backend::Flex;
/// use pipetransformer_models::tokenizer::{Padding, WordPieceTokenizer};
///
/// let vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "the", "movie", "was", "great", "##ly", "fun", "."];
/// let tokenizer = WordPieceTokenizer::from_vocab(&vocab)?.with_padding(Padding::Longest);
/// let batch = tokenizer.encode_batch(&["The movie was greatly fun.", "Fun!"])?;
/// assert_eq!(batch.ids[0], vec![2, 4, 5, 6, 7, 8, 9, 10, 3]);
/// assert_eq!(batch.ids[1], vec![2, 9, 1, 3, 0, 0, 0, 0, 0]); // "!" is unknown
/// assert_eq!(batch.attention_mask[1], vec![1, 1, 1, 1, 0, 0, 0, 0, 0]);
/// let input = batch.to_input::<Flex>(&Default::default());
/// assert_eq!(input.tokens.dims(), [2, 9]);
/// # Ok::<(), pipetransformer_models::tokenizer::TokenizerError>(())
/// ```
#[derive(Debug, Clone)]
pub struct WordPieceTokenizer {
    inner: Tokenizer,
}

impl WordPieceTokenizer {
    /// Loads a `tokenizer.json` (from a Hugging Face checkpoint directory).
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, TokenizerError> {
        let path = path.as_ref();
        let inner = Tokenizer::from_file(path).map_err(|error| TokenizerError::Load {
            path: path.to_path_buf(),
            message: error.to_string(),
        })?;
        Self::new(inner)
    }

    /// A BERT-uncased tokenizer (lower-casing normaliser, BERT
    /// pre-tokenizer, WordPiece, `[CLS] text [SEP]`) over `vocab`, whose
    /// position is the id; it must hold `[PAD]`, `[UNK]`, `[CLS]` and `[SEP]`.
    pub fn from_vocab(vocab: &[&str]) -> Result<Self, TokenizerError> {
        let id = |token: &str| {
            vocab
                .iter()
                .position(|t| *t == token)
                .ok_or_else(|| TokenizerError::MissingToken(token.into()))
        };
        let (pad, cls, sep) = (id("[PAD]")?, id("[CLS]")?, id("[SEP]")?);
        id("[UNK]")?;
        let special = |token: &str, id: usize| {
            serde_json::json!({"id": id, "content": token, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": true})
        };
        let vocab_map: serde_json::Map<String, serde_json::Value> = vocab
            .iter()
            .enumerate()
            .map(|(i, token)| (token.to_string(), i.into()))
            .collect();
        let json = serde_json::json!({
            "version": "1.0",
            "truncation": null,
            "padding": null,
            "added_tokens": [special("[PAD]", pad), special("[UNK]", id("[UNK]")?),
                special("[CLS]", cls), special("[SEP]", sep)],
            "normalizer": {"type": "BertNormalizer", "clean_text": true,
                "handle_chinese_chars": true, "strip_accents": null, "lowercase": true},
            "pre_tokenizer": {"type": "BertPreTokenizer"},
            "post_processor": {"type": "TemplateProcessing",
                "single": [{"SpecialToken": {"id": "[CLS]", "type_id": 0}},
                    {"Sequence": {"id": "A", "type_id": 0}},
                    {"SpecialToken": {"id": "[SEP]", "type_id": 0}}],
                "pair": [{"SpecialToken": {"id": "[CLS]", "type_id": 0}},
                    {"Sequence": {"id": "A", "type_id": 0}},
                    {"SpecialToken": {"id": "[SEP]", "type_id": 0}},
                    {"Sequence": {"id": "B", "type_id": 1}},
                    {"SpecialToken": {"id": "[SEP]", "type_id": 1}}],
                "special_tokens": {
                    "[CLS]": {"id": "[CLS]", "ids": [cls], "tokens": ["[CLS]"]},
                    "[SEP]": {"id": "[SEP]", "ids": [sep], "tokens": ["[SEP]"]}}},
            "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": true},
            "model": {"type": "WordPiece", "unk_token": "[UNK]",
                "continuing_subword_prefix": "##", "max_input_chars_per_word": 100,
                "vocab": vocab_map}
        });
        let inner = Tokenizer::from_str(&json.to_string())
            .map_err(|error| TokenizerError::Invalid(error.to_string()))?;
        Self::new(inner)
    }

    fn new(mut inner: Tokenizer) -> Result<Self, TokenizerError> {
        if inner.get_padding().is_none() {
            let pad_id = inner
                .token_to_id("[PAD]")
                .ok_or_else(|| TokenizerError::MissingToken("[PAD]".into()))?;
            inner.with_padding(Some(PaddingParams {
                strategy: PaddingStrategy::BatchLongest,
                direction: PaddingDirection::Right,
                pad_to_multiple_of: None,
                pad_id,
                pad_type_id: 0,
                pad_token: "[PAD]".into(),
            }));
        }
        Ok(Self { inner })
    }

    /// Truncates every sequence to at most `max_length` tokens, `[CLS]` and
    /// `[SEP]` included.
    ///
    /// # Panics
    /// When `max_length` is below 2 (no room for `[CLS]` and `[SEP]`).
    pub fn with_max_length(mut self, max_length: usize) -> Self {
        assert!(
            max_length >= 2,
            "a maximum length below 2 leaves no room for [CLS] and [SEP]"
        );
        self.inner
            .with_truncation(Some(TruncationParams {
                direction: TruncationDirection::Right,
                max_length,
                strategy: TruncationStrategy::LongestFirst,
                stride: 0,
            }))
            .expect("a stride of 0 is valid for any maximum length");
        self
    }

    /// Sets how batches are padded.
    pub fn with_padding(mut self, padding: Padding) -> Self {
        let strategy = match padding {
            Padding::Longest => PaddingStrategy::BatchLongest,
            Padding::Fixed(length) => PaddingStrategy::Fixed(length),
        };
        if let Some(params) = self.inner.get_padding_mut() {
            params.strategy = strategy;
        }
        self
    }

    /// The maximum sequence length, when sequences are truncated.
    pub fn max_length(&self) -> Option<usize> {
        self.inner.get_truncation().map(|t| t.max_length)
    }

    /// Id of the padding token.
    pub fn pad_id(&self) -> u32 {
        self.inner.get_padding().map_or(0, |p| p.pad_id)
    }

    /// Vocabulary size, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// The `tokenizers` tokenizer underneath.
    pub fn inner(&self) -> &Tokenizer {
        &self.inner
    }

    /// Encodes single sentences, with `[CLS]` and `[SEP]`, into one padded batch.
    pub fn encode_batch(&self, texts: &[&str]) -> Result<EncodedBatch, TokenizerError> {
        let encodings = self
            .inner
            .encode_batch(texts.to_vec(), true)
            .map_err(|error| TokenizerError::Encode(error.to_string()))?;
        let mut batch = EncodedBatch {
            ids: Vec::with_capacity(texts.len()),
            type_ids: Vec::with_capacity(texts.len()),
            attention_mask: Vec::with_capacity(texts.len()),
        };
        for encoding in &encodings {
            batch.ids.push(encoding.get_ids().to_vec());
            batch.type_ids.push(encoding.get_type_ids().to_vec());
            batch
                .attention_mask
                .push(encoding.get_attention_mask().to_vec());
        }
        if let Some(length) = batch
            .ids
            .iter()
            .map(Vec::len)
            .find(|&l| l != batch.seq_len())
        {
            return Err(TokenizerError::Encode(format!(
                "sequences of {} and {length} tokens in one batch: a fixed padding shorter than a \
                 sequence needs a maximum length as well",
                batch.seq_len()
            )));
        }
        Ok(batch)
    }
}
