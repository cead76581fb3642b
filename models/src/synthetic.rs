//! Generated classification tasks that a small model learns in a few steps.
//!
//! Every batch is a pure function of the task's seed and the batch index, so
//! runs are reproducible and two processes see the same data.

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

/// Token sequences labelled 1 when most of their tokens come from the upper
/// half of the vocabulary, else 0.
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
        }
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
        let middle = 2 + (self.vocab_size - 2) / 2;
        let mut len = self.min_len + rng.below(self.max_len - self.min_len + 1);
        if len.is_multiple_of(2) {
            len += 1;
        }
        let mut sequence = vec![Self::CLS];
        let mut high = 0;
        for _ in 0..len {
            let token = 2 + rng.below(self.vocab_size - 2);
            high += usize::from(token >= middle);
            sequence.push(token as u32);
        }
        (sequence, i64::from(2 * high > len))
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
