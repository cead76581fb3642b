//! The bound a [`Trainer`](super::Trainer) puts on its stack, named once (the optimizer's is
//! burn-freeze's `StackOptimizer`).

use burn_freeze::{AutodiffActivation, Cacheable, Differentiable, InnerBackendOf, StackTypes};

/// A stack whose frozen prefix AutoCache can serve (its input and hidden
/// activations on the inner backend are [`Cacheable`]) and whose output can
/// be differentiated (profiling times the last unit's backward pass): what
/// [`Trainer::fit_epoch`](super::Trainer::fit_epoch) asks of a stack. Every
/// stack of tensors (and tuples of them) is one.
///
/// Generic code over any stack, optimizer and targets:
///
/// ```
/// use burn::data::dataloader::batcher::Batcher;
/// use burn::data::dataset::Dataset;
/// use burn_elastic_dp::{CacheableStack, Trainer, TrainerError};
/// use burn_freeze::{Activation, StackOptimizer};
///
/// /// Trains until `epochs` epochs are done; the last epoch's mean loss.
/// fn train_to<S, O, T, I, D, Bt>(
///     trainer: &mut Trainer<S, O, T>,
///     data: &D,
///     batcher: &Bt,
///     epochs: usize,
/// ) -> Result<f64, TrainerError>
/// where
///     S: CacheableStack,
///     O: StackOptimizer<S>,
///     T: Activation<S::Backend> + Send + 'static,
///     D: Dataset<I>,
///     Bt: Batcher<S::Backend, I, (S::Input, T)>,
/// {
///     let mut loss = f64::NAN;
///     while trainer.epoch() < epochs {
///         loss = trainer.fit_epoch(data, batcher)?.loss;
///     }
///     Ok(loss)
/// }
/// ```
pub trait CacheableStack:
    StackTypes<
        Input: AutodiffActivation<
            <Self as StackTypes>::Backend,
            Inner: Cacheable<InnerBackendOf<Self>>,
        >,
        Hidden: AutodiffActivation<
            <Self as StackTypes>::Backend,
            Inner: Cacheable<InnerBackendOf<Self>>,
        >,
        Output: Differentiable<<Self as StackTypes>::Backend>,
    >
{
}

impl<S> CacheableStack for S
where
    S: StackTypes,
    burn_freeze::InnerInput<S>: Cacheable<InnerBackendOf<S>>,
    burn_freeze::InnerHidden<S>: Cacheable<InnerBackendOf<S>>,
    S::Output: Differentiable<S::Backend>,
{
}
