//! `plan --calibrate`: the simulator's predictions of this machine's measured
//! step and epoch times, the fitted parameters, `calibration.json` and a plot.

use std::path::PathBuf;

use burn_elastic_dp::plan::ModelSpec;
use serde::Serialize;

use super::{
    Calibrated, CpuModel, PipeBaseline, PipeReport, TrainLog, fit_overhead, parse_train_log,
    parse_train_metrics, predict_pipe, predict_train, read_pipe_report,
};
use crate::plan::presets::Shape;
use crate::plan::profile::{self, StepCosts};
use crate::plan::sharing::{self, Sharing};
use crate::plan::{PlanCliError, plot, report};

/// What `plan --calibrate` is given.
#[derive(Debug, Clone)]
pub struct CalibrationOptions {
    /// `bench pipe`'s report.
    pub pipe_report: Option<PathBuf>,
    /// The main job's `metrics.json` or log.
    pub train_log: Option<PathBuf>,
    /// Cores the stage threads share (`None`: the cores the OS gives this
    /// process).
    pub cpu_cores: Option<f64>,
    /// Cores one pass takes alone, instead of measuring it.
    pub pass_parallelism: Option<f64>,
    /// Batch sizes to profile at.
    pub profile_batches: Vec<usize>,
    /// Fixed seconds per pass on top of the unit costs.
    pub pass_overhead: f64,
    /// Where `calibration.json` and the plot go.
    pub out_dir: PathBuf,
}

/// What one measured run (bench pipe's or the main job's) was calibrated
/// with, and its predictions from the profile alone.
#[derive(Debug, Clone, Serialize)]
pub struct RunCalibration {
    /// The model's costs profiled on this machine.
    pub costs: ModelSpec,
    /// The step's costs outside the passes.
    pub step: StepCosts,
    /// How passes share the CPU, probed.
    pub sharing: Vec<Sharing>,
    /// `[samples per pass, cores one pass takes alone]` points used.
    pub parallelism: Vec<[f64; 2]>,
    /// `[samples per pass, spawned-thread slowdown]` points used.
    pub thread_factor: Vec<[f64; 2]>,
    /// Predicted beside measured, nothing fitted.
    pub rows: Vec<Calibrated>,
}

/// The two fitted parameters and the predictions with them (both
/// measurements given).
#[derive(Debug, Clone, Serialize)]
pub struct Fitted {
    /// Seconds each trainable parameter tensor adds to a stage's backward
    /// pass.
    pub per_tensor_per_pass_s: f64,
    /// Cores a pipeline stage's pass takes beyond the probe's.
    pub extra_parallelism: f64,
    /// bench pipe relative to its sequential run, nothing fitted.
    pub pipe_relative_unfitted: Vec<Calibrated>,
    /// bench pipe relative to its sequential run, fitted.
    pub pipe_relative_calibrated: Vec<Calibrated>,
    /// bench pipe absolute, fitted.
    pub pipe_absolute_calibrated: Vec<Calibrated>,
    /// The main job's epochs, fitted.
    pub train_calibrated: Vec<Calibrated>,
}

/// `calibration.json`.
#[derive(Debug, Clone, Serialize)]
pub struct CalibrationFile {
    /// Cores the stage threads share.
    pub cpu_cores: f64,
    /// Fixed seconds per pass given.
    pub pass_overhead_s: f64,
    /// bench pipe's calibration.
    pub pipe: Option<RunCalibration>,
    /// The main job's calibration.
    pub train: Option<RunCalibration>,
    /// With both: the fit.
    pub fitted: Option<Fitted>,
}

/// Profiles `shape` (its costs at `options.profile_batches`, its step costs
/// at `batch`), probes how its passes share the CPU at the distinct `sizes`
/// (samples per pass), and prints the probe.
fn measure(
    shape: &Shape,
    batch: usize,
    mut sizes: Vec<usize>,
    cores: f64,
    options: &CalibrationOptions,
) -> (ModelSpec, StepCosts, Vec<Sharing>, CpuModel) {
    let costs = profile::profile(shape, &options.profile_batches, 5);
    let step = profile::step_costs(shape, batch, 9);
    println!(
        "measured outside the passes: Adam {:.1} us and gradient accumulation {:.1} us per parameter tensor and micro-batch, data {:.2} ms per batch",
        step.optimizer_per_tensor * 1e6,
        step.accumulate_per_tensor * 1e6,
        step.data * 1e3
    );
    sizes.sort_unstable();
    sizes.dedup();
    let sharing = sharing::probe(shape, &sizes);
    report::print_sharing(&sharing, cores);
    let cpu = CpuModel {
        cores,
        parallelism: match options.pass_parallelism {
            Some(p) => vec![[1.0, p]],
            None => sharing::parallelism_points(&sharing, cores),
        },
        extra: 0.0,
        thread_factor: sharing::thread_factor_points(&sharing),
    };
    (costs, step, sharing, cpu)
}

/// A measured run, its calibration and the CPU model it was made with.
struct Measured<T> {
    input: T,
    cpu: CpuModel,
    calibration: RunCalibration,
}

impl<T> Measured<T> {
    fn new(input: T, measured: (ModelSpec, StepCosts, Vec<Sharing>, CpuModel)) -> Self {
        let (costs, step, sharing, cpu) = measured;
        Self {
            input,
            calibration: RunCalibration {
                costs,
                step,
                parallelism: cpu.parallelism.clone(),
                thread_factor: cpu.thread_factor.clone(),
                sharing,
                rows: Vec::new(),
            },
            cpu,
        }
    }
}

fn calibrate_pipe(
    path: &std::path::Path,
    cores: f64,
    options: &CalibrationOptions,
) -> Result<Measured<PipeReport>, PlanCliError> {
    let report = read_pipe_report(path)?;
    let shape = Shape::Vit(crate::bench::pipe::model_config(report.quick).0);
    println!(
        "bench pipe report: {} on {}, batch {}; profiling {} at batches {:?}",
        report.model,
        report.backend,
        report.batch,
        shape.describe(),
        options.profile_batches
    );
    let sizes = report
        .rows
        .iter()
        .map(|r| report.batch.div_ceil(r.micro_batches))
        .collect();
    let batch = report.batch;
    let mut run = Measured::new(report, measure(&shape, batch, sizes, cores, options));
    let c = &run.calibration;
    let rows = predict_pipe(
        &run.input,
        &c.costs,
        &c.step,
        &run.cpu,
        options.pass_overhead,
        PipeBaseline::Absolute,
    )?;
    run.calibration.rows = rows;
    report::print_calibration(
        &format!(
            "bench pipe step times, from the profile alone ({} us per pass):",
            options.pass_overhead * 1e6
        ),
        &run.calibration.rows,
    );
    Ok(run)
}

fn calibrate_train(
    path: &std::path::Path,
    cores: f64,
    options: &CalibrationOptions,
) -> Result<Measured<TrainLog>, PlanCliError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| PlanCliError::Input(format!("cannot read {}: {e}", path.display())))?;
    // `metrics.json` of today's main job, or the log of the loop before it.
    let log = if text.trim_start().starts_with('{') {
        parse_train_metrics(&text)?
    } else {
        parse_train_log(&text)?
    };
    let shape = log.shape();
    println!(
        "main job log: {} {} units, {} epochs x {} steps x {}, {} stages, alpha {}; profiling {} at batches {:?}",
        log.model,
        log.units,
        log.epochs,
        log.steps,
        log.batch,
        log.stages,
        log.alpha,
        shape.describe(),
        options.profile_batches
    );
    let sizes = log
        .epoch_rows
        .iter()
        .map(|r| log.batch.div_ceil(r.micro_batches))
        .chain([log.batch])
        .collect();
    let batch = log.batch;
    let mut run = Measured::new(log, measure(&shape, batch, sizes, cores, options));
    let c = &run.calibration;
    let rows = predict_train(
        &run.input,
        &c.costs,
        &c.step,
        &run.cpu,
        options.pass_overhead,
    )?;
    run.calibration.rows = rows;
    report::print_calibration(
        &format!(
            "main job epoch times (steps + the held-out forward pass), from the profile alone ({} us per pass):",
            options.pass_overhead * 1e6
        ),
        &run.calibration.rows,
    );
    Ok(run)
}

/// Two parameters, each fitted on one set of rows and checked on the
/// others. First the cores a pipeline stage's pass takes beyond the
/// probe's p (the probe's copies are whole models on threads of their own;
/// a stage's passes are short and handed between threads), on bench pipe's
/// 1F1B rows with K >= 2, relative to the interleaved sequential run;
/// checked on its GPipe rows. Then what each trainable parameter tensor
/// adds to a stage's backward pass beyond the unit's profiled time (in the
/// pipeline a stage makes fresh autodiff leaves of its parameters for
/// every micro-batch and collects their gradients after it; a stage with
/// nothing to train pays nothing), on the main job's epochs after the
/// first (the first also warms the process up); checked on epoch 0 (bench
/// pipe's rows hardly depend on it).
fn fit(
    pipe: &Measured<PipeReport>,
    train: &Measured<TrainLog>,
    given: f64,
) -> Result<Fitted, PlanCliError> {
    let (report, pipe_run) = (&pipe.input, &pipe.calibration);
    let (log, train_run) = (&train.input, &train.calibration);
    let with_extra = |cpu: &CpuModel, extra: f64| CpuModel {
        extra,
        ..cpu.clone()
    };
    let relative = |step: &StepCosts, cpu: &CpuModel| {
        predict_pipe(
            report,
            &pipe_run.costs,
            step,
            cpu,
            given,
            PipeBaseline::Relative,
        )
    };
    let unfitted = relative(&pipe_run.step, &pipe.cpu)?;
    let extra = fit_overhead(1.0, |x| {
        Ok(relative(&pipe_run.step, &with_extra(&pipe.cpu, x))?
            .into_iter()
            .zip(&report.rows)
            .filter(|(_, row)| row.stages > 1 && row.schedule == "OneFOneB")
            .map(|(r, _)| r)
            .collect())
    })?;
    let (pipe_cpu, train_cpu) = (with_extra(&pipe.cpu, extra), with_extra(&train.cpu, extra));
    let with = |base: &StepCosts, t: f64| StepCosts {
        accumulate_per_tensor: t,
        ..*base
    };
    let per_tensor = fit_overhead(1e-3, |t| {
        predict_train(
            log,
            &train_run.costs,
            &with(&train_run.step, t),
            &train_cpu,
            given,
        )
        .map(|rows| rows.into_iter().skip(1).collect())
    })?;
    let pipe_step = with(&pipe_run.step, per_tensor);
    Ok(Fitted {
        per_tensor_per_pass_s: per_tensor,
        extra_parallelism: extra,
        pipe_relative_unfitted: unfitted,
        pipe_relative_calibrated: relative(&pipe_step, &pipe_cpu)?,
        pipe_absolute_calibrated: predict_pipe(
            report,
            &pipe_run.costs,
            &pipe_step,
            &pipe_cpu,
            given,
            PipeBaseline::Absolute,
        )?,
        train_calibrated: predict_train(
            log,
            &train_run.costs,
            &with(&train_run.step, per_tensor),
            &train_cpu,
            given,
        )?,
    })
}

fn print_fitted(fitted: &Fitted) {
    println!();
    report::print_calibration(
        "bench pipe step times relative to the interleaved sequential run, nothing fitted (measured sharing, measured accumulation):",
        &fitted.pipe_relative_unfitted,
    );
    println!();
    println!(
        "calibrated: passes in the pipeline take {:.3} cores more than the probe's p (fitted on bench pipe's 1F1B rows with K >= 2; its GPipe rows are the check); {:.1} us per trainable parameter tensor and backward pass (fitted on the main job's epochs 1..; epoch 0 is the check)",
        fitted.extra_parallelism,
        fitted.per_tensor_per_pass_s * 1e6
    );
    report::print_calibration(
        "bench pipe step times relative to the interleaved sequential run (1F1B rows with K >= 2: the fit; the others: the check):",
        &fitted.pipe_relative_calibrated,
    );
    report::print_calibration(
        "bench pipe step times, absolute (the profile ran at another moment of the shared machine's load):",
        &fitted.pipe_absolute_calibrated,
    );
    report::print_calibration(
        "main job epoch times (the fit; epoch 0 includes the process's warm-up and was not fitted):",
        &fitted.train_calibrated,
    );
}

/// Runs the calibration `options` ask for: prints every table, writes
/// `calibration.json` and `predicted_vs_measured.png` into
/// `options.out_dir`.
///
/// `plan --calibrate`: profile the model of `bench pipe`'s report and of the
/// main job on this machine, probe how its passes share the CPU, predict
/// the measured step and epoch times, fit the two parameters the probe
/// cannot see when both measurements are given, and write
/// `calibration.json` (one serde record, [`CalibrationFile`]) and a plot.
pub fn run_calibration(options: &CalibrationOptions) -> Result<(), PlanCliError> {
    let cores = options
        .cpu_cores
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1.0, |n| n.get() as f64));
    println!(
        "calibration on this machine: stages are threads sharing {cores} cores (--cpu-cores); a pass takes as many cores as it does alone ({}), running passes share the cores evenly; with 2 or more stages a pass runs on a spawned thread, as many times slower as the probe measured",
        options
            .pass_parallelism
            .map_or("measured below".to_string(), |p| format!(
                "{p}, --pass-parallelism"
            ))
    );
    let pipe = match &options.pipe_report {
        Some(path) => Some(calibrate_pipe(path, cores, options)?),
        None => None,
    };
    let train = match &options.train_log {
        Some(path) => Some(calibrate_train(path, cores, options)?),
        None => None,
    };
    let fitted = match (&pipe, &train) {
        (Some(pipe), Some(train)) => Some(fit(pipe, train, options.pass_overhead)?),
        _ => None,
    };
    let mut plotted: Vec<(&str, &[Calibrated])> = Vec::new();
    if let Some(fitted) = &fitted {
        print_fitted(fitted);
        plotted.push((
            "bench pipe steps, relative to its sequential run",
            &fitted.pipe_relative_calibrated,
        ));
        plotted.push((
            "bench pipe steps, absolute",
            &fitted.pipe_absolute_calibrated,
        ));
        plotted.push(("main job epochs", &fitted.train_calibrated));
    } else {
        if let Some(pipe) = &pipe {
            plotted.push(("bench pipe steps", &pipe.calibration.rows));
        }
        if let Some(train) = &train {
            plotted.push(("main job epochs", &train.calibration.rows));
        }
    }
    let file = CalibrationFile {
        cpu_cores: cores,
        pass_overhead_s: options.pass_overhead,
        pipe: pipe.as_ref().map(|p| p.calibration.clone()),
        train: train.as_ref().map(|t| t.calibration.clone()),
        fitted: fitted.clone(),
    };
    let dir = &options.out_dir;
    std::fs::create_dir_all(dir)
        .map_err(|e| PlanCliError::Input(format!("cannot create {}: {e}", dir.display())))?;
    let json = dir.join("calibration.json");
    std::fs::write(
        &json,
        serde_json::to_string_pretty(&file).expect("the calibration serialises"),
    )
    .map_err(|e| PlanCliError::Input(format!("cannot write {}: {e}", json.display())))?;
    println!("wrote {}", json.display());
    let path = dir.join("predicted_vs_measured.png");
    match plot::predicted_vs_measured(&path, &plotted) {
        Ok(()) => println!("wrote {}", path.display()),
        Err(e) => eprintln!("{e}; skipped {}", path.display()),
    }
    Ok(())
}
