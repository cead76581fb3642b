//! The pieces of `--bin plan`: presets, profiles, calibration, tables and
//! plots (the planner itself is `burn_elastic_dp::plan`).

pub mod calibrate;
pub mod plot;
pub mod presets;
pub mod profile;
pub mod report;
pub mod sharing;

use burn_elastic_dp::plan::PlanError;

/// Why `plan` stopped.
#[derive(Debug, thiserror::Error)]
pub enum PlanCliError {
    /// A configuration the planner refuses.
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// Flags that do not go together (exit code 2, as for a bad flag).
    #[error("{0}")]
    Flags(String),
    /// An input file that cannot be read or understood, or an output that
    /// cannot be written (exit code 1).
    #[error("{0}")]
    Input(String),
    /// A plot that could not be drawn or written.
    #[error("plot: {0}")]
    Plot(String),
}
