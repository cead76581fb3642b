//! Loading ViT checkpoints in timm and Hugging Face naming that the tests
//! write themselves from a Burn ViT: the loaded model computes the same
//! logits, timm's fused qkv included.

mod common;
mod support;

use burn::prelude::*;
use pipetransformer_models::pretrained::{
    LoadOptions, PretrainedError, VitCheckpointFormat, load_vit_safetensors,
};
use pipetransformer_models::vit::{Vit, VitConfig};
use support::{Checkpoint, scratch_dir};

type B = common::Inner;

fn timm_checkpoint(vit: &Vit<B>) -> Checkpoint {
    let mut c = Checkpoint::default();
    c.param("patch_embed.proj.weight", &vit.embedding.projection.weight);
    c.param(
        "patch_embed.proj.bias",
        vit.embedding.projection.bias.as_ref().unwrap(),
    );
    c.param("cls_token", &vit.embedding.class_token);
    c.param("pos_embed", &vit.embedding.positions);
    for (i, block) in vit.blocks.iter().enumerate() {
        let mha = &block.attention.attention;
        c.layer_norm(&format!("blocks.{i}.norm1"), &block.attention.norm);
        // timm fuses query, key and value: weight [3 * out, in], bias [3 * out].
        let qkv_weight = Tensor::cat(
            vec![
                mha.query.weight.val().transpose(),
                mha.key.weight.val().transpose(),
                mha.value.weight.val().transpose(),
            ],
            0,
        );
        c.tensor(&format!("blocks.{i}.attn.qkv.weight"), qkv_weight);
        let bias = |l: &burn::nn::Linear<B>| l.bias.as_ref().unwrap().val();
        c.tensor(
            &format!("blocks.{i}.attn.qkv.bias"),
            Tensor::cat(vec![bias(&mha.query), bias(&mha.key), bias(&mha.value)], 0),
        );
        c.linear(&format!("blocks.{i}.attn.proj"), &mha.output);
        c.layer_norm(&format!("blocks.{i}.norm2"), &block.mlp.norm);
        c.linear(&format!("blocks.{i}.mlp.fc1"), &block.mlp.mlp.fc1);
        c.linear(&format!("blocks.{i}.mlp.fc2"), &block.mlp.mlp.fc2);
    }
    c.layer_norm("norm", &vit.norm);
    c.linear("head", &vit.head.linear);
    c
}

fn hf_checkpoint(vit: &Vit<B>) -> Checkpoint {
    let mut c = Checkpoint::default();
    c.param(
        "vit.embeddings.patch_embeddings.projection.weight",
        &vit.embedding.projection.weight,
    );
    c.param(
        "vit.embeddings.patch_embeddings.projection.bias",
        vit.embedding.projection.bias.as_ref().unwrap(),
    );
    c.param("vit.embeddings.cls_token", &vit.embedding.class_token);
    c.param(
        "vit.embeddings.position_embeddings",
        &vit.embedding.positions,
    );
    for (i, block) in vit.blocks.iter().enumerate() {
        let l = format!("vit.encoder.layer.{i}");
        let mha = &block.attention.attention;
        c.layer_norm(&format!("{l}.layernorm_before"), &block.attention.norm);
        c.linear(&format!("{l}.attention.attention.query"), &mha.query);
        c.linear(&format!("{l}.attention.attention.key"), &mha.key);
        c.linear(&format!("{l}.attention.attention.value"), &mha.value);
        c.linear(&format!("{l}.attention.output.dense"), &mha.output);
        c.layer_norm(&format!("{l}.layernorm_after"), &block.mlp.norm);
        c.linear(&format!("{l}.intermediate.dense"), &block.mlp.mlp.fc1);
        c.linear(&format!("{l}.output.dense"), &block.mlp.mlp.fc2);
    }
    c.layer_norm("vit.layernorm", &vit.norm);
    c.linear("classifier", &vit.head.linear);
    c
}

fn images() -> Tensor<B, 4> {
    Tensor::random(
        [2, 3, 16, 16],
        burn::tensor::Distribution::Normal(0.0, 1.0),
        &Default::default(),
    )
}

#[test]
fn timm_and_hugging_face_vit_checkpoints_load_exactly() {
    let device = Default::default();
    let config = VitConfig::tiny(5).with_layers(3);
    let source = config.init::<B>(&device);
    let images = images();
    let expected = source.forward(images.clone());
    let dir = scratch_dir("vit-formats");

    for (format, checkpoint) in [
        (VitCheckpointFormat::Timm, timm_checkpoint(&source)),
        (VitCheckpointFormat::HuggingFace, hf_checkpoint(&source)),
    ] {
        let path = dir.join(format!("{format:?}.safetensors"));
        checkpoint.write(&path);
        let (loaded, report) =
            load_vit_safetensors::<B>(&path, format, &config, &LoadOptions::vit(), &device)
                .unwrap();
        // 4 embedding tensors, 16 per block, 2 final norm, 2 head.
        assert_eq!(report.loaded.len(), 4 + 16 * 3 + 4, "{format:?}: {report}");
        assert!(
            report.missing.is_empty() && report.unused.is_empty(),
            "{report}"
        );
        let diff: f32 = (loaded.forward(images.clone()) - expected.clone())
            .abs()
            .max()
            .into_scalar();
        assert!(diff <= 1e-5, "{format:?} differs by {diff}");
        // A fresh model does not: the test would notice a load that did nothing.
        let fresh: f32 = (config.init::<B>(&device).forward(images.clone()) - expected.clone())
            .abs()
            .max()
            .into_scalar();
        assert!(fresh > 1e-3);
    }
}

#[test]
fn a_vit_checkpoint_for_other_classes_is_refused_naming_the_head() {
    let device = Default::default();
    let source = VitConfig::tiny(5).init::<B>(&device);
    let path = scratch_dir("vit-head").join("timm.safetensors");
    timm_checkpoint(&source).write(&path);

    let error = load_vit_safetensors::<B>(
        &path,
        VitCheckpointFormat::Timm,
        &VitConfig::tiny(7),
        &LoadOptions::vit(),
        &device,
    )
    .unwrap_err();
    assert!(
        matches!(&error, PretrainedError::ShapeMismatch { checkpoint_name, .. } if checkpoint_name.starts_with("head.")),
        "{error}"
    );
    // The wrong naming scheme matches nothing and says so.
    let error = load_vit_safetensors::<B>(
        &path,
        VitCheckpointFormat::HuggingFace,
        &VitConfig::tiny(5),
        &LoadOptions::vit(),
        &device,
    )
    .unwrap_err();
    assert!(matches!(error, PretrainedError::Missing { .. }), "{error}");
}
