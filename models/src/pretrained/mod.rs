//! Pretrained checkpoints: Hugging Face BERT and timm / Hugging Face ViT safetensors files
//! loaded into this crate's models through burn-store.

mod bert;
mod error;
mod vit;

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};

use burn::prelude::*;
use burn_store::{
    ApplyError, KeyRemapper, ModuleSnapshot, ModuleStore, PyTorchToBurnAdapter, SafetensorsStore,
    TensorSnapshot,
};

pub use bert::{BertCheckpoint, HfBertConfig, load_bert_safetensors};
pub use error::PretrainedError;
pub use vit::{VitCheckpointFormat, load_vit_safetensors};

/// What a load may leave out, on either side.
///
/// A load never succeeds partially in silence: a shape mismatch, a model
/// parameter the checkpoint lacks, or a checkpoint tensor that matches
/// nothing is an error naming the tensor, unless [`LoadOptions`] lists it
/// (by default only BERT's classifier, which a pretrained encoder does not
/// have, and buffers such as `position_ids`). What was allowed is in the
/// [`LoadReport`].
///
/// ```
/// use pipetransformer_models::pretrained::LoadOptions;
///
/// let options = LoadOptions::bert().with_allow_missing(vec!["head.".into()]);
/// assert!(options.allows_missing("head.pooler.weight"));
/// assert!(!options.allows_missing("blocks.0.attention.norm.gamma"));
/// assert!(LoadOptions::bert().ignores_unused("bert.embeddings.position_ids"));
/// ```
#[derive(Config, Debug)]
pub struct LoadOptions {
    /// Model parameter paths, or prefixes of them, that the checkpoint may
    /// lack; they keep their fresh initialisation and are listed in the report.
    #[config(default = "Vec::new()")]
    pub allow_missing: Vec<String>,
    /// Checkpoint tensor names, or prefixes of them, that may match no model
    /// parameter; they are skipped and listed in the report.
    #[config(default = "Vec::new()")]
    pub ignore_unused: Vec<String>,
}

impl LoadOptions {
    /// Nothing may be missing or unused.
    pub fn strict() -> Self {
        Self::new()
    }

    /// For a Hugging Face BERT encoder (`BertModel`, or the `bert.` part of a
    /// task model): the classifier may be missing (an encoder has none); the
    /// `position_ids` buffer and the pretraining heads (`cls.`) are not weights
    /// of a classifier.
    pub fn bert() -> Self {
        Self::new()
            .with_allow_missing(vec!["head.classifier.".into()])
            .with_ignore_unused(vec![
                "embeddings.position_ids".into(),
                "bert.embeddings.position_ids".into(),
                "cls.".into(),
            ])
    }

    /// For a ViT classifier: everything must match, except the pooler of a
    /// Hugging Face `ViTModel`, which a class-token classifier does not use.
    pub fn vit() -> Self {
        Self::new().with_ignore_unused(vec!["pooler.".into(), "vit.pooler.".into()])
    }

    /// Whether the model parameter `path` may be absent from the checkpoint.
    pub fn allows_missing(&self, path: &str) -> bool {
        self.allow_missing
            .iter()
            .any(|prefix| path.starts_with(prefix.as_str()))
    }

    /// Whether the checkpoint tensor `name` may match nothing.
    pub fn ignores_unused(&self, name: &str) -> bool {
        self.ignore_unused
            .iter()
            .any(|prefix| name.starts_with(prefix.as_str()))
    }
}

/// What a successful load did.
///
/// Loading goes through burn-store: the checkpoint's tensors are read from
/// the safetensors file, renamed to the model's parameter paths by a
/// [`KeyRemapper`](burn_store::KeyRemapper) (one anchored regex per tensor
/// family), converted from PyTorch's layout (Linear weights transposed) by
/// [`PyTorchToBurnAdapter`](burn_store::PyTorchToBurnAdapter), and applied to
/// a freshly built model, with every shape checked.
///
/// The loaded model is the same type as a freshly built one, so it splits into
/// the same partition units and freezes and pipelines unchanged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadReport {
    /// The safetensors file.
    pub file: PathBuf,
    /// Model parameter paths loaded from the checkpoint.
    pub loaded: Vec<String>,
    /// Model parameter paths the checkpoint lacked (allowed by the options;
    /// they keep their fresh initialisation).
    pub missing: Vec<String>,
    /// Checkpoint tensor names that matched nothing (allowed by the options).
    pub unused: Vec<String>,
}

impl fmt::Display for LoadReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: loaded {} tensors; freshly initialised: {}; ignored from the checkpoint: {}",
            self.file.display(),
            self.loaded.len(),
            list_or_none(&self.missing),
            list_or_none(&self.unused)
        )
    }
}

fn list_or_none(names: &[String]) -> String {
    if names.is_empty() {
        "none".into()
    } else {
        names.join(", ")
    }
}

/// Reads every tensor of a safetensors file as a lazy snapshot named as in
/// the file.
fn read_snapshots(path: &Path) -> Result<Vec<TensorSnapshot>, PretrainedError> {
    std::fs::metadata(path).map_err(|source| PretrainedError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let mut store = SafetensorsStore::from_file(path);
    let snapshots = store
        .get_all_snapshots()
        .map_err(|error| PretrainedError::Safetensors {
            path: path.to_path_buf(),
            message: error.to_string(),
        })?;
    Ok(snapshots.values().cloned().collect())
}

/// Applies the tensors of a safetensors file to `module`: renames them with
/// `rules` (regex, replacement; applied in order to each name), converts
/// PyTorch layouts, checks shapes, and enforces `options`.
///
/// `prepare` may rewrite the snapshots first (for example to split a fused
/// tensor into the ones the model has).
fn load_safetensors<B: Backend, M: Module<B>>(
    mut module: M,
    path: &Path,
    rules: &[(String, String)],
    prepare: impl FnOnce(Vec<TensorSnapshot>) -> Vec<TensorSnapshot>,
    options: &LoadOptions,
) -> Result<(M, LoadReport), PretrainedError> {
    let snapshots = prepare(read_snapshots(path)?);
    let remapper = KeyRemapper::from_patterns(rules.to_vec())
        .expect("the built-in renaming rules are valid regular expressions");
    let (snapshots, renamed) = remapper.remap(snapshots);
    let original = checkpoint_names(path, renamed)?;
    let name_of = |model_path: &str| {
        original
            .get(model_path)
            .cloned()
            .unwrap_or_else(|| model_path.to_string())
    };

    let result = module.apply(snapshots, None, Some(Box::new(PyTorchToBurnAdapter)), false);

    if let Some(error) = result.errors.first() {
        return Err(apply_error(error, &name_of));
    }
    let missing_allowed = allowed_missing(result.missing, options)?;
    let unused_ignored = ignored_unused(&result.unused, options, &name_of)?;

    let report = LoadReport {
        file: path.to_path_buf(),
        loaded: result.applied,
        missing: missing_allowed,
        unused: unused_ignored,
    };
    tracing::info!(
        file = %path.display(),
        loaded = report.loaded.len(),
        missing = ?report.missing,
        unused = ?report.unused,
        "loaded checkpoint"
    );
    Ok((module, report))
}

/// Model path -> checkpoint name, from the renamer's `(new, old)` pairs; two
/// checkpoint tensors for one parameter would make the result depend on file
/// order, so refuse them.
fn checkpoint_names(
    path: &Path,
    renamed: Vec<(String, String)>,
) -> Result<HashMap<String, String>, PretrainedError> {
    let mut original: HashMap<String, String> = HashMap::new();
    for (new, old) in renamed {
        if let Some(previous) = original.insert(new.clone(), old.clone()) {
            return Err(PretrainedError::Unsupported {
                path: path.to_path_buf(),
                reason: format!(
                    "checkpoint tensors `{previous}` and `{old}` both map to model parameter `{new}`"
                ),
            });
        }
    }
    Ok(original)
}

/// The error for a tensor burn-store could not apply, naming it as in the
/// checkpoint (`name_of`) and in the model.
fn apply_error(error: &ApplyError, name_of: &impl Fn(&str) -> String) -> PretrainedError {
    match error {
        ApplyError::ShapeMismatch {
            path,
            expected,
            found,
        } => PretrainedError::ShapeMismatch {
            tensor: path.clone(),
            checkpoint_name: name_of(path),
            expected: expected.iter().copied().collect(),
            found: found.iter().copied().collect(),
        },
        ApplyError::DTypeMismatch { path, .. }
        | ApplyError::AdapterError { path, .. }
        | ApplyError::LoadError { path, .. } => PretrainedError::Tensor {
            tensor: path.clone(),
            checkpoint_name: name_of(path),
            message: error.to_string(),
        },
    }
}

/// The model parameters the checkpoint lacked, if `options` allows each.
fn allowed_missing(
    missing: Vec<(String, String)>,
    options: &LoadOptions,
) -> Result<Vec<String>, PretrainedError> {
    let (missing_allowed, missing): (Vec<String>, Vec<String>) = missing
        .into_iter()
        .map(|(model_path, _)| model_path)
        .partition(|model_path| options.allows_missing(model_path));
    if let Some(first) = missing.first() {
        return Err(PretrainedError::Missing {
            first: first.clone(),
            all: missing,
        });
    }
    Ok(missing_allowed)
}

/// The checkpoint tensors that matched nothing (named as in the checkpoint),
/// if `options` ignores each.
fn ignored_unused(
    unused: &[String],
    options: &LoadOptions,
    name_of: &impl Fn(&str) -> String,
) -> Result<Vec<String>, PretrainedError> {
    let (unused_ignored, unused): (Vec<String>, Vec<String>) = unused
        .iter()
        .map(|model_path| name_of(model_path))
        .partition(|name| options.ignores_unused(name));
    if let Some(first) = unused.first() {
        return Err(PretrainedError::Unused {
            first: first.clone(),
            all: unused,
        });
    }
    Ok(unused_ignored)
}

/// The four renaming rules of a norm, whose checkpoint names end in
/// `weight`/`bias` (or, in old checkpoints, `gamma`/`beta`), and whose Burn
/// parameters are `gamma` and `beta`. `from` is a regex prefix, `to` a
/// replacement prefix.
fn norm_rules(from: &str, to: &str) -> [(String, String); 2] {
    [
        (format!(r"{from}\.(?:weight|gamma)$"), format!("{to}.gamma")),
        (format!(r"{from}\.(?:bias|beta)$"), format!("{to}.beta")),
    ]
}
