//! The main job's output (its `metrics.json`, or the log of the loop
//! before it) and the planner's epochs for it.

use burn_elastic_dp::plan::{ClusterConfig, Link, ModelSpec, PlanConfig, plan};
use burn_elastic_dp::{BatchPolicy, FreezeRule, Parts};

use super::{Calibrated, CpuModel};
use crate::plan::PlanCliError;
use crate::plan::presets::{Preset, Shape};
use crate::plan::profile::StepCosts;

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

impl TrainLog {
    /// The model the job trained, for profiling: the tiny preset of its
    /// kind with its depth (from the unit count) and width.
    pub fn shape(&self) -> Shape {
        let (preset, layers) = if self.model == "Bert" {
            (Preset::BertTiny, self.units.saturating_sub(2) / 2)
        } else {
            (Preset::VitTiny, self.units.saturating_sub(3) / 2)
        };
        match (preset.shape(Some(layers)), self.hidden) {
            (Shape::Vit(c), Some(h)) => Shape::Vit(c.with_hidden(h).with_mlp_dim(2 * h)),
            (Shape::Bert(c, s), Some(h)) => {
                Shape::Bert(c.with_hidden(h).with_intermediate(2 * h), s)
            }
            (shape, None) => shape,
        }
    }
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
/// let parsed = pipetransformer_harness::plan::calibrate::parse_train_log(log).unwrap();
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
        epoch_rows.push(metrics_epoch(epoch)?);
    }
    if epoch_rows.is_empty() {
        return Err(bad("epoch"));
    }
    // The metrics give each epoch's stages, balance and M as the epoch ran
    // with them, and its front at its end (after the epoch's transition):
    // an epoch trains with the units frozen that the one before ended with,
    // epoch 0 with none.
    let stages = number(&json, "stages").ok_or_else(|| bad("stages"))? as usize;
    let fronts_during = std::iter::once(0).chain(epoch_rows.iter().map(|e| e.frozen_units));
    let epoch_rows: Vec<TrainEpoch> = epoch_rows
        .iter()
        .zip(fronts_during)
        .map(|(epoch, frozen_units)| TrainEpoch {
            frozen_units,
            ..epoch.clone()
        })
        .collect();
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

/// One epoch of the metrics' PipeTransformer run (its front as at its end).
fn metrics_epoch(epoch: &serde_json::Value) -> Result<TrainEpoch, PlanCliError> {
    let bad = |what: &str| PlanCliError::Input(format!("the train metrics have no {what}"));
    let number = |v: &serde_json::Value, key: &str| v.get(key).and_then(serde_json::Value::as_f64);
    let balance = epoch
        .get("balance")
        .and_then(|b| b.as_array())
        .ok_or_else(|| bad("balance"))?
        .iter()
        .map(|v| v.as_u64().map(|n| n as usize))
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| bad("readable balance"))?;
    Ok(TrainEpoch {
        frozen_units: number(epoch, "front").ok_or_else(|| bad("front"))? as usize,
        stages: number(epoch, "stages").ok_or_else(|| bad("stages"))? as usize,
        balance,
        micro_batches: number(epoch, "micro_batches").ok_or_else(|| bad("M"))? as usize,
        seconds: number(epoch, "seconds").ok_or_else(|| bad("epoch time"))?,
    })
}

/// Held-out samples the main job evaluates at the end of every epoch.
pub const TRAIN_HELD_OUT: usize = 256;

/// The planner's epochs for the main job of `log` (its stages threads on
/// the CPU `cpu`, no replicas, parameter-balanced, nothing cached), each
/// with the held-out forward pass when the job timed it too; `overhead`
/// seconds per pass; `step` the job's optimizer and data costs. (That the
/// planner's F, K, R, M and balance are the trainer's is a test:
/// burn-elastic-dp's `plan_matches_trainer`.)
pub fn predict_train(
    log: &TrainLog,
    costs: &ModelSpec,
    step: &StepCosts,
    cpu: &CpuModel,
    overhead: f64,
) -> Result<Vec<Calibrated>, PlanCliError> {
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
        FreezeRule::AlphaSchedule { alpha: log.alpha },
    )
    .with_parts(Parts::new().with_dp(false).with_cache(false))
    .with_stages(Some(log.stages))
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
    Ok(log
        .epoch_rows
        .iter()
        .zip(&planned.epochs)
        .enumerate()
        .map(|(e, (measured, p))| Calibrated {
            label: format!("epoch {e} F={} K={} {:?}", p.front, p.stages, p.balance),
            predicted: p.time.total() + eval,
            measured: measured.seconds,
        })
        .collect())
}
