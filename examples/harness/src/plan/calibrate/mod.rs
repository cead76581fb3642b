//! Calibration: the simulator's predictions beside this machine's
//! measurements of `bench pipe`'s steps and the main job's epochs.

use burn_elastic_dp::plan::parallelism_at;

use super::PlanCliError;

mod pipe;
mod run;
mod train;

pub use pipe::{PipeBaseline, PipeReport, PipeRow, predict_pipe, read_pipe_report};
pub use run::{CalibrationFile, CalibrationOptions, Fitted, RunCalibration, run_calibration};
pub use train::{
    TRAIN_HELD_OUT, TrainEpoch, TrainLog, parse_train_log, parse_train_metrics, predict_train,
};

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
    /// use pipetransformer_harness::plan::calibrate::CpuModel;
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

/// The overhead in `0..=max` (steps of `max / 500`) whose predictions
/// from `predict` have the least mean squared log error.
///
/// ```
/// use pipetransformer_harness::plan::calibrate::{Calibrated, fit_overhead};
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
