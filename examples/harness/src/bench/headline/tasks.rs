//! `bench select-task`: which generated fine-tuning task needs its top
//! layers (how the headline's task was chosen).

use burn_elastic_dp::{FreezeRule, Parts};
use serde::Serialize;

use super::configs::{Setting, parameter_costs, spec};
use super::shared::{Progress, run_err};
use crate::bench::{BenchError, title, write_report};
use pipetransformer_jobs::job::{FinetuneTask, JobSpec, Method, ModelKind, Pretrained};

/// The conditions' margins, in accuracy points.
const FROZEN_BELOW: f64 = 5.0;
const FIRST_EPOCH_BELOW: f64 = 10.0;
const ALPHA_WITHIN: f64 = 0.5;

/// One candidate task at one learning rate on one seed.
#[derive(Debug, Clone, Serialize)]
struct TaskRow {
    task: FinetuneTask,
    lr: f64,
    seed: u64,
    /// Plain Burn's held-out accuracy after each epoch, in %.
    plain_epochs: Vec<f64>,
    all_frozen: f64,
    alpha_third: f64,
    /// The three conditions, in the module's order.
    frozen_loses: bool,
    plain_learns: bool,
    alpha_keeps: bool,
}

impl TaskRow {
    fn plain_final(&self) -> f64 {
        self.plain_epochs.last().copied().unwrap_or(f64::NAN)
    }

    fn meets_all(&self) -> bool {
        self.frozen_loses && self.plain_learns && self.alpha_keeps
    }
}

#[derive(Debug, Serialize)]
struct Report {
    bench: &'static str,
    quick: bool,
    note: &'static str,
    spec: JobSpec,
    pretrain_lr: f64,
    rows: Vec<TaskRow>,
}

/// The candidates `bench select-task` tries when none are named.
pub const DEFAULT_TASKS: [FinetuneTask; 3] = [
    FinetuneTask::Same,
    FinetuneTask::FirstToken,
    FinetuneTask::MiddleMajority,
];

/// Runs the candidate `tasks` at each fine-tuning learning rate of `lrs`
/// (each in (0, 1]) on each of `seeds`, pretraining once per seed as the
/// headline does.
///
/// The headline's accuracy column says something about AutoFreeze only on
/// a task that a frozen encoder does not solve. Per seed this pretrains the
/// headline's BERT once, then for each candidate task ([`FinetuneTask`])
/// and fine-tuning learning rate runs, on one device:
///
/// - plain Burn, its held-out accuracy after every epoch,
/// - "all frozen": every block frozen from the first step, only the
///   classifier trains (with the cache),
/// - AutoFreeze at alpha = 1/3 (with the cache),
///
/// and checks the three conditions a headline task must meet: all frozen
/// at least 5 points below plain Burn's final accuracy, plain Burn's first
/// epoch at least 10 points below its final, alpha = 1/3 no more than 0.5
/// points below plain Burn. It prints a table and writes
/// `target/bench/select-task.json`. Speed is not measured here (`bench
/// tasks`, [`super::suite`], measures freezing's speed at equal accuracy).
pub fn run_select_task(
    quick: bool,
    tasks: &[FinetuneTask],
    lrs: &[f64],
    seeds: &[u64],
) -> Result<(), BenchError> {
    super::validate_seeds(seeds).map_err(BenchError::Run)?;
    if tasks.is_empty() || lrs.is_empty() {
        return Err(BenchError::Run(
            "bench select-task needs at least one task and one learning rate".into(),
        ));
    }
    let base = spec(ModelKind::Bert, quick);
    let pretraining = super::configs::pretraining(&base);
    for &lr in lrs {
        JobSpec { lr, ..base.clone() }.validate().map_err(run_err)?;
    }
    let details = format!(
        "Bert {} layers, hidden {}; {} samples/epoch, batch {}, {} epochs, one device; tasks {tasks:?}, fine-tuning lr {lrs:?}, seeds {seeds:?}",
        base.layers, base.hidden, base.samples, base.batch, base.epochs
    );
    println!("{}", title("select-task", quick, &details));
    let setting = Setting::unbounded(base.layers, parameter_costs(), false);
    let one_device = |freeze: FreezeRule| Method::Trainer {
        config: setting.trainer(Parts::new().with_pipe(false).with_dp(false), freeze),
        devices: 1,
    };
    let all_frozen = one_device(FreezeRule::Fronts {
        layers: vec![base.layers],
    });
    let alpha_third = one_device(FreezeRule::AlphaSchedule { alpha: 1.0 / 3.0 });
    let mut rows = Vec::new();
    for &seed in seeds {
        let seeded = JobSpec {
            seed,
            ..base.clone()
        };
        let pretrained = seeded.pretrain_with(pretraining, &mut Progress);
        for &task in tasks {
            for &lr in lrs {
                let job = JobSpec {
                    task,
                    lr,
                    ..seeded.clone()
                };
                let row = task_row(&job, &pretrained, [&all_frozen, &alpha_third])?;
                print_row(&row);
                rows.push(row);
            }
        }
    }
    println!("\nall runs:");
    for row in &rows {
        print_row(row);
    }
    let report = Report {
        bench: "select-task",
        quick,
        note: "one device; accuracies on the held-out samples, in %; speed not measured",
        spec: base,
        pretrain_lr: pretraining.lr,
        rows,
    };
    let path = write_report("select-task", &report)?;
    println!("wrote {}", path.display());
    Ok(())
}

/// The row of `job` (its task, learning rate and seed) from `pretrained`:
/// plain Burn's accuracy per epoch, then the accuracies of `all_frozen`
/// and of `alpha_third`, against the row's thresholds.
fn task_row(
    job: &JobSpec,
    pretrained: &Pretrained,
    [all_frozen, alpha_third]: [&Method; 2],
) -> Result<TaskRow, BenchError> {
    let (task, lr, seed) = (job.task, job.lr, job.seed);
    let name = format!("{task:?} lr {lr:e} seed {seed}");
    let accuracy = |method: &Method, what: &str| {
        job.finetune(
            pretrained,
            &format!("{name}: {what}"),
            method,
            &mut Progress,
        )
        .map(|(record, _)| record)
        .map_err(run_err)
    };
    let plain = accuracy(&Method::Plain, "plain")?;
    let frozen = 100.0 * accuracy(all_frozen, "all frozen")?.accuracy;
    let alpha = 100.0 * accuracy(alpha_third, "alpha 1/3")?.accuracy;
    let plain_epochs: Vec<f64> = plain.epochs.iter().map(|e| 100.0 * e.accuracy).collect();
    let last = plain_epochs.last().copied().unwrap_or(f64::NAN);
    let first = plain_epochs.first().copied().unwrap_or(f64::NAN);
    Ok(TaskRow {
        task,
        lr,
        seed,
        frozen_loses: frozen <= last - FROZEN_BELOW,
        plain_learns: first <= last - FIRST_EPOCH_BELOW,
        alpha_keeps: alpha >= last - ALPHA_WITHIN,
        plain_epochs,
        all_frozen: frozen,
        alpha_third: alpha,
    })
}

fn print_row(row: &TaskRow) {
    let epochs: Vec<String> = row.plain_epochs.iter().map(|a| format!("{a:.1}")).collect();
    let mark = |ok: bool| if ok { "yes" } else { "no" };
    println!(
        "{:<16} lr {:<8.0e} seed {:<3} plain {} | final {:.1} | all frozen {:.1} ({}) | alpha 1/3 {:.1} ({}) | first epoch 10 below ({}) | {}",
        format!("{:?}", row.task),
        row.lr,
        row.seed,
        epochs.join(" "),
        row.plain_final(),
        row.all_frozen,
        mark(row.frozen_loses),
        row.alpha_third,
        mark(row.alpha_keeps),
        mark(row.plain_learns),
        if row.meets_all() {
            "MEETS ALL"
        } else {
            "misses"
        }
    );
}
