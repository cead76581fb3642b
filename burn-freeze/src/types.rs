//! The types of a layer stack, bundled in one trait so generic code carries
//! one bound instead of five.

use std::marker::PhantomData;

use burn::module::AutodiffModule;
use burn::tensor::backend::AutodiffBackend;

use crate::activation::{AutodiffActivation, Differentiable};
use crate::unit::Unit;

/// The types of a layer stack: its backend, its three kinds of unit and the
/// activations between them, with every bound of the layer-stack contract
/// stated once.
///
/// This is the pattern of Burn's own `LearningComponentsTypes`: the bounds on
/// the associated types are implied wherever `S: StackTypes` is, so a
/// function generic over a stack needs no other bound:
///
/// ```
/// use burn_freeze::{LayerStack, StackTypes};
///
/// /// Parameters of the middle units of any stack.
/// fn middle_params<S: StackTypes>(stack: &LayerStack<S>) -> usize {
///     use burn::module::Module;
///     stack.middle().iter().map(|unit| unit.num_params()).sum()
/// }
/// ```
///
/// You rarely implement it: [`StackMarker`] implements it for any first,
/// middle and last unit types that chain, and a model names its bundle with
/// a type alias (`type VitTypes<B> = StackMarker<B, PatchEmbedding<B>,
/// VitUnit<B>, VitHead<B>>`).
pub trait StackTypes: Sized + Send + Sync + 'static {
    /// The autodiff backend the trainable units run on; frozen units run on
    /// its inner backend.
    type Backend: AutodiffBackend;
    /// What the model takes (token ids, pixels).
    type Input: AutodiffActivation<Self::Backend>;
    /// What passes between units.
    type Hidden: Differentiable<Self::Backend>;
    /// What the model returns (logits).
    type Output: AutodiffActivation<Self::Backend>;
    /// Unit 0: input to hidden.
    type First: Unit<Self::Backend, Input = Self::Input, Output = Self::Hidden>;
    /// Every middle unit: hidden to hidden.
    type Middle: Unit<Self::Backend, Input = Self::Hidden, Output = Self::Hidden>;
    /// The last unit: hidden to output.
    type Last: Unit<Self::Backend, Input = Self::Hidden, Output = Self::Output>;
}

/// [`StackTypes`] for first, middle and last unit types `F`, `M`, `L` on
/// backend `B`: the one place the contract's bounds are written out.
///
/// It is only a marker (no value of it exists); [`LayerStack::new`] infers it
/// from the units it is given.
///
/// [`LayerStack::new`]: crate::LayerStack::new
pub struct StackMarker<B, F, M, L> {
    _types: PhantomData<Types<B, F, M, L>>,
}

/// What [`StackMarker`] holds: nothing but its types (always `Send` and `Sync`).
type Types<B, F, M, L> = fn() -> (B, F, M, L);

impl<B, F, M, L> StackTypes for StackMarker<B, F, M, L>
where
    B: AutodiffBackend,
    F: Unit<B> + 'static,
    F::Output: Differentiable<B>,
    M: Unit<B, Input = F::Output, Output = F::Output> + 'static,
    L: Unit<B, Input = F::Output> + 'static,
{
    type Backend = B;
    type Input = F::Input;
    type Hidden = F::Output;
    type Output = L::Output;
    type First = F;
    type Middle = M;
    type Last = L;
}

/// The inner backend of a stack: where frozen units run.
pub type InnerBackendOf<S> = <<S as StackTypes>::Backend as AutodiffBackend>::InnerBackend;

/// A stack's model input on the inner backend.
pub type InnerInput<S> =
    <<S as StackTypes>::Input as AutodiffActivation<<S as StackTypes>::Backend>>::Inner;

/// A stack's hidden activation on the inner backend.
pub type InnerHidden<S> =
    <<S as StackTypes>::Hidden as AutodiffActivation<<S as StackTypes>::Backend>>::Inner;

/// A stack's model output on the inner backend.
pub type InnerOutput<S> =
    <<S as StackTypes>::Output as AutodiffActivation<<S as StackTypes>::Backend>>::Inner;

/// The frozen (inner-backend) form of a stack's first unit.
pub type InnerFirst<S> =
    <<S as StackTypes>::First as AutodiffModule<<S as StackTypes>::Backend>>::InnerModule;

/// The frozen (inner-backend) form of a stack's middle units.
pub type InnerMiddle<S> =
    <<S as StackTypes>::Middle as AutodiffModule<<S as StackTypes>::Backend>>::InnerModule;

/// The frozen (inner-backend) form of a stack's last unit.
pub type InnerLast<S> =
    <<S as StackTypes>::Last as AutodiffModule<<S as StackTypes>::Backend>>::InnerModule;

/// The trainable units of a [`UnitRange`](crate::UnitRange): the stack's first unit if the
/// range holds it and it trains, the range's trainable middle units, and the
/// stack's last unit if the range holds it and it trains.
///
/// It is one Burn module (tuples, `Option` and `Vec` of modules are
/// modules), so one optimizer is built for it and only ever sees trainable
/// parameters:
/// `AdamConfig::new().init::<S::Backend, TrainableUnits<S>>()`.
pub type TrainableUnits<S> = (
    Option<<S as StackTypes>::First>,
    Vec<<S as StackTypes>::Middle>,
    Option<<S as StackTypes>::Last>,
);
