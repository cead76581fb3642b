//! What the workspace's integration tests share (the `testing` cargo feature):
//! the test backend, a residual unit, seeded numbers, weight comparisons,
//! plain Burn training with a freeze front applied by hand ([`PlainFronts`])
//! and an optimizer that panics on purpose ([`PanickingOptimizer`]).

use burn::module::{Module, ModuleVisitor, Param};
use burn::nn::{Linear, LinearConfig};
use burn::prelude::*;

mod panicking;
mod plain;
pub use panicking::{PanickingOptimizer, Tripwire};
pub use plain::{PlainFronts, StackParts};

/// Declares the tests' backend in the calling module: `Inner` (Flex, or
/// LibTorch on the CPU with the caller's `test-tch` feature), `B`
/// (`Autodiff<Inner>`) and `BACKEND_NAME` (what `B::name` reports).
#[macro_export]
macro_rules! test_backend {
    () => {
        /// The backend the tests run on: Flex, or LibTorch on the CPU (its default
        /// device) with the `test-tch` feature (`.ci/tch`).
        #[cfg(not(feature = "test-tch"))]
        pub type Inner = ::burn::backend::Flex;
        #[cfg(feature = "test-tch")]
        pub type Inner = ::burn::backend::LibTorch;
        pub type B = ::burn::backend::Autodiff<Inner>;
        /// What `B::name` reports for the backend above on its default device.
        pub const BACKEND_NAME: &str = if cfg!(feature = "test-tch") {
            "autodiff<libtorch<cpu>>"
        } else {
            "autodiff<flex>"
        };
    };
}

/// A residual unit `x + tanh(linear(x))` on `[batch, width]`.
#[derive(Module, Debug)]
pub struct Residual<B: Backend> {
    /// The square linear layer inside the residual branch.
    pub linear: Linear<B>,
}

impl<B: Backend> Residual<B> {
    /// `x + tanh(linear(x))`.
    pub fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        x.clone() + self.linear.forward(x).tanh()
    }
}

crate::unit!(Residual<B>: Tensor<B, 2> => Tensor<B, 2>);

/// One xorshift step of `state`, as a number in [0, 1).
pub fn xorshift(state: &mut u64) -> f32 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    (*state >> 40) as f32 / (1u64 << 24) as f32
}

/// `n` numbers in [-1, 1) from `seed`, without the backend's random state
/// (tests running in parallel share it).
pub fn numbers(seed: u64, n: usize) -> Vec<f32> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n).map(|_| 2.0 * xorshift(&mut state) - 1.0).collect()
}

/// A `Linear` of `i` inputs and `o` outputs whose weights and then bias are
/// [`numbers`] of `seed` scaled to +-1/sqrt(i) (Burn's default range).
pub fn seeded_linear<B: Backend>(seed: u64, i: usize, o: usize, device: &B::Device) -> Linear<B> {
    let bound = 1.0 / (i as f32).sqrt();
    let mut values = numbers(seed, i * o + o).into_iter().map(|v| v * bound);
    let weight: Vec<f32> = values.by_ref().take(i * o).collect();
    let bias: Vec<f32> = values.collect();
    let mut linear = LinearConfig::new(i, o).init::<B>(device);
    linear.weight = Param::from_tensor(Tensor::from_data(TensorData::new(weight, [i, o]), device));
    linear.bias = Some(Param::from_tensor(Tensor::from_data(
        TensorData::new(bias, [o]),
        device,
    )));
    linear
}

struct Collect(Vec<TensorData>);

impl<Be: Backend> ModuleVisitor<Be> for Collect {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<Be, D>>) {
        self.0.push(param.val().to_data());
    }
}

/// Every float parameter's values, in visiting order (reading them
/// initialises lazily initialised parameters).
pub fn weights<Be: Backend, Mo: Module<Be>>(module: &Mo) -> Vec<TensorData> {
    let mut collect = Collect(Vec::new());
    module.visit(&mut collect);
    collect.0
}

/// Whether two sets of weights are bit for bit the same.
pub fn bit_identical(a: &[TensorData], b: &[TensorData]) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| x.as_bytes() == y.as_bytes() && x.shape == y.shape)
}
