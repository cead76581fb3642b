//! Plans a PipeTransformer run before any training: per epoch the frozen
//! layers F, stages K, replicas R, micro-batches M and stage boundaries, and
//! the predicted epoch time split into compute, bubble, all-reduce and
//! transitions, against the baseline (pipeline + data parallel, nothing
//! frozen). Steps are simulated event by event (`burn_elastic_dp::plan`).
//!
//! ```text
//! # the paper's setting: ViT-B/16, 2 nodes x 8 GPUs, alpha 1/3, then 64..1024 GPUs
//! cargo run --release -p examples --bin plan -- --scaling 16,64,256,1024
//! # costs profiled on this backend, or read from a file measured elsewhere
//! cargo run --release -p examples --bin plan -- --model vit-tiny --profile --save-costs tiny.json
//! cargo run --release -p examples --bin plan -- --costs tiny.json --nodes 1 --devices-per-node 4
//! # calibration against this machine's measurements
//! cargo run --release -p examples --bin bench -- pipe --quick
//! cargo run --release -p examples --bin train -- --stages 4 --freeze-alpha 0.33 > train.log
//! cargo run --release -p examples --bin plan -- --calibrate target/bench/pipe.json --calibrate-train target/train/metrics.json
//! ```

use std::path::PathBuf;

use burn::collective::AllReduceStrategy;
use burn_elastic_dp::plan::{
    ClusterConfig, CostBasis, Link, ModelCosts, Plan, PlanConfig, ReduceTiming, TransitionCost,
    plan,
};
use burn_elastic_dp::{AllReduce, BatchPolicy};
use burn_pipe::Schedule;
use clap::{Parser, ValueEnum};
use examples::plan::calibrate::{self, Calibrated};
use examples::plan::presets::{Preset, Shape};
use examples::plan::report::{self, human};
use examples::plan::{PlanCliError, plot, profile, sharing};

#[derive(Debug, Clone, Copy, ValueEnum)]
enum ScheduleArg {
    Gpipe,
    #[value(name = "1f1b")]
    OneFOneB,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum StrategyArg {
    Ring,
    Tree,
    Centralized,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum TimingArg {
    /// As the replica group does: after the whole pass, stage after stage.
    AfterPass,
    /// Each stage as soon as its backward ends, in parallel (DDP per stage).
    PerStage,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum BasisArg {
    Params,
    Time,
}

#[derive(Debug, Parser)]
#[command(
    about = "Predict PipeTransformer's per-epoch schedule and epoch times (1 to thousands of GPUs)",
    allow_negative_numbers = true
)]
struct Args {
    /// Model preset (its units' parameters, activations and FLOPs).
    #[arg(long, value_enum, default_value = "vit-b16")]
    model: Preset,
    /// Transformer blocks, overriding the preset's.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=256))]
    layers: Option<u32>,
    /// Read per-unit costs from this JSON file (as written by --save-costs)
    /// instead of working them out from --model.
    #[arg(long)]
    costs: Option<PathBuf>,
    /// Profile --model's units on this machine's backend instead of
    /// estimating them from FLOPs.
    #[arg(long)]
    profile: bool,
    /// Batch sizes to profile at (fitted as fixed + per-sample time).
    #[arg(long, value_delimiter = ',', default_value = "2,8,32", value_parser = clap::value_parser!(u32).range(1..=4096))]
    profile_batches: Vec<u32>,
    /// Achieved FLOP/s per device for FLOP-based costs, in TFLOP/s, in (0, 10000].
    #[arg(long, default_value_t = 4.5, value_parser = positive("TFLOP/s", 10_000.0))]
    tflops: f64,
    /// Write the costs used to this JSON file.
    #[arg(long)]
    save_costs: Option<PathBuf>,
    /// Devices per node.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=4096))]
    devices_per_node: u32,
    /// Nodes.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=65536))]
    nodes: u32,
    /// Bandwidth between devices of a node, GB/s, in (0, 100000].
    #[arg(long, default_value_t = 12.0, value_parser = positive("GB/s", 100_000.0))]
    intra_gbs: f64,
    /// Latency between devices of a node, microseconds, in [0, 1000000].
    #[arg(long, default_value_t = 10.0, value_parser = non_negative("microseconds", 1e6))]
    intra_latency_us: f64,
    /// Bandwidth between nodes, Gb/s (bits), in (0, 100000].
    #[arg(long, default_value_t = 100.0, value_parser = positive("Gb/s", 100_000.0))]
    inter_gbps: f64,
    /// Latency between nodes, microseconds, in [0, 1000000].
    #[arg(long, default_value_t = 5.0, value_parser = non_negative("microseconds", 1e6))]
    inter_latency_us: f64,
    /// Samples per step and replica (the paper's choice); see --global-batch.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    batch: u32,
    /// --batch is the global batch, split over the replicas.
    #[arg(long)]
    global_batch: bool,
    /// Samples per epoch (default: ImageNet-1k's training set).
    #[arg(long, default_value_t = 1_281_167, value_parser = clap::value_parser!(u64).range(1..=10_000_000_000))]
    samples: u64,
    /// Epochs.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    epochs: u32,
    /// AutoFreeze's alpha, in (0, 1).
    #[arg(long, default_value_t = 1.0 / 3.0, value_parser = open_unit("alpha"))]
    alpha: f64,
    /// Stages per pipeline at the start (default: devices per node).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=4096))]
    stages: Option<u32>,
    /// Micro-batches per step (default: burn-pipe's choice for K).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=65536))]
    micro_batches: Option<u32>,
    /// Pass order.
    #[arg(long, value_enum, default_value = "1f1b")]
    schedule: ScheduleArg,
    /// What AutoPipe balances (parameters as burn-pipe's default, or time).
    #[arg(long, value_enum, default_value = "params")]
    balance_by: BasisArg,
    /// Cache the frozen prefix once this many layers are frozen (paper: 3 for ViT).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=256))]
    cache_from: u32,
    /// Host-to-device bandwidth of the activation cache, GB/s, in (0, 100000].
    #[arg(long, default_value_t = 12.0, value_parser = positive("GB/s", 100_000.0))]
    cache_gbs: f64,
    /// Never cache the frozen prefix.
    #[arg(long)]
    no_cache: bool,
    /// Keep the starting replica count (no AutoDP).
    #[arg(long)]
    no_auto_dp: bool,
    /// All-reduce algorithm within a node (burn-collective's).
    #[arg(long, value_enum, default_value = "ring")]
    strategy: StrategyArg,
    /// All-reduce algorithm between nodes.
    #[arg(long, value_enum, default_value = "ring")]
    global_strategy: StrategyArg,
    /// Children per parent of the tree strategy.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=64))]
    tree_arity: u32,
    /// Gradient bucket size in MiB, in [0, 100000]; 0: one call per tensor.
    #[arg(long, default_value_t = 25.0, value_parser = non_negative("MiB", 100_000.0))]
    bucket_mib: f64,
    /// When the all-reduce runs.
    #[arg(long, value_enum, default_value = "per-stage")]
    reduce_timing: TimingArg,
    /// Seconds to rebuild a pipeline at a transition, in [0, 100000].
    #[arg(long, default_value_t = 10.0, value_parser = non_negative("seconds", 1e5))]
    pipeline_rebuild_s: f64,
    /// Seconds to re-form the data-parallel group at a transition, in [0, 100000].
    #[arg(long, default_value_t = 15.0, value_parser = non_negative("seconds", 1e5))]
    group_rebuild_s: f64,
    /// Fixed microseconds per pass on top of the unit costs, in [0, 1000000].
    #[arg(long, default_value_t = 0.0, value_parser = non_negative("microseconds", 1e6))]
    pass_overhead_us: f64,
    /// Also predict these GPU counts (multiples of --devices-per-node).
    #[arg(long, value_delimiter = ',', value_parser = clap::value_parser!(u32).range(1..=1_048_576))]
    scaling: Vec<u32>,
    /// Calibrate against a `bench pipe` report (target/bench/pipe.json).
    #[arg(long)]
    calibrate: Option<PathBuf>,
    /// Calibrate against the main job: its metrics.json (`train --no-dp --no-cache --output-dir DIR`), or the log of the loop before it.
    #[arg(long)]
    calibrate_train: Option<PathBuf>,
    /// Cores of this CPU the stage threads share, for calibration, in (0, 1024] (default: the cores the OS gives this process).
    #[arg(long, value_parser = positive("cores", 1024.0))]
    cpu_cores: Option<f64>,
    /// Cores one pass takes alone, for calibration, in (0, 1024], instead of measuring it (1: passes on different threads never slow each other down; the core count: they never overlap usefully).
    #[arg(long, value_parser = positive("cores", 1024.0))]
    pass_parallelism: Option<f64>,
    /// Where the plots and plan.json go.
    #[arg(long, default_value = "target/plan")]
    out_dir: PathBuf,
}

fn parse_f64(text: &str) -> Result<f64, String> {
    text.parse::<f64>()
        .ok()
        .filter(|x| x.is_finite())
        .ok_or_else(|| format!("expected a number, got {text}"))
}

fn positive(unit: &'static str, max: f64) -> impl Fn(&str) -> Result<f64, String> + Clone {
    move |text| match parse_f64(text)? {
        x if x > 0.0 && x <= max => Ok(x),
        x => Err(format!("{x} is not in (0, {max}] {unit}")),
    }
}

fn non_negative(unit: &'static str, max: f64) -> impl Fn(&str) -> Result<f64, String> + Clone {
    move |text| match parse_f64(text)? {
        x if (0.0..=max).contains(&x) => Ok(x),
        x => Err(format!("{x} is not in [0, {max}] {unit}")),
    }
}

fn open_unit(name: &'static str) -> impl Fn(&str) -> Result<f64, String> + Clone {
    move |text| match parse_f64(text)? {
        x if x > 0.0 && x < 1.0 => Ok(x),
        x => Err(format!("{name} {x} is not in (0, 1)")),
    }
}

fn strategy(arg: StrategyArg, arity: u32) -> AllReduceStrategy {
    match arg {
        StrategyArg::Ring => AllReduceStrategy::Ring,
        StrategyArg::Tree => AllReduceStrategy::Tree(arity),
        StrategyArg::Centralized => AllReduceStrategy::Centralized,
    }
}

fn costs(args: &Args) -> Result<ModelCosts, PlanCliError> {
    let costs = if let Some(path) = &args.costs {
        let text = std::fs::read_to_string(path)
            .map_err(|e| PlanCliError::Input(format!("cannot read {}: {e}", path.display())))?;
        let costs: ModelCosts = serde_json::from_str(&text).map_err(|e| {
            PlanCliError::Input(format!("{} is not a cost file: {e}", path.display()))
        })?;
        costs.validate()?;
        costs
    } else {
        let shape = args.model.shape(args.layers.map(|l| l as usize));
        if args.profile {
            let batches: Vec<usize> = args.profile_batches.iter().map(|&b| b as usize).collect();
            eprintln!("profiling {} at batches {batches:?} ...", shape.describe());
            profile::profile(&shape, &batches, 3)
        } else {
            shape.analytic_costs(args.tflops * 1e12, 4)
        }
    };
    if let Some(path) = &args.save_costs {
        let json = serde_json::to_string_pretty(&costs).expect("costs serialise");
        std::fs::write(path, json)
            .map_err(|e| PlanCliError::Input(format!("cannot write {}: {e}", path.display())))?;
        println!("wrote {}", path.display());
    }
    Ok(costs)
}

fn config(args: &Args, nodes: usize) -> PlanConfig {
    let intra = Link::new(args.intra_gbs * 1e9, args.intra_latency_us * 1e-6);
    let inter = Link::new(args.inter_gbps * 1e9 / 8.0, args.inter_latency_us * 1e-6);
    let batch = args.batch as usize;
    PlanConfig::new(
        ClusterConfig::new(args.devices_per_node as usize, nodes, intra, inter),
        if args.global_batch {
            BatchPolicy::FixedGlobal { batch }
        } else {
            BatchPolicy::PerReplica { batch }
        },
        args.samples as usize,
        args.epochs as usize,
        args.alpha,
    )
    .with_stages(args.stages.map(|k| k as usize))
    .with_micro_batches(args.micro_batches.map(|m| m as usize))
    .with_schedule(match args.schedule {
        ScheduleArg::Gpipe => Schedule::GPipe,
        ScheduleArg::OneFOneB => Schedule::OneFOneB,
    })
    .with_balance_by(match args.balance_by {
        BasisArg::Params => CostBasis::Params,
        BasisArg::Time => CostBasis::Time,
    })
    .with_cache_from((!args.no_cache).then_some(args.cache_from as usize))
    .with_cache_bandwidth(Some(args.cache_gbs * 1e9))
    .with_auto_dp(!args.no_auto_dp)
    .with_local_strategy(strategy(args.strategy, args.tree_arity))
    .with_global_strategy(strategy(args.global_strategy, args.tree_arity))
    .with_all_reduce(if args.bucket_mib == 0.0 {
        AllReduce::PerTensor
    } else {
        AllReduce::Bucketed {
            bucket_bytes: ((args.bucket_mib * 1024.0 * 1024.0) as usize).max(1),
        }
    })
    .with_reduce_timing(match args.reduce_timing {
        TimingArg::AfterPass => ReduceTiming::AfterPass,
        TimingArg::PerStage => ReduceTiming::PerStage,
    })
    .with_transitions(
        TransitionCost::new()
            .with_pipeline_rebuild(args.pipeline_rebuild_s)
            .with_group_rebuild(args.group_rebuild_s),
    )
    .with_pass_overhead(args.pass_overhead_us * 1e-6)
}

fn k_sequence(plan: &Plan) -> String {
    let mut ks: Vec<String> = Vec::new();
    for e in &plan.epochs {
        let s = format!("{}x{}", e.stages, e.replicas);
        if ks.last() != Some(&s) {
            ks.push(s);
        }
    }
    ks.join(" -> ")
}

fn run_plan(args: &Args, costs: &ModelCosts) -> Result<(), PlanCliError> {
    if let Some(gpus) = args
        .scaling
        .iter()
        .find(|&&g| g % args.devices_per_node != 0)
    {
        return Err(PlanCliError::Input(format!(
            "--scaling {gpus} is not a multiple of --devices-per-node {}",
            args.devices_per_node
        )));
    }
    let config = config(args, args.nodes as usize);
    let planned = plan(&config, costs)?;
    println!("model: {} ({})", costs.model, costs.source);
    println!(
        "devices: {} nodes x {} = {}; batch {} {}; {} samples per epoch; alpha {:.3}",
        args.nodes,
        args.devices_per_node,
        config.cluster.devices(),
        args.batch,
        if args.global_batch {
            "global"
        } else {
            "per replica"
        },
        args.samples,
        args.alpha
    );
    report::print_epochs(
        "PipeTransformer (F frozen layers, K stages, R replicas, M micro-batches):",
        &planned.epochs,
    );
    report::print_epochs("baseline (nothing frozen):", &planned.baseline[..1]);
    report::print_summary(&planned);
    std::fs::create_dir_all(&args.out_dir).map_err(|e| {
        PlanCliError::Input(format!("cannot create {}: {e}", args.out_dir.display()))
    })?;
    let path = args.out_dir.join("plan.json");
    std::fs::write(
        &path,
        serde_json::to_string_pretty(&planned).expect("plan serialises"),
    )
    .map_err(|e| PlanCliError::Input(format!("cannot write {}: {e}", path.display())))?;
    println!("wrote {}", path.display());
    if !args.scaling.is_empty() {
        run_scaling(args, costs)?;
    }
    Ok(())
}

fn run_scaling(args: &Args, costs: &ModelCosts) -> Result<(), PlanCliError> {
    let per_node = args.devices_per_node;
    println!();
    println!(
        "scaling ({per_node} GPUs per node; same per-replica batch, samples and epochs; 'no transitions' and 'free links' are what-ifs that show which cost caps the speed-up):"
    );
    println!(
        "{:>6} {:<26} {:>9} {:>9} {:>8} {:>9} {:>9} {:>10} {:>10} {:>8} {:>8}",
        "GPUs",
        "KxR per epoch",
        "baseline",
        "PipeT.",
        "speedup",
        "compute",
        "bubble",
        "allreduce",
        "transit.",
        "no-trans",
        "free-net"
    );
    let (mut full, mut no_transitions, mut free) = (Vec::new(), Vec::new(), Vec::new());
    for &gpus in &args.scaling {
        if gpus % per_node != 0 {
            return Err(PlanCliError::Input(format!(
                "--scaling {gpus} is not a multiple of --devices-per-node {per_node}"
            )));
        }
        let nodes = (gpus / per_node) as usize;
        let config = config(args, nodes);
        let p = plan(&config, costs)?;
        let no_t = plan(
            &config.clone().with_transitions(TransitionCost::new()),
            costs,
        )?;
        let mut free_config = config.clone().with_transitions(TransitionCost::new());
        free_config.cluster.intra = Link::new(1e18, 0.0);
        free_config.cluster.inter = Link::new(1e18, 0.0);
        let f = plan(&free_config, costs)?;
        let b = p.breakdown();
        println!(
            "{:>6} {:<26} {:>9} {:>9} {:>7.2}x {:>9} {:>9} {:>10} {:>10} {:>7.2}x {:>7.2}x",
            gpus,
            k_sequence(&p),
            human(p.baseline_total()),
            human(p.total()),
            p.speedup(),
            human(b.steps.compute),
            human(b.steps.bubble),
            human(b.steps.all_reduce),
            human(b.transition),
            no_t.speedup(),
            f.speedup()
        );
        let bb = p.baseline_breakdown();
        println!(
            "{:>6} {:<26} baseline split: {}",
            "",
            "",
            report::split(&bb)
        );
        full.push((gpus as f64, p.speedup()));
        no_transitions.push((gpus as f64, no_t.speedup()));
        free.push((gpus as f64, f.speedup()));
    }
    std::fs::create_dir_all(&args.out_dir).map_err(|e| {
        PlanCliError::Input(format!("cannot create {}: {e}", args.out_dir.display()))
    })?;
    let path = args.out_dir.join("speedup_vs_gpus.png");
    match plot::speedup_vs_gpus(
        &path,
        &format!(
            "predicted PipeTransformer speed-up, {} units, alpha {:.2}",
            costs.units.len(),
            args.alpha
        ),
        &[
            ("predicted".to_string(), full),
            ("without transition costs".to_string(), no_transitions),
            ("free links, no transitions".to_string(), free),
        ],
    ) {
        Ok(()) => println!("wrote {}", path.display()),
        Err(e) => eprintln!("{e}; skipped {}", path.display()),
    }
    Ok(())
}

/// The step costs as JSON, for calibration.json.
fn step_json(step: &profile::StepCosts) -> serde_json::Value {
    serde_json::json!({
        "optimizer_per_tensor": step.optimizer_per_tensor,
        "data": step.data,
        "accumulate_per_tensor": step.accumulate_per_tensor,
    })
}

/// Probes how passes of `shape` share this CPU at the distinct `sizes`
/// (samples per pass), prints the probe, and records it with the profiled
/// `costs` and `step` costs in `dumps` (`costs_<run>`, `step_<run>`,
/// `sharing_<run>` of calibration.json).
fn probe_and_record(
    shape: &Shape,
    mut sizes: Vec<usize>,
    cores: f64,
    run: &str,
    costs: &impl serde::Serialize,
    step: &profile::StepCosts,
    dumps: &mut serde_json::Map<String, serde_json::Value>,
) -> Vec<sharing::Sharing> {
    sizes.sort_unstable();
    sizes.dedup();
    let sharing = sharing::probe(shape, &sizes);
    report::print_sharing(&sharing, cores);
    dumps.insert(
        format!("costs_{run}"),
        serde_json::to_value(costs).expect("costs serialise"),
    );
    dumps.insert(format!("step_{run}"), step_json(step));
    dumps.insert(
        format!("sharing_{run}"),
        serde_json::to_value(&sharing).expect("serialise"),
    );
    sharing
}

fn run_calibration(args: &Args) -> Result<(), PlanCliError> {
    let cores = args
        .cpu_cores
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1.0, |n| n.get() as f64));
    println!(
        "calibration on this machine: stages are threads sharing {cores} cores (--cpu-cores); a pass takes as many cores as it does alone ({}), running passes share the cores evenly; with 2 or more stages a pass runs on a spawned thread, as many times slower as the probe measured",
        args.pass_parallelism
            .map_or("measured below".to_string(), |p| format!(
                "{p}, --pass-parallelism"
            ))
    );
    let cpu_model = |sharing: &[sharing::Sharing]| calibrate::CpuModel {
        cores,
        parallelism: match args.pass_parallelism {
            Some(p) => vec![[1.0, p]],
            None => sharing::parallelism_points(sharing, cores),
        },
        extra: 0.0,
        thread_factor: sharing::thread_factor_points(sharing),
    };
    let batches: Vec<usize> = args.profile_batches.iter().map(|&b| b as usize).collect();
    let given = args.pass_overhead_us * 1e-6;
    let mut dumps = serde_json::Map::new();
    let pipe = match &args.calibrate {
        None => None,
        Some(path) => {
            let report = calibrate::read_pipe_report(path)?;
            let shape = Shape::Vit(examples::bench::pipe::model_config(report.quick).0);
            println!(
                "bench pipe report: {} on {}, batch {}; profiling {} at batches {batches:?}",
                report.model,
                report.backend,
                report.batch,
                shape.describe()
            );
            let costs = profile::profile(&shape, &batches, 5);
            let step = profile::step_costs(&shape, report.batch, 9);
            println!(
                "measured outside the passes: gradient accumulation {:.1} us per parameter tensor and micro-batch",
                step.accumulate_per_tensor * 1e6
            );
            let sizes: Vec<usize> = report
                .rows
                .iter()
                .map(|r| report.batch.div_ceil(r.micro_batches))
                .collect();
            let sharing = probe_and_record(&shape, sizes, cores, "pipe", &costs, &step, &mut dumps);
            let cpu = cpu_model(&sharing);
            let rows = calibrate::predict_pipe(&report, &costs, &step, &cpu, given)?;
            report::print_calibration(
                &format!(
                    "bench pipe step times, from the profile alone ({} us per pass):",
                    args.pass_overhead_us
                ),
                &rows,
            );
            Some((report, costs, step, rows, cpu))
        }
    };
    let train = match &args.calibrate_train {
        None => None,
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| PlanCliError::Input(format!("cannot read {}: {e}", path.display())))?;
            // `metrics.json` of today's main job, or the log of the loop before it.
            let log = if text.trim_start().starts_with('{') {
                calibrate::parse_train_metrics(&text)?
            } else {
                calibrate::parse_train_log(&text)?
            };
            let (preset, layers) = if log.model == "Bert" {
                (Preset::BertTiny, log.units.saturating_sub(2) / 2)
            } else {
                (Preset::VitTiny, log.units.saturating_sub(3) / 2)
            };
            let shape = match (preset.shape(Some(layers)), log.hidden) {
                (Shape::Vit(c), Some(h)) => Shape::Vit(c.with_hidden(h).with_mlp_dim(2 * h)),
                (Shape::Bert(c, s), Some(h)) => {
                    Shape::Bert(c.with_hidden(h).with_intermediate(2 * h), s)
                }
                (shape, None) => shape,
            };
            println!(
                "main job log: {} {} units, {} epochs x {} steps x {}, {} stages, alpha {}; profiling {} at batches {batches:?}",
                log.model,
                log.units,
                log.epochs,
                log.steps,
                log.batch,
                log.stages,
                log.alpha,
                shape.describe()
            );
            let costs = profile::profile(&shape, &batches, 5);
            let step = profile::step_costs(&shape, log.batch, 9);
            println!(
                "measured outside the passes: Adam {:.1} us and gradient accumulation {:.1} us per parameter tensor, data {:.2} ms per batch",
                step.optimizer_per_tensor * 1e6,
                step.accumulate_per_tensor * 1e6,
                step.data * 1e3
            );
            let sizes: Vec<usize> = log
                .epoch_rows
                .iter()
                .map(|r| log.batch.div_ceil(r.micro_batches))
                .chain([log.batch])
                .collect();
            let sharing =
                probe_and_record(&shape, sizes, cores, "train", &costs, &step, &mut dumps);
            let cpu = cpu_model(&sharing);
            let (rows, matches) = calibrate::predict_train(&log, &costs, &step, &cpu, given)?;
            for (e, ok) in matches.iter().enumerate() {
                let m = &log.epoch_rows[e];
                println!(
                    "epoch {e}: the job ran F units {} K={} {:?} M={}; the planner {}",
                    m.frozen_units,
                    m.stages,
                    m.balance,
                    m.micro_batches,
                    if *ok {
                        "agrees"
                    } else {
                        "DIFFERS (see the table)"
                    }
                );
            }
            report::print_calibration(
                &format!(
                    "main job epoch times (steps + the held-out forward pass), from the profile alone ({} us per pass):",
                    args.pass_overhead_us
                ),
                &rows,
            );
            Some((log, costs, step, rows, cpu))
        }
    };
    let mut plotted: Vec<(&str, Vec<Calibrated>)> = Vec::new();
    let mut fitted = serde_json::Map::new();
    if let (
        Some((report, pipe_costs, pipe_step, _, pipe_cpu)),
        Some((log, train_costs, step, _, train_cpu)),
    ) = (&pipe, &train)
    {
        // Two parameters, each fitted on one set of rows and checked on
        // the others. First the cores a pipeline stage's pass takes beyond
        // the probe's p (the probe's copies are whole models on threads of
        // their own; a stage's passes are short and handed between
        // threads), on bench pipe's 1F1B rows with K >= 2, relative to the
        // interleaved sequential run; checked on its GPipe rows.
        let with_extra = |cpu: &calibrate::CpuModel, extra: f64| calibrate::CpuModel {
            extra,
            ..cpu.clone()
        };
        let unfitted =
            calibrate::predict_pipe_relative(report, pipe_costs, pipe_step, pipe_cpu, given)?;
        let extra = calibrate::fit_overhead(1.0, |x| {
            let rows = calibrate::predict_pipe_relative(
                report,
                pipe_costs,
                pipe_step,
                &with_extra(pipe_cpu, x),
                given,
            )?;
            Ok(rows
                .into_iter()
                .zip(&report.rows)
                .filter(|(_, row)| row.stages > 1 && row.schedule == "OneFOneB")
                .map(|(r, _)| r)
                .collect())
        })?;
        let (pipe_cpu, train_cpu) = (with_extra(pipe_cpu, extra), with_extra(train_cpu, extra));
        // Then what each trainable parameter tensor adds to a stage's
        // backward pass beyond the unit's profiled time (in the pipeline a
        // stage makes fresh autodiff leaves of its parameters for every
        // micro-batch and collects their gradients after it; a stage with
        // nothing to train pays nothing), on the main job's epochs after
        // the first (the first also warms the process up); checked on
        // epoch 0 (bench pipe's rows hardly depend on it).
        let with = |base: &examples::plan::profile::StepCosts, t: f64| {
            let mut step = *base;
            step.accumulate_per_tensor = t;
            step
        };
        let per_tensor = calibrate::fit_overhead(1e-3, |t| {
            calibrate::predict_train(log, train_costs, &with(step, t), &train_cpu, given)
                .map(|r| r.0.into_iter().skip(1).collect())
        })?;
        let pipe_step = with(pipe_step, per_tensor);
        let pipe_relative =
            calibrate::predict_pipe_relative(report, pipe_costs, &pipe_step, &pipe_cpu, given)?;
        let pipe_absolute =
            calibrate::predict_pipe(report, pipe_costs, &pipe_step, &pipe_cpu, given)?;
        let train_fitted =
            calibrate::predict_train(log, train_costs, &with(step, per_tensor), &train_cpu, given)?
                .0;
        let pass = per_tensor;
        println!();
        report::print_calibration(
            "bench pipe step times relative to the interleaved sequential run, nothing fitted (measured sharing, measured accumulation):",
            &unfitted,
        );
        println!();
        println!(
            "calibrated: passes in the pipeline take {extra:.3} cores more than the probe's p (fitted on bench pipe's 1F1B rows with K >= 2; its GPipe rows are the check); {:.1} us per trainable parameter tensor and backward pass (fitted on the main job's epochs 1..; epoch 0 is the check)",
            per_tensor * 1e6
        );
        report::print_calibration(
            "bench pipe step times relative to the interleaved sequential run (1F1B rows with K >= 2: the fit; the others: the check):",
            &pipe_relative,
        );
        report::print_calibration(
            "bench pipe step times, absolute (the profile ran at another moment of the shared machine's load):",
            &pipe_absolute,
        );
        report::print_calibration(
            "main job epoch times (the fit; epoch 0 includes the process's warm-up and was not fitted):",
            &train_fitted,
        );
        fitted.insert("per_tensor_per_pass_fitted_s".into(), pass.into());
        fitted.insert("extra_parallelism_fitted".into(), extra.into());
        for (name, rows) in [
            ("pipe_relative_unfitted", &unfitted),
            ("pipe_relative_calibrated", &pipe_relative),
            ("pipe_absolute_calibrated", &pipe_absolute),
            ("train_calibrated", &train_fitted),
        ] {
            fitted.insert(
                name.into(),
                serde_json::to_value(rows).expect("rows serialise"),
            );
        }
        plotted.push((
            "bench pipe steps, relative to its sequential run",
            pipe_relative,
        ));
        plotted.push(("bench pipe steps, absolute", pipe_absolute));
        plotted.push(("main job epochs", train_fitted));
    } else {
        if let Some((_, _, _, rows, _)) = &pipe {
            plotted.push(("bench pipe steps", rows.clone()));
        }
        if let Some((_, _, _, rows, _)) = &train {
            plotted.push(("main job epochs", rows.clone()));
        }
    }
    std::fs::create_dir_all(&args.out_dir).map_err(|e| {
        PlanCliError::Input(format!("cannot create {}: {e}", args.out_dir.display()))
    })?;
    let json = args.out_dir.join("calibration.json");
    let mut all = serde_json::Map::new();
    all.insert("cpu_cores".into(), cores.into());
    for (name, cpu) in [
        ("pipe", pipe.as_ref().map(|p| &p.4)),
        ("train", train.as_ref().map(|t| &t.4)),
    ] {
        if let Some(cpu) = cpu {
            all.insert(
                format!("{name}_parallelism"),
                serde_json::to_value(&cpu.parallelism).expect("points serialise"),
            );
            all.insert(
                format!("{name}_thread_factor"),
                serde_json::to_value(&cpu.thread_factor).expect("points serialise"),
            );
        }
    }
    all.insert("pass_overhead_s".into(), given.into());
    all.insert(
        "pipe".into(),
        serde_json::to_value(pipe.as_ref().map(|p| &p.3)).expect("rows serialise"),
    );
    all.insert(
        "train".into(),
        serde_json::to_value(train.as_ref().map(|t| &t.3)).expect("rows serialise"),
    );
    all.extend(fitted);
    all.extend(dumps);
    std::fs::write(
        &json,
        serde_json::to_string_pretty(&all).expect("rows serialise"),
    )
    .map_err(|e| PlanCliError::Input(format!("cannot write {}: {e}", json.display())))?;
    println!("wrote {}", json.display());
    let path = args.out_dir.join("predicted_vs_measured.png");
    let series: Vec<(&str, &[Calibrated])> =
        plotted.iter().map(|(n, r)| (*n, r.as_slice())).collect();
    match plot::predicted_vs_measured(&path, &series) {
        Ok(()) => println!("wrote {}", path.display()),
        Err(e) => eprintln!("{e}; skipped {}", path.display()),
    }
    Ok(())
}

fn main() {
    // Freed tensors' memory reused, not returned to the system and faulted
    // in again every step (see `examples::allocator`).
    examples::allocator::keep_freed_memory();
    let args = match Args::try_parse() {
        Ok(args) => args,
        Err(e) if !e.use_stderr() => e.exit(),
        Err(e) => {
            let text = e.to_string();
            eprintln!("{}", text.lines().next().unwrap_or("bad arguments"));
            std::process::exit(2);
        }
    };
    let result = if args.calibrate.is_some() || args.calibrate_train.is_some() {
        run_calibration(&args)
    } else {
        costs(&args).and_then(|costs| run_plan(&args, &costs))
    };
    if let Err(error) = result {
        eprintln!("error: {error}");
        std::process::exit(match error {
            PlanCliError::Plan(_) | PlanCliError::Input(_) => 2,
            PlanCliError::Plot(_) => 1,
        });
    }
}
