//! The loss a pipeline trains on, named once.

use burn::prelude::*;
use burn_freeze::StackTypes;

/// A micro-batch loss for a stack `S` with targets `T`: maps the last unit's
/// output for a micro-batch and that micro-batch's targets to the *mean*
/// loss over its samples. Every closure `Fn(S::Output, T) -> Tensor<_, 1> +
/// Sync` is one, borrowing or owning what it uses; the pipeline calls it
/// from the last stage's thread and weights each micro-batch by its share of
/// the batch.
///
/// Code that runs a pipeline's pass on threads that may outlive the call (a
/// data-parallel group built on this crate, say) asks for
/// `MicroBatchLoss<S, T> + Send + 'static` (an owned closure): any such loss
/// is a pipeline's loss too.
///
/// ```
/// use burn::backend::{Autodiff, Flex};
/// use burn::prelude::*;
/// use burn_freeze::StackMarker;
/// use burn_pipe::MicroBatchLoss;
///
/// #[derive(Module, Debug)]
/// pub struct Dense<B: Backend> { linear: burn::nn::Linear<B> }
/// impl<B: Backend> Dense<B> {
///     fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> { self.linear.forward(x) }
/// }
/// burn_freeze::unit!(Dense<B>: Tensor<B, 2> => Tensor<B, 2>);
/// type B = Autodiff<Flex>;
/// type Types = StackMarker<B, Dense<B>, Dense<B>, Dense<B>>;
///
/// fn mean_square<L: MicroBatchLoss<Types, Tensor<B, 2>>>(loss: L) -> L { loss }
/// let loss = mean_square(|output: Tensor<B, 2>, target| (output - target).powi_scalar(2).mean());
/// let x = Tensor::<B, 2>::ones([2, 3], &Default::default());
/// assert_eq!(loss(x.clone(), x).into_scalar(), 0.0);
/// ```
pub trait MicroBatchLoss<S: StackTypes, T>:
    Fn(S::Output, T) -> Tensor<S::Backend, 1> + Sync
{
}

impl<S, T, F> MicroBatchLoss<S, T> for F
where
    S: StackTypes,
    F: Fn(S::Output, T) -> Tensor<S::Backend, 1> + Sync,
{
}
