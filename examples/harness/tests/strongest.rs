//! The (b*) search: its candidates, the fit hook, the winner, and that
//! (b*) freezes nothing. Measured times are injected, so nothing is timed.

use burn_elastic_dp::{Parts, TrainerConfig};
use pipetransformer_harness::strongest::{
    Candidate, candidates, fits_without_budget, no_freeze_config, pick_fastest,
};
use pipetransformer_jobs::job::JobError;

fn shapes(list: &[Candidate]) -> Vec<(usize, usize)> {
    list.iter().map(|c| (c.stages, c.replicas)).collect()
}

#[test]
fn four_devices_give_k_over_the_divisors_and_r_the_rest() {
    let list = candidates(4, fits_without_budget, |k| 10 * k);
    assert_eq!(shapes(&list), [(1, 4), (2, 2), (4, 1)]);
    assert_eq!(
        list.iter().map(|c| c.micro_batches).collect::<Vec<_>>(),
        [10, 20, 40]
    );
    assert_eq!(
        shapes(&candidates(6, fits_without_budget, |_| 1)),
        [(1, 6), (2, 3), (3, 2), (6, 1)]
    );
}

#[test]
fn a_candidate_the_fit_hook_refuses_is_neither_listed_nor_measured() {
    let list = candidates(4, |k| k != 1, |_| 1);
    assert_eq!(shapes(&list), [(2, 2), (4, 1)]);
    let mut asked = Vec::new();
    let found = pick_fastest(list, |c| {
        asked.push(c.stages);
        Ok(1.0)
    })
    .unwrap();
    assert_eq!(asked, [2, 4]);
    assert_eq!(found.measured.len(), 2);
}

#[test]
fn the_winner_is_the_fastest_measured() {
    let times = |c: Candidate| match c.stages {
        1 => 0.30,
        2 => 0.20,
        _ => 0.25,
    };
    let found = pick_fastest(candidates(4, fits_without_budget, |_| 1), |c| Ok(times(c))).unwrap();
    assert_eq!((found.winner.stages, found.winner.replicas), (2, 2));
    assert_eq!(found.measured.len(), 3);
    assert!(
        found.summary().contains("fastest: K=2 R=2"),
        "{}",
        found.summary()
    );
    // Another order of times, another winner: the pick follows the measurements.
    let found = pick_fastest(candidates(4, fits_without_budget, |_| 1), |c| {
        Ok(c.stages as f64)
    })
    .unwrap();
    assert_eq!(found.winner.stages, 1);
}

#[test]
fn no_candidate_left_is_an_error_and_a_failed_measurement_stops_the_search() {
    let none = pick_fastest(candidates(4, |_| false, |_| 1), |_| Ok(1.0));
    assert!(matches!(none, Err(JobError::Spec(m)) if m.contains("every K was refused")));
    let failed = pick_fastest(candidates(4, fits_without_budget, |_| 1), |c| {
        if c.stages == 2 {
            Err(JobError::Spec("boom".into()))
        } else {
            Ok(1.0)
        }
    });
    assert!(matches!(failed, Err(JobError::Spec(m)) if m == "boom"));
}

#[test]
fn the_baseline_freezes_nothing_in_the_shape_found() {
    let base = TrainerConfig::new();
    let candidate = Candidate {
        stages: 2,
        replicas: 2,
        micro_batches: 4,
    };
    let config = no_freeze_config(&base, candidate);
    assert_eq!(
        config.parts,
        Parts::new()
            .with_freeze(false)
            .with_pipe(false)
            .with_cache(false)
    );
    assert!(config.parts.dp, "R = D / K needs AutoDP's replica count");
    assert_eq!(config.stages, Some(2));
    assert_eq!(config.replicas.pipeline.micro_batches_for(2), 4);
    assert!(config.checkpoint.is_none() && config.output_dir.is_none());
    assert!(config.validate(4).is_ok());
}

/// A two-layer ViT job of `batch` samples a step, small enough that the
/// search's closures never train it.
fn tiny_spec(batch: usize) -> pipetransformer_jobs::job::JobSpec {
    pipetransformer_jobs::job::JobSpec {
        model: pipetransformer_jobs::job::ModelKind::Vit,
        layers: 2,
        hidden: 8,
        pretrain_epochs: 0,
        samples: 100,
        eval_samples: 4,
        batch,
        epochs: 5,
        lr: 1e-3,
        seed: 1,
        task: pipetransformer_jobs::job::FinetuneTask::Same,
    }
}

#[test]
fn the_search_runs_each_accepted_shape_briefly_and_skips_those_the_trainer_refuses() {
    use burn_elastic_dp::BatchPolicy;
    use burn_pipe::PipelineConfig;
    use pipetransformer_harness::strongest::{MEASURED_STEPS, WARM_UP_STEPS, find};
    use pipetransformer_jobs::job::{Method, RunRecord};

    let spec = tiny_spec(2);
    // One micro-batch: K=1 needs R x M = 4 samples a step, more than the
    // batch of 2, so the trainer refuses it; K=2 (R=2) and K=4 (R=1) fit.
    let mut base = TrainerConfig::new().with_batch(BatchPolicy::FixedGlobal { batch: 2 });
    base.replicas.pipeline = PipelineConfig::new().with_micro_batches(Some(1));
    let mut asked = Vec::new();
    let found = find(
        &spec,
        &base,
        4,
        fits_without_budget,
        |short, method, _clock| {
            assert_eq!(short.epochs, 1);
            assert_eq!(short.samples, (WARM_UP_STEPS + MEASURED_STEPS) * spec.batch);
            let Method::Trainer { config, devices } = method else {
                panic!("(b*) runs the trainer");
            };
            assert!(!config.parts.freeze && !config.parts.cache);
            asked.push((config.stages, *devices));
            Ok(RunRecord::new("candidate", Vec::new()))
        },
    )
    .unwrap();
    assert_eq!(asked, [(Some(2), 4), (Some(4), 4)]);
    assert_eq!(found.measured.len(), 2);
}

#[test]
fn under_profiled_costs_the_pipelines_micro_batches_are_the_trainers_choice_and_recorded() {
    use burn_elastic_dp::{BatchPolicy, CostModel};
    use pipetransformer_harness::strongest::find;
    use pipetransformer_jobs::job::{EpochRecord, Method, RunRecord};

    let spec = tiny_spec(64);
    let base = TrainerConfig::new()
        .with_batch(BatchPolicy::FixedGlobal { batch: 64 })
        .with_costs(CostModel::Profiled { repeats: 1 });
    assert!(!base.measures_micro_batches(1) && base.measures_micro_batches(2));
    // A configured count is no choice to make.
    let mut fixed = base.clone();
    fixed.replicas.pipeline = fixed.replicas.pipeline.with_micro_batches(Some(2));
    assert!(!fixed.measures_micro_batches(2));
    let mut asked = Vec::new();
    let found = find(
        &spec,
        &base,
        4,
        fits_without_budget,
        |_short, method, _clock| {
            let Method::Trainer { config, .. } = method else {
                panic!("(b*) runs the trainer");
            };
            let stages = config.stages.unwrap();
            let micro_batches = config.replicas.pipeline.micro_batches;
            asked.push((stages, micro_batches));
            // What the trainer would report: M = 1 at one stage, 3 chosen
            // by measurement for a pipeline.
            let ran = if stages == 1 { 1 } else { 3 };
            let report: EpochRecord = serde_json::from_value(serde_json::json!({
                "epoch": 0, "steps": 4, "samples": 64, "loss": 1.0, "seconds": 1.0,
                "samples_per_second": 64.0, "transition_seconds": 0.0,
                "all_reduce_seconds": 0.0, "frozen_layers": 0, "front": 0,
                "stages": stages, "replicas": 4 / stages, "micro_batches": ran,
                "balance": [], "transitions": [], "cache_hits": 0, "cache_misses": 0,
                "accuracy": 0.5
            }))
            .unwrap();
            Ok(RunRecord::new("candidate", vec![report]))
        },
    )
    .unwrap();
    // K = 1 keeps the rule's M = 1; the pipelines leave M to the trainer.
    assert_eq!(asked, [(1, Some(1)), (2, None), (4, None)]);
    let recorded: Vec<(usize, usize)> = found
        .measured
        .iter()
        .map(|m| (m.candidate.stages, m.candidate.micro_batches))
        .collect();
    assert_eq!(recorded, [(1, 1), (2, 3), (4, 3)]);
}
