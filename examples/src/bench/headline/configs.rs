//! What `bench headline` runs: the job's sizes and the configurations of
//! its three tables.

use burn_elastic_dp::{CostModel, FreezeRule, LayerSpec, Parts, TrainerConfig};
use serde::{Deserialize, Serialize};

use crate::job::{JobSpec, Method, ModelKind};
use crate::strongest::{self, Candidate};

/// Logical devices every distributed configuration uses.
pub(super) const DEVICES: usize = 4;

/// Which table a configuration belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(super) enum Group {
    /// (a), (b), (b*), (c).
    Headline,
    /// The paper's ablation (all four = (c)).
    Ablation,
    /// The alpha sweep (1/3 = (c)).
    Alpha,
}

/// One configuration: its key in the report, its name in the tables, its
/// table and how it fine-tunes.
#[derive(Clone)]
pub(super) struct Configuration {
    pub(super) key: &'static str,
    pub(super) name: String,
    pub(super) group: Group,
    pub(super) method: Method,
}

/// Sizes of a run. BERT's task (majority of upper-half tokens) needs no
/// position learning and transfers from pretraining within this budget;
/// the tiny ViT's band task needs learned positions and stays near chance
/// for hundreds of steps at these sizes.
pub(super) fn spec(model: ModelKind, quick: bool) -> JobSpec {
    let (hidden, samples, pretrain_epochs) = if quick {
        (64, 384, 10)
    } else {
        (128, 2048, 12)
    };
    JobSpec {
        model,
        layers: 12,
        hidden,
        pretrain_epochs,
        samples,
        eval_samples: 512,
        batch: 64,
        epochs: 10,
        lr: 3e-4,
        seed: 42,
    }
}

/// AutoPipe's unit costs in the generated task's headline: parameter
/// counts, so every configuration gets the same shapes whatever the noise.
pub(super) fn parameter_costs() -> CostModel {
    CostModel::Parameters {
        frozen_factor: 1.0 / 3.0,
    }
}

fn trainer(parts: Parts, alpha: f64, layers: usize, costs: CostModel) -> TrainerConfig {
    TrainerConfig::new()
        .with_parts(parts)
        .with_freeze(FreezeRule::AlphaSchedule { alpha })
        .with_layers(LayerSpec::Uniform {
            offset: 1,
            per_layer: 2,
            layers,
        })
        .with_costs(costs)
}

/// The settings (b*) starts from before the search gives it its shape
/// and turns freezing off (see [`crate::strongest::no_freeze_config`]).
pub(super) fn strongest_base(layers: usize, costs: CostModel) -> TrainerConfig {
    trainer(Parts::new(), 1.0 / 3.0, layers, costs)
}

/// The (b*) row for the search's `winner`; it goes after (b).
pub(super) fn strongest_row(layers: usize, costs: CostModel, winner: Candidate) -> Configuration {
    Configuration {
        key: STRONGEST,
        name: format!("{}, {DEVICES} dev", strongest::name(winner)),
        group: Group::Headline,
        method: strongest::method(&strongest_base(layers, costs), winner, DEVICES),
    }
}

/// (b*)'s key in the report.
pub(super) const STRONGEST: &str = "bstar";

/// (a), (b), (c), then the ablations and the alpha sweep, for a model of
/// `layers` layers, AutoPipe balancing on `costs`. (b) is the paper's
/// baseline: a pipeline over every device (K = D, set explicitly, not the
/// trainer's default start), nothing frozen; (c) and the alpha sweep start
/// where memory-aware AutoPipe chooses; the ablations (freeze only, ...)
/// at the paper's start, K = D.
pub(super) fn configurations(layers: usize, costs: CostModel) -> Vec<Configuration> {
    let all = Parts::new();
    let trainer_method = |parts: Parts, alpha: f64| Method::Trainer {
        config: trainer(parts, alpha, layers, costs),
        devices: DEVICES,
    };
    let mut list = vec![
        Configuration {
            key: "a",
            name: "(a) plain Burn, 1 device".into(),
            group: Group::Headline,
            method: Method::Plain,
        },
        Configuration {
            key: "b",
            name: format!("(b) pipe+DP baseline, {DEVICES} dev"),
            group: Group::Headline,
            method: Method::Trainer {
                config: trainer(all.with_freeze(false), 1.0 / 3.0, layers, costs)
                    .with_stages(Some(DEVICES)),
                devices: DEVICES,
            },
        },
        Configuration {
            key: "c",
            name: "(c) PipeTransformer a=1/3".into(),
            group: Group::Headline,
            method: trainer_method(all, 1.0 / 3.0),
        },
    ];
    let ablations = [
        (
            "freeze",
            "freeze only",
            all.with_pipe(false).with_dp(false).with_cache(false),
        ),
        ("freeze+pipe+cache", "freeze+pipe+cache", all.with_dp(false)),
        ("freeze+pipe+dp", "freeze+pipe+dp", all.with_cache(false)),
    ];
    // The paper's ablations at the paper's start (one pipeline over every
    // device): from one stage, AutoPipe has nothing to compress.
    for (key, name, parts) in ablations {
        list.push(Configuration {
            key,
            name: name.into(),
            group: Group::Ablation,
            method: Method::Trainer {
                config: trainer(parts, 1.0 / 3.0, layers, costs).with_stages(Some(DEVICES)),
                devices: DEVICES,
            },
        });
    }
    for (key, name, alpha) in [
        ("alpha=1/5", "alpha=1/5", 0.2),
        ("alpha=1/4", "alpha=1/4", 0.25),
        ("alpha=2/5", "alpha=2/5", 0.4),
        ("alpha=1/2", "alpha=1/2", 0.5),
    ] {
        list.push(Configuration {
            key,
            name: name.into(),
            group: Group::Alpha,
            method: trainer_method(all, alpha),
        });
    }
    list
}

/// Whether `method` reads frozen outputs from the cache.
pub(super) fn uses_cache(method: &Method) -> bool {
    match method {
        Method::Plain => false,
        Method::Trainer { config, .. } | Method::Resume { config, .. } => {
            config.parts.cache && config.parts.freeze
        }
    }
}
