//! The job's promise that every run of one spec starts from the same weights.

use super::*;

fn tiny_spec() -> JobSpec {
    JobSpec {
        model: ModelKind::Bert,
        layers: 2,
        hidden: 16,
        pretrain_epochs: 1,
        samples: 32,
        eval_samples: 16,
        batch: 16,
        epochs: 1,
        lr: 1e-3,
        seed: 7,
        task: FinetuneTask::MiddleMajority,
    }
}

fn losses(record: &RunRecord) -> Vec<f64> {
    record.epochs.iter().map(|e| e.report.loss).collect()
}

/// The fresh classifier is drawn once, when the model is pretrained: two
/// runs from one pretrained model train the same numbers even when the
/// backend's random stream moved on between them (here by a fresh model,
/// as a second configuration's own initialisation would). With Burn's lazy
/// parameters left undrawn, each run's clone drew its own classifier.
#[test]
fn every_run_of_one_pretrained_model_starts_from_the_same_classifier() {
    let spec = tiny_spec();
    let pretrained = spec.pretrain(&mut Silent);
    let (first, _) = spec
        .finetune(&pretrained, "first", &Method::Plain, &mut Silent)
        .unwrap();
    let _ = spec.fresh_model();
    let (second, _) = spec
        .finetune(&pretrained, "second", &Method::Plain, &mut Silent)
        .unwrap();
    assert_eq!(first.epochs.len(), spec.epochs);
    assert!(losses(&first).iter().all(|l| l.is_finite()));
    assert_eq!(losses(&first), losses(&second));
    assert_eq!(first.accuracy, second.accuracy);
}
