//! Activations of several tensors: tuples of tensors as they are, and structs
//! through [`activation!`](crate::activation!).

use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{BasicOps, TensorData, TensorKind};

use crate::activation::{Activation, AutodiffActivation, Differentiable};
use crate::cache::Cacheable;

/// A part of an activation of several tensors: a float tensor is
/// differentiated, an integer or boolean one carried over unchanged.
pub trait ActivationPart<B: AutodiffBackend>: AutodiffActivation<B> {
    /// A float part becomes a leaf that requires a gradient; others stay.
    fn part_require_grad(self) -> Self;

    /// A float part's gradient (`None` when it took no part in the
    /// computation); another part itself, on the inner backend.
    fn part_grad(&self, grads: &B::Gradients) -> Option<Self::Inner>;

    /// A float part's `sum(self * grad)`; `None` for another part.
    fn part_seed(&self, grad: Self::Inner) -> Option<Tensor<B, 1>>;

    /// The device the part lives on.
    fn part_device(&self) -> B::Device;
}

impl<B: AutodiffBackend, const D: usize> ActivationPart<B> for Tensor<B, D> {
    fn part_require_grad(self) -> Self {
        Differentiable::require_grad(self)
    }

    fn part_grad(&self, grads: &B::Gradients) -> Option<Self::Inner> {
        Differentiable::grad(self, grads)
    }

    fn part_seed(&self, grad: Self::Inner) -> Option<Tensor<B, 1>> {
        Some(Differentiable::seed(self, grad))
    }

    fn part_device(&self) -> B::Device {
        self.device()
    }
}

/// Integer and boolean tensors: carried over, never differentiated.
macro_rules! carried_part {
    ($kind:ty) => {
        impl<B: AutodiffBackend, const D: usize> ActivationPart<B> for Tensor<B, D, $kind> {
            fn part_require_grad(self) -> Self {
                self
            }

            fn part_grad(&self, _grads: &B::Gradients) -> Option<Self::Inner> {
                Some(self.clone().inner())
            }

            fn part_seed(&self, _grad: Self::Inner) -> Option<Tensor<B, 1>> {
                None
            }

            fn part_device(&self) -> B::Device {
                self.device()
            }
        }
    };
}
carried_part!(Int);
carried_part!(Bool);

/// A [`Cacheable`] whose number of cached parts is known without a value:
/// what a tuple or an [`activation!`](crate::activation!) struct needs of
/// its parts to rebuild them.
pub trait CachePart<B: Backend>: Cacheable<B> {
    /// Parts of [`Cacheable::to_data_parts`].
    const PARTS: usize;
}

impl<B, const D: usize, K> CachePart<B> for Tensor<B, D, K>
where
    B: Backend,
    K: TensorKind<B> + BasicOps<B> + Send + 'static,
    K::Primitive: Send,
{
    const PARTS: usize = 1;
}

/// Rebuilds the next part `C` of a composite from `parts` (its
/// [`CachePart::PARTS`] of them).
///
/// # Panics
/// When `parts` runs out: the data was not made by the same composite.
#[doc(hidden)]
pub fn take_cache_parts<B: Backend, C: CachePart<B>>(
    parts: &mut std::vec::IntoIter<TensorData>,
    device: &B::Device,
) -> C {
    let taken: Vec<TensorData> = parts.by_ref().take(C::PARTS).collect();
    assert_eq!(
        taken.len(),
        C::PARTS,
        "a cached activation is rebuilt from the parts it was cached as"
    );
    C::from_data(taken, device)
}

/// The seed of a composite: the sum of its float parts' seeds, or a zero
/// scalar on `device` when it has none (nothing to differentiate).
#[doc(hidden)]
pub fn sum_seeds<B: AutodiffBackend>(
    seeds: impl IntoIterator<Item = Option<Tensor<B, 1>>>,
    device: &B::Device,
) -> Tensor<B, 1> {
    seeds
        .into_iter()
        .flatten()
        .reduce(|a, b| a + b)
        .unwrap_or_else(|| Tensor::zeros([1], device))
}

macro_rules! tuple_activation {
    ($(($X:ident, $x:ident, $i:tt)),+) => {
        impl<B: Backend, $($X: Activation<B>),+> Activation<B> for ($($X,)+) {
            fn batch_size(&self) -> usize {
                self.0.batch_size()
            }

            fn split_batch(self, sizes: &[usize]) -> Vec<Self> {
                $(let mut $x = self.$i.split_batch(sizes).into_iter();)+
                (0..sizes.len())
                    .map(|_| ($($x.next().expect("one part per size"),)+))
                    .collect()
            }

            fn cat_batch(parts: Vec<Self>) -> Self {
                $(let mut $x = Vec::with_capacity(parts.len());)+
                for part in parts {
                    $($x.push(part.$i);)+
                }
                ($($X::cat_batch($x),)+)
            }

            fn to_device(self, device: &B::Device) -> Self {
                ($(self.$i.to_device(device),)+)
            }
        }

        impl<B: AutodiffBackend, $($X: AutodiffActivation<B>),+> AutodiffActivation<B>
            for ($($X,)+)
        {
            type Inner = ($($X::Inner,)+);

            fn inner(self) -> Self::Inner {
                ($(self.$i.inner(),)+)
            }

            fn from_inner(inner: Self::Inner) -> Self {
                ($($X::from_inner(inner.$i),)+)
            }
        }

        impl<B: AutodiffBackend, $($X: ActivationPart<B>),+> Differentiable<B> for ($($X,)+) {
            fn require_grad(self) -> Self {
                ($(self.$i.part_require_grad(),)+)
            }

            fn grad(&self, grads: &B::Gradients) -> Option<Self::Inner> {
                Some(($(self.$i.part_grad(grads)?,)+))
            }

            fn seed(&self, grad: Self::Inner) -> Tensor<B, 1> {
                sum_seeds([$(self.$i.part_seed(grad.$i)),+], &self.0.part_device())
            }
        }

        impl<B: Backend, $($X: CachePart<B>),+> Cacheable<B> for ($($X,)+) {
            fn shapes(&self) -> Vec<Vec<usize>> {
                let mut shapes = Vec::new();
                $(shapes.extend(self.$i.shapes());)+
                shapes
            }

            fn num_bytes(&self) -> usize {
                0 $(+ self.$i.num_bytes())+
            }

            fn to_data_parts(&self) -> Vec<TensorData> {
                let mut parts = Vec::new();
                $(parts.extend(self.$i.to_data_parts());)+
                parts
            }

            fn from_data(parts: Vec<TensorData>, device: &B::Device) -> Self {
                let mut parts = parts.into_iter();
                let value = ($(take_cache_parts::<B, $X>(&mut parts, device),)+);
                assert!(parts.next().is_none(), "a cached tuple has more parts than it holds");
                value
            }

            fn device(&self) -> B::Device {
                self.0.device()
            }
        }

        impl<B: Backend, $($X: CachePart<B>),+> CachePart<B> for ($($X,)+) {
            const PARTS: usize = 0 $(+ $X::PARTS)+;
        }
    };
}

tuple_activation!((X0, x0, 0), (X1, x1, 1));
tuple_activation!((X0, x0, 0), (X1, x1, 1), (X2, x2, 2));
tuple_activation!((X0, x0, 0), (X1, x1, 1), (X2, x2, 2), (X3, x3, 3));

/// Writes [`Activation`], [`AutodiffActivation`], [`Differentiable`] and
/// [`Cacheable`] for a struct of tensors generic over its backend, from the
/// names of its fields: float tensors are differentiated, integer and
/// boolean ones carried over ([`ActivationPart`]); the first field gives
/// the batch size and the device.
///
/// ```
/// use burn::backend::{Autodiff, Flex};
/// use burn::prelude::*;
/// use burn_freeze::{Activation, Cacheable};
///
/// /// Hidden states and their padding mask.
/// #[derive(Debug, Clone)]
/// pub struct Hidden<B: Backend> {
///     pub states: Tensor<B, 3>,
///     pub padding: Tensor<B, 2, Bool>,
/// }
/// burn_freeze::activation!(Hidden<B> { states, padding });
///
/// let device = Default::default();
/// let hidden = Hidden::<Autodiff<Flex>> {
///     states: Tensor::zeros([4, 3, 8], &device),
///     padding: Tensor::<Autodiff<Flex>, 2, Int>::zeros([4, 3], &device).bool(),
/// };
/// let parts = hidden.clone().split_batch(&[1, 3]);
/// assert_eq!(parts[1].padding.dims(), [3, 3]);
/// assert_eq!(hidden.shapes(), vec![vec![4, 3, 8], vec![4, 3]]);
/// ```
#[macro_export]
macro_rules! activation {
    ($name:ident < $b:ident > { $($field:ident),+ $(,)? }) => {
        impl<$b: $crate::__private::Backend> $crate::Activation<$b> for $name<$b> {
            fn batch_size(&self) -> usize {
                let sizes = [$($crate::Activation::<$b>::batch_size(&self.$field)),+];
                sizes[0]
            }

            fn split_batch(self, sizes: &[usize]) -> Vec<Self> {
                $(let mut $field = $crate::Activation::<$b>::split_batch(self.$field, sizes).into_iter();)+
                (0..sizes.len())
                    .map(|_| Self { $($field: $field.next().expect("one part per size")),+ })
                    .collect()
            }

            fn cat_batch(parts: Vec<Self>) -> Self {
                $(let mut $field = Vec::with_capacity(parts.len());)+
                for part in parts {
                    $($field.push(part.$field);)+
                }
                Self { $($field: $crate::Activation::<$b>::cat_batch($field)),+ }
            }

            fn to_device(self, device: &$b::Device) -> Self {
                Self { $($field: $crate::Activation::<$b>::to_device(self.$field, device)),+ }
            }
        }

        impl<$b: $crate::__private::AutodiffBackend> $crate::AutodiffActivation<$b> for $name<$b> {
            type Inner = $name<$b::InnerBackend>;

            fn inner(self) -> Self::Inner {
                $name { $($field: $crate::AutodiffActivation::<$b>::inner(self.$field)),+ }
            }

            fn from_inner(inner: Self::Inner) -> Self {
                Self { $($field: $crate::AutodiffActivation::<$b>::from_inner(inner.$field)),+ }
            }
        }

        impl<$b: $crate::__private::AutodiffBackend> $crate::Differentiable<$b> for $name<$b> {
            fn require_grad(self) -> Self {
                Self { $($field: $crate::ActivationPart::<$b>::part_require_grad(self.$field)),+ }
            }

            fn grad(&self, grads: &$b::Gradients) -> Option<Self::Inner> {
                Some($name { $($field: $crate::ActivationPart::<$b>::part_grad(&self.$field, grads)?),+ })
            }

            fn seed(&self, grad: Self::Inner) -> $crate::__private::Tensor<$b, 1> {
                let devices = [$($crate::ActivationPart::<$b>::part_device(&self.$field)),+];
                $crate::__private::sum_seeds(
                    [$($crate::ActivationPart::<$b>::part_seed(&self.$field, grad.$field)),+],
                    &devices[0],
                )
            }
        }

        impl<$b: $crate::__private::Backend> $crate::Cacheable<$b> for $name<$b> {
            fn shapes(&self) -> Vec<Vec<usize>> {
                let mut shapes = Vec::new();
                $(shapes.extend($crate::Cacheable::<$b>::shapes(&self.$field));)+
                shapes
            }

            fn num_bytes(&self) -> usize {
                0 $(+ $crate::Cacheable::<$b>::num_bytes(&self.$field))+
            }

            fn to_data_parts(&self) -> Vec<$crate::__private::TensorData> {
                let mut parts = Vec::new();
                $(parts.extend($crate::Cacheable::<$b>::to_data_parts(&self.$field));)+
                parts
            }

            fn from_data(parts: Vec<$crate::__private::TensorData>, device: &$b::Device) -> Self {
                let mut parts = parts.into_iter();
                let value = Self { $($field: $crate::__private::take_cache_parts::<$b, _>(&mut parts, device)),+ };
                assert!(parts.next().is_none(), concat!("a cached ", stringify!($name), " has more parts than it holds"));
                value
            }

            fn device(&self) -> $b::Device {
                let devices = [$($crate::Cacheable::<$b>::device(&self.$field)),+];
                devices[0].clone()
            }
        }
    };
}
