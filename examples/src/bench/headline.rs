//! `bench headline`: the same fine-tuning job (examples/src/job.rs), in one
//! process and from the same pretrained weights, as
//!
//! - (a) plain Burn on one device (no crate of ours on the hot path),
//! - (b) the paper's baseline: pipeline (+ data parallel) on the same
//!   devices, nothing frozen,
//! - (c) PipeTransformer, alpha = 1/3, all four parts,
//!
//! then the paper's ablations (freeze only; freeze + AutoPipe + AutoCache;
//! freeze + AutoPipe + AutoDP; all four = (c)) and its alpha sweep (1/5,
//! 1/4, 1/3 = (c), 2/5, 1/2).
//!
//! Printed and written to `target/bench/headline.json`: wall time,
//! samples/s per epoch, peak heap, final accuracy, speed-ups against (a) and
//! (b), and the ideal speed-up each freeze schedule allows with the fraction
//! of it reached. The ideal is a cost model on unit times profiled once
//! (`burn_pipe::profile_units`, one global batch on device 0): per epoch,
//! the active units' forward and backward, plus the forward of the frozen
//! units that ran (with AutoCache only the units frozen since the last epoch,
//! once per sample; without it every frozen unit), cache reads costing
//! nothing; summed over epochs, against every unit's forward and backward in
//! every epoch. For (c), a per-phase breakdown: measured transitions,
//! all-reduce and pipeline bubble, the modelled frozen forward and active
//! forward/backward, and the rest (cache reads, batching, optimizer steps,
//! threads and channels). PNG plots go to `target/bench/headline/`.

use std::path::PathBuf;

use burn::data::dataloader::batcher::Batcher;
use burn_elastic_dp::{CostModel, FreezeRule, LayerSpec, Parts, TrainerConfig};
use burn_pipe::{UnitProfile, profile_units};
use models::synthetic::{BandImages, MajorityTokens};
use serde::{Deserialize, Serialize};

use super::{BenchError, alloc, write_report};
use crate::backend;
use crate::job::{EpochRecord, JobSpec, Method, ModelKind, Observer, Pretrained, RunRecord};
use crate::plots::{self, Bar};
use crate::task::TaskBatcher;

/// Logical devices every distributed configuration uses.
const DEVICES: usize = 4;
/// Unit-profile repetitions (the fastest counts).
const PROFILE_REPEATS: usize = 5;

/// Which table a configuration belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
enum Group {
    /// (a), (b), (c).
    Headline,
    /// The paper's ablation (all four = (c)).
    Ablation,
    /// The alpha sweep (1/3 = (c)).
    Alpha,
}

struct Configuration {
    key: &'static str,
    name: String,
    group: Group,
    method: Method,
}

/// One configuration's results.
#[derive(Debug, Serialize, Deserialize)]
struct Row {
    key: String,
    group: Group,
    run: RunRecord,
    /// Peak heap during the run, above the level before it.
    peak_bytes: Option<usize>,
    speedup_vs_plain: f64,
    speedup_vs_baseline: f64,
    /// What the freeze schedule allows (cost model); 1 for no freezing.
    ideal_speedup: f64,
    /// Measured speed-up over (b) / ideal.
    fraction_of_ideal_vs_baseline: f64,
    /// Measured speed-up over (a) / ideal.
    fraction_of_ideal_vs_plain: f64,
    /// Final accuracy minus (b)'s, in points.
    accuracy_delta_vs_baseline: f64,
    /// Final accuracy minus (a)'s, in points.
    accuracy_delta_vs_plain: f64,
}

/// One epoch of (c), split by phase (seconds).
#[derive(Debug, Serialize)]
struct Phases {
    epoch: usize,
    wall: f64,
    /// Modelled: frozen units' forward for the samples whose prefix ran.
    frozen_forward_model: f64,
    /// Modelled: active units' forward and backward.
    active_model: f64,
    /// Measured: all-reduce (slowest replica, per step, summed).
    all_reduce: f64,
    /// Measured: transitions (freeze, repartition, resize).
    transitions: f64,
    /// Measured: stage idle time (see `EpochReport::bubble_seconds`).
    bubble: f64,
    /// Wall minus the rest: cache reads, batching, optimizer steps, threads
    /// and channels, and the model's error (negative when the stages ran in
    /// parallel on more than one core).
    other: f64,
    cache_hits: u64,
    cache_misses: u64,
}

#[derive(Debug, Serialize)]
struct Targets {
    speedup_vs_baseline_3x: bool,
    speedup_vs_plain_5x: bool,
    accuracy_within_half_point_of_baseline: bool,
    fraction_of_ideal_85_percent: bool,
}

#[derive(Debug, Serialize)]
struct Report {
    bench: &'static str,
    backend: &'static str,
    quick: bool,
    note: &'static str,
    spec: JobSpec,
    devices: usize,
    micro_batches: String,
    cost_model: String,
    params: usize,
    units: usize,
    /// Per unit: forward and backward milliseconds on one global batch.
    unit_profile_ms: Vec<(f64, f64)>,
    pretrain_seconds: f64,
    rows: Vec<Row>,
    breakdown: Vec<Phases>,
    targets: Targets,
    plots: Vec<PathBuf>,
}

/// Sizes of a run. BERT's task (majority of upper-half tokens) needs no
/// position learning and transfers from pretraining within this budget;
/// the tiny ViT's band task needs learned positions and stays near chance
/// for hundreds of steps at these sizes.
fn spec(model: ModelKind, quick: bool) -> JobSpec {
    let (hidden, samples, pretrain_epochs) = if quick {
        (64, 384, 10)
    } else {
        (128, 2048, 12)
    };
    JobSpec {
        model,
        layers: 12,
        hidden,
        pretrain_epochs,
        samples,
        eval_samples: 512,
        batch: 64,
        epochs: 10,
        lr: 3e-4,
        seed: 42,
    }
}

fn trainer(parts: Parts, alpha: f64, layers: usize) -> TrainerConfig {
    TrainerConfig::new()
        .with_parts(parts)
        .with_freeze(FreezeRule::AlphaSchedule { alpha })
        .with_layers(LayerSpec::Uniform {
            offset: 1,
            per_layer: 2,
            layers,
        })
        .with_costs(CostModel::Parameters {
            frozen_factor: 1.0 / 3.0,
        })
}

fn configurations(layers: usize) -> Vec<Configuration> {
    let all = Parts::new();
    let trainer_method = |parts: Parts, alpha: f64| Method::Trainer {
        config: trainer(parts, alpha, layers),
        devices: DEVICES,
    };
    let mut list = vec![
        Configuration {
            key: "a",
            name: "(a) plain Burn, 1 device".into(),
            group: Group::Headline,
            method: Method::Plain,
        },
        Configuration {
            key: "b",
            name: format!("(b) pipe+DP baseline, {DEVICES} dev"),
            group: Group::Headline,
            method: trainer_method(all.with_freeze(false), 1.0 / 3.0),
        },
        Configuration {
            key: "c",
            name: "(c) PipeTransformer a=1/3".into(),
            group: Group::Headline,
            method: trainer_method(all, 1.0 / 3.0),
        },
    ];
    let ablations = [
        (
            "freeze",
            "freeze only",
            all.with_pipe(false).with_dp(false).with_cache(false),
        ),
        ("freeze+pipe+cache", "freeze+pipe+cache", all.with_dp(false)),
        ("freeze+pipe+dp", "freeze+pipe+dp", all.with_cache(false)),
    ];
    for (key, name, parts) in ablations {
        list.push(Configuration {
            key,
            name: name.into(),
            group: Group::Ablation,
            method: trainer_method(parts, 1.0 / 3.0),
        });
    }
    for (key, name, alpha) in [
        ("alpha=1/5", "alpha=1/5", 0.2),
        ("alpha=1/4", "alpha=1/4", 0.25),
        ("alpha=2/5", "alpha=2/5", 0.4),
        ("alpha=1/2", "alpha=1/2", 0.5),
    ] {
        list.push(Configuration {
            key,
            name: name.into(),
            group: Group::Alpha,
            method: trainer_method(all, alpha),
        });
    }
    list
}

/// Prints one line per epoch to stderr.
struct Progress;

impl Observer for Progress {
    fn start(&mut self, name: &str, epochs: usize, samples: usize) {
        eprintln!("-- {name}: {epochs} epochs of {samples} samples");
    }
    fn epoch(&mut self, e: &EpochRecord) {
        // Pretraining has no held-out accuracy.
        let accuracy = if e.accuracy.is_nan() {
            "    -".to_string()
        } else {
            format!("{:>5.1}", 100.0 * e.accuracy)
        };
        eprintln!(
            "   epoch {:>2}: loss {:.4}  acc {accuracy}%  {:>7.2} s  {:>7.1} samples/s  F={} K={} R={}",
            e.epoch, e.loss, e.seconds, e.samples_per_second, e.frozen_layers, e.stages, e.replicas
        );
    }
}

/// Each unit's forward and backward time on one global batch.
fn profile(spec: &JobSpec, pretrained: &Pretrained) -> Vec<UnitProfile> {
    let device = backend::device(0);
    let items: Vec<usize> = (0..spec.batch).collect();
    match pretrained {
        Pretrained::Vit(stack) => {
            let (x, _) = TaskBatcher(BandImages::new(4, 3, 16, spec.seed)).batch(items, &device);
            profile_units(stack, x, &device, PROFILE_REPEATS)
        }
        Pretrained::Bert(stack) => {
            let (x, _) =
                TaskBatcher(MajorityTokens::new(64, 5, 15, spec.seed)).batch(items, &device);
            profile_units(stack, x, &device, PROFILE_REPEATS)
        }
    }
}

/// The cost model of one run, per epoch: (frozen forward, active forward
/// and backward), in seconds per global batch. The front during epoch `T`
/// is the one epoch `T - 1` ended with.
fn modelled(profile: &[UnitProfile], run: &RunRecord, cache: bool) -> Vec<(f64, f64)> {
    let fwd: Vec<f64> = profile.iter().map(|p| p.forward.as_secs_f64()).collect();
    let both: Vec<f64> = profile.iter().map(|p| p.cost(false, false)).collect();
    let units = profile.len();
    let mut previous = 0;
    run.epochs
        .iter()
        .enumerate()
        .map(|(t, _)| {
            let front = if t == 0 { 0 } else { run.epochs[t - 1].front };
            let front = front.min(units);
            // `+ 0.0`: an empty f64 sum is -0.0.
            let frozen: f64 = 0.0
                + if cache {
                    fwd[previous.min(front)..front].iter().sum::<f64>()
                } else {
                    fwd[..front].iter().sum::<f64>()
                };
            previous = front;
            (frozen, both[front..].iter().sum())
        })
        .collect()
}

fn ideal_speedup(profile: &[UnitProfile], run: &RunRecord, cache: bool) -> f64 {
    let full: f64 = profile.iter().map(|p| p.cost(false, false)).sum();
    let work: f64 = modelled(profile, run, cache)
        .iter()
        .map(|(f, a)| f + a)
        .sum();
    full * run.epochs.len() as f64 / work
}

fn uses_cache(method: &Method) -> bool {
    match method {
        Method::Plain => false,
        Method::Trainer { config, .. } | Method::Resume { config, .. } => {
            config.parts.cache && config.parts.freeze
        }
    }
}

fn run_err<E: std::fmt::Display>(error: E) -> BenchError {
    BenchError::Run(error.to_string())
}

fn mib(bytes: Option<usize>) -> String {
    bytes.map_or("-".into(), |b| {
        format!("{:.1}", b as f64 / (1 << 20) as f64)
    })
}

/// Runs the headline benchmark on `model`.
pub fn run(quick: bool, model: ModelKind) -> Result<(), BenchError> {
    let spec = spec(model, quick);
    spec.check().map_err(run_err)?;
    let configurations = configurations(spec.layers);
    println!(
        "bench headline ({}; backend {}; {:?} {} layers, hidden {}; {} samples/epoch, batch {}, {} epochs; {DEVICES} logical devices sharing this machine's CPU; shared 2-core machine: times are noisy)",
        if quick { "quick" } else { "full" },
        backend::NAME,
        spec.model,
        spec.layers,
        spec.hidden,
        spec.samples,
        spec.batch,
        spec.epochs
    );
    let start = std::time::Instant::now();
    let pretrained = spec.pretrain(&mut Progress);
    let pretrain_seconds = start.elapsed().as_secs_f64();
    println!(
        "pretrained in {pretrain_seconds:.0} s ({} epochs); {} parameters, {} units",
        spec.pretrain_epochs,
        pretrained.num_params(),
        pretrained.num_units()
    );
    let profile = profile(&spec, &pretrained);
    let unit_profile_ms: Vec<(f64, f64)> = profile
        .iter()
        .map(|p| {
            (
                p.forward.as_secs_f64() * 1e3,
                p.backward.as_secs_f64() * 1e3,
            )
        })
        .collect();
    eprintln!(
        "unit profile (forward ms, backward ms per batch of {}): {unit_profile_ms:.2?}",
        spec.batch
    );

    let mut runs: Vec<(RunRecord, Option<usize>)> = Vec::new();
    for configuration in &configurations {
        let before = alloc::reset_peak();
        let (record, trained) = spec
            .finetune(
                &pretrained,
                &configuration.name,
                &configuration.method,
                &mut Progress,
            )
            .map_err(run_err)?;
        drop(trained);
        let peak = alloc::installed().then(|| alloc::peak().saturating_sub(before));
        runs.push((record, peak));
    }

    let (plain, baseline) = (runs[0].0.clone(), runs[1].0.clone());
    let rows: Vec<Row> = configurations
        .iter()
        .zip(runs)
        .map(|(c, (run, peak))| {
            let ideal = ideal_speedup(&profile, &run, uses_cache(&c.method));
            let vs_plain = plain.seconds / run.seconds;
            let vs_base = baseline.seconds / run.seconds;
            Row {
                key: c.key.to_string(),
                group: c.group,
                peak_bytes: peak,
                speedup_vs_plain: vs_plain,
                speedup_vs_baseline: vs_base,
                ideal_speedup: ideal,
                fraction_of_ideal_vs_baseline: vs_base / ideal,
                fraction_of_ideal_vs_plain: vs_plain / ideal,
                accuracy_delta_vs_baseline: 100.0 * (run.accuracy - baseline.accuracy),
                accuracy_delta_vs_plain: 100.0 * (run.accuracy - plain.accuracy),
                run,
            }
        })
        .collect();

    println!(
        "{:<30} {:>8} {:>9} {:>7} {:>7} {:>6} {:>7} {:>7} {:>9} {:>6} {:>6}",
        "configuration",
        "wall s",
        "samples/s",
        "vs (a)",
        "vs (b)",
        "ideal",
        "of id.",
        "peak MiB",
        "acc %",
        "d(a)",
        "d(b)"
    );
    for row in &rows {
        let r = &row.run;
        println!(
            "{:<30} {:>8.1} {:>9.1} {:>6.2}x {:>6.2}x {:>5.2}x {:>6.0}% {:>8} {:>9.2} {:>+6.2} {:>+6.2}",
            r.name,
            r.seconds,
            (spec.samples * spec.epochs) as f64 / r.seconds,
            row.speedup_vs_plain,
            row.speedup_vs_baseline,
            row.ideal_speedup,
            100.0 * row.fraction_of_ideal_vs_baseline,
            mib(row.peak_bytes),
            100.0 * r.accuracy,
            row.accuracy_delta_vs_plain,
            row.accuracy_delta_vs_baseline,
        );
    }
    println!(
        "(vs: speed-up in wall time; ideal: the freeze schedule's cost model; of id.: speed-up vs (b) / ideal; d: accuracy points vs (a), (b))"
    );

    println!("samples/s per epoch:");
    for row in &rows {
        let per: Vec<String> = row
            .run
            .epochs
            .iter()
            .map(|e| format!("{:.0}", e.samples_per_second))
            .collect();
        println!("  {:<30} {}", row.run.name, per.join(" "));
    }
    let c = row_c(&rows)?;
    println!("(c) F/K/R per epoch (at its end):");
    let shape: Vec<String> = c
        .run
        .epochs
        .iter()
        .map(|e| format!("{}/{}/{}", e.frozen_layers, e.stages, e.replicas))
        .collect();
    println!("  {}", shape.join(" "));

    // Per-phase breakdown of (c).
    let batches = spec.samples as f64 / spec.batch as f64;
    let breakdown: Vec<Phases> = modelled(&profile, &c.run, true)
        .into_iter()
        .zip(&c.run.epochs)
        .map(|((frozen, active), e)| {
            let frozen_forward_model = frozen * batches;
            let active_model = active * batches;
            let all_reduce = e.all_reduce_seconds * e.steps as f64;
            let other = e.seconds
                - frozen_forward_model
                - active_model
                - all_reduce
                - e.transition_seconds
                - e.bubble_seconds;
            Phases {
                epoch: e.epoch,
                wall: e.seconds,
                frozen_forward_model,
                active_model,
                all_reduce,
                transitions: e.transition_seconds,
                bubble: e.bubble_seconds,
                other,
                cache_hits: e.cache_hits,
                cache_misses: e.cache_misses,
            }
        })
        .collect();
    println!(
        "(c) per-phase breakdown, seconds (frozen fwd and active fwd+bwd modelled from the unit profile; all-reduce, transitions, bubble measured; other = the rest):"
    );
    println!(
        "  {:>5} {:>8} {:>10} {:>10} {:>10} {:>11} {:>8} {:>8} {:>7} {:>7}",
        "epoch",
        "wall",
        "frozen fwd",
        "active f+b",
        "all-reduce",
        "transitions",
        "bubble",
        "other",
        "hits",
        "misses"
    );
    let mut total = [0.0f64; 7];
    for p in &breakdown {
        println!(
            "  {:>5} {:>8.2} {:>10.2} {:>10.2} {:>10.2} {:>11.2} {:>8.2} {:>8.2} {:>7} {:>7}",
            p.epoch,
            p.wall,
            p.frozen_forward_model,
            p.active_model,
            p.all_reduce,
            p.transitions,
            p.bubble,
            p.other,
            p.cache_hits,
            p.cache_misses
        );
        for (t, v) in total.iter_mut().zip([
            p.wall,
            p.frozen_forward_model,
            p.active_model,
            p.all_reduce,
            p.transitions,
            p.bubble,
            p.other,
        ]) {
            *t += v;
        }
    }
    println!(
        "  {:>5} {:>8.2} {:>10.2} {:>10.2} {:>10.2} {:>11.2} {:>8.2} {:>8.2}",
        "all", total[0], total[1], total[2], total[3], total[4], total[5], total[6]
    );

    let targets = Targets {
        speedup_vs_baseline_3x: c.speedup_vs_baseline >= 3.0,
        speedup_vs_plain_5x: c.speedup_vs_plain >= 5.0,
        accuracy_within_half_point_of_baseline: c.accuracy_delta_vs_baseline >= -0.5,
        fraction_of_ideal_85_percent: c.fraction_of_ideal_vs_baseline >= 0.85,
    };
    println!(
        "targets for (c): >= 3x vs (b): {} ({:.2}x); >= 5x vs (a): {} ({:.2}x); accuracy >= (b) - 0.5 pt: {} ({:+.2} pt); >= 85% of ideal: {} ({:.0}% of {:.2}x vs (b); {:.0}% vs (a))",
        yes(targets.speedup_vs_baseline_3x),
        c.speedup_vs_baseline,
        yes(targets.speedup_vs_plain_5x),
        c.speedup_vs_plain,
        yes(targets.accuracy_within_half_point_of_baseline),
        c.accuracy_delta_vs_baseline,
        yes(targets.fraction_of_ideal_85_percent),
        100.0 * c.fraction_of_ideal_vs_baseline,
        c.ideal_speedup,
        100.0 * c.fraction_of_ideal_vs_plain
    );

    let plots = draw(&rows).map_err(run_err)?;
    let report = Report {
        bench: "headline",
        backend: backend::NAME,
        quick,
        note: "shared 2-core machine; logical devices share its CPU; one run per configuration",
        params: pretrained.num_params(),
        units: pretrained.num_units(),
        spec,
        devices: DEVICES,
        micro_batches: "the paper's per K (burn_pipe::partition::default_micro_batches)".into(),
        cost_model: "AutoPipe: CostModel::Parameters { frozen_factor: 1/3 }; ideal: profiled units"
            .into(),
        unit_profile_ms,
        pretrain_seconds,
        rows,
        breakdown,
        targets,
        plots,
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

fn row_c(rows: &[Row]) -> Result<&Row, BenchError> {
    rows.iter()
        .find(|r| r.key == "c")
        .ok_or_else(|| BenchError::Run("no row (c) in the results".into()))
}

/// Redraws the plots from `target/bench/headline.json` (a finished run),
/// training nothing.
pub fn replot() -> Result<(), BenchError> {
    #[derive(Deserialize)]
    struct Saved {
        rows: Vec<Row>,
    }
    let path = plot_dir().with_extension("json");
    let text = std::fs::read_to_string(&path)
        .map_err(|e| BenchError::Run(format!("cannot read {}: {e}", path.display())))?;
    let saved: Saved = serde_json::from_str(&text)
        .map_err(|e| BenchError::Run(format!("cannot parse {}: {e}", path.display())))?;
    let plots = draw(&saved.rows)?;
    println!(
        "redrew {} plots in {} from {}",
        plots.len(),
        plot_dir().display(),
        path.display()
    );
    Ok(())
}

fn yes(ok: bool) -> &'static str {
    if ok { "met" } else { "MISSED" }
}

fn plot_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("target"))
        .join("bench")
        .join("headline")
}

fn draw(rows: &[Row]) -> Result<Vec<PathBuf>, BenchError> {
    let dir = plot_dir();
    std::fs::create_dir_all(&dir).map_err(|source| BenchError::Write {
        path: dir.clone(),
        source,
    })?;
    let runs: Vec<RunRecord> = rows.iter().map(|r| r.run.clone()).collect();
    let headline: Vec<RunRecord> = rows
        .iter()
        .filter(|r| r.group == Group::Headline)
        .map(|r| r.run.clone())
        .collect();
    // (b) first, then the group's rows, (c) where the group puts it: last
    // in the ablation ("all four"), at 1/3 in the alpha sweep.
    let bar = |r: &Row, name: &str| Bar {
        name: name.to_string(),
        value: r.speedup_vs_baseline,
        label: format!(
            "{:.2}x, {:.1}%",
            r.speedup_vs_baseline,
            100.0 * r.run.accuracy
        ),
    };
    let find = |key: &str| rows.iter().find(|r| r.key == key);
    let in_group = |group: Group| rows.iter().filter(move |r| r.group == group);
    let mut ablation: Vec<Bar> = find("b").map(|r| bar(r, "(b)")).into_iter().collect();
    ablation.extend(in_group(Group::Ablation).map(|r| bar(r, &r.key)));
    ablation.extend(find("c").map(|r| bar(r, "all four (c)")));
    let mut sweep: Vec<Bar> = find("b").map(|r| bar(r, "(b)")).into_iter().collect();
    let mut alphas: Vec<(f64, Bar)> = in_group(Group::Alpha)
        .map(|r| {
            let name = r.key.trim_start_matches("alpha=");
            (alpha_of(name), bar(r, name))
        })
        .chain(find("c").map(|r| (1.0 / 3.0, bar(r, "1/3 (c)"))))
        .collect();
    alphas.sort_by(|x, y| x.0.total_cmp(&y.0));
    sweep.extend(alphas.into_iter().map(|(_, b)| b));
    let mut paths = vec![
        plots::throughput(&dir, &runs).map_err(run_err)?,
        plots::loss(&dir, &headline).map_err(run_err)?,
        plots::accuracy(&dir, &runs).map_err(run_err)?,
        plots::shape(&dir, &row_c(rows)?.run, "c").map_err(run_err)?,
    ];
    paths.push(
        plots::bar_chart(
            &dir.join("ablation.png"),
            "Ablation (alpha = 1/3): speed-up over (b), final accuracy",
            "speed-up over (b)",
            &ablation,
            Some(1.0),
        )
        .map_err(run_err)?,
    );
    paths.push(
        plots::bar_chart(
            &dir.join("alpha.png"),
            "Alpha sweep: speed-up over (b), final accuracy",
            "speed-up over (b)",
            &sweep,
            Some(1.0),
        )
        .map_err(run_err)?,
    );
    Ok(paths)
}

/// The alpha of a sweep key such as "2/5".
fn alpha_of(name: &str) -> f64 {
    match name.split_once('/') {
        Some((n, d)) => n.parse::<f64>().unwrap_or(0.0) / d.parse::<f64>().unwrap_or(1.0),
        None => 0.0,
    }
}
