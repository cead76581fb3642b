//! `bench pipe`: pipeline schedules against sequential training (issue: burn-pipe).

use super::BenchError;

/// Runs the pipeline benchmark.
pub fn run(_quick: bool) -> Result<(), BenchError> {
    Err(BenchError::Run("the pipe benchmark is not written yet".into()))
}
