//! What enters BERT and what flows between its units.

use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;
use burn_freeze::{Activation, AutodiffActivation, Cacheable, Differentiable};

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

impl<B: Backend> Activation<B> for BertInput<B> {
    fn batch_size(&self) -> usize {
        self.tokens.dims()[0]
    }

    fn split_batch(self, sizes: &[usize]) -> Vec<Self> {
        let tokens = self.tokens.split_batch(sizes);
        let token_types = self.token_types.split_batch(sizes);
        let padding = self.padding.split_batch(sizes);
        tokens
            .into_iter()
            .zip(token_types)
            .zip(padding)
            .map(|((tokens, token_types), padding)| Self {
                tokens,
                token_types,
                padding,
            })
            .collect()
    }

    fn cat_batch(parts: Vec<Self>) -> Self {
        let (mut tokens, mut token_types, mut padding) = (Vec::new(), Vec::new(), Vec::new());
        for part in parts {
            tokens.push(part.tokens);
            token_types.push(part.token_types);
            padding.push(part.padding);
        }
        Self {
            tokens: Activation::cat_batch(tokens),
            token_types: Activation::cat_batch(token_types),
            padding: Activation::cat_batch(padding),
        }
    }

    fn to_device(self, device: &B::Device) -> Self {
        Self {
            tokens: self.tokens.to_device(device),
            token_types: self.token_types.to_device(device),
            padding: self.padding.to_device(device),
        }
    }
}

impl<B: AutodiffBackend> AutodiffActivation<B> for BertInput<B> {
    type Inner = BertInput<B::InnerBackend>;

    fn inner(self) -> Self::Inner {
        BertInput {
            tokens: self.tokens.inner(),
            token_types: self.token_types.inner(),
            padding: self.padding.inner(),
        }
    }

    fn from_inner(inner: Self::Inner) -> Self {
        Self {
            tokens: Tensor::from_inner(inner.tokens),
            token_types: Tensor::from_inner(inner.token_types),
            padding: Tensor::from_inner(inner.padding),
        }
    }
}

impl<B: Backend> Activation<B> for BertHidden<B> {
    fn batch_size(&self) -> usize {
        self.states.dims()[0]
    }

    fn split_batch(self, sizes: &[usize]) -> Vec<Self> {
        let states = self.states.split_batch(sizes);
        let padding = self.padding.split_batch(sizes);
        states
            .into_iter()
            .zip(padding)
            .map(|(states, padding)| Self { states, padding })
            .collect()
    }

    fn cat_batch(parts: Vec<Self>) -> Self {
        let (states, padding): (Vec<_>, Vec<_>) =
            parts.into_iter().map(|p| (p.states, p.padding)).unzip();
        Self {
            states: Activation::cat_batch(states),
            padding: Activation::cat_batch(padding),
        }
    }

    fn to_device(self, device: &B::Device) -> Self {
        Self {
            states: self.states.to_device(device),
            padding: self.padding.to_device(device),
        }
    }
}

impl<B: AutodiffBackend> AutodiffActivation<B> for BertHidden<B> {
    type Inner = BertHidden<B::InnerBackend>;

    fn inner(self) -> Self::Inner {
        BertHidden {
            states: self.states.inner(),
            padding: self.padding.inner(),
        }
    }

    fn from_inner(inner: Self::Inner) -> Self {
        Self {
            states: Tensor::from_inner(inner.states),
            padding: Tensor::from_inner(inner.padding),
        }
    }
}

impl<B: AutodiffBackend> Differentiable<B> for BertHidden<B> {
    fn require_grad(self) -> Self {
        Self {
            states: self.states.require_grad(),
            padding: self.padding,
        }
    }

    fn grad(&self, grads: &B::Gradients) -> Option<Self::Inner> {
        Some(BertHidden {
            states: self.states.grad(grads)?,
            padding: self.padding.clone().inner(),
        })
    }

    fn seed(&self, grad: Self::Inner) -> Tensor<B, 1> {
        self.states.seed(grad.states)
    }
}

/// Cached as its two tensors: the hidden states, then the padding mask.
impl<B: Backend> Cacheable<B> for BertHidden<B> {
    fn shapes(&self) -> Vec<Vec<usize>> {
        vec![self.states.dims().to_vec(), self.padding.dims().to_vec()]
    }

    fn num_bytes(&self) -> usize {
        self.states.num_bytes() + self.padding.num_bytes()
    }

    fn to_data_parts(&self) -> Vec<TensorData> {
        vec![self.states.to_data(), self.padding.to_data()]
    }

    fn from_data(parts: Vec<TensorData>, device: &B::Device) -> Self {
        let [states, padding]: [TensorData; 2] =
            parts.try_into().unwrap_or_else(|parts: Vec<TensorData>| {
                panic!(
                    "BERT's hidden state is rebuilt from 2 parts, got {}",
                    parts.len()
                )
            });
        Self {
            states: Cacheable::from_data(vec![states], device),
            padding: Cacheable::from_data(vec![padding], device),
        }
    }

    fn device(&self) -> B::Device {
        self.states.device()
    }
}

/// Cached as its three tensors: tokens, token types, then the padding mask.
impl<B: Backend> Cacheable<B> for BertInput<B> {
    fn shapes(&self) -> Vec<Vec<usize>> {
        vec![
            self.tokens.dims().to_vec(),
            self.token_types.dims().to_vec(),
            self.padding.dims().to_vec(),
        ]
    }

    fn num_bytes(&self) -> usize {
        self.tokens.num_bytes() + self.token_types.num_bytes() + self.padding.num_bytes()
    }

    fn to_data_parts(&self) -> Vec<TensorData> {
        vec![
            self.tokens.to_data(),
            self.token_types.to_data(),
            self.padding.to_data(),
        ]
    }

    fn from_data(parts: Vec<TensorData>, device: &B::Device) -> Self {
        let [tokens, token_types, padding]: [TensorData; 3] =
            parts.try_into().unwrap_or_else(|parts: Vec<TensorData>| {
                panic!("a BERT input is rebuilt from 3 parts, got {}", parts.len())
            });
        Self {
            tokens: Cacheable::from_data(vec![tokens], device),
            token_types: Cacheable::from_data(vec![token_types], device),
            padding: Cacheable::from_data(vec![padding], device),
        }
    }

    fn device(&self) -> B::Device {
        self.tokens.device()
    }
}
