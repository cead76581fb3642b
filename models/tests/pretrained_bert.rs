//! Loading Hugging Face BERT checkpoints that the tests write themselves:
//! names with or without `bert.`, PyTorch layouts, and clear errors for
//! every kind of mismatch.

mod common;
mod support;

use burn::prelude::*;
use pipetransformer_models::bert::{Bert, BertConfig, BertInput};
use pipetransformer_models::pretrained::{
    BertCheckpoint, LoadOptions, PretrainedError, load_bert_safetensors,
};
use support::{Checkpoint, scratch_dir};

type B = common::Inner;

/// `bert` in Hugging Face `BertForSequenceClassification` naming, without
/// the `bert.` prefix.
fn hf_checkpoint(bert: &Bert<B>) -> Checkpoint {
    let mut c = Checkpoint::default();
    let e = &bert.embeddings;
    c.param("embeddings.word_embeddings.weight", &e.words.weight);
    c.param("embeddings.position_embeddings.weight", &e.positions.weight);
    c.param(
        "embeddings.token_type_embeddings.weight",
        &e.token_types.weight,
    );
    c.layer_norm("embeddings.LayerNorm", &e.norm);
    for (i, block) in bert.blocks.iter().enumerate() {
        let l = format!("encoder.layer.{i}");
        let mha = &block.attention.attention;
        c.linear(&format!("{l}.attention.self.query"), &mha.query);
        c.linear(&format!("{l}.attention.self.key"), &mha.key);
        c.linear(&format!("{l}.attention.self.value"), &mha.value);
        c.linear(&format!("{l}.attention.output.dense"), &mha.output);
        c.layer_norm(
            &format!("{l}.attention.output.LayerNorm"),
            &block.attention.norm,
        );
        c.linear(
            &format!("{l}.intermediate.dense"),
            &block.feed_forward.feed_forward.fc1,
        );
        c.linear(
            &format!("{l}.output.dense"),
            &block.feed_forward.feed_forward.fc2,
        );
        c.layer_norm(&format!("{l}.output.LayerNorm"), &block.feed_forward.norm);
    }
    c.linear("pooler.dense", &bert.head.pooler);
    c.linear("classifier", &bert.head.classifier);
    c
}

fn input() -> BertInput<B> {
    BertInput::from_token_ids(
        &[vec![1, 5, 9, 12, 2], vec![1, 7, 2]],
        0,
        &Default::default(),
    )
}

fn max_diff(a: Tensor<B, 2>, b: Tensor<B, 2>) -> f32 {
    (a - b).abs().max().into_scalar()
}

#[test]
fn a_bert_checkpoint_with_or_without_the_bert_prefix_loads_exactly() {
    let device = Default::default();
    let config = BertConfig::tiny(3);
    let source = config.init::<B>(&device);
    let expected = source.forward(input());
    let dir = scratch_dir("bert-prefix");

    for prefixed in [false, true] {
        let mut checkpoint = hf_checkpoint(&source);
        checkpoint.tensor(
            "embeddings.position_ids",
            Tensor::<B, 2>::zeros([1, 64], &device),
        );
        if prefixed {
            checkpoint.rename_all(|n| {
                if n.starts_with("classifier") {
                    n.into()
                } else {
                    format!("bert.{n}")
                }
            });
        }
        let path = dir.join(format!("prefixed-{prefixed}.safetensors"));
        checkpoint.write(&path);

        let (loaded, report) =
            load_bert_safetensors::<B>(&path, &config, &LoadOptions::bert(), &device).unwrap();
        assert_eq!(report.loaded.len(), loaded.num_params_tensors());
        assert!(report.missing.is_empty(), "{report}");
        assert_eq!(report.unused.len(), 1, "{report}");
        assert!(max_diff(loaded.forward(input()), expected.clone()) <= 1e-6);
    }
}

/// Number of parameter tensors of a module.
trait NumTensors {
    fn num_params_tensors(&self) -> usize;
}

impl NumTensors for Bert<B> {
    fn num_params_tensors(&self) -> usize {
        // embeddings 5, per block 16, head 4
        5 + 16 * self.blocks.len() + 4
    }
}

#[test]
fn an_encoder_checkpoint_loads_with_a_fresh_classifier_reported() {
    let device = Default::default();
    let config = BertConfig::tiny(2);
    let source = config.init::<B>(&device);
    let mut checkpoint = hf_checkpoint(&source);
    checkpoint.remove("classifier.weight");
    checkpoint.remove("classifier.bias");
    let dir = scratch_dir("bert-encoder");
    std::fs::write(
        dir.join("config.json"),
        r#"{"vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
            "intermediate_size": 64, "max_position_embeddings": 64, "hidden_act": "gelu"}"#,
    )
    .unwrap();
    checkpoint.write(&dir.join("model.safetensors"));

    let opened = BertCheckpoint::open(&dir).unwrap();
    let loaded_config = opened.config(2).with_dropout(0.0);
    assert_eq!(loaded_config, config);
    let (loaded, report) = opened.load::<B>(&loaded_config, &device).unwrap();
    assert_eq!(
        report.missing,
        ["head.classifier.bias", "head.classifier.weight"]
    );
    // The encoder is the source's: same final hidden states.
    let diff = (loaded.encode(input()).states - source.encode(input()).states)
        .abs()
        .max()
        .into_scalar();
    assert!(diff <= 1e-6, "{diff}");

    // Strict options refuse the same file, naming the first missing tensor.
    let error = opened
        .load_with::<B>(&loaded_config, &LoadOptions::strict(), &device)
        .unwrap_err();
    assert!(
        matches!(&error, PretrainedError::Missing { first, all } if first == "head.classifier.bias" && all.len() == 2),
        "{error}"
    );
    assert!(
        error.to_string().contains("head.classifier.bias"),
        "{error}"
    );
}

#[test]
fn a_shape_mismatch_names_the_tensor_in_both_namings() {
    let device = Default::default();
    let source = BertConfig::tiny(2).init::<B>(&device);
    let path = scratch_dir("bert-shape").join("model.safetensors");
    hf_checkpoint(&source).write(&path);
    // The model expects a wider feed-forward than the checkpoint has.
    let config = BertConfig::tiny(2).with_intermediate(48);
    let error =
        load_bert_safetensors::<B>(&path, &config, &LoadOptions::bert(), &device).unwrap_err();
    match &error {
        PretrainedError::ShapeMismatch {
            tensor,
            checkpoint_name,
            expected,
            found,
        } => {
            assert!(
                tensor.starts_with("blocks.0.feed_forward.feed_forward.fc"),
                "{error}"
            );
            assert!(checkpoint_name.starts_with("encoder.layer.0."), "{error}");
            assert_ne!(expected, found);
        }
        other => panic!("expected a shape mismatch, got {other}"),
    }
    assert!(error.to_string().contains("encoder.layer.0."), "{error}");
}

#[test]
fn unknown_and_missing_tensors_are_errors_not_partial_loads() {
    let device = Default::default();
    let config = BertConfig::tiny(2);
    let source = config.init::<B>(&device);
    let dir = scratch_dir("bert-names");

    let mut extra = hf_checkpoint(&source);
    extra.tensor(
        "encoder.layer.0.attention.self.rotary.weight",
        Tensor::<B, 1>::zeros([4], &device),
    );
    extra.write(&dir.join("extra.safetensors"));
    let error = load_bert_safetensors::<B>(
        dir.join("extra.safetensors"),
        &config,
        &LoadOptions::bert(),
        &device,
    )
    .unwrap_err();
    assert!(
        matches!(&error, PretrainedError::Unused { first, .. } if first == "encoder.layer.0.attention.self.rotary.weight"),
        "{error}"
    );

    let mut lacking = hf_checkpoint(&source);
    lacking.remove("encoder.layer.1.output.LayerNorm.weight");
    lacking.write(&dir.join("lacking.safetensors"));
    let error = load_bert_safetensors::<B>(
        dir.join("lacking.safetensors"),
        &config,
        &LoadOptions::bert(),
        &device,
    )
    .unwrap_err();
    assert!(
        matches!(&error, PretrainedError::Missing { first, .. } if first == "blocks.1.feed_forward.norm.gamma"),
        "{error}"
    );

    // A checkpoint of 2 blocks into a model of 3: the third block is missing.
    let error = load_bert_safetensors::<B>(
        dir.join("extra.safetensors"),
        &config.clone().with_layers(3),
        &LoadOptions::bert()
            .with_ignore_unused(vec!["encoder.layer.0.attention.self.rotary".into()]),
        &device,
    )
    .unwrap_err();
    assert!(
        matches!(&error, PretrainedError::Missing { first, .. } if first.starts_with("blocks.2.")),
        "{error}"
    );
}

#[test]
fn bad_files_get_clear_errors() {
    let device = Default::default();
    let dir = scratch_dir("bert-files");
    let config = BertConfig::tiny(2);

    let error = load_bert_safetensors::<B>(
        dir.join("absent.safetensors"),
        &config,
        &LoadOptions::bert(),
        &device,
    )
    .unwrap_err();
    assert!(matches!(error, PretrainedError::Io { .. }), "{error}");
    assert!(error.to_string().contains("absent.safetensors"), "{error}");

    std::fs::write(dir.join("garbage.safetensors"), b"not a safetensors file").unwrap();
    let error = load_bert_safetensors::<B>(
        dir.join("garbage.safetensors"),
        &config,
        &LoadOptions::bert(),
        &device,
    )
    .unwrap_err();
    assert!(
        matches!(error, PretrainedError::Safetensors { .. }),
        "{error}"
    );

    std::fs::write(
        dir.join("config.json"),
        r#"{"vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
            "intermediate_size": 64, "hidden_act": "relu"}"#,
    )
    .unwrap();
    let error = BertCheckpoint::open(&dir).unwrap_err();
    assert!(error.to_string().contains("hidden_act `relu`"), "{error}");

    std::fs::write(dir.join("config.json"), r#"{"hidden_size": 32}"#).unwrap();
    let error = BertCheckpoint::open(&dir).unwrap_err();
    assert!(matches!(error, PretrainedError::Config { .. }), "{error}");
}
