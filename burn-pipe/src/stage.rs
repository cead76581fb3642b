//! A pipeline stage's share of the layer stack: a contiguous range of units.

use std::marker::PhantomData;
use std::ops::Range;

use burn::module::Module;
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;
use burn_freeze::{Differentiable, InnerOf, LayerStack, Unit};

/// The trainable units of one stage, as one Burn module so that one optimizer
/// serves it (frozen units are kept apart, on the inner backend).
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

    /// Number of trainable units on this stage.
    pub fn len(&self) -> usize {
        usize::from(self.first.is_some()) + self.middle.len() + usize::from(self.last.is_some())
    }

    /// True when every unit of the stage is frozen.
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
    /// Runs the stage's trainable units on the autodiff backend.
    pub(crate) fn forward(
        &self,
        input: StageInput<F::Input, F::Output>,
    ) -> StageOutput<F::Output, L::Output> {
        let hidden = match (input, &self.first) {
            (StageInput::Input(input), Some(first)) => first.forward(input),
            (StageInput::Hidden(hidden), None) => hidden,
            (StageInput::Input(_), None) => {
                unreachable!("the model input reaches the first unit only")
            }
            (StageInput::Hidden(_), Some(_)) => {
                unreachable!("the first unit always receives the model input")
            }
        };
        let hidden = self.middle.iter().fold(hidden, |h, unit| unit.forward(h));
        match &self.last {
            Some(last) => StageOutput::Output(last.forward(hidden)),
            None => StageOutput::Hidden(hidden),
        }
    }
}

impl<B, F, M, L> StageModule<B, F, M, L>
where
    B: AutodiffBackend,
    F: Unit<B>,
    M: Unit<B, Input = F::Output, Output = F::Output>,
    L: Unit<B, Input = F::Output>,
{
    /// Runs the stage's trainable units on the inner backend: no graph,
    /// dropout off (evaluation).
    pub(crate) fn forward_inner(
        &self,
        input: StageInput<InnerOf<B, F::Input>, InnerOf<B, F::Output>>,
    ) -> StageOutput<InnerOf<B, F::Output>, InnerOf<B, L::Output>> {
        let hidden = match (input, &self.first) {
            (StageInput::Input(input), Some(first)) => F::forward_inner(&first.valid(), input),
            (StageInput::Hidden(hidden), None) => hidden,
            _ => unreachable!("the model input reaches the first unit only"),
        };
        let hidden = self
            .middle
            .iter()
            .fold(hidden, |h, unit| M::forward_inner(&unit.valid(), h));
        match &self.last {
            Some(last) => StageOutput::Output(L::forward_inner(&last.valid(), hidden)),
            None => StageOutput::Hidden(hidden),
        }
    }
}

/// A stage's frozen units, on the inner backend: no gradient, no optimizer
/// state, no graph. Frozen units form a prefix of the stack, and the last
/// unit is never frozen.
pub(crate) struct FrozenPart<B: AutodiffBackend, F: Unit<B>, M: Unit<B>> {
    first: Option<F::InnerModule>,
    middle: Vec<M::InnerModule>,
}

impl<B, F, M> FrozenPart<B, F, M>
where
    B: AutodiffBackend,
    F: Unit<B>,
    M: Unit<B, Input = F::Output, Output = F::Output>,
{
    fn empty() -> Self {
        Self {
            first: None,
            middle: Vec::new(),
        }
    }

    /// Number of frozen units.
    pub(crate) fn len(&self) -> usize {
        usize::from(self.first.is_some()) + self.middle.len()
    }

    /// Runs the frozen units on an inner-backend input; without frozen units
    /// the input passes through unchanged.
    pub(crate) fn forward(
        &self,
        input: StageInput<InnerOf<B, F::Input>, InnerOf<B, F::Output>>,
    ) -> StageInput<InnerOf<B, F::Input>, InnerOf<B, F::Output>> {
        if self.len() == 0 {
            return input;
        }
        let hidden = match (input, &self.first) {
            (StageInput::Input(input), Some(first)) => F::forward_inner(first, input),
            (StageInput::Hidden(hidden), None) => hidden,
            _ => unreachable!("the model input reaches the first unit only"),
        };
        StageInput::Hidden(
            self.middle
                .iter()
                .fold(hidden, |h, unit| M::forward_inner(unit, h)),
        )
    }
}

/// Every unit of one stage: its frozen prefix, then its trainable units.
pub(crate) struct StageUnits<B: AutodiffBackend, F: Unit<B>, M: Unit<B>, L: Unit<B>> {
    pub frozen: FrozenPart<B, F, M>,
    pub trainable: StageModule<B, F, M, L>,
}

impl<B, F, M, L> StageUnits<B, F, M, L>
where
    B: AutodiffBackend,
    F: Unit<B>,
    M: Unit<B, Input = F::Output, Output = F::Output>,
    L: Unit<B, Input = F::Output>,
{
    /// Freezes the next `count` trainable units of the stage (never its last unit).
    pub(crate) fn freeze_next(&mut self, count: usize) {
        let mut count = count;
        if count > 0
            && let Some(first) = self.trainable.first.take()
        {
            self.frozen.first = Some(first.valid());
            count -= 1;
        }
        let moved: Vec<M> = self.trainable.middle.drain(..count).collect();
        self.frozen
            .middle
            .extend(moved.iter().map(|unit| unit.valid()));
    }

    /// Moves the stage's units to `device`; trainable ones stay trainable leaves.
    pub(crate) fn fork(self, device: &B::Device) -> Self {
        Self {
            frozen: FrozenPart {
                first: self.frozen.first.map(|u| u.to_device(device)),
                middle: self
                    .frozen
                    .middle
                    .into_iter()
                    .map(|u| u.to_device(device))
                    .collect(),
            },
            trainable: self.trainable.fork(device),
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

/// Cuts a stack into stages of `balance[s]` units each (already validated),
/// freezing units `0..front` (`front < stack.len()`).
pub(crate) fn split<B, F, M, L>(
    stack: LayerStack<F, M, L>,
    balance: &[usize],
    front: usize,
) -> Vec<StageUnits<B, F, M, L>>
where
    B: AutodiffBackend,
    F: Unit<B>,
    M: Unit<B, Input = F::Output, Output = F::Output>,
    L: Unit<B, Input = F::Output>,
{
    let len = stack.len();
    let (first, middle, last) = stack.into_parts();
    let mut first = Some(first);
    let mut last = Some(last);
    let mut middle = middle.into_iter();
    ranges(balance)
        .into_iter()
        .map(|range| {
            let mut frozen = FrozenPart::empty();
            let mut trainable = StageModule::new(None, Vec::new(), None);
            for index in range {
                if index == 0 {
                    let unit = first.take().expect("unit 0 is placed once");
                    if index < front {
                        frozen.first = Some(unit.valid());
                    } else {
                        trainable.first = Some(unit);
                    }
                } else if index == len - 1 {
                    trainable.last = last.take();
                } else {
                    let unit = middle.next().expect("a middle unit per index");
                    if index < front {
                        frozen.middle.push(unit.valid());
                    } else {
                        trainable.middle.push(unit);
                    }
                }
            }
            StageUnits { frozen, trainable }
        })
        .collect()
}

/// Joins stages, in order, back into a stack; frozen units train again.
pub(crate) fn join<B, F, M, L>(stages: Vec<StageUnits<B, F, M, L>>) -> LayerStack<F, M, L>
where
    B: AutodiffBackend,
    F: Unit<B>,
    M: Unit<B, Input = F::Output, Output = F::Output>,
    L: Unit<B, Input = F::Output>,
{
    let mut first = None;
    let mut last = None;
    let mut middle = Vec::new();
    for StageUnits { frozen, trainable } in stages {
        first = first
            .or(frozen.first.map(F::from_inner))
            .or(trainable.first);
        middle.extend(frozen.middle.into_iter().map(M::from_inner));
        middle.extend(trainable.middle);
        last = trainable.last.or(last);
    }
    LayerStack::new(
        first.expect("stage 0 holds the first unit"),
        middle,
        last.expect("the last stage holds the last unit"),
    )
}
