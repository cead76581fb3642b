//! A pipeline stage's share of the layer stack: a contiguous range of units.

use std::marker::PhantomData;
use std::ops::Range;

use burn::module::Module;
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;
use burn_freeze::{Differentiable, Unit};

/// The units of one stage, as one Burn module so that one optimizer serves it.
///
/// Stage 0 holds the stack's first unit, the last stage its last unit; every
/// stage may hold middle units. Unit numbers follow
/// [`LayerStack`](burn_freeze::LayerStack): first is 0, last is `len - 1`.
#[derive(Module, Debug)]
pub struct StageModule<B: Backend, F: Module<B>, M: Module<B>, L: Module<B>> {
    /// The stack's first unit, on stage 0 only.
    pub first: Option<F>,
    /// Middle units, in order.
    pub middle: Vec<M>,
    /// The stack's last unit, on the last stage only.
    pub last: Option<L>,
    backend: PhantomData<B>,
}

/// What enters a stage: the model's input on stage 0, a hidden activation elsewhere.
pub(crate) enum StageInput<I, H> {
    Input(I),
    Hidden(H),
}

/// What leaves a stage: a hidden activation, or the model's output on the last stage.
pub(crate) enum StageOutput<H, O> {
    Hidden(H),
    Output(O),
}

impl<B: Backend, F: Module<B>, M: Module<B>, L: Module<B>> StageModule<B, F, M, L> {
    pub(crate) fn new(first: Option<F>, middle: Vec<M>, last: Option<L>) -> Self {
        Self {
            first,
            middle,
            last,
            backend: PhantomData,
        }
    }

    /// Number of units on this stage.
    pub fn len(&self) -> usize {
        usize::from(self.first.is_some()) + self.middle.len() + usize::from(self.last.is_some())
    }

    /// Always false: a stage holds at least one unit.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<B, F, M, L> StageModule<B, F, M, L>
where
    B: AutodiffBackend,
    F: Unit<B>,
    F::Output: Differentiable<B>,
    M: Unit<B, Input = F::Output, Output = F::Output>,
    L: Unit<B, Input = F::Output>,
{
    /// Runs the stage's units on the autodiff backend.
    pub(crate) fn forward(
        &self,
        input: StageInput<F::Input, F::Output>,
    ) -> StageOutput<F::Output, L::Output> {
        let hidden = match (input, &self.first) {
            (StageInput::Input(input), Some(first)) => first.forward(input),
            (StageInput::Hidden(hidden), None) => hidden,
            (StageInput::Input(_), None) => {
                unreachable!("the pipeline feeds the model input to stage 0 only")
            }
            (StageInput::Hidden(_), Some(_)) => {
                unreachable!("stage 0 always receives the model input")
            }
        };
        let hidden = self.middle.iter().fold(hidden, |h, unit| unit.forward(h));
        match &self.last {
            Some(last) => StageOutput::Output(last.forward(hidden)),
            None => StageOutput::Hidden(hidden),
        }
    }
}

/// The unit range of each stage for a balance (units per stage).
pub(crate) fn ranges(balance: &[usize]) -> Vec<Range<usize>> {
    let mut start = 0;
    balance
        .iter()
        .map(|&n| {
            let range = start..start + n;
            start += n;
            range
        })
        .collect()
}

