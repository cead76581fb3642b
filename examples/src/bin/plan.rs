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
    ClusterConfig, Link, ModelSpec, Plan, PlanConfig, ReduceTiming, TransitionCost, plan,
};
use burn_elastic_dp::{AllReduce, BatchPolicy, CostModel, FreezeRule, MemoryConfig, Parts};
use burn_pipe::Schedule;
use clap::{Parser, ValueEnum};
use examples::plan::calibrate::{self, CalibrationOptions};
use examples::plan::presets::Preset;
use examples::plan::report::{self, human};
use examples::plan::{PlanCliError, plot, profile};

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
    version,
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
    /// Stages per pipeline at the start (default: devices per node, the
    /// paper's start; with --device-memory: the fewest that fit, as train).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=4096))]
    stages: Option<u32>,
    /// Bytes one device holds for its stage (parameters, gradients, Adam's
    /// state, activations): memory-aware AutoPipe, as train's flag.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    device_memory: Option<u64>,
    /// Micro-batches per step (default: burn-pipe's choice for K).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=65536))]
    micro_batches: Option<u32>,
    /// Pass order.
    #[arg(long, value_enum, default_value = "1f1b")]
    schedule: ScheduleArg,
    /// What AutoPipe balances, as the trainer's --costs: parameter counts
    /// (a frozen unit a third of an active one), or the units' times (a
    /// frozen unit its forward time).
    #[arg(long, value_enum, default_value = "params")]
    balance_by: BasisArg,
    /// Host-to-device bandwidth of the activation cache, GB/s, in (0, 100000].
    #[arg(long, default_value_t = 12.0, value_parser = positive("GB/s", 100_000.0))]
    cache_gbs: f64,
    /// Never cache the frozen prefix (else cached once anything is frozen,
    /// as the trainer's AutoCache).
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

fn costs(args: &Args) -> Result<ModelSpec, PlanCliError> {
    let costs = if let Some(path) = &args.costs {
        let text = std::fs::read_to_string(path)
            .map_err(|e| PlanCliError::Input(format!("cannot read {}: {e}", path.display())))?;
        let costs: ModelSpec = serde_json::from_str(&text).map_err(|e| {
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

fn config(args: &Args, nodes: usize, units: usize) -> PlanConfig {
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
        FreezeRule::AlphaSchedule { alpha: args.alpha },
    )
    .with_stages(match (args.stages, args.device_memory) {
        (Some(k), _) => Some(k as usize),
        // Memory-aware AutoPipe picks the start.
        (None, Some(_)) => None,
        // The paper's start: one node's devices.
        (None, None) => Some(
            (args.devices_per_node as usize)
                .min(units)
                .min(nodes * args.devices_per_node as usize),
        ),
    })
    .with_memory(MemoryConfig::new().with_device_bytes(args.device_memory))
    .with_micro_batches(args.micro_batches.map(|m| m as usize))
    .with_schedule(match args.schedule {
        ScheduleArg::Gpipe => Schedule::GPipe,
        ScheduleArg::OneFOneB => Schedule::OneFOneB,
    })
    .with_costs(match args.balance_by {
        BasisArg::Params => CostModel::Parameters {
            frozen_factor: 1.0 / 3.0,
        },
        BasisArg::Time => CostModel::Profiled { repeats: 1 },
    })
    .with_parts(
        Parts::new()
            .with_cache(!args.no_cache)
            .with_dp(!args.no_auto_dp),
    )
    .with_cache_bandwidth(Some(args.cache_gbs * 1e9))
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

fn run_plan(args: &Args, costs: &ModelSpec) -> Result<(), PlanCliError> {
    if let Some(gpus) = args
        .scaling
        .iter()
        .find(|&&g| g % args.devices_per_node != 0)
    {
        return Err(PlanCliError::Flags(format!(
            "--scaling {gpus} is not a multiple of --devices-per-node {}",
            args.devices_per_node
        )));
    }
    let config = config(args, args.nodes as usize, costs.units.len());
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

fn run_scaling(args: &Args, costs: &ModelSpec) -> Result<(), PlanCliError> {
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
            return Err(PlanCliError::Flags(format!(
                "--scaling {gpus} is not a multiple of --devices-per-node {per_node}"
            )));
        }
        let nodes = (gpus / per_node) as usize;
        let config = config(args, nodes, costs.units.len());
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

fn calibration_options(args: &Args) -> CalibrationOptions {
    CalibrationOptions {
        pipe_report: args.calibrate.clone(),
        train_log: args.calibrate_train.clone(),
        cpu_cores: args.cpu_cores,
        pass_parallelism: args.pass_parallelism,
        profile_batches: args.profile_batches.iter().map(|&b| b as usize).collect(),
        pass_overhead: args.pass_overhead_us * 1e-6,
        out_dir: args.out_dir.clone(),
    }
}

fn main() {
    // Freed tensors' memory reused, not returned to the system and faulted
    // in again every step (see `examples::allocator`).
    examples::allocator::keep_freed_memory();
    examples::init_logging();
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
        calibrate::run_calibration(&calibration_options(&args))
    } else {
        costs(&args).and_then(|costs| run_plan(&args, &costs))
    };
    if let Err(error) = result {
        eprintln!("error: {error}");
        std::process::exit(match error {
            // A configuration the planner refuses comes from the flags.
            PlanCliError::Plan(_) | PlanCliError::Flags(_) => 2,
            PlanCliError::Input(_) | PlanCliError::Plot(_) => 1,
        });
    }
}
