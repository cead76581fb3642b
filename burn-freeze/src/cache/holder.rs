//! What holds an AutoCache: a stack, a pipeline (on its first stage), a
//! group of replicas (on its first replica), each through one trait.

use super::serve::StackCache;
use crate::types::StackTypes;

/// A model that holds an AutoCache ([`StackCache`]) for its frozen prefix:
/// [`FreezableStack`](crate::FreezableStack) here, and what crates built on
/// this one train (a pipeline holds it for its first stage, a group of
/// replicas on its first replica). Each says where the cache lives
/// ([`cache_slot`](Self::cache_slot), [`cache`](Self::cache)); attaching
/// and detaching are written once, here.
///
/// ```
/// use burn::backend::{Autodiff, Flex};
/// use burn::nn::{Linear, LinearConfig};
/// use burn::prelude::*;
/// use burn_freeze::{ActivationCache, CacheConfig, CacheHolder, FreezableStack, LayerStack};
///
/// #[derive(Module, Debug)]
/// pub struct Dense<B: Backend> { linear: Linear<B> }
/// impl<B: Backend> Dense<B> {
///     fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> { self.linear.forward(x) }
/// }
/// burn_freeze::unit!(Dense<B>: Tensor<B, 2> => Tensor<B, 2>);
///
/// let device = Default::default();
/// let dense = || Dense::<Autodiff<Flex>> { linear: LinearConfig::new(2, 2).init(&device) };
/// let mut stack = FreezableStack::new(LayerStack::new(dense(), vec![dense()], dense()));
/// assert!(stack.attach_cache(ActivationCache::new(CacheConfig::new(1 << 20))?).is_none());
/// assert!(stack.cache().is_some());
/// assert!(stack.detach_cache().is_some()); // dropping it removes its spill files
/// assert!(stack.cache().is_none());
/// # Ok::<(), burn_freeze::CacheError>(())
/// ```
pub trait CacheHolder {
    /// The stack whose frozen prefix the cache holds.
    type Stack: StackTypes;

    /// Where the cache lives; `None` when nothing can hold one now (a
    /// group that lost every replica).
    fn cache_slot(&mut self) -> Option<&mut Option<StackCache<Self::Stack>>>;

    /// The attached cache.
    fn cache(&self) -> Option<&StackCache<Self::Stack>>;

    /// Attaches an AutoCache, replacing (and returning) any attached
    /// before; gives `cache` back when nothing can hold it.
    fn attach_cache(&mut self, cache: StackCache<Self::Stack>) -> Option<StackCache<Self::Stack>> {
        match self.cache_slot() {
            Some(slot) => slot.replace(cache),
            None => Some(cache),
        }
    }

    /// Detaches the cache (dropping it removes its spill files).
    fn detach_cache(&mut self) -> Option<StackCache<Self::Stack>> {
        self.cache_slot()?.take()
    }
}
