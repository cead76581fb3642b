//! Vision Transformer (ViT) as a stack of PipeTransformer partition units.

mod config;
mod model;
mod units;

pub use config::VitConfig;
pub use model::{Vit, VitBlock, VitTypes};
pub use units::{PatchEmbedding, PreNormAttention, PreNormMlp, VitHead, VitUnit};
