//! The planner's tests: the paper's setting, the parts, transitions, the
//! shared CPU, bad values.

use crate::pipetransformer::plan::{
    ClusterConfig, Link, MeasuredPass, ModelSpec, PlanConfig, TransitionCost, UnitSpec, plan,
};
use crate::pipetransformer::trainer::{FreezeRule, LayerSpec, Parts};
use crate::sampler::BatchPolicy;

/// ViT-B/16's 27 units by parameter bytes (fp32), timed by a flat
/// 1 ms per million parameters per sample.
fn vit_b16() -> ModelSpec {
    let d = 768usize;
    let attention = vec![
        d * 4,
        d * 4,
        d * d * 4,
        d * 4,
        d * d * 4,
        d * 4,
        d * d * 4,
        d * 4,
        d * d * 4,
        d * 4,
    ];
    let mlp = vec![d * 4, d * 4, d * 4 * d * 4, 4 * d * 4, 4 * d * d * 4, d * 4];
    let embedding = vec![3 * 16 * 16 * d * 4, d * 4, d * 4, 197 * d * 4];
    let head = vec![d * 1000 * 4, 1000 * 4];
    let norm = vec![d * 4, d * 4];
    let mut units = vec![("embedding".to_string(), embedding)];
    for l in 0..12 {
        units.push((format!("attention {l}"), attention.clone()));
        units.push((format!("mlp {l}"), mlp.clone()));
    }
    units.push(("norm".into(), norm));
    units.push(("head".into(), head));
    ModelSpec {
        model: "ViT-B/16".into(),
        source: "test".into(),
        layers: LayerSpec::Uniform {
            offset: 1,
            per_layer: 2,
            layers: 12,
        },
        units: units
            .into_iter()
            .map(|(name, param_tensors)| {
                let params = param_tensors.iter().sum::<usize>() as f64 / 4.0;
                UnitSpec {
                    name,
                    forward: params * 1e-9,
                    backward: 2.0 * params * 1e-9,
                    forward_fixed: 0.0,
                    backward_fixed: 0.0,
                    measured: vec![],
                    activation_bytes: 197 * d * 4,
                    saved_bytes: 0,
                    param_tensors,
                }
            })
            .collect(),
    }
}

fn paper(epochs: usize) -> PlanConfig {
    let link = Link::new(12e9, 1e-5);
    PlanConfig::new(
        ClusterConfig::new(8, 2, link, Link::new(12.5e9, 5e-6)),
        BatchPolicy::PerReplica { batch: 256 },
        1_281_167,
        epochs,
        FreezeRule::AlphaSchedule { alpha: 1.0 / 3.0 },
    )
    // The paper's start: one node's 8 devices.
    .with_stages(Some(8))
}

#[test]
fn paper_setting_compresses_8_4_2_1_as_replicas_grow() {
    let plan = plan(&paper(10), &vit_b16()).unwrap();
    let fronts: Vec<usize> = plan.epochs.iter().map(|e| e.frozen_layers).collect();
    assert_eq!(fronts, [0, 4, 7, 9, 10, 11, 11, 12, 12, 12]);
    let mut ks: Vec<usize> = plan.epochs.iter().map(|e| e.stages).collect();
    ks.dedup();
    assert_eq!(ks, [8, 4, 2, 1]);
    for e in &plan.epochs {
        assert_eq!(e.replicas * e.stages, 16);
        assert_eq!(e.balance.iter().sum::<usize>(), 27);
    }
    assert!(
        plan.baseline
            .iter()
            .all(|e| e.stages == 8 && e.replicas == 2)
    );
    assert!(plan.speedup() > 1.5, "speed-up {}", plan.speedup());
}

#[test]
fn freezing_without_autodp_or_cache_gains_less() {
    let costs = vit_b16();
    let full = plan(&paper(10), &costs).unwrap().speedup();
    let no_dp = plan(&paper(10).with_parts(Parts::new().with_dp(false)), &costs)
        .unwrap()
        .speedup();
    let no_dp_no_cache = plan(
        &paper(10).with_parts(Parts::new().with_dp(false).with_cache(false)),
        &costs,
    )
    .unwrap()
    .speedup();
    assert!(full > no_dp, "{full} vs {no_dp}");
    assert!(no_dp >= no_dp_no_cache, "{no_dp} vs {no_dp_no_cache}");
}

#[test]
fn transitions_are_charged_when_k_or_r_change() {
    let costs = vit_b16();
    let config = paper(10).with_transitions(
        TransitionCost::new()
            .with_pipeline_rebuild(10.0)
            .with_group_rebuild(15.0),
    );
    let plan = plan(&config, &costs).unwrap();
    for pair in plan.epochs.windows(2) {
        let changed = pair[0].replicas != pair[1].replicas;
        assert_eq!(pair[1].time.transition >= 25.0, changed);
    }
    assert_eq!(plan.epochs[0].time.transition, 0.0);
}

/// ViT-B/16's costs measured at one batch size, each frozen forward a
/// `frozen` share of its forward.
fn measured_vit(batch: usize, frozen: f64) -> ModelSpec {
    let mut costs = vit_b16();
    for unit in &mut costs.units {
        let forward = unit.forward_time(batch as f64);
        unit.measured = vec![MeasuredPass {
            batch,
            forward,
            backward: unit.backward_time(batch as f64),
            frozen_forward: Some(frozen * forward),
        }];
    }
    costs
}

/// 4 stages as threads of one 2-core CPU, no transitions, no cache.
fn on_a_cpu(parallelism: f64) -> PlanConfig {
    let link = Link::new(1e15, 0.0);
    PlanConfig::new(
        ClusterConfig::new(4, 1, link, link)
            .with_shared_device_capacity(Some(2.0))
            .with_shared_device_parallelism(vec![[1.0, parallelism]]),
        BatchPolicy::FixedGlobal { batch: 64 },
        64 * 8,
        4,
        FreezeRule::AlphaSchedule { alpha: 1.0 / 3.0 },
    )
    .with_parts(Parts::new().with_dp(false).with_cache(false))
    .with_stages(Some(4))
    .with_transitions(TransitionCost::new())
}

#[test]
fn frozen_units_cost_their_measured_inner_forward() {
    let autodiff = plan(&on_a_cpu(1.0), &measured_vit(4, 1.0)).unwrap();
    let inner = plan(&on_a_cpu(1.0), &measured_vit(4, 0.5)).unwrap();
    // Nothing frozen in epoch 0: the same; frozen units later: cheaper.
    assert_eq!(autodiff.epochs[0].time, inner.epochs[0].time);
    for (a, i) in autodiff.epochs.iter().zip(&inner.epochs).skip(1) {
        assert!(a.front > 0 && i.time.total() < a.time.total());
    }
}

#[test]
fn passes_taking_more_of_the_shared_cpu_overlap_less() {
    let costs = vit_b16();
    let times: Vec<f64> = [1.0, 1.5, 2.0]
        .iter()
        .map(|&p| plan(&on_a_cpu(p), &costs).unwrap().epochs[0].time.total())
        .collect();
    assert!(times[0] < times[1] && times[1] < times[2], "{times:?}");
}

#[test]
fn worker_threads_slow_only_pipelines_of_two_or_more_stages() {
    let costs = vit_b16();
    let slow = |config: PlanConfig| PlanConfig {
        cluster: config
            .cluster
            .clone()
            .with_shared_device_thread_factor(vec![[1.0, 2.0]]),
        ..config
    };
    let time = |config: &PlanConfig| plan(config, &costs).unwrap().epochs[0].time.steps;
    let four = on_a_cpu(1.0);
    assert!(
        (time(&slow(four.clone())).compute - 2.0 * time(&four).compute).abs()
            < 1e-9 * time(&four).compute
    );
    let one = on_a_cpu(1.0).with_stages(Some(1));
    assert_eq!(time(&slow(one.clone())), time(&one));
}

#[test]
fn bad_values_name_their_range() {
    let costs = vit_b16();
    let err = plan(
        &PlanConfig {
            freeze: FreezeRule::AlphaSchedule { alpha: 1.5 },
            ..paper(10)
        },
        &costs,
    )
    .unwrap_err();
    assert!(
        err.to_string()
            .contains("freeze.alpha = 1.5 is not accepted: expected a number in (0, 1]")
    );
    let err = plan(&paper(0), &costs).unwrap_err();
    assert!(err.to_string().contains("epochs must be in 1..=10000"));
    let err = plan(&paper(3).with_stages(Some(40)), &costs).unwrap_err();
    assert!(err.to_string().contains("stages must be in 1..=8"));
    let err = plan(
        &PlanConfig {
            batch: BatchPolicy::PerReplica { batch: 4 },
            ..paper(3)
        },
        &costs,
    )
    .unwrap_err();
    assert!(err.to_string().contains("fewer than the 16 micro-batches"));
}

#[test]
fn fronts_that_go_down_are_not_planned() {
    // The trainer thaws on such a list; the planner models fronts that only
    // move up, and says so rather than predicting the wrong shapes.
    let thawing = PlanConfig {
        freeze: FreezeRule::Fronts {
            layers: vec![0, 4, 2],
        },
        ..paper(3)
    };
    let err = plan(&thawing, &vit_b16()).unwrap_err();
    assert!(
        err.to_string().contains("non-decreasing fronts only"),
        "{err}"
    );
    let rising = PlanConfig {
        freeze: FreezeRule::Fronts {
            layers: vec![0, 2, 4],
        },
        ..paper(3)
    };
    assert!(plan(&rising, &vit_b16()).is_ok());
}
