//! `bench pipe`'s report (`target/bench/pipe.json`) and the simulator's
//! step for each of its rows.

use std::path::Path;

use burn_elastic_dp::plan::{ModelSpec, PipelineSim, StageWork, parallelism_at};
use burn_pipe::Schedule;
use serde::Deserialize;

use super::{Calibrated, CpuModel};
use crate::plan::PlanCliError;
use crate::plan::profile::StepCosts;

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

/// What a predicted `bench pipe` step is measured against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PipeBaseline {
    /// The simulated step as it is.
    Absolute,
    /// Relative to the sequential run the benchmark interleaved with each
    /// row: predicted step = measured sequential time x simulated step /
    /// simulated sequential time. The machine's load, which drifts between
    /// runs on a shared machine, cancels; what is left is what the
    /// simulator adds (schedule, bubble, shared device, pass overhead).
    Relative,
}

/// The simulated step of every row of `report`: its stages threads on the
/// CPU `cpu`, unit costs from `costs`, `overhead` seconds per pass, as
/// `baseline` says.
pub fn predict_pipe(
    report: &PipeReport,
    costs: &ModelSpec,
    step: &StepCosts,
    cpu: &CpuModel,
    overhead: f64,
    baseline: PipeBaseline,
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
        let predicted = if baseline == PipeBaseline::Relative {
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

fn check_balance(balance: &[usize], costs: &ModelSpec) -> Result<(), PlanCliError> {
    if balance.iter().sum::<usize>() != costs.units.len() {
        return Err(PlanCliError::Input(format!(
            "the report's balance {balance:?} does not cover the {} units of the profiled model",
            costs.units.len()
        )));
    }
    Ok(())
}
