//! Helpers shared by the model tests.
#![allow(dead_code)]

use burn::prelude::*;

burn_freeze::test_backend!();

/// Largest absolute difference between two tensors, relative to the largest
/// magnitude in `expected` (at least 1).
pub fn relative_max_diff<Be: Backend, const D: usize>(
    actual: Tensor<Be, D>,
    expected: Tensor<Be, D>,
) -> f32 {
    assert_eq!(actual.dims(), expected.dims(), "shapes differ");
    let scale = expected
        .clone()
        .abs()
        .max()
        .into_scalar()
        .elem::<f32>()
        .max(1.0);
    let diff = (actual - expected).abs().max().into_scalar().elem::<f32>();
    diff / scale
}

/// Runs `f` with Burn's random generator seeded with `seed`, holding a lock
/// that every other `seeded` call of this test binary waits for: the
/// generator is global to the process and the test harness runs tests on
/// several threads, so without the lock another test's draws (weights,
/// dropout masks) would interleave and the run would depend on timing.
pub fn seeded<T>(seed: u64, f: impl FnOnce() -> T) -> T {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _guard = LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    B::seed(&Default::default(), seed);
    f()
}
