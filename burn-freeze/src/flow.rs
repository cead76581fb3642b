//! The value flowing through a range of units: the model's input before unit
//! 0, a hidden activation between units, the model's output after the last.

use crate::activation::{Activation, AutodiffActivation};
use crate::types::{InnerHidden, InnerInput, InnerOutput, StackTypes};

/// What enters or leaves a range of units.
///
/// A range that starts at unit 0 takes [`Flow::Input`]; one that ends with
/// the last unit returns [`Flow::Output`]; everything else passes
/// [`Flow::Hidden`].
#[derive(Debug, Clone)]
pub enum Flow<I, H, O> {
    /// The model's input, before unit 0.
    Input(I),
    /// A hidden activation, between units.
    Hidden(H),
    /// The model's output, after the last unit.
    Output(O),
}

/// A flow on the autodiff backend of stack `S`.
pub type TrainFlow<S> =
    Flow<<S as StackTypes>::Input, <S as StackTypes>::Hidden, <S as StackTypes>::Output>;

/// A flow on the inner backend of stack `S` (frozen units, evaluation).
pub type InnerFlow<S> = Flow<InnerInput<S>, InnerHidden<S>, InnerOutput<S>>;

impl<I, H, O> Flow<I, H, O> {
    /// Which value this is, in words.
    pub fn kind(&self) -> &'static str {
        match self {
            Flow::Input(_) => "the model input",
            Flow::Hidden(_) => "a hidden activation",
            Flow::Output(_) => "the model output",
        }
    }

    /// The model input, for unit 0.
    ///
    /// # Panics
    /// When the flow is not the model input: a range was fed the wrong value.
    pub fn expect_input(self, unit: usize) -> I {
        match self {
            Flow::Input(input) => input,
            other => panic!("unit {unit} takes the model input, got {}", other.kind()),
        }
    }

    /// The hidden activation, for a middle or the last unit.
    ///
    /// # Panics
    /// When the flow is not a hidden activation.
    pub fn expect_hidden(self, unit: usize) -> H {
        match self {
            Flow::Hidden(hidden) => hidden,
            other => panic!(
                "unit {unit} takes a hidden activation, got {}",
                other.kind()
            ),
        }
    }
}

/// A training flow on the inner backend, with no autodiff state.
pub fn flow_into_inner<S: StackTypes>(flow: TrainFlow<S>) -> InnerFlow<S> {
    match flow {
        Flow::Input(x) => Flow::Input(x.inner()),
        Flow::Hidden(x) => Flow::Hidden(x.inner()),
        Flow::Output(x) => Flow::Output(x.inner()),
    }
}

/// An inner flow back on the autodiff backend as a constant: a fresh leaf,
/// no history.
pub fn flow_from_inner<S: StackTypes>(inner: InnerFlow<S>) -> TrainFlow<S> {
    match inner {
        Flow::Input(x) => Flow::Input(S::Input::from_inner(x)),
        Flow::Hidden(x) => Flow::Hidden(S::Hidden::from_inner(x)),
        Flow::Output(x) => Flow::Output(S::Output::from_inner(x)),
    }
}

/// Moves a flow's tensors to `device` (any backend's activations).
pub fn flow_to_device<Be, I, H, O>(flow: Flow<I, H, O>, device: &Be::Device) -> Flow<I, H, O>
where
    Be: burn::tensor::backend::Backend,
    I: Activation<Be>,
    H: Activation<Be>,
    O: Activation<Be>,
{
    match flow {
        Flow::Input(x) => Flow::Input(x.to_device(device)),
        Flow::Hidden(x) => Flow::Hidden(x.to_device(device)),
        Flow::Output(x) => Flow::Output(x.to_device(device)),
    }
}

/// The samples in a flow (any backend's activations).
pub fn flow_batch_size<Be, I, H, O>(flow: &Flow<I, H, O>) -> usize
where
    Be: burn::tensor::backend::Backend,
    I: Activation<Be>,
    H: Activation<Be>,
    O: Activation<Be>,
{
    match flow {
        Flow::Input(x) => x.batch_size(),
        Flow::Hidden(x) => x.batch_size(),
        Flow::Output(x) => x.batch_size(),
    }
}

/// A flow split along the batch into parts of `sizes` samples (summing to
/// its batch), in order.
pub fn split_flow<Be, I, H, O>(flow: Flow<I, H, O>, sizes: &[usize]) -> Vec<Flow<I, H, O>>
where
    Be: burn::tensor::backend::Backend,
    I: Activation<Be>,
    H: Activation<Be>,
    O: Activation<Be>,
{
    match flow {
        Flow::Input(x) => x.split_batch(sizes).into_iter().map(Flow::Input).collect(),
        Flow::Hidden(x) => x.split_batch(sizes).into_iter().map(Flow::Hidden).collect(),
        Flow::Output(x) => x.split_batch(sizes).into_iter().map(Flow::Output).collect(),
    }
}
