//! `bench tasks`: the task suite for freezing at equal accuracy: five tasks,
//! each as (b*), the paper's alpha 1/3 and the default freeze rule.

mod data;
mod summary;
mod task;
mod tta;

pub use task::{ALL_TASKS, OtherSignal, SuiteTask, TaskTargets};
pub use tta::{TARGET_MARGIN_POINTS, TimeToAccuracy, speedup_at_equal_accuracy, time_to_accuracy};

use std::time::Instant;

use burn_elastic_dp::{FreezeRule, Parts, TrainerConfig};
use serde::Serialize;

use super::configs::{
    Configuration, DEVICES, Group, Setting, parameter_costs, start_at_searched, strongest_row,
};
use super::real::RealPaths;
use super::shared::{Progress, find_pipelined, find_strongest, run_err};
use crate::bench::{BenchError, title, write_report};
use crate::strongest::{StepClock, Strongest};
use data::{Generated, Pretrains, Sst, TaskData};
use pipetransformer_jobs::backend;
use pipetransformer_jobs::job::{JobSpec, Method, Pretrained, RunRecord};
use summary::{ConfigSummary, print_table, summaries};

/// The seeds `bench tasks` runs without `--seeds`: 1, 2, 3 (accuracy
/// claims are means over 3); `--quick`: 1.
pub fn default_seeds(quick: bool) -> Vec<u64> {
    if quick { vec![1] } else { vec![1, 2, 3] }
}

/// Tasks not run, each with why.
type Skipped = Vec<(SuiteTask, String)>;

/// What `target/bench/tasks.json` holds.
#[derive(Debug, Serialize)]
struct Report {
    bench: &'static str,
    backend: &'static str,
    quick: bool,
    note: &'static str,
    seeds: Vec<u64>,
    devices: usize,
    tasks: Vec<TaskReport>,
    /// Tasks not run, and why (`--quick` without MiniLM or SST).
    skipped: Skipped,
    total_seconds: f64,
}

/// One task's section.
#[derive(Debug, Serialize)]
struct TaskReport {
    task: SuiteTask,
    /// The first seed's spec (the others differ in the seed).
    spec: JobSpec,
    /// SST: tokens per sentence (the training subset is the same for every
    /// seed).
    #[serde(skip_serializing_if = "Option::is_none")]
    max_length: Option<usize>,
    /// `memory-bound` or `unbounded`, as in the table.
    setting: String,
    /// The per-device budget of every configuration (none: unbounded).
    device_bytes: Option<u64>,
    /// (b*)'s search on the first seed: each candidate and the fastest.
    strongest: Strongest,
    /// The time-to-accuracy target, in percent: (b*)'s final mean - 0.5.
    target_percent: f64,
    configurations: Vec<ConfigSummary>,
    targets: TaskTargets,
    seconds: f64,
}

/// Runs `tasks` over `seeds` (checked with
/// [`validate_seeds`](super::validate_seeds)); the SST tasks read MiniLM and
/// SST from `paths` (the resolved directories, or why they are missing:
/// the full run refuses, `--quick` skips them).
///
/// `bench tasks`: for each task ([`SuiteTask`]: `same` and
/// `middle-majority` on the generated BERT, `train`'s default ViT job,
/// MiniLM on SST-2 and on SST-5), on [`DEVICES`] logical devices,
///
/// - (b*), the fastest configuration that freezes nothing, searched on the
///   first seed as the headline does ([`crate::strongest`]),
/// - the paper's schedule, `FreezeRule::AlphaSchedule { alpha: 1/3 }`, all
///   four parts,
/// - the default, `TrainerConfig::new().freeze` (the evidence rule), all
///   four parts,
///
/// the freezing ones starting at (b*)'s shape; under the headline's
/// memory-bound budget (a per-device budget at which the model does not
/// fit one device, so (b*) must pipeline) where it can be set, else
/// unbounded (the table says which). Seeds interleaved: per seed, the
/// three configurations in turn. Per task a table: final held-out
/// accuracy and training seconds (evaluation excluded) as mean and range,
/// the training seconds until the held-out accuracy first reaches (b*)'s
/// final mean minus 0.5 points ([`time_to_accuracy`]), the speed-up at
/// equal accuracy, the first seed's per-epoch front, loss and accuracy,
/// and the issue's targets for the default, PASS or MISS
/// ([`TaskTargets`]). Written to `target/bench/tasks.json`.
pub fn run(
    quick: bool,
    tasks: &[SuiteTask],
    seeds: &[u64],
    signals: &[OtherSignal],
    paths: Result<RealPaths, String>,
) -> Result<(), BenchError> {
    let start = Instant::now();
    super::validate_seeds(seeds).map_err(BenchError::Run)?;
    let (tasks, skipped) = runnable(quick, tasks, &paths)?;
    let details = format!(
        "tasks {}; seeds {seeds:?} interleaved; (b*), alpha 1/3 and the default freeze rule on {DEVICES} logical devices sharing this machine's CPU; shared 2-core machine: times are noisy",
        tasks
            .iter()
            .map(|t| t.name())
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!("{}", title("tasks", quick, &details));
    for (task, why) in &skipped {
        println!("skipping {}: {why}", task.name());
    }
    let mut pretrains = Pretrains::default();
    let mut reports = Vec::new();
    for &task in &tasks {
        println!("\n== task {}", task.name());
        let report = match (&paths, task.sst_labels()) {
            (Ok(paths), Some(labels)) => {
                run_task(task, &mut Sst::load(labels, quick, paths)?, seeds, signals)?
            }
            (_, None) => match Generated::new(task, quick, &mut pretrains) {
                Some(mut data) => run_task(task, &mut data, seeds, signals)?,
                None => return Err(BenchError::Run(format!("{task:?} is no generated task"))),
            },
            (Err(why), Some(_)) => return Err(BenchError::Run(why.clone())),
        };
        reports.push(report);
    }
    println!("\ntargets for the default freeze rule over seeds {seeds:?}:");
    for report in &reports {
        println!("  {}", report.targets.line(report.task));
    }
    let report = Report {
        bench: "tasks",
        backend: backend::NAME,
        quick,
        note: "shared 2-core machine; logical devices share its CPU; seeds interleaved; training seconds exclude evaluation",
        seeds: seeds.to_vec(),
        devices: DEVICES,
        tasks: reports,
        skipped,
        total_seconds: start.elapsed().as_secs_f64(),
    };
    let path = write_report("tasks", &report)?;
    println!(
        "wrote {} ({:.0} s in all)",
        path.display(),
        report.total_seconds
    );
    Ok(())
}

/// Checks the tasks a user gives: at least one, each once.
///
/// ```
/// use pipetransformer_harness::bench::headline::suite::{SuiteTask, validate_tasks};
///
/// assert!(validate_tasks(&[SuiteTask::Same, SuiteTask::Sst5]).is_ok());
/// assert!(validate_tasks(&[]).is_err());
/// assert!(validate_tasks(&[SuiteTask::Vit, SuiteTask::Vit]).unwrap_err().contains("vit twice"));
/// ```
pub fn validate_tasks(tasks: &[SuiteTask]) -> Result<(), String> {
    if tasks.is_empty() {
        return Err("--tasks takes at least one task".into());
    }
    for (i, task) in tasks.iter().enumerate() {
        if tasks[..i].contains(task) {
            return Err(format!(
                "--tasks names {} twice: each task runs once",
                task.name()
            ));
        }
    }
    Ok(())
}

/// The tasks to run and those skipped with why: without MiniLM or SST
/// (`paths` an error) the full run refuses the SST tasks before any work,
/// `--quick` skips them.
fn runnable(
    quick: bool,
    tasks: &[SuiteTask],
    paths: &Result<RealPaths, String>,
) -> Result<(Vec<SuiteTask>, Skipped), BenchError> {
    validate_tasks(tasks).map_err(BenchError::Run)?;
    let mut run = Vec::new();
    let mut skipped = Vec::new();
    for &task in tasks {
        match (task.sst_labels(), paths) {
            (Some(_), Err(why)) if quick => skipped.push((task, why.clone())),
            (Some(_), Err(why)) => return Err(BenchError::Run(why.clone())),
            _ => run.push(task),
        }
    }
    Ok((run, skipped))
}

/// (b*), alpha 1/3 and the default over `seeds` on `data`: the setting
/// and (b*) from the first seed's model, then per seed the three runs.
fn run_task<D: TaskData>(
    task: SuiteTask,
    data: &mut D,
    seeds: &[u64],
    signals: &[OtherSignal],
) -> Result<TaskReport, BenchError> {
    let start = Instant::now();
    let spec = data.spec(seeds[0]);
    spec.validate().map_err(run_err)?;
    let first = data.model(seeds[0])?;
    let (setting, setting_name) = setting_of(data, &spec, &first)?;
    let strongest = search(data, &spec, &setting, &first)?;
    let configurations = suite_configurations(&setting, &strongest, signals);
    let mut runs: Vec<Vec<RunRecord>> = vec![Vec::new(); configurations.len()];
    let mut first = Some(first);
    for &seed in seeds {
        let model = match first.take() {
            Some(model) => model,
            None => data.model(seed)?,
        };
        let spec = data.spec(seed);
        for (configuration, runs) in configurations.iter().zip(&mut runs) {
            let record = data
                .finetune(
                    &spec,
                    &model,
                    &configuration.name,
                    &configuration.method,
                    &mut Progress,
                )
                .map_err(run_err)?;
            println!(
                "{} seed {seed}: {:<28} {:>8.1} s training, accuracy {:.2}%",
                task.name(),
                record.name,
                record.seconds,
                100.0 * record.accuracy
            );
            runs.push(record);
        }
    }
    let configurations = summaries(&configurations, runs)?;
    let target_percent = configurations
        .first()
        .map_or(f64::NAN, ConfigSummary::target_percent);
    println!("\ntask {} ({setting_name}):", task.name());
    print_table(&configurations, seeds[0]);
    let default = configurations
        .iter()
        .find(|c| c.key == DEFAULT)
        .ok_or_else(|| BenchError::Run("no default configuration".into()))?;
    let targets = TaskTargets::of(
        task,
        default.accuracy_delta_vs_strongest,
        default.speedup_at_equal_accuracy,
    );
    println!("{}", targets.line(task));
    Ok(TaskReport {
        task,
        spec,
        max_length: data.max_length(),
        device_bytes: setting.memory.device_bytes,
        setting: setting_name,
        strongest,
        target_percent,
        configurations,
        targets,
        seconds: start.elapsed().as_secs_f64(),
    })
}

/// The memory-bound setting as the headline sets it (a budget under which
/// the model does not fit one device) where the model's stages allow one,
/// else the unbounded one; with its name for the table.
fn setting_of<D: TaskData>(
    data: &D,
    spec: &JobSpec,
    model: &Pretrained,
) -> Result<(Setting, String), BenchError> {
    let unbounded = Setting::unbounded(data.layers(), parameter_costs(), false);
    let memory = data.unit_memory(spec, model)?;
    Ok(match super::memory::budget(spec, memory) {
        Ok(budget) => {
            let name = format!(
                "memory-bound: {:.1} MB per device, K=1 does not fit",
                budget.bytes as f64 / (1 << 20) as f64
            );
            (unbounded.with_budget(budget.bytes), name)
        }
        Err(why) => {
            println!("no memory-bound setting for this task ({why}): unbounded");
            (
                unbounded,
                "unbounded: no budget at which K=1 alone fails".into(),
            )
        }
    })
}

/// (b*) searched on `model` in `setting` (under a budget it must pipeline).
fn search<D: TaskData>(
    data: &D,
    spec: &JobSpec,
    setting: &Setting,
    model: &Pretrained,
) -> Result<Strongest, BenchError> {
    let finetune = |short: &JobSpec, method: &Method, clock: &mut StepClock| {
        data.finetune(short, model, "(b*) candidate", method, clock)
    };
    if setting.bounded() {
        find_pipelined(spec, setting, finetune)
    } else {
        find_strongest(spec, setting, finetune)
    }
}

/// The alpha 1/3 configuration's key.
const ALPHA: &str = "alpha";
/// The default freeze rule's key.
const DEFAULT: &str = "default";

/// (b*) for the search's winner, then alpha 1/3, the default rule and the
/// default with each of `signals`, all four parts, starting at (b*)'s
/// shape.
fn suite_configurations(
    setting: &Setting,
    strongest: &Strongest,
    signals: &[OtherSignal],
) -> Vec<Configuration> {
    let freezing = |key, name: &str, freeze: FreezeRule| Configuration {
        key,
        name: name.into(),
        group: Group::Headline,
        method: Method::Trainer {
            config: setting.trainer(Parts::new(), freeze),
            devices: DEVICES,
        },
    };
    let mut list = vec![
        strongest_row(setting, strongest.winner),
        freezing(
            ALPHA,
            "alpha 1/3 (paper)",
            FreezeRule::AlphaSchedule { alpha: 1.0 / 3.0 },
        ),
        freezing(DEFAULT, "default rule", TrainerConfig::new().freeze),
    ];
    list.extend(
        signals
            .iter()
            .map(|signal| freezing(signal.key(), signal.name(), signal.rule())),
    );
    start_at_searched(&mut list, strongest.winner);
    list
}
