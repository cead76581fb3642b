//! What flows into, between and out of partition units.

use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{BasicAutodiffOps, BasicOps, TensorKind};

/// A value passed into, between or out of partition units on backend `B`.
///
/// A layer stack passes one *hidden* type between its units; the first unit may
/// take another type (token ids, pixels) and the last may return another (logits).
/// Every such type implements [`Activation`], so a pipeline can split it into
/// micro-batches, join them again and move them between devices. On an autodiff
/// backend, [`AutodiffActivation`] moves a value to the inner backend and back,
/// which is how a frozen unit runs without recording a graph, and
/// [`Differentiable`] lets a pipeline stage start its backward pass from a
/// gradient that arrives from the next stage.
///
/// Plain tensors of any kind and rank already implement these traits. A struct
/// that carries several tensors (BERT's hidden state and its padding mask, for
/// example) implements them by forwarding to its fields.
///
/// The first dimension of every tensor inside is the batch dimension.
///
/// ```
/// use burn::backend::Flex;
/// use burn::prelude::*;
/// use burn_freeze::Activation;
///
/// let device = Default::default();
/// let x = Tensor::<Flex, 2>::ones([5, 3], &device);
/// let parts = x.split_batch(&[2, 3]);
/// assert_eq!(parts[1].dims(), [3, 3]);
/// assert_eq!(Activation::<Flex>::batch_size(&Tensor::cat_batch(parts)), 5);
/// ```
pub trait Activation<B: Backend>: Clone + Send + Sized + 'static {
    /// Number of samples (size of the first dimension).
    fn batch_size(&self) -> usize;

    /// Splits along the batch dimension into consecutive parts of the given sizes.
    ///
    /// The sizes sum to [`batch_size`](Activation::batch_size).
    fn split_batch(self, sizes: &[usize]) -> Vec<Self>;

    /// Joins parts made by [`split_batch`](Activation::split_batch), in order.
    fn cat_batch(parts: Vec<Self>) -> Self;

    /// Moves every tensor inside to `device`.
    fn to_device(self, device: &B::Device) -> Self;
}

/// An [`Activation`] of an autodiff backend that also exists on its inner backend.
pub trait AutodiffActivation<B: AutodiffBackend>: Activation<B> {
    /// The same value on `B::InnerBackend`, with no autodiff state.
    type Inner: Activation<B::InnerBackend>;

    /// Drops the autodiff state: the result records nothing.
    fn inner(self) -> Self::Inner;

    /// Re-enters autodiff as a constant: a fresh leaf with no history.
    fn from_inner(inner: Self::Inner) -> Self;
}

/// An activation whose float tensors can be differentiated through.
///
/// A pipeline stage makes its input a tracked leaf with
/// [`require_grad`](Differentiable::require_grad), runs its units, and seeds
/// the backward pass with the gradient received from downstream through
/// [`seed`](Differentiable::seed); the gradient it sends upstream is
/// [`grad`](Differentiable::grad) of its input.
pub trait Differentiable<B: AutodiffBackend>: AutodiffActivation<B> {
    /// Marks the float tensors inside as leaves that require a gradient.
    fn require_grad(self) -> Self;

    /// The gradient of this value's float tensors in `grads`, in the shape of
    /// the value itself (non-float parts are carried over unchanged). `None`
    /// when the value did not take part in the computation.
    fn grad(&self, grads: &B::Gradients) -> Option<Self::Inner>;

    /// A scalar whose gradient with respect to this value is `grad`:
    /// the sum over float tensors of `self * grad`. Calling `backward()` on it
    /// continues a backward pass that reached this value with gradient `grad`.
    fn seed(&self, grad: Self::Inner) -> Tensor<B, 1>;
}

impl<B, const D: usize, K> Activation<B> for Tensor<B, D, K>
where
    B: Backend,
    K: TensorKind<B> + BasicOps<B> + Send + 'static,
    K::Primitive: Send,
{
    fn batch_size(&self) -> usize {
        self.dims()[0]
    }

    fn split_batch(self, sizes: &[usize]) -> Vec<Self> {
        let mut start = 0;
        sizes
            .iter()
            .map(|&size| {
                let part = self.clone().narrow(0, start, size);
                start += size;
                part
            })
            .collect()
    }

    fn cat_batch(parts: Vec<Self>) -> Self {
        Tensor::cat(parts, 0)
    }

    fn to_device(self, device: &B::Device) -> Self {
        Tensor::to_device(self, device)
    }
}

impl<B, const D: usize, K> AutodiffActivation<B> for Tensor<B, D, K>
where
    B: AutodiffBackend,
    K: TensorKind<B> + BasicOps<B> + BasicAutodiffOps<B> + Send + 'static,
    <K as TensorKind<B>>::Primitive: Send,
    K::InnerKind: TensorKind<B::InnerBackend> + BasicOps<B::InnerBackend> + Send + 'static,
    <K::InnerKind as TensorKind<B::InnerBackend>>::Primitive: Send,
{
    type Inner = Tensor<B::InnerBackend, D, K::InnerKind>;

    fn inner(self) -> Self::Inner {
        Tensor::inner(self)
    }

    fn from_inner(inner: Self::Inner) -> Self {
        Tensor::from_inner(inner)
    }
}

impl<B: AutodiffBackend, const D: usize> Differentiable<B> for Tensor<B, D> {
    fn require_grad(self) -> Self {
        Tensor::require_grad(self)
    }

    fn grad(&self, grads: &B::Gradients) -> Option<Self::Inner> {
        Tensor::grad(self, grads)
    }

    fn seed(&self, grad: Self::Inner) -> Tensor<B, 1> {
        (self.clone() * Tensor::from_inner(grad)).sum()
    }
}
