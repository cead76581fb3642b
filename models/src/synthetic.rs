//! Generated classification tasks that a small model learns in a few steps; every batch is a
//! pure function of the task's seed and the batch index, so runs are reproducible across processes.

use burn::prelude::*;

use crate::bert::BertInput;

/// SplitMix64: a small, fast, well-mixed generator for reproducible data.
#[derive(Debug, Clone)]
struct SplitMix64(u64);

impl SplitMix64 {
    fn new(seed: u64, stream: u64) -> Self {
        let mut rng = Self(seed ^ stream.wrapping_mul(0xD1B5_4A32_D192_ED03));
        rng.next_u64();
        rng
    }

    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`.
    fn next_f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }

    /// Uniform in `0..n`.
    fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

/// Images whose class is the horizontal band that is brighter than the rest.
///
/// Class `c` of `C` lights up rows `c * size / C .. (c + 1) * size / C` on top
/// of uniform noise.
///
/// ```
/// use burn::backend::Flex;
/// use pipetransformer_models::synthetic::BandImages;
///
/// let task = BandImages::new(4, 3, 16, 7);
/// let (images, labels) = task.batch::<Flex>(0, 8, &Default::default());
/// assert_eq!(images.dims(), [8, 3, 16, 16]);
/// assert_eq!(labels.dims(), [8]);
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct BandImages {
    /// Number of classes (at most `image_size`).
    pub num_classes: usize,
    /// Colour channels.
    pub channels: usize,
    /// Side of the square image.
    pub image_size: usize,
    /// Seed of the generator.
    pub seed: u64,
}

impl BandImages {
    /// A task of `num_classes` bands on `channels x image_size x image_size` images.
    ///
    /// # Panics
    /// When `num_classes` is 0 or larger than `image_size`.
    pub fn new(num_classes: usize, channels: usize, image_size: usize, seed: u64) -> Self {
        assert!(
            num_classes > 0 && num_classes <= image_size,
            "BandImages needs 1..={image_size} classes, got {num_classes}"
        );
        Self {
            num_classes,
            channels,
            image_size,
            seed,
        }
    }

    /// Batch number `index`: images `[batch, channels, size, size]` and labels `[batch]`.
    pub fn batch<B: Backend>(
        &self,
        index: usize,
        batch_size: usize,
        device: &B::Device,
    ) -> (Tensor<B, 4>, Tensor<B, 1, Int>) {
        let mut rng = SplitMix64::new(self.seed, index as u64);
        let mut pixels = Vec::new();
        let labels = (0..batch_size)
            .map(|_| self.image(&mut rng, &mut pixels))
            .collect();
        self.tensors(pixels, labels, device)
    }

    /// Samples number `indices` of the task seen as a dataset (sample `i`
    /// is the same image whatever batch it is in): images `[n, channels,
    /// size, size]` and labels `[n]`.
    ///
    /// ```
    /// use burn::backend::Flex;
    /// use pipetransformer_models::synthetic::BandImages;
    ///
    /// let task = BandImages::new(4, 3, 16, 7);
    /// let (both, _) = task.samples::<Flex>(&[3, 5], &Default::default());
    /// let (five, _) = task.samples::<Flex>(&[5], &Default::default());
    /// both.slice([1..2]).into_data().assert_eq(&five.into_data(), true);
    /// ```
    pub fn samples<B: Backend>(
        &self,
        indices: &[usize],
        device: &B::Device,
    ) -> (Tensor<B, 4>, Tensor<B, 1, Int>) {
        let mut pixels = Vec::new();
        let labels = indices
            .iter()
            .map(|&i| {
                let mut rng = SplitMix64::new(self.seed ^ SAMPLE_STREAMS, i as u64);
                self.image(&mut rng, &mut pixels)
            })
            .collect();
        self.tensors(pixels, labels, device)
    }

    /// Draws one image onto `pixels`; returns its class.
    fn image(&self, rng: &mut SplitMix64, pixels: &mut Vec<f32>) -> i64 {
        let size = self.image_size;
        let class = rng.below(self.num_classes);
        let band = class * size / self.num_classes..(class + 1) * size / self.num_classes;
        for _ in 0..self.channels {
            for row in 0..size {
                let light = if band.contains(&row) { 1.0 } else { 0.0 };
                for _ in 0..size {
                    pixels.push(light + rng.next_f32() - 0.5);
                }
            }
        }
        class as i64
    }

    fn tensors<B: Backend>(
        &self,
        pixels: Vec<f32>,
        labels: Vec<i64>,
        device: &B::Device,
    ) -> (Tensor<B, 4>, Tensor<B, 1, Int>) {
        let (n, size) = (labels.len(), self.image_size);
        let images = Tensor::<B, 1>::from_data(
            TensorData::new(pixels, [n * self.channels * size * size]),
            device,
        )
        .reshape([n, self.channels, size, size]);
        let labels = Tensor::from_data(TensorData::new(labels, [n]), device);
        (images, labels)
    }
}

/// Mixed into the seed of per-sample generators, so that samples and
/// numbered batches are different draws.
const SAMPLE_STREAMS: u64 = 0x5A4D_504C_4553_0001;

/// Token sequences labelled by a [`TokenRule`]: by default 1 when most of
/// their tokens come from the upper half of the vocabulary, else 0.
///
/// Token 0 is padding and token 1 opens every sequence (like `[CLS]`); the
/// others are drawn from `2..vocab_size`. Sequences have an odd number of
/// drawn tokens, so there is no tie, and random lengths, so padding matters.
///
/// ```
/// use burn::backend::Flex;
/// use pipetransformer_models::synthetic::MajorityTokens;
///
/// let task = MajorityTokens::new(64, 5, 15, 3);
/// let (input, labels) = task.batch::<Flex>(0, 4, &Default::default());
/// assert_eq!(input.tokens.dims()[0], 4);
/// assert_eq!(labels.dims(), [4]);
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct MajorityTokens {
    /// Vocabulary size, at least 4.
    pub vocab_size: usize,
    /// Fewest drawn tokens per sequence.
    pub min_len: usize,
    /// Most drawn tokens per sequence.
    pub max_len: usize,
    /// Seed of the generator.
    pub seed: u64,
    /// What the label says of a sequence.
    pub rule: TokenRule,
}

/// What a [`MajorityTokens`] label says of a sequence's drawn tokens (the
/// opening token and the padding excluded). "Upper" tokens are the upper
/// half of the drawn ids, `2 + (vocab_size - 2) / 2..vocab_size`.
///
/// ```
/// use pipetransformer_models::synthetic::TokenRule;
///
/// // vocabulary 10: drawn ids 2..10, upper half 6..10, middle half 4..8.
/// assert_eq!(TokenRule::UpperMajority.label(&[6, 7, 2], 10), 1);
/// assert_eq!(TokenRule::FirstUpper.label(&[2, 7, 8], 10), 0);
/// assert_eq!(TokenRule::MiddleMajority.label(&[4, 7, 9], 10), 1);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub enum TokenRule {
    /// 1 when most drawn tokens are upper (the pretraining task).
    #[default]
    UpperMajority,
    /// 1 when the first drawn token (the one after the opening token) is
    /// upper: a rule about one position, which a sequence-wide count does
    /// not give.
    FirstUpper,
    /// 1 when most drawn tokens come from the middle half of the drawn ids
    /// (`2 + q..2 + 3q`, `q = (vocab_size - 2) / 4`).
    MiddleMajority,
}

impl TokenRule {
    /// The label of the drawn tokens `drawn` over a vocabulary of
    /// `vocab_size` (`drawn` is not empty).
    pub fn label(self, drawn: &[u32], vocab_size: usize) -> i64 {
        let drawn_ids = vocab_size - 2;
        let upper = |t: u32| t as usize >= 2 + drawn_ids / 2;
        match self {
            TokenRule::UpperMajority => {
                i64::from(2 * drawn.iter().filter(|&&t| upper(t)).count() > drawn.len())
            }
            TokenRule::FirstUpper => i64::from(upper(drawn[0])),
            TokenRule::MiddleMajority => {
                let q = drawn_ids / 4;
                let middle = |t: u32| (2 + q..2 + 3 * q).contains(&(t as usize));
                i64::from(2 * drawn.iter().filter(|&&t| middle(t)).count() > drawn.len())
            }
        }
    }
}

impl MajorityTokens {
    /// Padding token id.
    pub const PAD: u32 = 0;
    /// Id of the token that opens every sequence.
    pub const CLS: u32 = 1;

    /// A task over `vocab_size` tokens with `min_len..=max_len` drawn tokens per sequence.
    ///
    /// # Panics
    /// When `vocab_size < 4`, `min_len == 0` or `min_len > max_len`.
    pub fn new(vocab_size: usize, min_len: usize, max_len: usize, seed: u64) -> Self {
        assert!(
            vocab_size >= 4,
            "MajorityTokens needs a vocabulary of at least 4"
        );
        assert!(
            min_len > 0 && min_len <= max_len,
            "MajorityTokens needs 0 < min_len <= max_len, got {min_len} and {max_len}"
        );
        Self {
            vocab_size,
            min_len,
            max_len,
            seed,
            rule: TokenRule::default(),
        }
    }

    /// The same sequences labelled by `rule` instead.
    ///
    /// ```
    /// use burn::backend::Flex;
    /// use pipetransformer_models::synthetic::{MajorityTokens, TokenRule};
    ///
    /// let majority = MajorityTokens::new(64, 5, 15, 3);
    /// let first = majority.clone().with_rule(TokenRule::FirstUpper);
    /// let (a, _) = majority.samples::<Flex>(&[0, 1, 2, 3], &Default::default());
    /// let (b, _) = first.samples::<Flex>(&[0, 1, 2, 3], &Default::default());
    /// assert_eq!(a.tokens.into_data(), b.tokens.into_data());
    /// ```
    pub fn with_rule(mut self, rule: TokenRule) -> Self {
        self.rule = rule;
        self
    }

    /// Longest sequence a batch can hold, the opening token included.
    pub fn max_tokens(&self) -> usize {
        self.max_len + 2
    }

    /// Batch number `index`: padded sequences and labels `[batch]`.
    pub fn batch<B: Backend>(
        &self,
        index: usize,
        batch_size: usize,
        device: &B::Device,
    ) -> (BertInput<B>, Tensor<B, 1, Int>) {
        let mut rng = SplitMix64::new(self.seed, index as u64);
        let (sequences, labels): (Vec<_>, Vec<_>) =
            (0..batch_size).map(|_| self.sequence(&mut rng)).unzip();
        let input = BertInput::from_token_ids(&sequences, Self::PAD, device);
        let labels = Tensor::from_data(TensorData::new(labels, [batch_size]), device);
        (input, labels)
    }

    /// Samples number `indices` of the task seen as a dataset (sample `i`
    /// is the same sequence whatever batch it is in), every sequence padded
    /// to [`max_tokens`](Self::max_tokens) so that a sample keeps its shape
    /// from batch to batch (as AutoCache requires).
    ///
    /// ```
    /// use burn::backend::Flex;
    /// use pipetransformer_models::synthetic::MajorityTokens;
    ///
    /// let task = MajorityTokens::new(64, 5, 15, 3);
    /// let (input, labels) = task.samples::<Flex>(&[0, 9, 4], &Default::default());
    /// assert_eq!(input.tokens.dims(), [3, task.max_tokens()]);
    /// assert_eq!(labels.dims(), [3]);
    /// ```
    pub fn samples<B: Backend>(
        &self,
        indices: &[usize],
        device: &B::Device,
    ) -> (BertInput<B>, Tensor<B, 1, Int>) {
        let (sequences, labels): (Vec<_>, Vec<_>) = indices
            .iter()
            .map(|&i| self.sequence(&mut SplitMix64::new(self.seed ^ SAMPLE_STREAMS, i as u64)))
            .unzip();
        let input =
            BertInput::from_token_ids_padded(&sequences, Self::PAD, self.max_tokens(), device);
        let labels = Tensor::from_data(TensorData::new(labels, [indices.len()]), device);
        (input, labels)
    }

    /// One sequence and its label.
    fn sequence(&self, rng: &mut SplitMix64) -> (Vec<u32>, i64) {
        let mut len = self.min_len + rng.below(self.max_len - self.min_len + 1);
        if len.is_multiple_of(2) {
            len += 1;
        }
        let mut sequence = vec![Self::CLS];
        for _ in 0..len {
            sequence.push((2 + rng.below(self.vocab_size - 2)) as u32);
        }
        let label = self.rule.label(&sequence[1..], self.vocab_size);
        (sequence, label)
    }
}

/// A task is a Burn batcher of sample ids: the batch of ids `items` is
/// [`BandImages::samples`] of them (a dataset of ids, such as
/// `InMemDataset<usize>`, then gives every sample once per epoch, and each
/// id is the same image whatever batch it falls in, as AutoCache needs).
///
/// ```
/// use burn::backend::Flex;
/// use burn::data::dataloader::batcher::Batcher;
/// use burn::prelude::*;
/// use pipetransformer_models::synthetic::BandImages;
///
/// let task = BandImages::new(4, 3, 16, 7);
/// // `Batcher::batch`, not the inherent `batch` of numbered batches.
/// let (images, labels): (Tensor<Flex, 4>, Tensor<Flex, 1, Int>) = Batcher::batch(&task, vec![3, 5], &Default::default());
/// assert_eq!(images.dims(), [2, 3, 16, 16]);
/// assert_eq!(labels.dims(), [2]);
/// ```
impl<B: Backend>
    burn::data::dataloader::batcher::Batcher<B, usize, (Tensor<B, 4>, Tensor<B, 1, Int>)>
    for BandImages
{
    fn batch(&self, items: Vec<usize>, device: &B::Device) -> (Tensor<B, 4>, Tensor<B, 1, Int>) {
        self.samples(&items, device)
    }
}

/// A task is a Burn batcher of sample ids: the batch of ids `items` is
/// [`MajorityTokens::samples`] of them.
impl<B: Backend>
    burn::data::dataloader::batcher::Batcher<B, usize, (BertInput<B>, Tensor<B, 1, Int>)>
    for MajorityTokens
{
    fn batch(&self, items: Vec<usize>, device: &B::Device) -> (BertInput<B>, Tensor<B, 1, Int>) {
        self.samples(&items, device)
    }
}

#[cfg(test)]
mod tests {
    use burn::backend::Flex;

    use super::*;

    /// Each sample's drawn tokens (opening token and padding dropped) and
    /// its label.
    fn drawn_and_labels(task: &MajorityTokens, n: usize) -> Vec<(Vec<u32>, i64)> {
        let indices: Vec<usize> = (0..n).collect();
        let (input, labels) = task.samples::<Flex>(&indices, &Default::default());
        let width = task.max_tokens();
        let tokens: Vec<i64> = input.tokens.into_data().iter::<i64>().collect();
        let labels: Vec<i64> = labels.into_data().iter::<i64>().collect();
        tokens
            .chunks(width)
            .zip(labels)
            .map(|(row, label)| {
                let drawn = row[1..]
                    .iter()
                    .filter(|&&t| t != i64::from(MajorityTokens::PAD))
                    .map(|&t| t as u32)
                    .collect();
                (drawn, label)
            })
            .collect()
    }

    #[test]
    fn each_rule_labels_the_same_sequences_by_its_own_count() {
        let majority = MajorityTokens::new(64, 5, 15, 9);
        // Drawn ids 2..64: upper from 33, the middle half 17..47.
        let upper = |t: u32| t >= 33;
        let middle = |t: u32| (17..47).contains(&t);
        let most =
            |d: &[u32], f: &dyn Fn(u32) -> bool| 2 * d.iter().filter(|&&t| f(t)).count() > d.len();
        let base = drawn_and_labels(&majority, 200);
        for rule in [
            TokenRule::UpperMajority,
            TokenRule::FirstUpper,
            TokenRule::MiddleMajority,
        ] {
            let samples = drawn_and_labels(&majority.clone().with_rule(rule), 200);
            let mut ones = 0;
            for ((drawn, label), (base_drawn, _)) in samples.iter().zip(&base) {
                assert_eq!(drawn, base_drawn, "{rule:?} drew other tokens");
                let expected = match rule {
                    TokenRule::UpperMajority => most(drawn, &upper),
                    TokenRule::FirstUpper => upper(drawn[0]),
                    TokenRule::MiddleMajority => most(drawn, &middle),
                };
                assert_eq!(*label, i64::from(expected), "{rule:?} on {drawn:?}");
                ones += label;
            }
            // Neither class is rare: a rule the classifier cannot answer
            // by always saying one thing.
            assert!((50..150).contains(&ones), "{rule:?}: {ones} of 200 are 1");
        }
    }
}
