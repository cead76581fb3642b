//! Activations that AutoCache can store per sample, in memory or on disk.

use burn::prelude::*;
use burn::tensor::{BasicOps, TensorData, TensorKind};

use crate::activation::Activation;

/// An [`Activation`] that can be measured, turned into plain data and rebuilt,
/// so [`ActivationCache`](crate::ActivationCache) can hold it in memory and
/// spill it to disk.
///
/// Tensors of every kind and rank implement it. A struct of several tensors
/// implements it by listing its tensors in a fixed order:
///
/// ```
/// use burn::backend::Flex;
/// use burn::prelude::*;
/// use burn_freeze::Cacheable;
///
/// let device = Default::default();
/// let x = Tensor::<Flex, 2>::ones([1, 3], &device);
/// assert_eq!(x.shapes(), vec![vec![1, 3]]);
/// assert_eq!(x.num_bytes(), 12);
/// let back = <Tensor<Flex, 2> as Cacheable<Flex>>::from_data(x.to_data_parts(), &device);
/// back.into_data().assert_eq(&x.into_data(), true);
/// ```
pub trait Cacheable<B: Backend>: Activation<B> {
    /// The shapes of the tensors inside, in a fixed order.
    fn shapes(&self) -> Vec<Vec<usize>>;

    /// Bytes the tensors inside occupy.
    fn num_bytes(&self) -> usize;

    /// The tensors inside as plain data, in the order of [`shapes`](Cacheable::shapes).
    fn to_data_parts(&self) -> Vec<TensorData>;

    /// Rebuilds the value on `device` from [`to_data_parts`](Cacheable::to_data_parts).
    ///
    /// # Panics
    /// When `parts` are not what `to_data_parts` gives for this type (another
    /// number of parts). The cache checks the parts it read back against the
    /// sample's shapes first, and recomputes a sample whose parts differ.
    fn from_data(parts: Vec<TensorData>, device: &B::Device) -> Self;

    /// The device the value lives on.
    fn device(&self) -> B::Device;
}

impl<B, const D: usize, K> Cacheable<B> for Tensor<B, D, K>
where
    B: Backend,
    K: TensorKind<B> + BasicOps<B> + Send + 'static,
    K::Primitive: Send,
{
    fn shapes(&self) -> Vec<Vec<usize>> {
        vec![self.dims().to_vec()]
    }

    fn num_bytes(&self) -> usize {
        self.shape().num_elements() * self.dtype().size()
    }

    fn to_data_parts(&self) -> Vec<TensorData> {
        vec![self.to_data()]
    }

    fn from_data(mut parts: Vec<TensorData>, device: &B::Device) -> Self {
        assert_eq!(parts.len(), 1, "a tensor is rebuilt from exactly one part");
        let data = parts.pop().expect("one part");
        let dtype = data.dtype;
        Tensor::from_data(data, (device, dtype))
    }

    fn device(&self) -> B::Device {
        Tensor::device(self)
    }
}
