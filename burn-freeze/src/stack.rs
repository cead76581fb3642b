//! The layer-stack contract: a model as an ordered list of partition units.

use std::fmt;

use burn::module::Module;

use crate::error::StackError;
use crate::types::{StackMarker, StackTypes};
use crate::unit::Unit;

/// A model as an ordered list of partition units.
///
/// The first unit maps the model's input (token ids, pixels) to the hidden
/// activation, every middle unit maps hidden to hidden, and the last maps
/// hidden to the model's output (logits). The types, bundled in `S`
/// ([`StackTypes`]), are checked at compile time, so any contiguous range of
/// units can run on its own pipeline stage and exchange hidden activations
/// with its neighbours.
///
/// Units are numbered in order: the first unit is 0, the middle units are
/// `1..=middle.len()`, and the last unit is
/// [`num_units`](LayerStack::num_units)` - 1`.
///
/// ```
/// use burn::backend::{Autodiff, Flex};
/// use burn::nn::{Linear, LinearConfig};
/// use burn::prelude::*;
/// use burn_freeze::LayerStack;
///
/// // One unit type serves for every position here: a linear layer.
/// #[derive(Module, Debug)]
/// pub struct Dense<B: Backend> {
///     linear: Linear<B>,
/// }
///
/// impl<B: Backend> Dense<B> {
///     pub fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
///         self.linear.forward(x).tanh()
///     }
/// }
///
/// // One forward, for training and for frozen execution.
/// burn_freeze::unit!(Dense<B>: Tensor<B, 2> => Tensor<B, 2>);
///
/// type B = Autodiff<Flex>;
/// let device = Default::default();
/// let dense = |i, o| Dense::<B> { linear: LinearConfig::new(i, o).init(&device) };
/// let stack = LayerStack::new(dense(3, 8), vec![dense(8, 8), dense(8, 8)], dense(8, 2));
/// assert_eq!(stack.num_units(), 4);
/// assert_eq!(stack.unit_params(), vec![32, 72, 72, 18]);
/// let y = stack.forward(Tensor::<B, 2>::zeros([5, 3], &device));
/// assert_eq!(y.dims(), [5, 2]);
/// ```
pub struct LayerStack<S: StackTypes> {
    first: S::First,
    middle: Vec<S::Middle>,
    last: S::Last,
}

impl<B, F, M, L> LayerStack<StackMarker<B, F, M, L>>
where
    StackMarker<B, F, M, L>: StackTypes<First = F, Middle = M, Last = L>,
{
    /// Builds a stack from its first unit, its middle units in order, and
    /// its last unit; the unit types make its [`StackTypes`]
    /// ([`StackMarker`]), so the compiler checks that they chain.
    pub fn new(first: F, middle: Vec<M>, last: L) -> Self {
        Self::from_parts(first, middle, last)
    }
}

impl<S: StackTypes> LayerStack<S> {
    /// Builds a stack of any [`StackTypes`] from its units.
    pub fn from_parts(first: S::First, middle: Vec<S::Middle>, last: S::Last) -> Self {
        Self {
            first,
            middle,
            last,
        }
    }

    /// Number of partition units, first and last included.
    pub fn num_units(&self) -> usize {
        self.middle.len() + 2
    }

    /// The first unit (input to hidden).
    pub fn first(&self) -> &S::First {
        &self.first
    }

    /// The middle units (hidden to hidden), in order.
    pub fn middle(&self) -> &[S::Middle] {
        &self.middle
    }

    /// The last unit (hidden to output).
    pub fn last(&self) -> &S::Last {
        &self.last
    }

    /// Takes the stack apart: `(first, middle, last)`.
    pub fn into_parts(self) -> (S::First, Vec<S::Middle>, S::Last) {
        (self.first, self.middle, self.last)
    }

    /// Applies a function to every unit, keeping the order (to move units,
    /// change weights, or convert them to another stack's types).
    pub fn map<S2: StackTypes>(
        self,
        first: impl FnOnce(S::First) -> S2::First,
        middle: impl FnMut(S::Middle) -> S2::Middle,
        last: impl FnOnce(S::Last) -> S2::Last,
    ) -> LayerStack<S2> {
        LayerStack {
            first: first(self.first),
            middle: self.middle.into_iter().map(middle).collect(),
            last: last(self.last),
        }
    }

    /// Runs every unit in order on the autodiff backend.
    pub fn forward(&self, input: S::Input) -> S::Output {
        let hidden = self.first.forward(input);
        let hidden = self
            .middle
            .iter()
            .fold(hidden, |hidden, unit| unit.forward(hidden));
        self.last.forward(hidden)
    }

    /// Parameter count of each unit, in order.
    pub fn unit_params(&self) -> Vec<usize> {
        std::iter::once(self.first.num_params())
            .chain(self.middle.iter().map(|unit| unit.num_params()))
            .chain(std::iter::once(self.last.num_params()))
            .collect()
    }

    /// Moves every unit to `device`.
    pub fn to_device(self, device: &burn::tensor::Device<S::Backend>) -> Self {
        Self {
            first: self.first.to_device(device),
            middle: self
                .middle
                .into_iter()
                .map(|unit| unit.to_device(device))
                .collect(),
            last: self.last.to_device(device),
        }
    }
}

impl<S: StackTypes> LayerStack<S> {
    /// The stack on `device` with every parameter a fresh autodiff leaf
    /// (same values, same parameter ids; storage is shared).
    ///
    /// Start each training run from its own fork when two runs begin with
    /// the same weights: Burn 0.21's autodiff may drop the gradient of a
    /// leaf that an earlier backward pass consumed while another thread runs
    /// a backward pass of its own (tracel-ai/burn#5573); fresh leaves are
    /// not exposed to it.
    pub fn fork(self, device: &burn::tensor::Device<S::Backend>) -> Self {
        Self {
            first: self.first.fork(device),
            middle: self
                .middle
                .into_iter()
                .map(|unit| unit.fork(device))
                .collect(),
            last: self.last.fork(device),
        }
    }
}

/// Reads every float parameter, which initialises the lazy ones.
struct Materialize;

impl<Be: burn::tensor::backend::Backend> burn::module::ModuleVisitor<Be> for Materialize {
    fn visit_float<const D: usize>(
        &mut self,
        param: &burn::module::Param<burn::tensor::Tensor<Be, D>>,
    ) {
        let _ = param.val();
    }
}

impl<S: StackTypes> LayerStack<S> {
    /// Initialises every parameter now. Burn initialises parameters lazily,
    /// on first read: call this before cloning a stack whose weights were
    /// never read, so the clones share the weights instead of each drawing
    /// its own.
    pub fn materialize(&self) {
        self.first.visit(&mut Materialize);
        self.middle
            .iter()
            .for_each(|unit| unit.visit(&mut Materialize));
        self.last.visit(&mut Materialize);
    }
}

impl<S: StackTypes> Clone for LayerStack<S> {
    /// Clones the units. Burn initialises parameters lazily: clone a stack
    /// whose weights were never read and the two copies get different random
    /// weights; read them first ([`materialize`](LayerStack::materialize)).
    fn clone(&self) -> Self {
        Self {
            first: self.first.clone(),
            middle: self.middle.clone(),
            last: self.last.clone(),
        }
    }
}

impl<S: StackTypes> fmt::Debug for LayerStack<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LayerStack")
            .field("first", &self.first)
            .field("middle", &self.middle)
            .field("last", &self.last)
            .finish()
    }
}

/// A model that splits into a [`LayerStack`] of partition units and is
/// rebuilt from one.
pub trait IntoLayerStack: Sized {
    /// The stack's types (see [`StackTypes`]).
    type Types: StackTypes;

    /// Splits the model into its partition units, in order.
    fn into_layer_stack(self) -> LayerStack<Self::Types>;

    /// Rebuilds the model from a stack made by
    /// [`into_layer_stack`](IntoLayerStack::into_layer_stack), e.g. after
    /// training it in a pipeline. Fails when the units do not form this model.
    fn from_layer_stack(stack: LayerStack<Self::Types>) -> Result<Self, StackError>;
}

/// The layer stack type of a model.
pub type StackOf<Model> = LayerStack<<Model as IntoLayerStack>::Types>;

/// The stack types of a model.
pub type TypesOf<Model> = <Model as IntoLayerStack>::Types;
