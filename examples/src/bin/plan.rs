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

// The binary's own module, in `plan/` beside this file.
#[path = "plan/cli.rs"]
mod cli;

use burn_elastic_dp::plan::{Link, ModelSpec, Plan, TransitionCost, plan};
use clap::Parser;
use pipetransformer_harness::plan::calibrate;
use pipetransformer_harness::plan::report::{self, human};
use pipetransformer_harness::plan::{PlanCliError, plot, profile};

use cli::{Args, calibration_options, config};

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
    print_scaling_header(per_node);
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
        print_scaling_row(gpus, &p, &no_t, &f);
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

/// The scaling table's title and column heads.
fn print_scaling_header(per_node: u32) {
    println!();
    println!(
        "scaling ({per_node} GPUs per node; same per-replica batch, samples and epochs; 'exposed': the all-reduce time the backward does not hide, of 'exchange', its whole time (each stage's exchange starts when its backward ends); 'no transitions' and 'free links' are what-ifs that show which cost caps the speed-up):"
    );
    println!(
        "{:>6} {:<26} {:>9} {:>9} {:>8} {:>9} {:>9} {:>10} {:>10} {:>10} {:>8} {:>8}",
        "GPUs",
        "KxR per epoch",
        "baseline",
        "PipeT.",
        "speedup",
        "compute",
        "bubble",
        "exposed",
        "exchange",
        "transit.",
        "no-trans",
        "free-net"
    );
}

/// The scaling table's rows of `gpus` GPUs: the plan `p`, its speed-ups
/// without transitions (`no_t`) and on free links (`f`), and the
/// baseline's split.
fn print_scaling_row(gpus: u32, p: &Plan, no_t: &Plan, f: &Plan) {
    let b = p.breakdown();
    println!(
        "{:>6} {:<26} {:>9} {:>9} {:>7.2}x {:>9} {:>9} {:>10} {:>10} {:>10} {:>7.2}x {:>7.2}x",
        gpus,
        k_sequence(p),
        human(p.baseline_total()),
        human(p.total()),
        p.speedup(),
        human(b.steps.compute),
        human(b.steps.bubble),
        human(b.steps.all_reduce),
        human(b.steps.exchange),
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
}

fn main() {
    // Freed tensors' memory reused, not returned to the system and faulted
    // in again every step (see `pipetransformer_jobs::allocator`).
    pipetransformer_jobs::allocator::keep_freed_memory();
    pipetransformer_jobs::init_logging();
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
