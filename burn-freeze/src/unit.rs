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
/// A module whose forward is written once for every backend (the usual case)
/// becomes a unit with the [`unit!`](crate::unit!) macro, which implements
/// both forwards with that one method:
///
/// ```
/// use burn::backend::{Autodiff, Flex};
/// use burn::nn::{Linear, LinearConfig, Relu};
/// use burn::prelude::*;
/// use burn_freeze::Unit;
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
/// burn_freeze::unit!(Block<B>: Tensor<B, 2> => Tensor<B, 2>);
///
/// type B = Autodiff<Flex>;
/// let device = Default::default();
/// let block = Block::<B> { linear: LinearConfig::new(4, 4).init(&device), relu: Relu::new() };
/// let x = Tensor::<B, 2>::ones([2, 4], &device);
/// let trained = Unit::forward(&block, x.clone());
/// let frozen = block.forward_eval(x.inner()); // inner backend, no graph
/// trained.inner().into_data().assert_eq(&frozen.into_data(), true);
/// ```
///
/// Written by hand, the same unit reads:
///
/// ```
/// # use burn::nn::{Linear, Relu};
/// # use burn::prelude::*;
/// use burn::tensor::backend::AutodiffBackend;
/// use burn_freeze::{InnerOf, Unit};
/// # #[derive(Module, Debug)]
/// # pub struct Block<B: Backend> { linear: Linear<B>, relu: Relu }
/// # impl<B: Backend> Block<B> {
/// #     pub fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> { x }
/// # }
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

    /// This unit's forward for evaluation: on the inner backend (no graph,
    /// dropout off), through [`forward_inner`](Unit::forward_inner).
    fn forward_eval(&self, input: InnerOf<B, Self::Input>) -> InnerOf<B, Self::Output> {
        Self::forward_inner(&self.valid(), input)
    }
}

/// Implements [`Unit`] for a module generic over its backend whose inherent
/// forward method is written once for every backend.
///
/// `unit!(Type<B>: Input => Output)` uses the inherent method `forward`;
/// `unit!(Type<B>: Input => Output, via method)` another one. `B` names the
/// backend parameter in the types. Both forwards call that one method: on
/// the autodiff backend to train, on the inner backend when frozen.
///
/// ```
/// use burn::nn::{Linear, LinearConfig};
/// use burn::prelude::*;
///
/// #[derive(Module, Debug)]
/// pub struct Head<B: Backend> { linear: Linear<B> }
///
/// impl<B: Backend> Head<B> {
///     /// `[batch, tokens, hidden] -> [batch, classes]`: mean over tokens.
///     pub fn classify(&self, x: Tensor<B, 3>) -> Tensor<B, 2> {
///         self.linear.forward(x.mean_dim(1).squeeze_dim(1))
///     }
/// }
///
/// burn_freeze::unit!(Head<B>: Tensor<B, 3> => Tensor<B, 2>, via classify);
/// ```
#[macro_export]
macro_rules! unit {
    ($ty:ident < $b:ident > : $input:ty => $output:ty $(,)?) => {
        $crate::unit!($ty<$b>: $input => $output, via forward);
    };
    ($ty:ident < $b:ident > : $input:ty => $output:ty, via $method:ident $(,)?) => {
        impl<$b: $crate::__private::AutodiffBackend> $crate::Unit<$b> for $ty<$b> {
            type Input = $input;
            type Output = $output;

            fn forward(&self, input: $input) -> $output {
                $ty::<$b>::$method(self, input)
            }

            fn forward_inner(
                unit: &$ty<<$b as $crate::__private::AutodiffBackend>::InnerBackend>,
                input: $crate::InnerOf<$b, $input>,
            ) -> $crate::InnerOf<$b, $output> {
                $ty::<<$b as $crate::__private::AutodiffBackend>::InnerBackend>::$method(unit, input)
            }
        }
    };
}

/// Declares an enum of several unit types that is itself one [`Unit`], so a
/// stack's middle units may be of several kinds (attention, MLP, norm)
/// without an enum and two dispatching forwards written by hand.
///
/// Every variant holds one unit type generic over the backend `B` with the
/// given input and output. The enum derives Burn's `Module` (so the crate
/// using the macro depends on `burn`).
///
/// ```
/// use burn::nn::{Linear, LinearConfig, LayerNorm, LayerNormConfig};
/// use burn::prelude::*;
///
/// #[derive(Module, Debug)]
/// pub struct Mlp<B: Backend> { linear: Linear<B> }
/// impl<B: Backend> Mlp<B> {
///     pub fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> { x.clone() + self.linear.forward(x).tanh() }
/// }
/// burn_freeze::unit!(Mlp<B>: Tensor<B, 2> => Tensor<B, 2>);
///
/// #[derive(Module, Debug)]
/// pub struct Norm<B: Backend> { norm: LayerNorm<B> }
/// impl<B: Backend> Norm<B> {
///     pub fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> { self.norm.forward(x) }
/// }
/// burn_freeze::unit!(Norm<B>: Tensor<B, 2> => Tensor<B, 2>);
///
/// burn_freeze::unit_enum! {
///     /// A middle unit of my model.
///     pub enum Middle<B>: Tensor<B, 2> => Tensor<B, 2> {
///         Mlp(Mlp),
///         Norm(Norm),
///     }
/// }
///
/// type B = burn::backend::Autodiff<burn::backend::Flex>;
/// let device = Default::default();
/// let unit = Middle::<B>::Norm(Norm { norm: LayerNormConfig::new(4).init(&device) });
/// let y = burn_freeze::Unit::forward(&unit, Tensor::<B, 2>::ones([3, 4], &device));
/// assert_eq!(y.dims(), [3, 4]);
/// ```
#[macro_export]
macro_rules! unit_enum {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident < $b:ident > : $input:ty => $output:ty {
            $( $(#[$vmeta:meta])* $variant:ident ( $unit:ident ) ),+ $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(burn::module::Module, Debug)]
        $vis enum $name<$b: burn::tensor::backend::Backend> {
            $( $(#[$vmeta])* $variant($unit<$b>), )+
        }

        impl<$b: $crate::__private::AutodiffBackend> $crate::Unit<$b> for $name<$b> {
            type Input = $input;
            type Output = $output;

            fn forward(&self, input: $input) -> $output {
                match self {
                    $( $name::$variant(unit) => <$unit<$b> as $crate::Unit<$b>>::forward(unit, input), )+
                }
            }

            fn forward_inner(
                unit: &$name<<$b as $crate::__private::AutodiffBackend>::InnerBackend>,
                input: $crate::InnerOf<$b, $input>,
            ) -> $crate::InnerOf<$b, $output> {
                match unit {
                    $( $name::$variant(unit) => <$unit<$b> as $crate::Unit<$b>>::forward_inner(unit, input), )+
                }
            }
        }
    };
}
