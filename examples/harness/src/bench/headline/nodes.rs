//! `bench headline --mpi` (under `mpirun -np N`, cargo feature `mpi`): the
//! memory-bound headline across N processes.

#![cfg_attr(not(feature = "mpi"), allow(dead_code, unused_imports))]

use serde::Serialize;

use super::configs::{Configuration, DEVICES, SCHEDULE, Setting, configurations, parameter_costs};
use super::memory;
use super::real_rows::{self, RealRow};
use super::shared::{Progress, find_pipelined, run_err};
use crate::bench::BenchError;
use crate::bench::{title, write_report};
use crate::strongest::Strongest;
use pipetransformer_jobs::backend;
use pipetransformer_jobs::job::{
    EpochRecord, FinetuneTask, JobSpec, ModelKind, Observer, RunRecord,
};

/// The configurations every seed runs, in order ((b*) goes after (b)).
const KEYS: [&str; 3] = ["b", "c", SCHEDULE];

/// What `target/bench/headline-mpi.json` holds.
#[derive(Debug, Serialize)]
struct Report {
    bench: &'static str,
    backend: &'static str,
    quick: bool,
    note: &'static str,
    processes: usize,
    devices_per_process: usize,
    spec: JobSpec,
    /// The per-device budget (the largest of the ranks' estimates).
    device_bytes: u64,
    /// (b*)'s search across the ranks (the first seed).
    strongest: Strongest,
    /// What (c)'s freeze schedule allows (the first seed's unit profile).
    ideal_speedup: f64,
    rows: Vec<RealRow>,
    targets: NodeTargets,
}

/// The goals for (c) across processes, on the means.
#[derive(Debug, Serialize)]
struct NodeTargets {
    speedup_vs_strongest_2_5x: bool,
    accuracy_within_half_point_of_strongest: bool,
    fraction_of_ideal_vs_strongest: f64,
    fraction_of_ideal_vs_strongest_85_percent: bool,
}

impl NodeTargets {
    fn of(c: &RealRow, ideal_speedup: f64) -> Self {
        let fraction = c.vs_strongest.speedup / ideal_speedup;
        Self {
            speedup_vs_strongest_2_5x: c.vs_strongest.speedup >= 2.5,
            accuracy_within_half_point_of_strongest: c.vs_strongest.accuracy_delta >= -0.5,
            fraction_of_ideal_vs_strongest: fraction,
            fraction_of_ideal_vs_strongest_85_percent: fraction >= 0.85,
        }
    }

    fn print(&self, c: &RealRow, processes: usize, ideal_speedup: f64) {
        let yes = |ok: bool| if ok { "met" } else { "MISSED" };
        println!(
            "targets for (c) across {processes} processes over {} seed(s): >= 2.5x vs (b*): {} ({:.2}x); mean accuracy >= (b*) - 0.5 pt: {} ({:+.2} pt); >= 85% of ideal: {} ({:.0}% of {ideal_speedup:.2}x vs (b*))",
            c.seeds.len(),
            yes(self.speedup_vs_strongest_2_5x),
            c.vs_strongest.speedup,
            yes(self.accuracy_within_half_point_of_strongest),
            c.vs_strongest.accuracy_delta,
            yes(self.fraction_of_ideal_vs_strongest_85_percent),
            100.0 * self.fraction_of_ideal_vs_strongest,
        );
        if c.vs_baseline.speedup < c.vs_strongest.speedup {
            println!(
                "note: (b) ran faster than (b*) on the means, so the search's pick from its timed steps was not the fastest configuration that freezes nothing; against (b), the fastest measured, (c) is {:.2}x",
                c.vs_baseline.speedup
            );
        }
    }
}

/// Rank 0's progress lines (stderr); the other ranks' none.
struct RankProgress(bool);

impl Observer for RankProgress {
    fn start(&mut self, name: &str, epochs: usize, samples: usize) {
        if self.0 {
            Progress.start(name, epochs, samples);
        }
    }
    fn epoch(&mut self, record: &EpochRecord) {
        if self.0 {
            Progress.epoch(record);
        }
    }
}

/// What the first seed settles for every seed: the configurations ((b*)
/// found by the search), the unit profile of (c)'s ideal, the budget.
struct FirstSeed {
    list: Vec<Configuration>,
    strongest: Strongest,
    profile: Vec<burn_pipe::UnitProfile>,
    device_bytes: u64,
}

/// Runs the headline across the processes of the MPI job this process is
/// one of, on `model` over `seeds`.
///
/// `bench headline --mpi` (under `mpirun -np N`, cargo feature `mpi`): the
/// memory-bound headline across N processes, each with
/// [`DEVICES`](super::configs::DEVICES) logical devices, under the same
/// per-device budget as in one process (the largest rank's measurement):
///
/// - (b) the paper's baseline, a pipeline over every device of each rank
///   (K = D), nothing frozen, one replica per rank,
/// - (b*) the fastest configuration that freezes nothing, searched on the
///   same ranks (each K that fits the budget timed for a few steps across
///   them),
/// - (c) PipeTransformer (the default freeze rule) with AutoDP across the
///   ranks: every rank adds replicas on its freed devices at the same step,
/// - (c) under the paper's schedule (alpha 1/3), for its accuracy beside,
///
/// over the seeds, interleaved (seed 1: b, b*, c, schedule; seed 2:
/// ...). Plain Burn, on one device of one process, is not run. Rank 0
/// prints the table and writes `target/bench/headline-mpi.json`; the other
/// ranks print nothing on stdout.
#[cfg(not(feature = "mpi"))]
pub fn run_mpi(
    _quick: bool,
    _model: ModelKind,
    _task: Option<FinetuneTask>,
    _seeds: &[u64],
) -> Result<(), BenchError> {
    Err(BenchError::Run(
        "bench headline --mpi needs the cargo feature `mpi` (cargo build --release -p examples --features mpi; apt-get install -y libopenmpi-dev openmpi-bin libclang-dev), then mpirun -np 2 target/release/bench headline --mpi".into(),
    ))
}

/// Runs the headline across the processes of the MPI job this process is
/// one of, on `model` fine-tuned on `task` (None:
/// [`default_task`](super::default_task)) over `seeds`.
#[cfg(feature = "mpi")]
pub fn run_mpi(
    quick: bool,
    model: ModelKind,
    task: Option<FinetuneTask>,
    seeds: &[u64],
) -> Result<(), BenchError> {
    let first = super::first_spec(quick, model, task, seeds)?;
    let mpi = burn_elastic_dp::Mpi::init().map_err(run_err)?;
    let processes = mpi.size();
    if processes < 2 {
        return Err(BenchError::Run(
            "bench headline --mpi runs under an MPI launcher with 2 or more processes (mpirun -np 2 target/release/bench headline --mpi)".into(),
        ));
    }
    backend::set_first_device(mpi.local_rank() * DEVICES);
    let leader = mpi.rank() == 0;
    if !leader {
        pipetransformer_jobs::silence_stdout();
    }
    print_start(&first, quick, processes, seeds);
    let mut observer = RankProgress(leader);
    let mut first_seed: Option<FirstSeed> = None;
    let mut runs: Vec<Vec<RunRecord>> = Vec::new();
    for &seed in seeds {
        let spec = JobSpec {
            seed,
            ..first.clone()
        };
        let pretrained = spec.pretrain_with(super::configs::pretraining(&spec), &mut observer);
        if first_seed.is_none() {
            let settled = settle_first_seed(&spec, &pretrained)?;
            runs.resize_with(settled.list.len(), Vec::new);
            first_seed = Some(settled);
        }
        let Some(FirstSeed { list, .. }) = &first_seed else {
            unreachable!("set on the first seed")
        };
        for (configuration, runs) in list.iter().zip(&mut runs) {
            let (record, trained) = spec
                .finetune(
                    &pretrained,
                    &configuration.name,
                    &configuration.method,
                    &mut observer,
                )
                .map_err(run_err)?;
            drop(trained);
            println!(
                "seed {seed}: {:<36} {:>8.1} s (of which profiling {:.2} s), accuracy {:.2}%",
                record.name,
                record.seconds,
                record.profiling_seconds(),
                100.0 * record.accuracy
            );
            runs.push(record);
        }
    }
    let first_seed = first_seed.ok_or_else(|| BenchError::Run("no seed to run".into()))?;
    let report = summarize(quick, first, first_seed, runs, (seeds, processes))?;
    if leader {
        let path = write_report("headline-mpi", &report)?;
        println!("wrote {}", path.display());
    }
    drop(mpi);
    Ok(())
}

/// The run's first line.
#[cfg(feature = "mpi")]
fn print_start(first: &JobSpec, quick: bool, processes: usize, seeds: &[u64]) {
    let details = format!(
        "{:?} {} layers, hidden {}; fine-tuning task {:?}; {} samples/epoch, batch {}, {} epochs; {processes} processes (MPI) x {DEVICES} logical devices, all sharing this machine's CPU; seeds {seeds:?} interleaved",
        first.model,
        first.layers,
        first.hidden,
        first.task,
        first.samples,
        first.batch,
        first.epochs
    );
    println!("{}", title("headline --mpi", quick, &details));
}

/// What the first seed settles, on every rank: the unit profile, the
/// budget every rank agrees on (the largest estimate), and the
/// configurations with (b*) searched across the ranks.
#[cfg(feature = "mpi")]
fn settle_first_seed(
    spec: &JobSpec,
    pretrained: &pipetransformer_jobs::job::Pretrained,
) -> Result<FirstSeed, BenchError> {
    let profile = super::ideal::profile(spec, pretrained)?;
    let unbounded = Setting::unbounded(spec.layers, parameter_costs(), true);
    let budget = memory::budget(spec, memory::unit_memory(spec, pretrained)?)?;
    // Every rank configures the same budget: the largest estimate.
    let agreed = burn_elastic_dp::launcher::agree_max(
        &[budget.bytes as f64],
        std::time::Duration::from_secs(600),
    )
    .map_err(run_err)?;
    let bytes = agreed[0] as u64;
    let setting = unbounded.with_budget(bytes);
    let mut list: Vec<Configuration> = configurations(&setting)
        .into_iter()
        .filter(|c| KEYS.contains(&c.key))
        .collect();
    let found = find_pipelined(spec, &setting, |short, method, clock| {
        let (record, _) =
            short.finetune(pretrained, "(b*) candidate across ranks", method, clock)?;
        Ok(record)
    })?;
    list.insert(1, super::configs::strongest_row(&setting, found.winner));
    super::configs::start_at_searched(&mut list, found.winner);
    Ok(FirstSeed {
        list,
        strongest: found,
        profile,
        device_bytes: bytes,
    })
}

/// The rows over the seeds and (c)'s targets, printed (by rank 0 alone:
/// the other ranks' stdout is silenced), as the report.
#[cfg(feature = "mpi")]
fn summarize(
    quick: bool,
    first: JobSpec,
    first_seed: FirstSeed,
    runs: Vec<Vec<RunRecord>>,
    (seeds, processes): (&[u64], usize),
) -> Result<Report, BenchError> {
    let FirstSeed {
        list,
        strongest,
        profile,
        device_bytes,
    } = first_seed;
    let c_first = list
        .iter()
        .position(|c| c.key == "c")
        .and_then(|i| runs[i].first().cloned())
        .ok_or_else(|| BenchError::Run("no run of (c)".into()))?;
    let ideal_speedup = super::ideal::ideal_speedup(&profile, &c_first, true);
    let rows = real_rows::rows(&list, runs, seeds)?;
    println!("across {processes} processes, over seeds {seeds:?}:");
    real_rows::print_rows(&rows);
    let c = rows
        .iter()
        .find(|r| r.key == "c")
        .ok_or_else(|| BenchError::Run("no row (c)".into()))?;
    let targets = NodeTargets::of(c, ideal_speedup);
    targets.print(c, processes, ideal_speedup);
    Ok(Report {
        bench: "headline-mpi",
        backend: backend::NAME,
        quick,
        note: "every process on this shared 2-core machine; logical devices share its CPU; seeds interleaved; plain Burn not run",
        processes,
        devices_per_process: DEVICES,
        spec: first,
        device_bytes,
        strongest,
        ideal_speedup,
        rows,
        targets,
    })
}
