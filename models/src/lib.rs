//! ViT and BERT for Burn, written as stacks of PipeTransformer partition units.
//!
//! Each model is an ordinary Burn [`Module`](burn::module::Module) with its own
//! `forward`, and implements [`burn_freeze::IntoLayerStack`]: it splits into
//! the units PipeTransformer partitions (per block one attention unit and one
//! MLP unit, so no cut crosses a residual connection) and is rebuilt from them.
//!
//! The Vision Transformer comes with the presets ViT-B/16 and a tiny one
//! ([`vit::VitConfig`]), BERT with BERT-base, MiniLM-L6-H384 and a tiny one
//! ([`bert::BertConfig`]). Pretrained Hugging Face BERT and timm / Hugging
//! Face ViT checkpoints (safetensors) load into them through burn-store
//! ([`pretrained`]), BERT's input comes from WordPiece tokenization with a
//! checkpoint's `tokenizer.json`, and the Stanford Sentiment Treebank reads as
//! an SST-2 Burn `Dataset`. Generated, learnable classification tasks for
//! both models ([`synthetic`]) serve tests and CPU runs without a dataset.
//!
//! With the cargo feature `burn-train`, ViT and BERT implement burn-train's
//! `TrainStep` and `InferenceStep` (images or token sequences and class
//! labels to a `ClassificationOutput` scored by cross-entropy).

#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod bert;
mod feed_forward;
pub mod pretrained;
pub mod sst;
pub mod synthetic;
pub mod tokenizer;
#[cfg(feature = "burn-train")]
mod train_step;
pub mod vit;

pub use feed_forward::FeedForward;

/// The repository's README, whose every Rust block is compiled and run as a
/// doc test of this crate (`cargo test -p pipetransformer-models --doc`).
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;
