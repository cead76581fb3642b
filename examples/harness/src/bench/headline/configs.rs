//! What `bench headline` runs: the job's sizes and the configurations of
//! its three tables.

use burn_elastic_dp::{
    CostModel, FreezeRule, LayerSpec, MemoryConfig, NodeConfig, Parts, ReplicaConfig, TrainerConfig,
};
use serde::{Deserialize, Serialize};

use crate::strongest::{self, Candidate};
use pipetransformer_jobs::job::{FinetuneTask, JobSpec, Method, ModelKind, PretrainSettings};

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

/// Adam's learning rate while pretraining the headline's model.
pub(super) const PRETRAIN_LR: f64 = 3e-4;

/// Adam's learning rate while fine-tuning. At 3e-4 plain fine-tuning on
/// the middle-majority task sits at the majority class for two epochs
/// before it learns, and every schedule that freezes in those epochs stays
/// there (BENCHMARKS.md); at 1e-4 it learns from the first epoch.
pub(super) const FINETUNE_LR: f64 = 1e-4;

/// How the headline pretrains: at [`PRETRAIN_LR`], at the spec's batch.
pub(super) fn pretraining(spec: &JobSpec) -> PretrainSettings {
    PretrainSettings {
        lr: PRETRAIN_LR,
        batch: spec.batch,
    }
}

/// The fine-tuning task the headline takes for `model` when none is
/// given: for BERT the majority of the middle half of the ids, which the
/// frozen encoder does not solve (`bench select-task`); the ViT has one.
pub fn default_task(model: ModelKind) -> FinetuneTask {
    match model {
        ModelKind::Bert => FinetuneTask::MiddleMajority,
        ModelKind::Vit => FinetuneTask::Same,
    }
}

/// Sizes of a run. BERT is pretrained on the majority of upper-half
/// tokens (no position learning; it transfers within this budget) and
/// fine-tuned on [`default_task`]; the tiny ViT's band task needs learned
/// positions and stays near chance for hundreds of steps at these sizes.
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
        lr: FINETUNE_LR,
        seed: 42,
        task: default_task(model),
    }
}

/// AutoPipe's unit costs in the generated task's headline: parameter
/// counts, so every configuration gets the same shapes whatever the noise.
pub(super) fn parameter_costs() -> CostModel {
    CostModel::Parameters {
        frozen_factor: 1.0 / 3.0,
    }
}

/// What every trainer configuration of a table shares: the model's
/// layers, AutoPipe's unit costs and the per-device memory budget.
#[derive(Debug, Clone)]
pub(super) struct Setting {
    pub(super) layers: usize,
    pub(super) costs: CostModel,
    /// The per-device budget (the memory-bound setting), or none.
    pub(super) memory: MemoryConfig,
    /// Whether the replica groups span the processes of the MPI job
    /// (`bench headline --mpi`).
    pub(super) nodes: bool,
}

impl Setting {
    /// `layers` blocks balanced on `costs`, without a per-device budget;
    /// `nodes`: the replica groups span the MPI job's processes.
    pub(super) fn unbounded(layers: usize, costs: CostModel, nodes: bool) -> Self {
        Self {
            layers,
            costs,
            memory: MemoryConfig::new(),
            nodes,
        }
    }

    /// This setting under a budget of `device_bytes` per device.
    pub(super) fn with_budget(&self, device_bytes: u64) -> Self {
        Self {
            memory: MemoryConfig::new().with_device_bytes(Some(device_bytes)),
            ..self.clone()
        }
    }

    /// The trainer's configuration of `parts` under `freeze` in this setting.
    pub(super) fn trainer(&self, parts: Parts, freeze: FreezeRule) -> TrainerConfig {
        TrainerConfig::new()
            .with_parts(parts)
            .with_freeze(freeze)
            .with_layers(LayerSpec::Uniform {
                offset: 1,
                per_layer: 2,
                layers: self.layers,
            })
            .with_costs(self.costs)
            .with_memory(self.memory.clone())
            .with_replicas(ReplicaConfig::new().with_nodes(self.nodes.then(NodeConfig::new)))
    }

    /// Whether the setting has a per-device budget.
    pub(super) fn bounded(&self) -> bool {
        self.memory.device_bytes.is_some()
    }
}

fn alpha(alpha: f64) -> FreezeRule {
    FreezeRule::AlphaSchedule { alpha }
}

/// The settings (b*) starts from before the search gives it its shape
/// and turns freezing off (see [`crate::strongest::no_freeze_config`]).
pub(super) fn strongest_base(setting: &Setting) -> TrainerConfig {
    setting.trainer(Parts::new(), alpha(1.0 / 3.0))
}

/// The (b*) row for the search's `winner`; it goes after (b).
pub(super) fn strongest_row(setting: &Setting, winner: Candidate) -> Configuration {
    Configuration {
        key: STRONGEST,
        name: format!("{}, {DEVICES} dev", strongest::name(winner)),
        group: Group::Headline,
        method: strongest::method(&strongest_base(setting), winner, DEVICES),
    }
}

/// (b*)'s key in the report.
pub(super) const STRONGEST: &str = "bstar";

/// (a), (b), (c) (the default freeze rule), (c) under the paper's
/// schedule, then the ablations and the alpha sweep (both at the paper's
/// alpha 1/3), in `setting`.
/// (a) is plain Burn on one device, without the budget (it has no
/// pipeline to spread a model over). (b) is the paper's baseline: a
/// pipeline over every device (K = D, set explicitly), nothing frozen;
/// (c), the ablations (freeze only, ...) and the alpha sweep start where
/// memory-aware AutoPipe chooses (the smallest K whose stages fit) until
/// [`start_at_searched`] moves them to (b*)'s shape. "all frozen" freezes
/// every block from the first step (only the classifier trains): what the
/// task loses without its top layers.
pub(super) fn configurations(setting: &Setting) -> Vec<Configuration> {
    let mut list = headline_configurations(setting);
    list.extend(ablations(setting));
    list.extend(alpha_sweep(setting));
    list
}

/// The trainer on [`DEVICES`] devices with `parts` and `freeze` in `setting`.
fn trainer_method(setting: &Setting, parts: Parts, freeze: FreezeRule) -> Method {
    Method::Trainer {
        config: setting.trainer(parts, freeze),
        devices: DEVICES,
    }
}

/// (a), (b), (c) under the default freeze rule ([`FreezeRule::Evidence`])
/// and (c) under the paper's schedule.
fn headline_configurations(setting: &Setting) -> Vec<Configuration> {
    let all = Parts::new();
    let plain = if setting.bounded() {
        "(a) plain Burn, 1 device, no budget"
    } else {
        "(a) plain Burn, 1 device"
    };
    vec![
        Configuration {
            key: "a",
            name: plain.into(),
            group: Group::Headline,
            method: Method::Plain,
        },
        Configuration {
            key: "b",
            name: format!("(b) pipe+DP baseline, {DEVICES} dev"),
            group: Group::Headline,
            method: Method::Trainer {
                config: setting
                    .trainer(all.with_freeze(false), alpha(1.0 / 3.0))
                    .with_stages(Some(DEVICES)),
                devices: DEVICES,
            },
        },
        Configuration {
            key: "c",
            name: "(c) PipeTransformer".into(),
            group: Group::Headline,
            method: trainer_method(setting, all, TrainerConfig::new().freeze),
        },
        Configuration {
            key: SCHEDULE,
            name: "(c) paper's schedule a=1/3".into(),
            group: Group::Headline,
            method: trainer_method(setting, all, alpha(1.0 / 3.0)),
        },
    ]
}

/// The key of (c) under the paper's schedule (alpha 1/3), the rule the
/// ablations and the alpha sweep vary; (c) itself runs the default rule.
pub(super) const SCHEDULE: &str = "schedule";

/// The paper's ablations (each under the paper's schedule, so "all four"
/// is the [`SCHEDULE`] row), then "all frozen".
fn ablations(setting: &Setting) -> Vec<Configuration> {
    let all = Parts::new();
    let ablations = [
        (
            "freeze",
            "freeze only",
            all.with_pipe(false).with_dp(false).with_cache(false),
        ),
        ("freeze+pipe+cache", "freeze+pipe+cache", all.with_dp(false)),
        ("freeze+pipe+dp", "freeze+pipe+dp", all.with_cache(false)),
    ];
    let mut list = Vec::new();
    for (key, name, parts) in ablations {
        list.push(Configuration {
            key,
            name: name.into(),
            group: Group::Ablation,
            method: trainer_method(setting, parts, alpha(1.0 / 3.0)),
        });
    }
    list.push(Configuration {
        key: ALL_FROZEN,
        name: "all frozen (classifier only)".into(),
        group: Group::Ablation,
        method: trainer_method(
            setting,
            all,
            FreezeRule::Fronts {
                layers: vec![setting.layers],
            },
        ),
    });
    list
}

/// The alpha sweep around the paper's 1/3 (the [`SCHEDULE`] row), then
/// the argmin rule.
fn alpha_sweep(setting: &Setting) -> Vec<Configuration> {
    let all = Parts::new();
    let mut list = Vec::new();
    for (key, name, alpha_value) in [
        ("alpha=1/5", "alpha=1/5", 0.2),
        ("alpha=1/4", "alpha=1/4", 0.25),
        ("alpha=2/5", "alpha=2/5", 0.4),
        ("alpha=1/2", "alpha=1/2", 0.5),
    ] {
        list.push(Configuration {
            key,
            name: name.into(),
            group: Group::Alpha,
            method: trainer_method(setting, all, alpha(alpha_value)),
        });
    }
    list.push(Configuration {
        key: "argmin",
        name: "--freeze-rule argmin a=1/3".into(),
        group: Group::Alpha,
        method: trainer_method(
            setting,
            all,
            FreezeRule::AlphaArgmin {
                alpha: 1.0 / 3.0,
                statistic: None,
            },
        ),
    });
    list
}

/// Starts every configuration that freezes ((c), the ablations, the alpha
/// sweep) at the shape (b*)'s search found fastest, `winner.stages` stages:
/// the same start rule as (b*), so the first epoch, before anything is
/// frozen, runs at (b*)'s speed, and what (c) gains after it is AutoFreeze,
/// AutoPipe, AutoDP and AutoCache. AutoPipe then compresses from there
/// (never to a stage larger than the start's, nor over the budget); with
/// AutoDP off the replicas stay at `devices / winner.stages`. (a), (b) and
/// (b*) freeze nothing and keep their shapes.
pub(super) fn start_at_searched(configurations: &mut [Configuration], winner: Candidate) {
    for configuration in configurations {
        if let Method::Trainer { config, .. } = &mut configuration.method
            && config.parts.freeze
        {
            config.stages = Some(winner.stages);
        }
    }
}

/// The "all frozen" row's key in the report.
pub(super) const ALL_FROZEN: &str = "all-frozen";

/// Whether `method` reads frozen outputs from the cache.
pub(super) fn uses_cache(method: &Method) -> bool {
    match method {
        Method::Plain => false,
        Method::Trainer { config, .. } | Method::Resume { config, .. } => {
            config.parts.cache && config.parts.freeze
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pipetransformer_jobs::job::{JobSpec, ModelKind, Silent};

    fn trainer_of<'a>(list: &'a [Configuration], key: &str) -> &'a TrainerConfig {
        match &list.iter().find(|c| c.key == key).unwrap().method {
            Method::Trainer { config, .. } => config,
            _ => panic!("{key} runs the trainer"),
        }
    }

    #[test]
    fn every_configuration_that_freezes_starts_at_the_searched_shape_and_the_baselines_keep_theirs()
    {
        let setting = Setting::unbounded(12, parameter_costs(), false).with_budget(1 << 24);
        let winner = Candidate {
            stages: 2,
            replicas: 2,
            micro_batches: 16,
        };
        let mut list = configurations(&setting);
        list.insert(2, strongest_row(&setting, winner));
        // Before: the memory-aware start, chosen by the trainer.
        assert_eq!(trainer_of(&list, "c").stages, None);
        start_at_searched(&mut list, winner);
        let mut moved = 0;
        for configuration in &list {
            let Method::Trainer { config, .. } = &configuration.method else {
                assert_eq!(configuration.key, "a");
                continue;
            };
            let expected = match configuration.key {
                "b" => Some(DEVICES),
                _ => Some(winner.stages),
            };
            assert_eq!(config.stages, expected, "{}", configuration.key);
            moved += usize::from(config.parts.freeze);
        }
        // (c), the schedule, 3 ablations, "all frozen", 4 alphas and argmin.
        assert_eq!(moved, 11);
        assert!(!trainer_of(&list, "b").parts.freeze);
        assert!(!trainer_of(&list, STRONGEST).parts.freeze);
    }

    #[test]
    fn c_trains_its_first_epoch_in_the_searched_shape() {
        let spec = JobSpec {
            model: ModelKind::Bert,
            layers: 4,
            hidden: 16,
            pretrain_epochs: 0,
            samples: 64,
            eval_samples: 8,
            batch: 32,
            epochs: 2,
            lr: 1e-3,
            seed: 3,
            task: default_task(ModelKind::Bert),
        };
        let pretrained = spec.pretrain(&mut Silent);
        let setting = Setting::unbounded(spec.layers, parameter_costs(), false);
        let first_shape = |list: &[Configuration]| {
            let c = list.iter().find(|c| c.key == "c").unwrap();
            let (record, _) = spec
                .finetune(&pretrained, "c", &c.method, &mut Silent)
                .unwrap();
            let first = &record.epochs[0].report;
            (first.stages, first.replicas)
        };
        let mut list = configurations(&setting);
        // Without a budget the memory-aware start is one stage on every device.
        assert_eq!(first_shape(&list), (1, DEVICES));
        start_at_searched(
            &mut list,
            Candidate {
                stages: 2,
                replicas: 2,
                micro_batches: 16,
            },
        );
        assert_eq!(first_shape(&list), (2, 2));
    }
}
