//! Helpers shared by burn-pipe's integration tests: a small layer stack a user
//! might write, and comparisons of gradients and weights by parameter id.
#![allow(dead_code)]

use burn::module::{ModuleVisitor, Param, ParamId};
use burn::nn::Linear;
use burn::optim::GradientsParams;
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;
use burn_freeze::{LayerStack, StackMarker};

burn_freeze::test_backend!();

/// Largest absolute difference relative to the largest magnitude of `expected`.
pub fn relative_diff<const D: usize>(actual: Tensor<Inner, D>, expected: Tensor<Inner, D>) -> f32 {
    assert_eq!(actual.dims(), expected.dims());
    let scale = expected
        .clone()
        .abs()
        .max()
        .into_scalar()
        .max(f32::MIN_POSITIVE);
    (actual - expected).abs().max().into_scalar() / scale
}

/// Visits a module's float parameters and compares, for each, the gradient in
/// `actual` with the one in `expected` (by parameter id): the largest absolute
/// difference relative to the largest magnitude of the expected gradient.
///
/// A few gradients are zero in exact arithmetic (attention's key bias: softmax
/// ignores a shift shared by all keys) and hold only rounding noise near 1e-9,
/// where a relative comparison means nothing. An expected gradient whose
/// largest magnitude is below `zero_below` counts as zero, and then the actual
/// one must be below `zero_below` too.
pub struct CompareGrads<'a> {
    pub actual: &'a GradientsParams,
    pub expected: &'a GradientsParams,
    pub zero_below: f32,
    pub worst: f32,
    pub compared: usize,
    pub missing: Vec<ParamId>,
    pub not_zero: Vec<ParamId>,
}

impl<'a> CompareGrads<'a> {
    pub fn new(
        actual: &'a GradientsParams,
        expected: &'a GradientsParams,
        zero_below: f32,
    ) -> Self {
        Self {
            actual,
            expected,
            zero_below,
            worst: 0.0,
            compared: 0,
            missing: Vec::new(),
            not_zero: Vec::new(),
        }
    }
}

impl<Be: AutodiffBackend<InnerBackend = Inner>> ModuleVisitor<Be> for CompareGrads<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<Be, D>>) {
        match (
            self.actual.get::<Inner, D>(param.id),
            self.expected.get::<Inner, D>(param.id),
        ) {
            (Some(actual), Some(expected)) => {
                self.compared += 1;
                if expected.clone().abs().max().into_scalar() < self.zero_below {
                    if actual.abs().max().into_scalar() >= self.zero_below {
                        self.not_zero.push(param.id);
                    }
                } else {
                    self.worst = self.worst.max(relative_diff(actual, expected));
                }
            }
            _ => self.missing.push(param.id),
        }
    }
}

/// The largest gradient magnitude of a module's parameters in `grads`.
pub struct MaxGrad<'a> {
    pub grads: &'a GradientsParams,
    pub max: f32,
}

impl<Be: AutodiffBackend<InnerBackend = Inner>> ModuleVisitor<Be> for MaxGrad<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<Be, D>>) {
        if let Some(grad) = self.grads.get::<Inner, D>(param.id) {
            self.max = self.max.max(grad.abs().max().into_scalar());
        }
    }
}

/// Initialises every lazily initialised parameter of `module` in place, so
/// its clones share one set of values (an uninitialised parameter draws its
/// values when first read, separately in each clone).
pub fn materialize<Be: Backend, Mo: Module<Be>>(module: Mo) -> Mo {
    Weights::of(&module);
    module
}

/// Collects every float parameter's value, keyed by id.
#[derive(Default)]
pub struct Weights(pub Vec<(ParamId, Vec<f32>, Vec<usize>)>);

impl<Be: Backend> ModuleVisitor<Be> for Weights {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<Be, D>>) {
        let value = param.val();
        let dims = value.dims().to_vec();
        self.0.push((
            param.id,
            value.into_data().convert::<f32>().to_vec().unwrap(),
            dims,
        ));
    }
}

impl Weights {
    pub fn of<Be: Backend, Mo: Module<Be>>(module: &Mo) -> Self {
        let mut weights = Weights::default();
        module.visit(&mut weights);
        weights
    }

    /// Largest relative difference against `other`, matching parameters by id.
    pub fn relative_diff(&self, other: &Weights) -> f32 {
        assert_eq!(self.0.len(), other.0.len(), "different parameter sets");
        let mut worst = 0.0f32;
        for (id, values, dims) in &self.0 {
            let (_, theirs, their_dims) = other
                .0
                .iter()
                .find(|(other_id, _, _)| other_id == id)
                .unwrap_or_else(|| panic!("parameter {id} missing"));
            assert_eq!(dims, their_dims);
            let scale = theirs
                .iter()
                .fold(0.0f32, |m, v| m.max(v.abs()))
                .max(f32::MIN_POSITIVE);
            let diff = values
                .iter()
                .zip(theirs)
                .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
            worst = worst.max(diff / scale);
        }
        worst
    }
}

// ---------------------------------------------------------------------------
// A layer stack defined here, as a user would: an input projection, residual
// tanh blocks (and parameter-free activations), and a classifier.

/// Input projection `[batch, inputs] -> [batch, width]`.
#[derive(Module, Debug)]
pub struct Project<B: Backend> {
    pub linear: Linear<B>,
}

/// A middle unit: a residual block, or a parameter-free `tanh`.
#[derive(Module, Debug)]
pub enum Block<B: Backend> {
    Residual(Linear<B>),
    Tanh(burn::nn::Tanh),
}

/// Classifier `[batch, width] -> [batch, classes]`.
#[derive(Module, Debug)]
pub struct Classify<B: Backend> {
    pub linear: Linear<B>,
}

impl<B: Backend> Block<B> {
    pub fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        match self {
            Block::Residual(linear) => x.clone() + linear.forward(x).tanh(),
            Block::Tanh(tanh) => tanh.forward(x),
        }
    }
}

impl<B: Backend> Project<B> {
    pub fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        self.linear.forward(x)
    }
}

impl<B: Backend> Classify<B> {
    pub fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        self.linear.forward(x)
    }
}

// The units: one line each, the forward written once above.
burn_freeze::unit!(Project<B>: Tensor<B, 2> => Tensor<B, 2>);
burn_freeze::unit!(Block<B>: Tensor<B, 2> => Tensor<B, 2>);
burn_freeze::unit!(Classify<B>: Tensor<B, 2> => Tensor<B, 2>);

pub type UserTypes = StackMarker<B, Project<B>, Block<B>, Classify<B>>;
pub type UserStack = LayerStack<UserTypes>;

/// `Project(inputs -> width)`, `blocks` residual blocks with a `tanh` after
/// the first, and `Classify(width -> classes)`.
pub fn user_stack(inputs: usize, width: usize, blocks: usize, classes: usize) -> UserStack {
    // Weights from a seeded generator, not the backend's global one, which
    // tests running at once in this process would draw from in turn.
    let mut seed = (inputs * 1_000_003 + width * 10_007 + blocks * 101 + classes) as u64;
    let mut linear = |i: usize, o: usize| {
        seed += 1;
        seeded_linear(seed, i, o)
    };
    let mut middle = Vec::new();
    for i in 0..blocks {
        middle.push(Block::Residual(linear(width, width)));
        if i == 0 {
            middle.push(Block::Tanh(burn::nn::Tanh::new()));
        }
    }
    LayerStack::new(
        Project {
            linear: linear(inputs, width),
        },
        middle,
        Classify {
            linear: linear(width, classes),
        },
    )
}

/// A `Linear` of `i` inputs and `o` outputs whose weights and bias are
/// uniform in +-1/sqrt(i) (Burn's default range), drawn from `seed`.
pub fn seeded_linear(seed: u64, i: usize, o: usize) -> Linear<B> {
    burn_freeze::testing::seeded_linear(seed, i, o, &Default::default())
}

/// A batch for the user stack: inputs `[batch, inputs]` and labels `[batch]`.
pub fn user_batch(
    seed: u64,
    batch: usize,
    inputs: usize,
    classes: usize,
) -> (Tensor<B, 2>, Tensor<B, 1, Int>) {
    let device = Default::default();
    let mut state = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut next = || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (state >> 40) as f32 / (1u64 << 24) as f32
    };
    let values: Vec<f32> = (0..batch * inputs).map(|_| 2.0 * next() - 1.0).collect();
    let labels: Vec<i64> = (0..batch)
        .map(|_| (next() * classes as f32) as i64 % classes as i64)
        .collect();
    (
        Tensor::<B, 1>::from_data(TensorData::new(values, [batch * inputs]), &device)
            .reshape([batch, inputs]),
        Tensor::from_data(TensorData::new(labels, [batch]), &device),
    )
}
