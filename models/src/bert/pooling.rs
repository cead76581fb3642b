//! Summaries of a sequence: BERT's [CLS] pooler or the mean over real tokens.

use burn::prelude::*;
use serde::{Deserialize, Serialize};

use super::activation::BertHidden;

/// How BERT's head summarises a sequence before classifying it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum BertPooling {
    /// BERT's pooler: `tanh(dense(state of the first token))`, as pretrained
    /// for next-sentence prediction.
    #[default]
    Cls,
    /// The mean of the final states over the non-padding tokens, as
    /// sentence-transformers models (all-MiniLM-L6-v2) are trained. The
    /// pooler's weights stay in the model (so checkpoints load the same way)
    /// but are not used.
    Mean,
}

impl<B: Backend> BertHidden<B> {
    /// Mean of the states over the positions that are not padding,
    /// `[batch, seq, hidden] -> [batch, hidden]`.
    ///
    /// ```
    /// use burn::backend::Flex;
    /// use burn::prelude::*;
    /// use pipetransformer_models::bert::BertHidden;
    ///
    /// let device = Default::default();
    /// let states = Tensor::<Flex, 3>::from_floats([[[1.0, 2.0], [3.0, 4.0], [100.0, 100.0]]], &device);
    /// let padding = Tensor::<Flex, 2, Bool>::from_bool(TensorData::from([[false, false, true]]), &device);
    /// let mean = BertHidden { states, padding }.mean_pool();
    /// assert_eq!(mean.into_data().to_vec::<f32>().unwrap(), vec![2.0, 3.0]);
    /// ```
    pub fn mean_pool(&self) -> Tensor<B, 2> {
        let [batch, seq, hidden] = self.states.dims();
        let keep = self
            .padding
            .clone()
            .bool_not()
            .float()
            .reshape([batch, seq, 1]);
        let summed = (self.states.clone() * keep.clone())
            .sum_dim(1)
            .reshape([batch, hidden]);
        let counts = keep.sum_dim(1).reshape([batch, 1]).clamp_min(1e-9);
        summed / counts
    }
}

/// Scales each row to unit Euclidean length (rows of zeros stay zero),
/// `[batch, dim] -> [batch, dim]`, as sentence-transformers normalise embeddings.
///
/// ```
/// use burn::backend::Flex;
/// use burn::prelude::*;
/// use pipetransformer_models::bert::l2_normalize;
///
/// let x = Tensor::<Flex, 2>::from_floats([[3.0, 4.0]], &Default::default());
/// assert_eq!(l2_normalize(x).into_data().to_vec::<f32>().unwrap(), vec![0.6, 0.8]);
/// ```
pub fn l2_normalize<B: Backend>(x: Tensor<B, 2>) -> Tensor<B, 2> {
    let norm = x.clone().powi_scalar(2).sum_dim(1).sqrt().clamp_min(1e-12);
    x / norm
}
