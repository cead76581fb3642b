//! What enters BERT and what flows between its units.

use burn::prelude::*;

/// A batch of token sequences: BERT's input, and its first unit's.
#[derive(Debug, Clone)]
pub struct BertInput<B: Backend> {
    /// Word-piece ids, `[batch, seq]`.
    pub tokens: Tensor<B, 2, Int>,
    /// Segment ids, `[batch, seq]`.
    pub token_types: Tensor<B, 2, Int>,
    /// `true` where a position is padding, `[batch, seq]`.
    pub padding: Tensor<B, 2, Bool>,
}

impl<B: Backend> BertInput<B> {
    /// Pads sequences of token ids with `pad_id` to the longest one; every
    /// token is of segment 0.
    ///
    /// ```
    /// use burn::backend::Flex;
    /// use pipetransformer_models::bert::BertInput;
    ///
    /// let input = BertInput::<Flex>::from_token_ids(&[vec![101, 7, 102], vec![101, 102]], 0, &Default::default());
    /// assert_eq!(input.tokens.dims(), [2, 3]);
    /// assert_eq!(input.padding.into_data().to_vec::<bool>().unwrap(), vec![false, false, false, false, false, true]);
    /// ```
    ///
    /// # Panics
    /// When `sequences` is empty or holds an empty sequence.
    pub fn from_token_ids(sequences: &[Vec<u32>], pad_id: u32, device: &B::Device) -> Self {
        let seq = sequences.iter().map(Vec::len).max().unwrap_or(0);
        Self::from_token_ids_padded(sequences, pad_id, seq, device)
    }

    /// [`from_token_ids`](Self::from_token_ids), padded to `seq` positions
    /// whatever the longest sequence (a fixed shape per sample, as a cache
    /// of frozen outputs needs).
    ///
    /// ```
    /// use burn::backend::Flex;
    /// use pipetransformer_models::bert::BertInput;
    ///
    /// let input = BertInput::<Flex>::from_token_ids_padded(&[vec![101, 102]], 0, 4, &Default::default());
    /// assert_eq!(input.tokens.dims(), [1, 4]);
    /// ```
    ///
    /// # Panics
    /// When `sequences` is empty, holds an empty sequence, or one longer
    /// than `seq`.
    pub fn from_token_ids_padded(
        sequences: &[Vec<u32>],
        pad_id: u32,
        seq: usize,
        device: &B::Device,
    ) -> Self {
        assert!(
            sequences.iter().all(|s| !s.is_empty()) && !sequences.is_empty(),
            "BERT input needs at least one non-empty sequence"
        );
        assert!(
            sequences.iter().all(|s| s.len() <= seq),
            "a sequence is longer than the {seq} positions asked for"
        );
        let batch = sequences.len();
        let mut tokens = Vec::with_capacity(batch * seq);
        let mut padding = Vec::with_capacity(batch * seq);
        for sequence in sequences {
            for position in 0..seq {
                let token = sequence.get(position);
                tokens.push(i64::from(*token.unwrap_or(&pad_id)));
                padding.push(token.is_none());
            }
        }
        let tokens = Tensor::<B, 1, Int>::from_data(TensorData::new(tokens, [batch * seq]), device)
            .reshape([batch, seq]);
        let padding =
            Tensor::<B, 1, Bool>::from_data(TensorData::new(padding, [batch * seq]), device)
                .reshape([batch, seq]);
        Self {
            token_types: tokens.zeros_like(),
            tokens,
            padding,
        }
    }
}

/// BERT's hidden state with the padding mask every attention unit needs.
#[derive(Debug, Clone)]
pub struct BertHidden<B: Backend> {
    /// Hidden states, `[batch, seq, hidden]`.
    pub states: Tensor<B, 3>,
    /// `true` where a position is padding, `[batch, seq]`.
    pub padding: Tensor<B, 2, Bool>,
}

// Hidden states are differentiated, the mask and the ids carried over;
// cached as their tensors in field order.
burn_freeze::activation!(BertInput<B> { tokens, token_types, padding });
burn_freeze::activation!(BertHidden<B> { states, padding });
