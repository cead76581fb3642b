//! `bench freeze`: frozen prefixes and AutoCache against the unfrozen step (issue: burn-freeze).

use super::BenchError;

/// Runs the freeze benchmark.
pub fn run(_quick: bool) -> Result<(), BenchError> {
    Err(BenchError::Run("the freeze benchmark is not written yet".into()))
}
