//! The main job: pretrain a tiny transformer on generated data, then
//! fine-tune it on a related task with PipeTransformer (freezing, pipeline,
//! replicas, cache), next to plain Burn training and the strongest
//! configuration that freezes nothing, (b*), from the same weights; a line
//! per epoch, a summary table with the speed-ups against both, the trained
//! model and the metrics saved.
//!
//! ```text
//! cargo run --release -p examples --bin train                     # ViT, 4 devices, alpha 1/3
//! cargo run --release -p examples --bin train -- --size ci        # a quick smoke run
//! cargo run --release -p examples --bin train -- --model bert --no-dp
//! cargo run --release -p examples --bin train -- --plain          # plain Burn only
//! ```

// The binary's own modules, in `train/` beside this file.
#[path = "train/cli.rs"]
mod cli;
#[path = "train/console.rs"]
mod console;
#[path = "train/mpi_job.rs"]
mod mpi_job;

use std::path::Path;

use burn::data::dataset::Dataset;
use burn_elastic_dp::{Parts, TrainerConfig, TrainerError};
use clap::Parser;
use pipetransformer_harness::plots::{self, EpochMetric};
use pipetransformer_harness::strongest::{self, Strongest, fits_without_budget};
use pipetransformer_jobs::backend;
use pipetransformer_jobs::job::{
    JobError, JobSpec, Method, Observer, PretrainSettings, Pretrained, RunRecord, SstJob,
    sst_accuracy,
};
use serde::Serialize;

use cli::{Args, Rule};
use console::{Console, Pretraining, print_summary};
use mpi_job::MpiJob;

/// Why a run stopped: a one-line message and the exit code, 2 for flags
/// that cannot work together, 1 for paths the file system refuses and for
/// a run that failed.
pub(crate) struct Failure {
    code: i32,
    message: String,
}

impl Failure {
    /// Flags that cannot work (exit 2).
    pub(crate) fn usage(message: impl std::fmt::Display) -> Self {
        Self {
            code: 2,
            message: message.to_string(),
        }
    }

    /// Weights, data or an output directory that cannot be read or
    /// written, or a run that failed (exit 1).
    pub(crate) fn io(message: impl std::fmt::Display) -> Self {
        Self {
            code: 1,
            message: message.to_string(),
        }
    }

    /// A fine-tuning run's error: a size it refused is a flag's (exit 2).
    fn of_job(error: JobError) -> Self {
        match error {
            JobError::Trainer(TrainerError::Stopped { .. }) => Self {
                code: burn_elastic_dp::STOPPED_EXIT_CODE,
                message: error.to_string(),
            },
            JobError::Spec(_)
            | JobError::Trainer(
                TrainerError::DoesNotFit { .. } | TrainerError::StageDoesNotFit { .. },
            ) => Self::usage(error),
            _ => Self::io(error),
        }
    }
}

/// The heap counted, so that memory-aware AutoPipe measures each unit's
/// activations on the first batch (see `burn_pipe::balance::HeapCounter`).
#[global_allocator]
static HEAP: burn_pipe::balance::HeapCounter = burn_pipe::balance::HeapCounter;

fn main() {
    // Under mpirun (feature `mpi`): MPI first, then everything else.
    let job = MpiJob::start();
    // Freed tensors' memory reused, not returned to the system and faulted
    // in again every step (see `pipetransformer_jobs::allocator`).
    pipetransformer_jobs::allocator::keep_freed_memory();
    pipetransformer_jobs::init_logging();
    let args = Args::parse();
    if let Err(failure) = job.and_then(|job| run(&args, &job)) {
        eprintln!("error: {}", failure.message);
        std::process::exit(failure.code);
    }
}

/// The whole job: the flags checked, the model pretrained (or loaded),
/// fine-tuned each way asked, the summary printed, the results saved (by
/// rank 0 of a job across processes; see `train/mpi_job.rs`).
fn run(args: &Args, job: &MpiJob) -> Result<(), Failure> {
    let args = &job.adapt_args(args)?;
    let (mut spec, config) = args.validate()?;
    let config = job.adapt_config(config, args.devices as usize)?;
    let prepared = prepare(args, &mut spec)?;
    let (runs, strongest, trained) = finetune_runs(args, &spec, config, &prepared)?;
    if !job.is_leader() {
        return job.save_model(&args.output_dir, &trained);
    }
    let strongest_name = strongest.as_ref().map(|s| strongest::name(s.winner));
    print_summary(&runs, spec.samples, strongest_name.as_deref());
    if let (Some(file), Some(job)) = (&args.eval_file, &prepared.sst) {
        print_eval_file(file, job, &trained, &runs[0].name)?;
    }
    save_results(args, &spec, &prepared, &runs, strongest.as_ref(), &trained)
}

/// The model to fine-tune, with the real path's data or the generated
/// task's pretraining run.
struct Prepared {
    model: Pretrained,
    /// The real path: SST-2 or SST-5 (`None`: the generated task).
    sst: Option<SstJob>,
    /// Pretraining's epochs (none on the real path).
    pretraining: RunRecord,
    /// Pretraining's learning rate and batch (none on the real path).
    settings: Option<PretrainSettings>,
}

/// Loads the pretrained weights and SST-2 or SST-5 (the real path, `spec.samples`
/// set to the training sentences) or pretrains on the generated task.
fn prepare(args: &Args, spec: &mut JobSpec) -> Result<Prepared, Failure> {
    let Some((weights, data)) = args.real() else {
        return Ok(pretrain(spec, args.pretraining()));
    };
    let task = args.sst_task();
    let (model, job) = spec
        .load_sst_labelled(weights, data, args.max_length as usize, task.labels())
        .map_err(Failure::io)?;
    println!(
        "{} (pretrained, {} units) on {} from {}: {} training and {} held-out sentences, on {}; seed {}",
        weights.display(),
        model.num_units(),
        task.name(),
        data.display(),
        job.train.len(),
        job.dev.len(),
        backend::NAME,
        spec.seed
    );
    spec.samples = job.train.len();
    Ok(Prepared {
        model,
        sst: Some(job),
        pretraining: Pretraining::new().finish(),
        settings: None,
    })
}

/// Pretrains on the generated task with `settings`, a line per epoch.
fn pretrain(spec: &JobSpec, settings: PretrainSettings) -> Prepared {
    println!(
        "{:?} with {} blocks of width {} on {}; seed {}",
        spec.model,
        spec.layers,
        spec.hidden,
        backend::NAME,
        spec.seed
    );
    println!(
        "pretraining on the generated task ({} epochs of {} samples, batch {}, lr {:e}); fine-tuning at batch {}, lr {:e}",
        spec.pretrain_epochs, spec.samples, settings.batch, settings.lr, spec.batch, spec.lr
    );
    let mut pretraining = Pretraining::new();
    let model = spec.pretrain_with(settings, &mut pretraining);
    Prepared {
        model,
        sst: None,
        pretraining: pretraining.finish(),
        settings: Some(settings),
    }
}

/// Fine-tunes with PipeTransformer (unless `--plain`), (b*) (unless
/// `--plain`, `--no-baseline` or `--no-strongest`) and plain Burn (unless
/// `--no-baseline`), from the same weights. Gives the runs, (b*)'s search
/// where it ran, and the first run's trained model.
fn finetune_runs(
    args: &Args,
    spec: &JobSpec,
    config: TrainerConfig,
    prepared: &Prepared,
) -> Result<(Vec<RunRecord>, Option<Strongest>, Pretrained), Failure> {
    let mut console = Console::new(prepared.model.num_units());
    let mut runs = Vec::new();
    let mut trained = None;
    let mut strongest = None;
    if !args.plain {
        print_pipetransformer_start(args, &prepared.model);
        let devices = args.devices as usize;
        let base = config.clone();
        let method = if args.resume {
            Method::Resume { config, devices }
        } else {
            Method::Trainer { config, devices }
        };
        let (record, model) = finetune(spec, prepared, "PipeTransformer", &method, &mut console)
            .map_err(Failure::of_job)?;
        console.finish();
        if record.epochs.is_empty() {
            println!(
                "the checkpoint's run had already finished its {} epochs: nothing left to train (a larger --epochs trains on)",
                spec.epochs
            );
        }
        runs.push(record);
        trained = Some(model);
        if !args.no_baseline && !args.no_strongest {
            let (found, record) = strongest_run(spec, &base, devices, prepared, &mut console)?;
            runs.push(record);
            strongest = Some(found);
        }
    }
    if args.plain || !args.no_baseline {
        println!("fine-tuning with plain Burn on one device, from the same pretrained weights");
        let (record, model) = finetune(spec, prepared, "plain Burn", &Method::Plain, &mut console)
            .map_err(Failure::io)?;
        console.finish();
        runs.push(record);
        trained.get_or_insert(model);
    }
    // `--plain` conflicts with `--no-baseline`: one of the two ran.
    Ok((runs, strongest, trained.expect("a run")))
}

/// (b*): the fastest configuration that freezes nothing on `devices`
/// devices, found by timing a few steps of each candidate (every K that
/// divides the devices; no memory budget yet), then fine-tuned fully from
/// the same weights. Gives the search and the run.
fn strongest_run(
    spec: &JobSpec,
    base: &TrainerConfig,
    devices: usize,
    prepared: &Prepared,
    console: &mut Console,
) -> Result<(Strongest, RunRecord), Failure> {
    println!(
        "finding (b*), the fastest configuration that freezes nothing on {devices} devices: {} steps of each K dividing {devices}, R = {devices}/K",
        strongest::WARM_UP_STEPS + strongest::MEASURED_STEPS
    );
    let found = strongest::find(
        spec,
        base,
        devices,
        fits_without_budget,
        |short, method, clock| {
            finetune(short, prepared, "(b*) candidate", method, clock).map(|(record, _)| record)
        },
    )
    .map_err(Failure::of_job)?;
    println!("{}", found.summary());
    let name = strongest::name(found.winner);
    println!("fine-tuning with {name} (nothing frozen), from the same pretrained weights");
    let method = strongest::method(base, found.winner, devices);
    let (record, _) = finetune(spec, prepared, &name, &method, console).map_err(Failure::of_job)?;
    console.finish();
    Ok((found, record))
}

fn print_pipetransformer_start(args: &Args, model: &Pretrained) {
    let alpha = match (args.no_freeze, args.freeze_rule) {
        (true, _) => "nothing frozen".to_string(),
        (false, Rule::Evidence) => format!(
            "freezing on evidence, at most {:.2} of the active layers at once",
            args.alpha()
        ),
        (false, _) => format!("alpha {:.2}", args.alpha()),
    };
    println!(
        "fine-tuning with PipeTransformer on {} devices ({alpha}; {} units, {} parameters)",
        args.devices,
        model.num_units(),
        model.num_params()
    );
}

/// One fine-tuning run `name` with `method`, on SST or the generated task.
fn finetune(
    spec: &JobSpec,
    prepared: &Prepared,
    name: &str,
    method: &Method,
    observer: &mut impl Observer,
) -> Result<(RunRecord, Pretrained), JobError> {
    match &prepared.sst {
        Some(job) => spec.finetune_sst(&prepared.model, job, name, method, observer),
        None => spec.finetune(&prepared.model, name, method, observer),
    }
}

/// `--eval-file`: the accuracy of the run `name`'s model on it.
fn print_eval_file(
    file: &Path,
    job: &SstJob,
    model: &Pretrained,
    name: &str,
) -> Result<(), Failure> {
    let accuracy = sst_accuracy(model, file, job).map_err(Failure::io)?;
    println!(
        "accuracy on {} ({name}): {:.2}%",
        file.display(),
        100.0 * accuracy
    );
    Ok(())
}

/// What `metrics.json` holds.
#[derive(Serialize)]
struct Metrics<'a> {
    backend: &'a str,
    spec: &'a JobSpec,
    devices: u32,
    /// Pipeline stages the first run started with, as it ran (the
    /// memory-aware start, or `--stages`).
    stages: u32,
    freeze_alpha: f64,
    parts: Parts,
    units: usize,
    parameters: usize,
    pretraining: &'a RunRecord,
    /// Pretraining's learning rate and batch (the spec's are fine-tuning's).
    pretrain_settings: Option<PretrainSettings>,
    /// (b*)'s search: each candidate's seconds per step and the winner.
    strongest: Option<&'a Strongest>,
    runs: &'a [RunRecord],
}

/// Saves the first run's model (`model.mpk`), `metrics.json` and the
/// plots in the output directory, and says so.
fn save_results(
    args: &Args,
    spec: &JobSpec,
    prepared: &Prepared,
    runs: &[RunRecord],
    strongest: Option<&Strongest>,
    trained: &Pretrained,
) -> Result<(), Failure> {
    let dir = &args.output_dir;
    let metrics = Metrics {
        backend: backend::NAME,
        spec,
        devices: args.devices,
        stages: runs
            .first()
            .and_then(|run| run.epochs.first())
            .map_or(args.stages.unwrap_or(1), |epoch| epoch.report.stages as u32),
        freeze_alpha: args.alpha(),
        parts: args.parts(),
        units: prepared.model.num_units(),
        parameters: prepared.model.num_params(),
        pretraining: &prepared.pretraining,
        pretrain_settings: prepared.settings,
        strongest,
        runs,
    };
    save_model_and_metrics(dir, trained, &metrics).map_err(Failure::io)?;
    let plots = draw_plots(dir, runs).map_err(Failure::io)?;
    println!(
        "saved the trained model ({}, model.mpk), metrics.json, the transition log and the plots ({}) in {}",
        runs[0].name,
        plots.join(", "),
        dir.display()
    );
    Ok(())
}

fn save_model_and_metrics(dir: &Path, model: &Pretrained, metrics: &Metrics) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot make {}: {e}", dir.display()))?;
    let path = dir.join("model");
    model
        .save_file(&path)
        .map_err(|e| format!("cannot save the model to {}: {e}", path.display()))?;
    let json = serde_json::to_string_pretty(metrics).expect("metrics serialise");
    let path = dir.join("metrics.json");
    std::fs::write(&path, json).map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// Plots a person would rather look at than read; gives their file names.
fn draw_plots(dir: &Path, runs: &[RunRecord]) -> Result<Vec<String>, plots::PlotError> {
    let paths = EpochMetric::ALL
        .into_iter()
        .map(|metric| plots::per_epoch(dir, runs, metric))
        .chain(
            runs.iter()
                .find(|r| r.name == "PipeTransformer")
                .map(|run| plots::shape(dir, run, "pipetransformer")),
        )
        .collect::<Result<Vec<_>, _>>()?;
    Ok(paths
        .iter()
        .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .collect())
}
