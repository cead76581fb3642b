//! `plan`'s command line: the model, cluster, batch, freezing and cost
//! flags, and the planner's configuration they make.

use std::path::PathBuf;

use burn::collective::AllReduceStrategy;
use burn_elastic_dp::plan::{ClusterConfig, Link, PlanConfig, ReduceTiming, TransitionCost};
use burn_elastic_dp::{AllReduce, BatchPolicy, CostModel, FreezeRule, MemoryConfig, Parts};
use burn_pipe::Schedule;
use clap::{Parser, ValueEnum};
use pipetransformer_harness::plan::calibrate::CalibrationOptions;
use pipetransformer_harness::plan::presets::Preset;

#[derive(Debug, Clone, Copy, ValueEnum)]
pub(crate) enum ScheduleArg {
    Gpipe,
    #[value(name = "1f1b")]
    OneFOneB,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub(crate) enum StrategyArg {
    Ring,
    Tree,
    Centralized,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub(crate) enum TimingArg {
    /// As the replica group does: after the whole pass, stage after stage.
    AfterPass,
    /// Each stage as soon as its backward ends, in parallel (DDP per stage).
    PerStage,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub(crate) enum BasisArg {
    Params,
    Time,
}

#[derive(Debug, Parser)]
#[command(
    version,
    about = "Predict PipeTransformer's per-epoch schedule and epoch times (1 to thousands of GPUs)",
    allow_negative_numbers = true
)]
pub(crate) struct Args {
    /// Model preset (its units' parameters, activations and FLOPs).
    #[arg(long, value_enum, default_value = "vit-b16")]
    pub(crate) model: Preset,
    /// Transformer blocks, overriding the preset's.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub(crate) layers: Option<u32>,
    /// Read per-unit costs from this JSON file (as written by --save-costs)
    /// instead of working them out from --model.
    #[arg(long)]
    pub(crate) costs: Option<PathBuf>,
    /// Profile --model's units on this machine's backend instead of
    /// estimating them from FLOPs.
    #[arg(long)]
    pub(crate) profile: bool,
    /// Batch sizes to profile at (fitted as fixed + per-sample time).
    #[arg(long, value_delimiter = ',', default_value = "2,8,32", value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub(crate) profile_batches: Vec<u32>,
    /// Achieved FLOP/s per device for FLOP-based costs, in TFLOP/s, in (0, 10000].
    #[arg(long, default_value_t = 4.5, value_parser = positive("TFLOP/s", 10_000.0))]
    pub(crate) tflops: f64,
    /// Write the costs used to this JSON file.
    #[arg(long)]
    pub(crate) save_costs: Option<PathBuf>,
    /// Devices per node.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub(crate) devices_per_node: u32,
    /// Nodes.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=65536))]
    pub(crate) nodes: u32,
    /// Bandwidth between devices of a node, GB/s, in (0, 100000].
    #[arg(long, default_value_t = 12.0, value_parser = positive("GB/s", 100_000.0))]
    pub(crate) intra_gbs: f64,
    /// Latency between devices of a node, microseconds, in [0, 1000000].
    #[arg(long, default_value_t = 10.0, value_parser = non_negative("microseconds", 1e6))]
    pub(crate) intra_latency_us: f64,
    /// Bandwidth between nodes, Gb/s (bits), in (0, 100000].
    #[arg(long, default_value_t = 100.0, value_parser = positive("Gb/s", 100_000.0))]
    pub(crate) inter_gbps: f64,
    /// Latency between nodes, microseconds, in [0, 1000000].
    #[arg(long, default_value_t = 5.0, value_parser = non_negative("microseconds", 1e6))]
    pub(crate) inter_latency_us: f64,
    /// Samples per step and replica (the paper's choice); see --global-batch.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub(crate) batch: u32,
    /// --batch is the global batch, split over the replicas.
    #[arg(long)]
    pub(crate) global_batch: bool,
    /// Samples per epoch (default: ImageNet-1k's training set).
    #[arg(long, default_value_t = 1_281_167, value_parser = clap::value_parser!(u64).range(1..=10_000_000_000))]
    pub(crate) samples: u64,
    /// Epochs.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub(crate) epochs: u32,
    /// AutoFreeze's alpha, in (0, 1).
    #[arg(long, default_value_t = 1.0 / 3.0, value_parser = open_unit("alpha"))]
    pub(crate) alpha: f64,
    /// Stages per pipeline at the start (default: devices per node, the
    /// paper's start; with --device-memory: the fewest that fit, as train).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub(crate) stages: Option<u32>,
    /// Bytes one device holds for its stage (parameters, gradients, Adam's
    /// state, activations): memory-aware AutoPipe, as train's flag.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) device_memory: Option<u64>,
    /// Micro-batches per step (default: burn-pipe's choice for K).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=65536))]
    pub(crate) micro_batches: Option<u32>,
    /// Pass order.
    #[arg(long, value_enum, default_value = "1f1b")]
    pub(crate) schedule: ScheduleArg,
    /// What AutoPipe balances, as the trainer's --costs: parameter counts
    /// (a frozen unit a third of an active one), or the units' times (a
    /// frozen unit its forward time).
    #[arg(long, value_enum, default_value = "params")]
    pub(crate) balance_by: BasisArg,
    /// Host-to-device bandwidth of the activation cache, GB/s, in (0, 100000].
    #[arg(long, default_value_t = 12.0, value_parser = positive("GB/s", 100_000.0))]
    pub(crate) cache_gbs: f64,
    /// Never cache the frozen prefix (else cached once anything is frozen,
    /// as the trainer's AutoCache).
    #[arg(long)]
    pub(crate) no_cache: bool,
    /// Keep the starting replica count (no AutoDP).
    #[arg(long)]
    pub(crate) no_auto_dp: bool,
    /// All-reduce algorithm within a node (burn-collective's).
    #[arg(long, value_enum, default_value = "ring")]
    pub(crate) strategy: StrategyArg,
    /// All-reduce algorithm between nodes.
    #[arg(long, value_enum, default_value = "ring")]
    pub(crate) global_strategy: StrategyArg,
    /// Children per parent of the tree strategy.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub(crate) tree_arity: u32,
    /// Gradient bucket size in MiB, in [0, 100000]; 0: one call per tensor.
    #[arg(long, default_value_t = 25.0, value_parser = non_negative("MiB", 100_000.0))]
    pub(crate) bucket_mib: f64,
    /// When the all-reduce runs.
    #[arg(long, value_enum, default_value = "per-stage")]
    pub(crate) reduce_timing: TimingArg,
    /// Seconds to rebuild a pipeline at a transition, in [0, 100000].
    #[arg(long, default_value_t = 10.0, value_parser = non_negative("seconds", 1e5))]
    pub(crate) pipeline_rebuild_s: f64,
    /// Seconds to re-form the data-parallel group at a transition, in [0, 100000].
    #[arg(long, default_value_t = 15.0, value_parser = non_negative("seconds", 1e5))]
    pub(crate) group_rebuild_s: f64,
    /// Fixed microseconds per pass on top of the unit costs, in [0, 1000000].
    #[arg(long, default_value_t = 0.0, value_parser = non_negative("microseconds", 1e6))]
    pub(crate) pass_overhead_us: f64,
    /// Also predict these GPU counts (multiples of --devices-per-node).
    #[arg(long, value_delimiter = ',', value_parser = clap::value_parser!(u32).range(1..=1_048_576))]
    pub(crate) scaling: Vec<u32>,
    /// Calibrate against a `bench pipe` report (target/bench/pipe.json).
    #[arg(long)]
    pub(crate) calibrate: Option<PathBuf>,
    /// Calibrate against the main job: its metrics.json (`train --no-dp --no-cache --output-dir DIR`), or the log of the loop before it.
    #[arg(long)]
    pub(crate) calibrate_train: Option<PathBuf>,
    /// Cores of this CPU the stage threads share, for calibration, in (0, 1024] (default: the cores the OS gives this process).
    #[arg(long, value_parser = positive("cores", 1024.0))]
    pub(crate) cpu_cores: Option<f64>,
    /// Cores one pass takes alone, for calibration, in (0, 1024], instead of measuring it (1: passes on different threads never slow each other down; the core count: they never overlap usefully).
    #[arg(long, value_parser = positive("cores", 1024.0))]
    pub(crate) pass_parallelism: Option<f64>,
    /// Where the plots and plan.json go.
    #[arg(long, default_value = "target/plan")]
    pub(crate) out_dir: PathBuf,
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

pub(crate) fn config(args: &Args, nodes: usize, units: usize) -> PlanConfig {
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

pub(crate) fn calibration_options(args: &Args) -> CalibrationOptions {
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
