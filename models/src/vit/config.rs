//! ViT hyper-parameters and presets.

use burn::prelude::*;

/// Configuration of a Vision Transformer (ViT) classifier.
///
/// ```
/// use burn::backend::Flex;
/// use pipetransformer_models::vit::VitConfig;
///
/// let config = VitConfig::tiny(10);
/// let vit = config.init::<Flex>(&Default::default());
/// assert_eq!(config.num_units(), 2 * config.layers + 3);
/// # let _ = vit;
/// ```
#[derive(Config, Debug, PartialEq)]
pub struct VitConfig {
    /// Side of the square input image, in pixels.
    #[config(default = 224)]
    pub image_size: usize,
    /// Side of a square patch, in pixels.
    #[config(default = 16)]
    pub patch_size: usize,
    /// Colour channels of the input.
    #[config(default = 3)]
    pub channels: usize,
    /// Width of the hidden state.
    #[config(default = 768)]
    pub hidden: usize,
    /// Number of transformer blocks.
    #[config(default = 12)]
    pub layers: usize,
    /// Attention heads per block.
    #[config(default = 12)]
    pub heads: usize,
    /// Width of the MLP's intermediate layer.
    #[config(default = 3072)]
    pub mlp_dim: usize,
    /// Number of output classes.
    #[config(default = 1000)]
    pub num_classes: usize,
    /// Dropout probability in embeddings, attention and MLP.
    #[config(default = 0.0)]
    pub dropout: f64,
    /// Epsilon of every layer norm.
    #[config(default = 1e-6)]
    pub layer_norm_eps: f64,
}

impl VitConfig {
    /// ViT-B/16: 224x224 images, 16x16 patches, 12 blocks of width 768 (86.6M
    /// parameters with 1000 classes).
    pub fn vit_b16(num_classes: usize) -> Self {
        Self::new().with_num_classes(num_classes)
    }

    /// A tiny ViT for tests and CPU runs: 16x16 images, 4x4 patches, 2 blocks of width 32.
    pub fn tiny(num_classes: usize) -> Self {
        Self::new()
            .with_image_size(16)
            .with_patch_size(4)
            .with_hidden(32)
            .with_layers(2)
            .with_heads(4)
            .with_mlp_dim(64)
            .with_num_classes(num_classes)
    }

    /// Number of patches per image.
    pub fn num_patches(&self) -> usize {
        (self.image_size / self.patch_size).pow(2)
    }

    /// Number of partition units: embedding, (attention, MLP) per block, final norm, head.
    pub fn num_units(&self) -> usize {
        2 * self.layers + 3
    }

    /// Checks that the hyper-parameters fit together.
    pub fn validate(&self) -> Result<(), String> {
        if self.patch_size == 0 || !self.image_size.is_multiple_of(self.patch_size) {
            return Err(format!(
                "image_size {} is not a multiple of patch_size {}",
                self.image_size, self.patch_size
            ));
        }
        if self.heads == 0 || !self.hidden.is_multiple_of(self.heads) {
            return Err(format!(
                "hidden {} is not a multiple of heads {}",
                self.hidden, self.heads
            ));
        }
        if self.num_classes == 0 {
            return Err("num_classes must be at least 1".into());
        }
        Ok(())
    }
}
