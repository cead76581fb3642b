//! What can go wrong loading a checkpoint.

use std::path::PathBuf;

/// Why a checkpoint could not be loaded. Every variant names the file or the
/// tensor at fault; nothing is ever loaded partially without one of these.
#[derive(Debug, thiserror::Error)]
pub enum PretrainedError {
    /// A file of the checkpoint could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// `config.json` is not valid JSON of the expected shape.
    #[error("cannot parse {path}: {source}")]
    Config {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: serde_json::Error,
    },
    /// The checkpoint describes a model this crate does not implement.
    #[error("unsupported checkpoint {path}: {reason}")]
    Unsupported {
        /// The file that says so.
        path: PathBuf,
        /// What is unsupported.
        reason: String,
    },
    /// The safetensors file is unreadable or malformed.
    #[error("cannot read safetensors file {path}: {message}")]
    Safetensors {
        /// The file.
        path: PathBuf,
        /// The underlying error, in words.
        message: String,
    },
    /// A tensor has a different shape in the checkpoint than in the model.
    #[error(
        "shape mismatch for `{checkpoint_name}` (model tensor `{tensor}`): the model expects {expected:?}, \
         the checkpoint has {found:?} (shapes in Burn's layout, Linear weights as [in, out])"
    )]
    ShapeMismatch {
        /// The model's parameter path.
        tensor: String,
        /// The name in the checkpoint.
        checkpoint_name: String,
        /// The model's shape.
        expected: Vec<usize>,
        /// The checkpoint's shape, after conversion to Burn's layout.
        found: Vec<usize>,
    },
    /// A tensor's data could not be read or converted.
    #[error("cannot load `{checkpoint_name}` into `{tensor}`: {message}")]
    Tensor {
        /// The model's parameter path.
        tensor: String,
        /// The name in the checkpoint.
        checkpoint_name: String,
        /// What went wrong.
        message: String,
    },
    /// Model parameters that the checkpoint does not provide.
    #[error(
        "the checkpoint has no tensor for model parameter `{first}`{}",
        more_suffix(.all.len())
    )]
    Missing {
        /// The first missing parameter path.
        first: String,
        /// All missing parameter paths.
        all: Vec<String>,
    },
    /// Checkpoint tensors that match no model parameter.
    #[error(
        "checkpoint tensor `{first}` matches no model parameter{}",
        more_suffix(.all.len())
    )]
    Unused {
        /// The first unused checkpoint name.
        first: String,
        /// All unused checkpoint names.
        all: Vec<String>,
    },
}

fn more_suffix(count: usize) -> String {
    match count {
        0 | 1 => String::new(),
        n => format!(" ({} more)", n - 1),
    }
}
