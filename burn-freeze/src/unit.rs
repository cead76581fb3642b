//! A partition unit: the smallest piece of a model a pipeline may place on a stage.

use burn::module::{AutodiffModule, ModuleDisplay};
use burn::tensor::backend::AutodiffBackend;

use crate::activation::AutodiffActivation;

/// The inner-backend form of an activation type.
pub type InnerOf<B, A> = <A as AutodiffActivation<B>>::Inner;

/// A partition unit: a module that maps one activation to another.
///
/// A unit runs on the autodiff backend when it trains, and on the inner backend
/// (through [`AutodiffModule::valid`]) when it is frozen, so it records no graph.
/// Its parameter count is [`Module::num_params`](burn::module::Module::num_params)
/// and it moves between devices with
/// [`Module::to_device`](burn::module::Module::to_device); both come with
/// `#[derive(Module)]`, as does the `ModuleDisplay` bound.
///
/// A unit written once for every backend implements both forwards with the
/// same code:
///
/// ```
/// use burn::backend::{Autodiff, Flex};
/// use burn::module::{AutodiffModule, ModuleDisplay};
/// use burn::nn::{Linear, LinearConfig, Relu};
/// use burn::prelude::*;
/// use burn::tensor::backend::AutodiffBackend;
/// use burn_freeze::{InnerOf, Unit};
///
/// /// A residual MLP block of a user's own model.
/// #[derive(Module, Debug)]
/// pub struct Block<B: Backend> {
///     linear: Linear<B>,
///     relu: Relu,
/// }
///
/// impl<B: Backend> Block<B> {
///     pub fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
///         x.clone() + self.relu.forward(self.linear.forward(x))
///     }
/// }
///
/// impl<B: AutodiffBackend> Unit<B> for Block<B> {
///     type Input = Tensor<B, 2>;
///     type Output = Tensor<B, 2>;
///
///     fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
///         Block::forward(self, x)
///     }
///
///     fn forward_inner(
///         block: &Block<B::InnerBackend>,
///         x: InnerOf<B, Tensor<B, 2>>,
///     ) -> InnerOf<B, Tensor<B, 2>> {
///         block.forward(x)
///     }
/// }
///
/// type B = Autodiff<Flex>;
/// let device = Default::default();
/// let block = Block::<B> { linear: LinearConfig::new(4, 4).init(&device), relu: Relu::new() };
/// let x = Tensor::<B, 2>::ones([2, 4], &device);
/// let trained = Unit::forward(&block, x.clone());
/// let frozen = <Block<B> as Unit<B>>::forward_inner(&block.valid(), x.inner());
/// trained.inner().into_data().assert_eq(&frozen.into_data(), true);
/// ```
pub trait Unit<B: AutodiffBackend>:
    AutodiffModule<B, InnerModule: ModuleDisplay> + ModuleDisplay
{
    /// What the unit takes.
    type Input: AutodiffActivation<B>;
    /// What the unit returns.
    type Output: AutodiffActivation<B>;

    /// Forward pass on the autodiff backend (records a graph when trained).
    fn forward(&self, input: Self::Input) -> Self::Output;

    /// The same forward pass on the inner backend, for a unit made inner with
    /// [`AutodiffModule::valid`]. Nothing is recorded.
    fn forward_inner(
        unit: &Self::InnerModule,
        input: InnerOf<B, Self::Input>,
    ) -> InnerOf<B, Self::Output>;
}
