//! The types a [`Trainer`](super::Trainer) is made of, bundled once, and the bound it puts on
//! its stack (the optimizer's is burn-freeze's `StackOptimizer`).

use std::marker::PhantomData;

use burn::optim::Optimizer;
use burn_freeze::{
    Activation, AutodiffActivation, Cacheable, Differentiable, InnerBackendOf, StackOptimizer,
    StackTypes, TrainableUnits,
};

/// The three types a [`Trainer`](super::Trainer) is made of, named once
/// (burn-train's habit with its `LearningComponentsTypes`): the layer stack,
/// the optimizer that steps each stage, and the targets the loss scores.
/// Every trainer is a `Trainer<TrainerTypesOf<S, O, T>>`, which
/// [`TrainerConfig::init`](super::TrainerConfig::init) builds from a stack
/// of types `S`, an optimizer factory and a loss; code generic over trainers
/// names this one bound.
///
/// ```
/// use burn_elastic_dp::{Trainer, TrainerTypes};
///
/// /// Steps trained so far, with the freeze front, for any trainer.
/// fn progress<TT: TrainerTypes>(trainer: &Trainer<TT>) -> (usize, usize) {
///     (trainer.steps(), trainer.front())
/// }
/// ```
pub trait TrainerTypes {
    /// The layer stack's types.
    type Stack: StackTypes;
    /// The optimizer of one stage's trainable units.
    type Optimizer: StackOptimizer<Self::Stack>;
    /// The targets of a batch, which the loss scores against the output.
    type Targets: Activation<<Self::Stack as StackTypes>::Backend> + Send + 'static;
}

/// The [`TrainerTypes`] of a stack of types `S`, an optimizer `O` and
/// targets `T`: a marker, never made.
pub struct TrainerTypesOf<S, O, T> {
    _types: PhantomData<fn() -> (S, O, T)>,
}

impl<S, O, T> TrainerTypes for TrainerTypesOf<S, O, T>
where
    S: StackTypes,
    O: StackOptimizer<S>,
    T: Activation<S::Backend> + Send + 'static,
{
    type Stack = S;
    type Optimizer = O;
    type Targets = T;
}

/// The backend a trainer of `TT` trains on (its stack's).
pub type TrainerBackend<TT> = <<TT as TrainerTypes>::Stack as StackTypes>::Backend;

/// The input of a trainer's batches (its stack's input).
pub type TrainerInput<TT> = <<TT as TrainerTypes>::Stack as StackTypes>::Input;

/// What a stage's optimizer records (its state, checkpointed).
pub(crate) type OptimizerRecord<TT> = <<TT as TrainerTypes>::Optimizer as Optimizer<
    TrainableUnits<<TT as TrainerTypes>::Stack>,
    TrainerBackend<TT>,
>>::Record;

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
/// use burn_elastic_dp::{
///     CacheableStack, Trainer, TrainerBackend, TrainerError, TrainerInput, TrainerTypes,
/// };
///
/// /// Trains until `epochs` epochs are done; the last epoch's mean loss.
/// fn train_to<TT, I, D, Bt>(
///     trainer: &mut Trainer<TT>,
///     data: &D,
///     batcher: &Bt,
///     epochs: usize,
/// ) -> Result<f64, TrainerError>
/// where
///     TT: TrainerTypes<Stack: CacheableStack>,
///     D: Dataset<I>,
///     Bt: Batcher<TrainerBackend<TT>, I, (TrainerInput<TT>, TT::Targets)>,
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
