//! Calibration: the simulator's predictions beside what this machine
//! measured, for `bench pipe`'s step times (its JSON report) and the main
//! job's epoch times (its printed log).

use std::path::Path;

use burn_elastic_dp::BatchPolicy;
use burn_elastic_dp::plan::{
    ClusterConfig, Link, ModelCosts, PipelineSim, PlanConfig, StageWork, parallelism_at, plan,
};
use burn_pipe::Schedule;
use serde::Deserialize;

use super::PlanCliError;
use super::profile::StepCosts;

/// How this CPU runs a pipeline's stages, which are threads: its cores
/// shared by the passes running at once, each pass taking at most as many
/// cores as it does alone ([`PipelineSim::parallelism`], measured by
/// [`super::sharing`]).
#[derive(Debug, Clone, PartialEq)]
pub struct CpuModel {
    /// Cores: the device's capacity.
    pub cores: f64,
    /// `[samples per pass, cores one pass takes alone]` points.
    pub parallelism: Vec<[f64; 2]>,
    /// Cores a pipeline stage's pass takes beyond `parallelism` (fitted;
    /// 0: as measured).
    pub extra: f64,
    /// `[samples per pass, how many times longer a pass takes on a spawned
    /// thread than on the calling thread]` points: a pipeline of 2 or more
    /// stages runs them on spawned threads, the profile and the
    /// benchmark's sequential run on the calling thread. Empty: 1.
    pub thread_factor: Vec<[f64; 2]>,
}

impl CpuModel {
    /// The cores a pass over `samples` takes alone in the pipeline:
    /// measured plus `extra`, at most `cores`.
    ///
    /// ```
    /// use examples::plan::calibrate::CpuModel;
    ///
    /// let cpu = CpuModel {
    ///     cores: 2.0, parallelism: vec![[2.0, 1.2], [8.0, 1.8]], extra: 0.3, thread_factor: vec![],
    /// };
    /// assert!((cpu.parallelism(2.0) - 1.5).abs() < 1e-12);
    /// assert_eq!(cpu.parallelism(8.0), 2.0);
    /// assert_eq!(cpu.points(), vec![[2.0, 1.5], [8.0, 2.0]]);
    /// ```
    pub fn parallelism(&self, samples: f64) -> f64 {
        (parallelism_at(&self.parallelism, samples) + self.extra).min(self.cores)
    }

    /// The `[samples, parallelism]` points with `extra` added, at most
    /// `cores`, for [`ClusterConfig::shared_device_parallelism`].
    pub fn points(&self) -> Vec<[f64; 2]> {
        self.parallelism
            .iter()
            .map(|&[b, p]| [b, (p + self.extra).min(self.cores)])
            .collect()
    }
}

/// One prediction beside its measurement.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Calibrated {
    /// What was timed.
    pub label: String,
    /// Predicted seconds.
    pub predicted: f64,
    /// Measured seconds.
    pub measured: f64,
}

impl Calibrated {
    /// `(predicted - measured) / measured`.
    pub fn error(&self) -> f64 {
        (self.predicted - self.measured) / self.measured
    }
}

/// The parts of `target/bench/pipe.json` the calibration reads.
#[derive(Debug, Deserialize)]
pub struct PipeReport {
    /// The backend it ran on.
    pub backend: String,
    /// Whether it was the quick run (which model).
    pub quick: bool,
    /// The model, in words.
    pub model: String,
    /// Samples per step.
    pub batch: usize,
    /// One row per (K, M, schedule).
    pub rows: Vec<PipeRow>,
}

/// One measured configuration of `bench pipe`.
#[derive(Debug, Deserialize)]
pub struct PipeRow {
    /// K.
    pub stages: usize,
    /// M.
    pub micro_batches: usize,
    /// `GPipe` or `OneFOneB`.
    pub schedule: String,
    /// Units per stage.
    pub balance: Vec<usize>,
    /// Median step, milliseconds.
    pub step_ms: f64,
    /// Median of the same micro-batches run one after another on one thread
    /// through the plain model, interleaved with the pipeline's steps.
    pub sequential_ms: f64,
}

/// Reads a `bench pipe` report.
pub fn read_pipe_report(path: &Path) -> Result<PipeReport, PlanCliError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| PlanCliError::Input(format!("cannot read {}: {e}", path.display())))?;
    serde_json::from_str(&text).map_err(|e| {
        PlanCliError::Input(format!(
            "{} is not a bench pipe report: {e}",
            path.display()
        ))
    })
}

fn schedule_named(name: &str) -> Result<Schedule, PlanCliError> {
    match name {
        "GPipe" => Ok(Schedule::GPipe),
        "OneFOneB" => Ok(Schedule::OneFOneB),
        other => Err(PlanCliError::Input(format!(
            "unknown schedule {other:?} in the report (expected GPipe or OneFOneB)"
        ))),
    }
}

/// The simulated step of every row of `report`: its stages threads on the
/// CPU `cpu`, unit costs from `costs`, `overhead` seconds per pass.
pub fn predict_pipe(
    report: &PipeReport,
    costs: &ModelCosts,
    step: &StepCosts,
    cpu: &CpuModel,
    overhead: f64,
) -> Result<Vec<Calibrated>, PlanCliError> {
    simulate_pipe(report, costs, step, cpu, overhead, false)
}

/// As [`predict_pipe`], but relative to the sequential run the benchmark
/// interleaved with each row: predicted step = measured sequential time x
/// simulated step / simulated sequential time. The machine's load, which
/// drifts between runs on a shared machine, cancels; what is left is what
/// the simulator adds (schedule, bubble, shared device, pass overhead).
pub fn predict_pipe_relative(
    report: &PipeReport,
    costs: &ModelCosts,
    step: &StepCosts,
    cpu: &CpuModel,
    overhead: f64,
) -> Result<Vec<Calibrated>, PlanCliError> {
    simulate_pipe(report, costs, step, cpu, overhead, true)
}

fn simulate_pipe(
    report: &PipeReport,
    costs: &ModelCosts,
    step: &StepCosts,
    cpu: &CpuModel,
    overhead: f64,
    relative: bool,
) -> Result<Vec<Calibrated>, PlanCliError> {
    let mut out = Vec::new();
    for row in &report.rows {
        check_balance(&row.balance, costs)?;
        let mb = report.batch as f64 / row.micro_batches as f64;
        let mut start = 0;
        // A single stage runs on the calling thread, more on spawned ones.
        let factor = if row.stages > 1 {
            parallelism_at(&cpu.thread_factor, mb)
        } else {
            1.0
        };
        let stages = row
            .balance
            .iter()
            .map(|&n| {
                let units = &costs.units[start..start + n];
                start += n;
                StageWork {
                    forward: factor * units.iter().map(|u| u.forward_time(mb)).sum::<f64>(),
                    backward: factor
                        * units
                            .iter()
                            .map(|u| {
                                u.backward_time(mb)
                                    + u.param_tensors.len() as f64 * step.accumulate_per_tensor
                            })
                            .sum::<f64>(),
                    device: 0,
                }
            })
            .collect();
        let mut sim = PipelineSim::new(schedule_named(&row.schedule)?, row.micro_batches, stages);
        sim.device_capacity = vec![cpu.cores];
        sim.parallelism = vec![cpu.parallelism(mb); row.stages];
        sim.pass_overhead = overhead;
        let trace = sim.run()?;
        let sequential: f64 = costs
            .units
            .iter()
            .map(|u| {
                u.forward_time(mb)
                    + u.backward_time(mb)
                    + u.param_tensors.len() as f64 * step.accumulate_per_tensor
            })
            .sum::<f64>()
            * row.micro_batches as f64;
        let predicted = if relative {
            row.sequential_ms / 1e3 * trace.makespan / sequential
        } else {
            trace.makespan
        };
        out.push(Calibrated {
            label: format!(
                "K={} M={:<2} {}",
                row.stages, row.micro_batches, row.schedule
            ),
            predicted,
            measured: row.step_ms / 1e3,
        });
    }
    Ok(out)
}

fn check_balance(balance: &[usize], costs: &ModelCosts) -> Result<(), PlanCliError> {
    if balance.iter().sum::<usize>() != costs.units.len() {
        return Err(PlanCliError::Input(format!(
            "the report's balance {balance:?} does not cover the {} units of the profiled model",
            costs.units.len()
        )));
    }
    Ok(())
}

/// What the main job (`--bin train`) printed: its run and each epoch.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainLog {
    /// `Vit` or `Bert`.
    pub model: String,
    /// Units of the model.
    pub units: usize,
    /// Epochs, steps per epoch, samples per step.
    pub epochs: usize,
    /// Steps per epoch.
    pub steps: usize,
    /// Samples per step.
    pub batch: usize,
    /// Pipeline stages at the start.
    pub stages: usize,
    /// AutoFreeze's alpha.
    pub alpha: f64,
    /// Per epoch: frozen units, K, balance, M, seconds.
    pub epoch_rows: Vec<TrainEpoch>,
    /// Width of the blocks, when the log says (`None`: the tiny preset's).
    pub hidden: Option<usize>,
    /// Whether an epoch's time includes the held-out evaluation.
    pub timed_eval: bool,
}

/// One epoch line of the main job.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainEpoch {
    /// Frozen units.
    pub frozen_units: usize,
    /// K.
    pub stages: usize,
    /// Units per stage.
    pub balance: Vec<usize>,
    /// M.
    pub micro_batches: usize,
    /// Seconds.
    pub seconds: f64,
}

fn number_after<T: std::str::FromStr>(line: &str, key: &str) -> Option<T> {
    let rest = &line[line.find(key)? + key.len()..];
    let end = rest
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(rest.len());
    rest[..end].parse().ok()
}

/// Parses the main job's output (its header and `epoch N: ...` lines).
///
/// ```
/// let log = "training tiny Vit (36516 parameters, 11 units) on flex (CPU): 2 epochs x 40 steps x 32 samples, as a pipeline of 4 stages, freezing with alpha 0.33\n\
///            epoch 0: mean loss 1.39, held-out accuracy 46.9%, frozen units 0/11, K=4 [3, 2, 2, 4], M=16, bubble 0.64, 0.93s\n";
/// let parsed = examples::plan::calibrate::parse_train_log(log).unwrap();
/// assert_eq!((parsed.units, parsed.steps, parsed.stages), (11, 40, 4));
/// assert_eq!(parsed.epoch_rows[0].balance, vec![3, 2, 2, 4]);
/// assert_eq!(parsed.epoch_rows[0].seconds, 0.93);
/// ```
pub fn parse_train_log(text: &str) -> Result<TrainLog, PlanCliError> {
    let bad = |what: &str| PlanCliError::Input(format!("the train log has no {what}"));
    let header = text
        .lines()
        .find(|l| l.starts_with("training "))
        .ok_or_else(|| bad("header line (\"training ...\")"))?;
    let model = if header.contains("Bert") {
        "Bert"
    } else {
        "Vit"
    }
    .to_string();
    let units = number_after(header, "parameters, ").ok_or_else(|| bad("unit count"))?;
    let epochs = number_after(header, ": ").ok_or_else(|| bad("epoch count"))?;
    let steps = number_after(header, "epochs x ").ok_or_else(|| bad("step count"))?;
    let batch = number_after(header, "steps x ").ok_or_else(|| bad("batch size"))?;
    let stages = number_after(header, "pipeline of ").unwrap_or(1);
    let alpha = number_after(header, "alpha ").ok_or_else(|| bad("freeze alpha"))?;
    let mut epoch_rows = Vec::new();
    for line in text.lines().filter(|l| l.starts_with("epoch ")) {
        let balance_text = line
            .find('[')
            .and_then(|a| line[a + 1..].find(']').map(|b| &line[a + 1..a + 1 + b]))
            .ok_or_else(|| bad("balance in an epoch line"))?;
        let balance = balance_text
            .split(',')
            .map(|x| x.trim().parse::<usize>())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|_| bad("readable balance"))?;
        let seconds = line
            .rsplit(", ")
            .next()
            .and_then(|t| t.trim().strip_suffix('s'))
            .and_then(|t| t.parse().ok())
            .ok_or_else(|| bad("epoch time"))?;
        epoch_rows.push(TrainEpoch {
            frozen_units: number_after(line, "frozen units ").ok_or_else(|| bad("front"))?,
            stages: number_after(line, "K=").ok_or_else(|| bad("K"))?,
            balance,
            micro_batches: number_after(line, "M=").ok_or_else(|| bad("M"))?,
            seconds,
        });
    }
    if epoch_rows.is_empty() {
        return Err(bad("epoch line"));
    }
    Ok(TrainLog {
        model,
        units,
        epochs,
        steps,
        batch,
        stages,
        alpha,
        epoch_rows,
        hidden: None,
        timed_eval: true,
    })
}

/// Reads the main job's `metrics.json` (`train --output-dir DIR`): its
/// PipeTransformer run, which must have run without replicas and cache
/// (`--no-dp --no-cache`, what the planner's CPU calibration models: the
/// stages threads of one shared device). Epoch times exclude evaluation.
pub fn parse_train_metrics(text: &str) -> Result<TrainLog, PlanCliError> {
    let bad = |what: &str| PlanCliError::Input(format!("the train metrics have no {what}"));
    let json: serde_json::Value = serde_json::from_str(text)
        .map_err(|e| PlanCliError::Input(format!("the train metrics are not JSON: {e}")))?;
    let number = |v: &serde_json::Value, key: &str| v.get(key).and_then(serde_json::Value::as_f64);
    let spec = json.get("spec").ok_or_else(|| bad("spec"))?;
    let parts = json.get("parts").ok_or_else(|| bad("parts"))?;
    if parts.get("dp").and_then(|v| v.as_bool()) != Some(false)
        || parts.get("cache").and_then(|v| v.as_bool()) != Some(false)
    {
        return Err(PlanCliError::Input(
            "calibrate with a run of `train --no-dp --no-cache` (the planner's CPU model has no replicas and no cache)".into(),
        ));
    }
    let run = json
        .get("runs")
        .and_then(|r| r.as_array())
        .and_then(|runs| {
            runs.iter()
                .find(|r| r.get("name").and_then(|n| n.as_str()) == Some("PipeTransformer"))
        })
        .ok_or_else(|| bad("PipeTransformer run"))?;
    let model = match spec.get("model").and_then(|m| m.as_str()) {
        Some("Bert") => "Bert",
        _ => "Vit",
    }
    .to_string();
    let samples = number(spec, "samples").ok_or_else(|| bad("samples"))? as usize;
    let batch = number(spec, "batch").ok_or_else(|| bad("batch"))? as usize;
    let mut epoch_rows = Vec::new();
    for epoch in run
        .get("epochs")
        .and_then(|e| e.as_array())
        .ok_or_else(|| bad("epochs"))?
    {
        let balance = epoch
            .get("balance")
            .and_then(|b| b.as_array())
            .ok_or_else(|| bad("balance"))?
            .iter()
            .map(|v| v.as_u64().map(|n| n as usize))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| bad("readable balance"))?;
        epoch_rows.push(TrainEpoch {
            frozen_units: number(epoch, "front").ok_or_else(|| bad("front"))? as usize,
            stages: number(epoch, "stages").ok_or_else(|| bad("stages"))? as usize,
            balance,
            micro_batches: number(epoch, "micro_batches").ok_or_else(|| bad("M"))? as usize,
            seconds: number(epoch, "seconds").ok_or_else(|| bad("epoch time"))?,
        });
    }
    if epoch_rows.is_empty() {
        return Err(bad("epoch"));
    }
    // The metrics give each epoch's shape at its end (after the epoch's
    // transition); an epoch trains at the shape the one before ended with.
    // Epoch 0 starts with nothing frozen on the starting stages (its
    // balance, from parameter counts, is not recorded: not compared).
    let stages = number(&json, "stages").ok_or_else(|| bad("stages"))? as usize;
    let mut during: Vec<TrainEpoch> = Vec::with_capacity(epoch_rows.len());
    during.push(TrainEpoch {
        frozen_units: 0,
        stages,
        balance: Vec::new(),
        micro_batches: burn_pipe::default_micro_batches(stages),
        seconds: epoch_rows[0].seconds,
    });
    for pair in epoch_rows.windows(2) {
        during.push(TrainEpoch {
            seconds: pair[1].seconds,
            ..pair[0].clone()
        });
    }
    let epoch_rows = during;
    Ok(TrainLog {
        model,
        units: number(&json, "units").ok_or_else(|| bad("unit count"))? as usize,
        epochs: epoch_rows.len(),
        steps: samples.div_ceil(batch),
        batch,
        stages,
        alpha: number(&json, "freeze_alpha").ok_or_else(|| bad("freeze alpha"))?,
        epoch_rows,
        hidden: number(spec, "hidden").map(|h| h as usize),
        timed_eval: false,
    })
}

/// Held-out samples the main job evaluates at the end of every epoch.
pub const TRAIN_HELD_OUT: usize = 256;

/// The planner's epochs for the main job of `log` (its stages threads on
/// the CPU `cpu`, no replicas, parameter-balanced, nothing cached), each
/// with the held-out forward pass when the job timed it too; and
/// whether the planned F, K and balance match the log's, epoch by epoch;
/// `overhead` seconds per pass; `step` the job's optimizer and data costs.
pub fn predict_train(
    log: &TrainLog,
    costs: &ModelCosts,
    step: &StepCosts,
    cpu: &CpuModel,
    overhead: f64,
) -> Result<(Vec<Calibrated>, Vec<bool>), PlanCliError> {
    // Stage threads hand activations over through memory: no link cost.
    let link = Link::new(1e15, 0.0);
    let cluster = ClusterConfig::new(log.stages, 1, link, link)
        .with_shared_device_capacity(Some(cpu.cores))
        .with_shared_device_parallelism(cpu.points())
        .with_shared_device_thread_factor(cpu.thread_factor.clone());
    let config = PlanConfig::new(
        cluster,
        BatchPolicy::FixedGlobal { batch: log.batch },
        log.steps * log.batch,
        log.epochs,
        log.alpha,
    )
    .with_auto_dp(false)
    .with_pass_overhead(overhead)
    .with_optimizer_per_tensor(step.optimizer_per_tensor)
    .with_backward_per_tensor(step.accumulate_per_tensor)
    .with_step_overhead(step.data);
    let planned = plan(&config, costs)?;
    let eval: f64 = if log.timed_eval {
        costs
            .units
            .iter()
            .map(|u| u.forward_time(TRAIN_HELD_OUT as f64))
            .sum()
    } else {
        0.0
    };
    let mut out = Vec::new();
    let mut matches = Vec::new();
    for (e, measured) in log.epoch_rows.iter().enumerate() {
        let Some(p) = planned.epochs.get(e) else {
            break;
        };
        matches.push(
            p.frozen_units == measured.frozen_units
                && p.stages == measured.stages
                && (measured.balance.is_empty() || p.balance == measured.balance)
                && p.micro_batches == measured.micro_batches,
        );
        out.push(Calibrated {
            label: format!(
                "epoch {e} F={} K={} {:?}",
                p.frozen_units, p.stages, p.balance
            ),
            predicted: p.time.total() + eval,
            measured: measured.seconds,
        });
    }
    Ok((out, matches))
}

/// The overhead in `0..=max` (steps of `max / 500`) whose predictions
/// from `predict` have the least mean squared log error.
///
/// ```
/// use examples::plan::calibrate::{Calibrated, fit_overhead};
///
/// // Measured = 1 + 10 * overhead: the fit finds 0.02.
/// let fit = fit_overhead(0.1, |o| Ok(vec![Calibrated { label: "x".into(), predicted: 1.0 + 10.0 * o, measured: 1.2 }])).unwrap();
/// assert!((fit - 0.02).abs() < 1e-9);
/// ```
pub fn fit_overhead(
    max: f64,
    predict: impl Fn(f64) -> Result<Vec<Calibrated>, PlanCliError>,
) -> Result<f64, PlanCliError> {
    let mut best = (f64::INFINITY, 0.0);
    for step in 0..=500 {
        let overhead = max * step as f64 / 500.0;
        let rows = predict(overhead)?;
        let loss = rows
            .iter()
            .map(|r| (r.predicted / r.measured).ln().powi(2))
            .sum::<f64>();
        if loss < best.0 {
            best = (loss, overhead);
        }
    }
    Ok(best.1)
}
