//! timm and Hugging Face ViT checkpoints (safetensors).

use std::path::Path;
use std::rc::Rc;

use burn::module::ParamId;
use burn::prelude::*;
use burn_store::{TensorSnapshot, TensorSnapshotError};

use super::{LoadOptions, LoadReport, PretrainedError, load_safetensors, norm_rules};
use crate::vit::{Vit, VitConfig};

/// The naming scheme of a ViT checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VitCheckpointFormat {
    /// timm's `VisionTransformer` (`patch_embed.proj`, `blocks.N.attn.qkv`
    /// with query, key and value fused, `head`).
    Timm,
    /// Hugging Face `ViTForImageClassification` / `ViTModel`
    /// (`vit.embeddings...`, `vit.encoder.layer.N...`, `classifier`).
    HuggingFace,
}

/// Suffix given to the three parts of a fused timm `qkv` tensor.
const QKV_PARTS: [&str; 3] = ["query", "key", "value"];

fn timm_rules() -> Vec<(String, String)> {
    let b = r"^blocks\.(\d+)";
    let mut rules = vec![
        (
            r"^patch_embed\.proj\.(weight|bias)$".into(),
            "embedding.projection.${1}".into(),
        ),
        (r"^cls_token$".into(), "embedding.class_token".into()),
        (r"^pos_embed$".into(), "embedding.positions".into()),
        (
            format!(r"{b}\.attn\.qkv\.(query|key|value)\.(weight|bias)$"),
            "blocks.${1}.attention.attention.${2}.${3}".into(),
        ),
        (
            format!(r"{b}\.attn\.proj\.(weight|bias)$"),
            "blocks.${1}.attention.attention.output.${2}".into(),
        ),
        (
            format!(r"{b}\.mlp\.(fc1|fc2)\.(weight|bias)$"),
            "blocks.${1}.mlp.mlp.${2}.${3}".into(),
        ),
        (r"^head\.(weight|bias)$".into(), "head.linear.${1}".into()),
    ];
    rules.extend(norm_rules(
        &format!(r"{b}\.norm1"),
        "blocks.${1}.attention.norm",
    ));
    rules.extend(norm_rules(&format!(r"{b}\.norm2"), "blocks.${1}.mlp.norm"));
    rules.extend(norm_rules(r"^norm", "norm"));
    rules
}

fn hf_rules() -> Vec<(String, String)> {
    let p = r"^(?:vit\.)?";
    let l = r"^(?:vit\.)?encoder\.layer\.(\d+)";
    let mut rules = vec![
        (
            format!(r"{p}embeddings\.cls_token$"),
            "embedding.class_token".into(),
        ),
        (
            format!(r"{p}embeddings\.position_embeddings$"),
            "embedding.positions".into(),
        ),
        (
            format!(r"{p}embeddings\.patch_embeddings\.projection\.(weight|bias)$"),
            "embedding.projection.${1}".into(),
        ),
        (
            format!(r"{l}\.attention\.attention\.(query|key|value)\.(weight|bias)$"),
            "blocks.${1}.attention.attention.${2}.${3}".into(),
        ),
        (
            format!(r"{l}\.attention\.output\.dense\.(weight|bias)$"),
            "blocks.${1}.attention.attention.output.${2}".into(),
        ),
        (
            format!(r"{l}\.intermediate\.dense\.(weight|bias)$"),
            "blocks.${1}.mlp.mlp.fc1.${2}".into(),
        ),
        (
            format!(r"{l}\.output\.dense\.(weight|bias)$"),
            "blocks.${1}.mlp.mlp.fc2.${2}".into(),
        ),
        (
            r"^classifier\.(weight|bias)$".into(),
            "head.linear.${1}".into(),
        ),
    ];
    rules.extend(norm_rules(
        &format!(r"{l}\.layernorm_before"),
        "blocks.${1}.attention.norm",
    ));
    rules.extend(norm_rules(
        &format!(r"{l}\.layernorm_after"),
        "blocks.${1}.mlp.norm",
    ));
    rules.extend(norm_rules(&format!(r"{p}layernorm"), "norm"));
    rules
}

/// Splits each fused timm `blocks.N.attn.qkv.{weight,bias}` (first dimension
/// `3 * hidden`, query then key then value) into three tensors named
/// `blocks.N.attn.qkv.{query,key,value}.{weight,bias}`. Other tensors pass
/// through; a `qkv` whose first dimension is not a multiple of 3 is kept whole
/// (and then reported as unused).
fn split_qkv(snapshots: Vec<TensorSnapshot>) -> Vec<TensorSnapshot> {
    let mut out = Vec::with_capacity(snapshots.len() + 64);
    for snapshot in snapshots {
        let name = snapshot.full_path();
        let fused = name.contains(".attn.qkv.")
            && (name.ends_with(".weight") || name.ends_with(".bias"))
            && !snapshot.shape.is_empty()
            && snapshot.shape[0] % 3 == 0;
        if !fused {
            out.push(snapshot);
            continue;
        }
        let rows = snapshot.shape[0] / 3;
        let row_len: usize = snapshot.shape.iter().skip(1).product();
        let mut shape: Vec<usize> = snapshot.shape.iter().copied().collect();
        shape[0] = rows;
        let (stem, param) = name.rsplit_once('.').expect("the name has a dot");
        for (part, label) in QKV_PARTS.iter().enumerate() {
            let data_fn = snapshot.clone_data_fn();
            let part_shape = shape.clone();
            let slice = Rc::new(move || -> Result<TensorData, TensorSnapshotError> {
                let data = data_fn()?;
                let size = data.dtype.size();
                let bytes = data.as_bytes();
                let start = part * rows * row_len * size;
                let end = start + rows * row_len * size;
                Ok(TensorData::from_bytes_vec(
                    bytes[start..end].to_vec(),
                    part_shape.clone(),
                    data.dtype,
                ))
            });
            let path: Vec<String> = format!("{stem}.{label}.{param}")
                .split('.')
                .map(str::to_string)
                .collect();
            out.push(TensorSnapshot::from_closure(
                slice,
                snapshot.dtype,
                shape.clone().into(),
                path,
                Vec::new(),
                ParamId::new(),
            ));
        }
    }
    out
}

/// Builds a [`Vit`] of `config` and loads a timm or Hugging Face ViT
/// safetensors file into it.
///
/// timm's fused `qkv` projections are split into query, key and value;
/// Linear weights are transposed to Burn's `[in, out]`; the patch
/// convolution keeps PyTorch's layout, which is Burn's. Fails, naming the
/// tensor, on the first shape mismatch, on a parameter the file lacks, or on
/// a file tensor that matches nothing, unless `options` allows it.
///
/// ```
/// use burn::backend::Flex;
/// use pipetransformer_models::pretrained::{load_vit_safetensors, LoadOptions, PretrainedError, VitCheckpointFormat};
/// use pipetransformer_models::vit::VitConfig;
///
/// let error = load_vit_safetensors::<Flex>(
///     "no/such/vit.safetensors",
///     VitCheckpointFormat::Timm,
///     &VitConfig::tiny(10),
///     &LoadOptions::vit(),
///     &Default::default(),
/// )
/// .unwrap_err();
/// assert!(matches!(error, PretrainedError::Io { .. }));
/// ```
pub fn load_vit_safetensors<B: Backend>(
    path: impl AsRef<Path>,
    format: VitCheckpointFormat,
    config: &VitConfig,
    options: &LoadOptions,
    device: &B::Device,
) -> Result<(Vit<B>, LoadReport), PretrainedError> {
    let path = path.as_ref();
    config
        .validate()
        .map_err(|reason| PretrainedError::Unsupported {
            path: path.to_path_buf(),
            reason: format!("invalid ViT configuration: {reason}"),
        })?;
    let vit = config.init::<B>(device);
    match format {
        VitCheckpointFormat::Timm => load_safetensors(vit, path, &timm_rules(), split_qkv, options),
        VitCheckpointFormat::HuggingFace => {
            load_safetensors(vit, path, &hf_rules(), |snapshots| snapshots, options)
        }
    }
}
