//! `bench headline`: the fine-tuning job as plain Burn, the baselines (b) and
//! (b*) and PipeTransformer (c), with the paper's ablations and alpha sweep.

mod configs;
mod ideal;
mod memory;
mod nodes;
mod plots;
pub mod real;
mod real_rows;
mod rows;
mod seeds;
mod shared;
pub mod suite;
mod tasks;

pub use configs::default_task;
pub use nodes::run_mpi;
pub use seeds::{MAX_SEEDS, default_seeds, validate_seeds};
pub use tasks::{DEFAULT_TASKS, run_select_task};

use std::path::PathBuf;

use burn_elastic_dp::TrainerConfig;
use burn_pipe::UnitProfile;
use serde::{Deserialize, Serialize};

use super::{BenchError, alloc, title, write_report};
use crate::strongest::Strongest;
use configs::{
    Configuration, DEVICES, Setting, configurations, parameter_costs, spec, start_at_searched,
    strongest_row,
};
use ideal::profile;
use pipetransformer_jobs::backend;
use pipetransformer_jobs::job::{FinetuneTask, JobSpec, Method, ModelKind, Pretrained, RunRecord};
use plots::{draw, plot_dir};
use rows::{Phases, Row, Targets, breakdown, print_breakdown, print_epochs, print_rows, row_c};
use shared::{Progress, find_pipelined, pretrain, run_err};

/// What `target/bench/headline.json` holds.
#[derive(Debug, Serialize)]
struct Report {
    bench: &'static str,
    backend: &'static str,
    quick: bool,
    note: &'static str,
    spec: JobSpec,
    devices: usize,
    /// The per-device budget of the tables ((a) runs without it).
    device_bytes: u64,
    micro_batches: String,
    cost_model: String,
    params: usize,
    units: usize,
    /// Per unit: forward and backward milliseconds on one global batch.
    unit_profile_ms: Vec<(f64, f64)>,
    pretrain_seconds: f64,
    /// (b*)'s search: each candidate's seconds per step and the winner.
    strongest: Strongest,
    rows: Vec<Row>,
    breakdown: Vec<Phases>,
    targets: Targets,
    plots: Vec<PathBuf>,
    /// Memory-aware AutoPipe: the estimate against the measured peak, and
    /// the memory-bound setting's (b*) and (c).
    memory: memory::MemoryReport,
    /// (a), (b), (b*) and (c) over every seed (absent for one seed).
    #[serde(skip_serializing_if = "Option::is_none")]
    seeds: Option<seeds::SeedsReport>,
    /// The real task's section (`bench headline --real`), kept from the
    /// file this run replaces.
    #[serde(skip_serializing_if = "Option::is_none")]
    real: Option<serde_json::Value>,
}

/// Runs the headline benchmark on `model` fine-tuned on `task` (None:
/// [`default_task`]) over `seeds` (checked with [`validate_seeds`]; the first
/// seed runs every table).
///
/// `bench headline`: the same fine-tuning job (`pipetransformer_jobs::job`), in one
/// process and from the same pretrained weights, as
///
/// - (a) plain Burn on one device (no crate of ours on the hot path),
/// - (b) the paper's baseline: pipeline (+ data parallel) on the same
///   devices, nothing frozen,
/// - (b*) the strongest baseline: the fastest configuration that freezes
///   nothing on the same devices (K over the divisors of the devices,
///   R = D / K), found by timing a few steps of each
///   ([`crate::strongest`]); the candidates and the winner are printed and
///   saved,
/// - (c) PipeTransformer, all four parts, the default freeze rule
///   (`FreezeRule::Evidence`),
/// - (c) under the paper's schedule, alpha = 1/3, for its accuracy beside,
///
/// then the paper's ablations, each at alpha 1/3 (freeze only; freeze +
/// AutoPipe + AutoCache; freeze + AutoPipe + AutoDP; all four = the
/// schedule row) and its alpha sweep (1/5, 1/4, 1/3 = the schedule row,
/// 2/5, 1/2).
///
/// Printed and written to `target/bench/headline.json`: wall time,
/// samples/s per epoch, peak heap, final accuracy, speed-ups against (a),
/// (b) and (b*), and the ideal speed-up each freeze schedule allows with the fraction
/// of it reached. The ideal is a cost model on unit times profiled once
/// (`burn_pipe::profile_units`, one global batch on device 0): per epoch,
/// the active units' forward and backward, plus the forward of the frozen
/// units that ran (with AutoCache only the units frozen since the last epoch,
/// once per sample; without it every frozen unit), cache reads costing
/// nothing; summed over epochs, against every unit's forward and backward in
/// every epoch. For (c), a per-phase breakdown: measured transitions,
/// all-reduce and pipeline bubble, the modelled frozen forward and active
/// forward/backward, and the rest (cache reads, batching, optimizer steps,
/// threads and channels). PNG plots go to `target/bench/headline/`.
///
/// Then memory-aware AutoPipe's estimate of a stage next to the measured
/// peak heap of a one-stage run, and the memory-bound setting: a budget
/// under which the model does not fit one device, with (b*) and (c) under
/// it (`memory.rs`).
///
/// All of that runs on the first seed. Each further seed (the full run's
/// default is seeds 1, 2, 3; `--quick` runs one) pretrains again and runs
/// (a), (b), (b*) and (c); their means and ranges over the seeds, the
/// speed-ups on the means and (c)'s targets on them follow (`seeds.rs`).
pub fn run(
    quick: bool,
    model: ModelKind,
    task: Option<FinetuneTask>,
    seeds: &[u64],
) -> Result<(), BenchError> {
    let spec = first_spec(quick, model, task, seeds)?;
    print_start(&spec, quick);
    let (pretrained, pretrain_seconds) = pretrain(&spec);
    let profile = profile(&spec, &pretrained)?;
    let unit_profile_ms = unit_profile_ms(&profile);
    eprintln!(
        "unit profile (forward ms, backward ms per batch of {}): {unit_profile_ms:.2?}",
        spec.batch
    );
    // The paper's situation first: a per-device budget under which the
    // model does not fit one device, so (b*) must pipeline.
    let unbounded = Setting::unbounded(spec.layers, parameter_costs(), false);
    let budget = memory::budget(&spec, memory::unit_memory(&spec, &pretrained)?)?;
    let setting = unbounded.with_budget(budget.bytes);
    let (configurations, strongest) = searched_configurations(&spec, &setting, &pretrained)?;
    let runs = finetune_all(&spec, &pretrained, &configurations)?;
    let rows = rows::rows(&configurations, runs, &profile);
    print_rows(&rows, &spec);
    let c = row_c(&rows)?;
    print_epochs(&rows, c);
    let breakdown = breakdown(&profile, &c.run, &spec);
    print_breakdown(&breakdown);
    let targets = Targets::of(c);
    targets.print(c);
    let memory = memory::run(
        &spec,
        &pretrained,
        budget,
        &unbounded,
        c_config(&configurations)?,
    )?;
    let (params, units) = (pretrained.num_params(), pretrained.num_units());
    drop(pretrained);
    let seeds = further_seeds(
        &spec,
        seeds,
        &configurations,
        &rows,
        (pretrain_seconds, c.ideal_speedup),
    )?;
    let plots = draw(&rows)?;
    let report = Report {
        bench: "headline",
        backend: backend::NAME,
        quick,
        note: "shared 2-core machine; logical devices share its CPU; the tables: one run per configuration (the first seed) under the per-device budget `device_bytes` ((a) without it); `seeds`: (a), (b), (b*), (c) over every seed; `memory.unbounded`: (b*) and (c) without the budget",
        params,
        units,
        spec,
        devices: DEVICES,
        device_bytes: memory.budget,
        micro_batches: "the paper's per K (burn_pipe::default_micro_batches)".into(),
        cost_model: "AutoPipe: CostModel::Parameters { frozen_factor: 1/3 }; ideal: profiled units"
            .into(),
        unit_profile_ms,
        pretrain_seconds,
        strongest,
        rows,
        breakdown,
        targets,
        plots,
        memory,
        seeds,
        real: real::saved_section(),
    };
    let path = write_report("headline", &report)?;
    println!(
        "wrote {} and {} plots in {}",
        path.display(),
        report.plots.len(),
        plot_dir().display()
    );
    Ok(())
}

/// (a), (b), (b*) and (c) over every seed, after the first seed's `rows`
/// and (c)'s `ideal_speedup` (`None` for one seed).
fn further_seeds(
    spec: &JobSpec,
    seeds: &[u64],
    configurations: &[Configuration],
    rows: &[Row],
    (pretrain_seconds, ideal_speedup): (f64, f64),
) -> Result<Option<seeds::SeedsReport>, BenchError> {
    Ok(if seeds.len() > 1 {
        Some(seeds::run(
            spec,
            seeds,
            configurations,
            rows,
            pretrain_seconds,
            ideal_speedup,
        )?)
    } else {
        None
    })
}

/// The configurations of `setting` with (b*), searched on `pretrained`,
/// after (a) and (b); the configurations that freeze start at its shape.
fn searched_configurations(
    spec: &JobSpec,
    setting: &Setting,
    pretrained: &Pretrained,
) -> Result<(Vec<Configuration>, Strongest), BenchError> {
    let mut configurations = configurations(setting);
    let strongest = find_pipelined(spec, setting, |short, method, clock| {
        let (record, _) = short.finetune(pretrained, "(b*) candidate", method, clock)?;
        Ok(record)
    })?;
    // After (a) and (b); the configurations that freeze start at its shape.
    configurations.insert(2, strongest_row(setting, strongest.winner));
    start_at_searched(&mut configurations, strongest.winner);
    Ok((configurations, strongest))
}

/// The trainer's configuration of (c) among `configurations`.
fn c_config(configurations: &[Configuration]) -> Result<&TrainerConfig, BenchError> {
    configurations
        .iter()
        .find_map(
            |configuration| match (&configuration.method, configuration.key) {
                (Method::Trainer { config, .. }, "c") => Some(config),
                _ => None,
            },
        )
        .ok_or_else(|| BenchError::Run("no (c) configuration".into()))
}

fn print_start(spec: &JobSpec, quick: bool) {
    let details = format!(
        "{:?} {} layers, hidden {}; fine-tuning task {:?}; {} samples/epoch, batch {}, {} epochs; {DEVICES} logical devices sharing this machine's CPU; shared 2-core machine: times are noisy",
        spec.model, spec.layers, spec.hidden, spec.task, spec.samples, spec.batch, spec.epochs
    );
    println!("{}", title("headline", quick, &details));
}

/// The first seed's spec of `model` fine-tuned on `task` (None:
/// [`default_task`]), after `seeds` and the spec are checked.
fn first_spec(
    quick: bool,
    model: ModelKind,
    task: Option<FinetuneTask>,
    seeds: &[u64],
) -> Result<JobSpec, BenchError> {
    validate_seeds(seeds).map_err(BenchError::Run)?;
    let first = JobSpec {
        seed: seeds[0],
        task: task.unwrap_or_else(|| default_task(model)),
        ..spec(model, quick)
    };
    first.validate().map_err(run_err)?;
    Ok(first)
}

/// Per unit: forward and backward milliseconds.
fn unit_profile_ms(profile: &[UnitProfile]) -> Vec<(f64, f64)> {
    profile
        .iter()
        .map(|p| {
            (
                p.forward.as_secs_f64() * 1e3,
                p.backward.as_secs_f64() * 1e3,
            )
        })
        .collect()
}

/// Fine-tunes `pretrained` with each configuration; each run's record and
/// peak heap above the level before it (where the counting allocator is
/// installed).
fn finetune_all(
    spec: &JobSpec,
    pretrained: &Pretrained,
    configurations: &[Configuration],
) -> Result<Vec<(RunRecord, Option<usize>)>, BenchError> {
    let mut runs = Vec::new();
    for configuration in configurations {
        let before = alloc::reset_peak();
        let (record, trained) = spec
            .finetune(
                pretrained,
                &configuration.name,
                &configuration.method,
                &mut Progress,
            )
            .map_err(run_err)?;
        drop(trained);
        let peak = alloc::installed().then(|| alloc::peak().saturating_sub(before));
        runs.push((record, peak));
    }
    Ok(runs)
}

/// Redraws the plots from `target/bench/headline.json` (a finished run),
/// training nothing.
pub fn replot() -> Result<(), BenchError> {
    let path = plot_dir().with_extension("json");
    let text = std::fs::read_to_string(&path)
        .map_err(|e| BenchError::Run(format!("cannot read {}: {e}", path.display())))?;
    let saved: Saved = serde_json::from_str(&text)
        .map_err(|e| BenchError::Run(format!("cannot parse {}: {e}", path.display())))?;
    if saved.rows.is_empty() {
        return Err(BenchError::Run(format!(
            "{} holds no rows of the generated task's headline (only `--real`'s): run `bench headline` first",
            path.display()
        )));
    }
    let plots = draw(&saved.rows)?;
    println!(
        "redrew {} plots in {} from {}",
        plots.len(),
        plot_dir().display(),
        path.display()
    );
    Ok(())
}

/// What `--replot` reads of `target/bench/headline.json`: the generated
/// task's rows (none in a file only `--real` wrote) and the real section
/// (absent from files written before it existed).
#[derive(Deserialize)]
struct Saved {
    #[serde(default)]
    rows: Vec<Row>,
    #[serde(default)]
    #[allow(dead_code)] // read to check that a saved section still parses
    real: Option<real::RealReport>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_written_before_the_real_section_still_loads() {
        let saved: Saved = serde_json::from_str(r#"{"bench":"headline","rows":[]}"#).unwrap();
        assert!(saved.real.is_none() && saved.rows.is_empty());
    }

    #[test]
    fn a_report_of_the_real_task_only_loads_without_rows() {
        let saved: Saved = serde_json::from_str(r#"{"bench":"headline"}"#).unwrap();
        assert!(saved.rows.is_empty());
    }
}
