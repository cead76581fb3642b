//! The paper's AutoFreeze rule on the epoch's accumulated gradient, in the
//! trainer: the fronts it picks do not depend on how the global batch is
//! spread (R replicas) or the model cut (K stages), since every stage of
//! every replica sums the all-reduced gradients of its own units.

mod common;

use burn::optim::AdamConfig;
use burn::prelude::*;
use burn_elastic_dp::{
    BatchPolicy, CostModel, FreezeRule, LayerSpec, Parts, ReplicaConfig, TrainerConfig,
};
use burn_freeze::ArgminStatistic;
use burn_pipe::PipelineConfig;

use common::{B, Rows, block_stack, four_class_rows, loss};

const WIDTH: usize = 8;
const UNITS: usize = 8;
const LAYERS: usize = UNITS - 1;
const EPOCHS: usize = 4;

/// The argmin rule with a loose alpha bound (0.9: from 0 of 7 layers, the
/// units before the classifier, up to 7), so the argmin decides; a fixed
/// global batch of 16.
fn config(statistic: Option<ArgminStatistic>, stages: usize, parts: Parts) -> TrainerConfig {
    TrainerConfig::new()
        .with_parts(parts)
        .with_stages(Some(stages))
        .with_freeze(FreezeRule::AlphaArgmin {
            alpha: 0.9,
            statistic,
        })
        .with_layers(LayerSpec::Uniform {
            offset: 0,
            per_layer: 1,
            layers: LAYERS,
        })
        .with_batch(BatchPolicy::FixedGlobal { batch: 16 })
        .with_lr(1e-2)
        .with_costs(CostModel::Parameters {
            frozen_factor: 1.0 / 3.0,
        })
        .with_replicas(
            ReplicaConfig::new().with_pipeline(PipelineConfig::new().with_micro_batches(Some(2))),
        )
        .with_seed(5)
}

/// The frozen layers after each epoch, and the (K, R) each epoch ran with.
fn fronts(config: TrainerConfig, devices: usize) -> (Vec<usize>, Vec<(usize, usize)>) {
    let device: Device<B> = Default::default();
    let data = four_class_rows::<WIDTH>(64);
    let mut trainer = config
        .init(
            block_stack(UNITS, WIDTH),
            vec![device; devices],
            || AdamConfig::new().init(),
            loss,
        )
        .unwrap();
    let mut fronts = Vec::new();
    let mut shapes = Vec::new();
    for _ in 0..EPOCHS {
        let report = trainer.fit_epoch(&data, &Rows).unwrap();
        shapes.push((report.stages, report.replicas));
        fronts.push(trainer.frozen_layers());
    }
    (fronts, shapes)
}

fn fixed() -> Parts {
    Parts::new()
        .with_pipe(false)
        .with_dp(false)
        .with_cache(false)
}

#[test]
fn the_accumulated_argmin_picks_the_same_fronts_for_any_replicas_and_stages() {
    let (one, shapes) = fronts(config(None, 1, fixed()), 1);
    assert_eq!(shapes, vec![(1, 1); EPOCHS]);
    // The argmin decided, not the alpha bound (7 layers after epoch 0).
    assert!(one[0] > 0 && one[0] < LAYERS, "fronts {one:?}");
    assert!(one.windows(2).all(|w| w[0] <= w[1]));

    let (two_replicas, shapes) = fronts(config(None, 1, fixed()), 2);
    assert_eq!(shapes, vec![(1, 2); EPOCHS]);
    assert_eq!(two_replicas, one, "R=2 against R=1");

    let (two_stages, shapes) = fronts(config(None, 2, fixed()), 2);
    assert_eq!(shapes, vec![(2, 1); EPOCHS]);
    assert_eq!(two_stages, one, "K=2 against K=1");

    // Every part on from K=4: the pipeline compresses and replicas join as
    // the front moves; the decisions stay those of one device.
    let (elastic, shapes) = fronts(config(None, 4, Parts::new()), 4);
    assert_eq!(shapes[0], (4, 1));
    assert!(shapes[1..].iter().any(|&s| s != (4, 1)), "{shapes:?}");
    assert_eq!(elastic, one, "elastic run against one device");
}

#[test]
fn an_old_argmin_configuration_runs_the_accumulated_statistic() {
    let old = config(None, 1, fixed());
    let explicit = config(Some(ArgminStatistic::AccumulatedGradient), 1, fixed());
    assert_eq!(fronts(old, 1).0, fronts(explicit, 1).0);
    // The configuration file of a run from before the statistic existed.
    let json = explicit_json_without_statistic();
    let parsed: TrainerConfig = serde_json::from_str(&json).unwrap();
    assert_eq!(
        parsed.freeze,
        FreezeRule::AlphaArgmin {
            alpha: 0.9,
            statistic: None
        }
    );
    assert_eq!(
        parsed.freeze.argmin_statistic(),
        Some(ArgminStatistic::AccumulatedGradient)
    );
}

/// A saved `TrainerConfig` whose `AlphaArgmin` has no `statistic` field.
fn explicit_json_without_statistic() -> String {
    let config = config(None, 1, fixed());
    let mut value: serde_json::Value = serde_json::to_value(&config).unwrap();
    let rule = value["freeze"]["AlphaArgmin"].as_object_mut().unwrap();
    assert!(rule.remove("statistic").is_some());
    serde_json::to_string(&value).unwrap()
}
