//! The layer-stack contract: a model as an ordered list of partition units.

use burn::module::Module;
use burn::tensor::backend::AutodiffBackend;

use crate::activation::Differentiable;
use crate::error::StackError;
use crate::unit::Unit;

/// A model as an ordered list of partition units.
///
/// The first unit maps the model's input (token ids, pixels) to the hidden
/// activation, every middle unit maps hidden to hidden, and the last maps
/// hidden to the model's output (logits). The types are checked at compile
/// time: a middle unit's input and output must be the first unit's output, and
/// the last unit's input the same, so any contiguous range of units can run on
/// its own pipeline stage and exchange hidden activations with its neighbours.
///
/// Units are numbered in order: the first unit is 0, the middle units are
/// `1..=middle.len()`, and the last unit is [`len`](LayerStack::len)` - 1`.
///
/// ```
/// use burn::backend::{Autodiff, Flex};
/// use burn::nn::{Linear, LinearConfig};
/// use burn::prelude::*;
/// use burn::tensor::backend::AutodiffBackend;
/// use burn_freeze::{InnerOf, LayerStack, Unit};
///
/// // One unit type serves for every position here: a linear layer.
/// #[derive(Module, Debug)]
/// pub struct Dense<B: Backend> {
///     linear: Linear<B>,
/// }
///
/// impl<B: AutodiffBackend> Unit<B> for Dense<B> {
///     type Input = Tensor<B, 2>;
///     type Output = Tensor<B, 2>;
///     fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
///         self.linear.forward(x).tanh()
///     }
///     fn forward_inner(unit: &Dense<B::InnerBackend>, x: InnerOf<B, Tensor<B, 2>>) -> InnerOf<B, Tensor<B, 2>> {
///         unit.linear.forward(x).tanh()
///     }
/// }
///
/// type B = Autodiff<Flex>;
/// let device = Default::default();
/// let dense = |i, o| Dense::<B> { linear: LinearConfig::new(i, o).init(&device) };
/// let stack = LayerStack::new(dense(3, 8), vec![dense(8, 8), dense(8, 8)], dense(8, 2));
/// assert_eq!(stack.len(), 4);
/// assert_eq!(stack.unit_params(), vec![32, 72, 72, 18]);
/// let y = stack.forward(Tensor::<B, 2>::zeros([5, 3], &device));
/// assert_eq!(y.dims(), [5, 2]);
/// ```
#[derive(Debug, Clone)]
pub struct LayerStack<F, M, L> {
    first: F,
    middle: Vec<M>,
    last: L,
}

impl<F, M, L> LayerStack<F, M, L> {
    /// Builds a stack from its first unit, its middle units in order, and its last unit.
    pub fn new(first: F, middle: Vec<M>, last: L) -> Self {
        Self {
            first,
            middle,
            last,
        }
    }

    /// Number of partition units, first and last included.
    pub fn len(&self) -> usize {
        self.middle.len() + 2
    }

    /// Always false: a stack holds at least its first and last unit.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The first unit (input to hidden).
    pub fn first(&self) -> &F {
        &self.first
    }

    /// The middle units (hidden to hidden), in order.
    pub fn middle(&self) -> &[M] {
        &self.middle
    }

    /// The last unit (hidden to output).
    pub fn last(&self) -> &L {
        &self.last
    }

    /// Takes the stack apart: `(first, middle, last)`.
    pub fn into_parts(self) -> (F, Vec<M>, L) {
        (self.first, self.middle, self.last)
    }

    /// Applies `f` to every unit, e.g. to move it to a device or change its
    /// weights, keeping the order.
    pub fn map<F2, M2, L2>(
        self,
        first: impl FnOnce(F) -> F2,
        middle: impl FnMut(M) -> M2,
        last: impl FnOnce(L) -> L2,
    ) -> LayerStack<F2, M2, L2> {
        LayerStack {
            first: first(self.first),
            middle: self.middle.into_iter().map(middle).collect(),
            last: last(self.last),
        }
    }
}

impl<F, M, L> LayerStack<F, M, L> {
    /// Runs every unit in order on the autodiff backend.
    pub fn forward<B>(&self, input: F::Input) -> L::Output
    where
        B: AutodiffBackend,
        F: Unit<B>,
        F::Output: Differentiable<B>,
        M: Unit<B, Input = F::Output, Output = F::Output>,
        L: Unit<B, Input = F::Output>,
    {
        let hidden = self.first.forward(input);
        let hidden = self
            .middle
            .iter()
            .fold(hidden, |hidden, unit| unit.forward(hidden));
        self.last.forward(hidden)
    }

    /// Parameter count of each unit, in order.
    pub fn unit_params<B>(&self) -> Vec<usize>
    where
        B: AutodiffBackend,
        F: Module<B>,
        M: Module<B>,
        L: Module<B>,
    {
        std::iter::once(self.first.num_params())
            .chain(self.middle.iter().map(|unit| unit.num_params()))
            .chain(std::iter::once(self.last.num_params()))
            .collect()
    }

    /// Moves every unit to `device`.
    pub fn to_device<B>(self, device: &B::Device) -> Self
    where
        B: AutodiffBackend,
        F: Module<B>,
        M: Module<B>,
        L: Module<B>,
    {
        self.map(
            |unit| unit.to_device(device),
            |unit| unit.to_device(device),
            |unit| unit.to_device(device),
        )
    }
}

/// A model that splits into a [`LayerStack`] of partition units and is rebuilt from one.
///
/// The hidden activation, the type passed between units, is the first unit's output.
pub trait IntoLayerStack<B: AutodiffBackend>: Sized {
    /// Input to hidden (embeddings).
    type First: Unit<B, Output: Differentiable<B>>;
    /// Hidden to hidden (attention and MLP sub-layers, norms).
    type Middle: Unit<B, Input = Hidden<B, Self>, Output = Hidden<B, Self>>;
    /// Hidden to output (classification head).
    type Last: Unit<B, Input = Hidden<B, Self>>;

    /// Splits the model into its partition units, in order.
    fn into_layer_stack(self) -> LayerStack<Self::First, Self::Middle, Self::Last>;

    /// Rebuilds the model from a stack made by
    /// [`into_layer_stack`](IntoLayerStack::into_layer_stack), e.g. after training
    /// it in a pipeline. Fails when the units do not form this model.
    fn from_layer_stack(
        stack: LayerStack<Self::First, Self::Middle, Self::Last>,
    ) -> Result<Self, StackError>;
}

/// The hidden activation type of a model's layer stack.
pub type Hidden<B, Model> = <<Model as IntoLayerStack<B>>::First as Unit<B>>::Output;

/// The layer stack type of a model.
pub type StackOf<B, Model> = LayerStack<
    <Model as IntoLayerStack<B>>::First,
    <Model as IntoLayerStack<B>>::Middle,
    <Model as IntoLayerStack<B>>::Last,
>;
