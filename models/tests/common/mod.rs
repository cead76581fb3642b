//! Helpers shared by the model tests.
#![allow(dead_code)]

use burn::backend::{Autodiff, Flex};
use burn::prelude::*;

pub type B = Autodiff<Flex>;

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
