//! Plain Burn training with the freeze front applied by hand: the reference
//! that training which freezes and thaws is compared with.

use std::collections::HashSet;

use burn::module::{AutodiffModule, Module, ModuleVisitor, Param, ParamId};
use burn::optim::{GradientsParams, Optimizer};
use burn::prelude::*;

use crate::optim_state::ParamStates;
use crate::{LayerStack, StackTypes};

/// A whole stack's units as one Burn module: `(first, middle, last)`.
pub type StackParts<S> = (
    <S as StackTypes>::First,
    Vec<<S as StackTypes>::Middle>,
    <S as StackTypes>::Last,
);

/// Plain Burn training of a whole [`LayerStack`] (every unit on the
/// autodiff backend, one optimizer over all of them) with a freeze front
/// applied by hand: at each step only the parameters of units at or above
/// the front get gradients, and a unit's optimizer state is dropped when it
/// freezes, so a unit that thaws starts from a fresh state.
///
/// ```
/// use burn::backend::{Autodiff, Flex};
/// use burn::optim::AdamConfig;
/// use burn::prelude::*;
/// use burn_freeze::testing::{PlainFronts, Residual, seeded_linear};
/// use burn_freeze::{LayerStack, StackMarker};
///
/// type B = Autodiff<Flex>;
/// type Types = StackMarker<B, Residual<B>, Residual<B>, Residual<B>>;
/// let device = Default::default();
/// let unit = |seed| Residual { linear: seeded_linear::<B>(seed, 4, 4, &device) };
/// let stack: LayerStack<Types> = LayerStack::new(unit(1), vec![unit(2)], unit(3));
/// let mut plain = PlainFronts::new(stack, AdamConfig::new().init());
/// plain.set_front(2);
/// let x = Tensor::<B, 2>::ones([2, 4], &device);
/// plain.step(0.1, x, |y| y.powi_scalar(2).mean());
/// plain.set_front(0); // units 0 and 1 thaw, with a fresh Adam state
/// assert_eq!(plain.front(), 0);
/// ```
pub struct PlainFronts<S: StackTypes, O> {
    parts: Option<StackParts<S>>,
    optimizer: Option<O>,
    units: Vec<Vec<ParamId>>,
    front: usize,
}

impl<S, O> PlainFronts<S, O>
where
    S: StackTypes,
    StackParts<S>: AutodiffModule<S::Backend>,
    O: Optimizer<StackParts<S>, S::Backend>,
    O::Record: ParamStates,
{
    /// `stack`, nothing frozen, trained by `optimizer`.
    pub fn new(stack: LayerStack<S>, optimizer: O) -> Self {
        let mut units = vec![param_ids(stack.first())];
        units.extend(stack.middle().iter().map(param_ids));
        units.push(param_ids(stack.last()));
        Self {
            parts: Some(stack.into_parts()),
            optimizer: Some(optimizer),
            units,
            front: 0,
        }
    }

    /// Units `0..front()` are frozen.
    pub fn front(&self) -> usize {
        self.front
    }

    /// Moves the front to `front` (clamped to the stack), up or down. Up,
    /// the optimizer state of the units that freeze is dropped.
    pub fn set_front(&mut self, front: usize) {
        let front = front.min(self.units.len());
        if front > self.front {
            let frozen: HashSet<ParamId> = self.units[self.front..front]
                .iter()
                .flatten()
                .copied()
                .collect();
            let optimizer = self.optimizer.take().expect("present between calls");
            let kept = optimizer
                .to_record()
                .into_states()
                .into_iter()
                .filter(|(id, _)| !frozen.contains(id))
                .collect();
            self.optimizer = Some(optimizer.load_record(O::Record::from_states(kept)));
        }
        self.front = front;
    }

    /// One step on `input`: the loss `loss(output)` backward, the
    /// gradients of the units at or above the front to the optimizer.
    /// Returns the loss.
    pub fn step(
        &mut self,
        lr: f64,
        input: S::Input,
        loss: impl FnOnce(S::Output) -> Tensor<S::Backend, 1>,
    ) -> f32 {
        let (first, middle, last) = self.parts.take().expect("present between calls");
        let stack = LayerStack::<S>::from_parts(first, middle, last);
        let loss = loss(stack.forward(input));
        let value = loss.clone().into_scalar().elem::<f32>();
        let parts = stack.into_parts();
        let trainable: Vec<ParamId> = self.units[self.front..].iter().flatten().copied().collect();
        let mut grads = loss.backward();
        let grads = GradientsParams::from_params(&mut grads, &parts, &trainable);
        let optimizer = self.optimizer.as_mut().expect("present between calls");
        self.parts = Some(optimizer.step(lr, parts, grads));
        value
    }

    /// The stack as trained so far.
    pub fn to_layer_stack(&self) -> LayerStack<S> {
        let (first, middle, last) = self.parts.clone().expect("present between calls");
        LayerStack::from_parts(first, middle, last)
    }
}

struct Ids(Vec<ParamId>);

impl<Be: Backend> ModuleVisitor<Be> for Ids {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<Be, D>>) {
        self.0.push(param.id);
    }
}

fn param_ids<Be: Backend, Mo: Module<Be>>(module: &Mo) -> Vec<ParamId> {
    let mut ids = Ids(Vec::new());
    module.visit(&mut ids);
    ids.0
}
