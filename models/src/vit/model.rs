//! The ViT classifier and its split into partition units.

use burn::nn::{LayerNorm, LayerNormConfig};
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;
use burn_freeze::{IntoLayerStack, LayerStack, StackError, StackMarker};

use super::config::VitConfig;
use super::units::{PatchEmbedding, PreNormAttention, PreNormMlp, VitHead, VitUnit};

/// One pre-norm transformer block: an attention unit then an MLP unit.
#[derive(Module, Debug)]
pub struct VitBlock<B: Backend> {
    /// Attention sub-layer.
    pub attention: PreNormAttention<B>,
    /// MLP sub-layer.
    pub mlp: PreNormMlp<B>,
}

/// Vision Transformer classifier (Dosovitskiy et al., 2021).
///
/// As a layer stack it has `2 * layers + 3` units: the patch embedding, an
/// attention and an MLP unit per block, the final norm, and the head
/// (27 for ViT-B/16).
///
/// ```
/// use burn::backend::{Autodiff, Flex};
/// use burn::prelude::*;
/// use burn_freeze::IntoLayerStack;
/// use pipetransformer_models::vit::VitConfig;
///
/// type B = Autodiff<Flex>;
/// let device = Default::default();
/// let config = VitConfig::tiny(10);
/// let vit = config.init::<B>(&device);
/// let images = Tensor::<B, 4>::zeros([2, 3, 16, 16], &device);
/// assert_eq!(vit.forward(images.clone()).dims(), [2, 10]);
///
/// let stack = vit.into_layer_stack();
/// assert_eq!(stack.num_units(), config.num_units());
/// assert_eq!(stack.forward(images).dims(), [2, 10]);
/// ```
#[derive(Module, Debug)]
pub struct Vit<B: Backend> {
    /// Unit 0.
    pub embedding: PatchEmbedding<B>,
    /// Transformer blocks.
    pub blocks: Vec<VitBlock<B>>,
    /// Norm after the last block.
    pub norm: LayerNorm<B>,
    /// Classification head.
    pub head: VitHead<B>,
}

impl<B: Backend> Vit<B> {
    pub(crate) fn new(config: &VitConfig, device: &B::Device) -> Self {
        Self {
            embedding: PatchEmbedding::new(config, device),
            blocks: (0..config.layers)
                .map(|_| VitBlock {
                    attention: PreNormAttention::new(config, device),
                    mlp: PreNormMlp::new(config, device),
                })
                .collect(),
            norm: LayerNormConfig::new(config.hidden)
                .with_epsilon(config.layer_norm_eps)
                .init(device),
            head: VitHead::new(config, device),
        }
    }

    /// Logits `[batch, classes]` for images `[batch, channels, size, size]`.
    pub fn forward(&self, images: Tensor<B, 4>) -> Tensor<B, 2> {
        let mut x = self.embedding.forward(images);
        for block in &self.blocks {
            x = block.mlp.forward(block.attention.forward(x));
        }
        self.head.forward(self.norm.forward(x))
    }
}

/// The types of ViT's layer stack: patch embedding, then attention, MLP and
/// norm units, then the head.
pub type VitTypes<B> = StackMarker<B, PatchEmbedding<B>, VitUnit<B>, VitHead<B>>;

impl<B: AutodiffBackend> IntoLayerStack for Vit<B> {
    type Types = VitTypes<B>;

    fn into_layer_stack(self) -> LayerStack<VitTypes<B>> {
        let mut middle = Vec::with_capacity(2 * self.blocks.len() + 1);
        for block in self.blocks {
            middle.push(VitUnit::Attention(block.attention));
            middle.push(VitUnit::Mlp(block.mlp));
        }
        middle.push(VitUnit::Norm(self.norm));
        LayerStack::new(self.embedding, middle, self.head)
    }

    fn from_layer_stack(stack: LayerStack<VitTypes<B>>) -> Result<Self, StackError> {
        let found = stack.num_units();
        let (embedding, middle, head) = stack.into_parts();
        if middle.len() % 2 == 0 {
            return Err(StackError::WrongLength {
                found,
                expected_description: "2 * layers + 3 units".into(),
            });
        }
        let unexpected =
            |index: usize, expected: &'static str, unit: &VitUnit<B>| StackError::UnexpectedUnit {
                index,
                expected,
                found: unit.kind(),
            };
        let mut units = middle.into_iter();
        let norm = match units.next_back() {
            Some(VitUnit::Norm(norm)) => norm,
            Some(other) => return Err(unexpected(found - 2, "norm", &other)),
            None => unreachable!("the length is odd"),
        };
        let mut blocks = Vec::with_capacity((found - 3) / 2);
        let mut index = 1;
        while let (Some(first), Some(second)) = (units.next(), units.next()) {
            match (first, second) {
                (VitUnit::Attention(attention), VitUnit::Mlp(mlp)) => {
                    blocks.push(VitBlock { attention, mlp })
                }
                (VitUnit::Attention(_), other) => return Err(unexpected(index + 1, "mlp", &other)),
                (other, _) => return Err(unexpected(index, "attention", &other)),
            }
            index += 2;
        }
        Ok(Self {
            embedding,
            blocks,
            norm,
            head,
        })
    }
}

impl VitConfig {
    /// Builds the model with freshly initialised weights.
    ///
    /// # Panics
    /// When [`validate`](VitConfig::validate) fails.
    pub fn init<B: Backend>(&self, device: &B::Device) -> Vit<B> {
        if let Err(reason) = self.validate() {
            panic!("invalid ViT configuration: {reason}");
        }
        Vit::new(self, device)
    }
}
