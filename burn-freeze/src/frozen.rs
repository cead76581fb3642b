//! Frozen execution: units held in their inner-backend form and run with no
//! autodiff graph.

use std::fmt;

use burn::module::{AutodiffModule, Module};

use crate::flow::{Flow, InnerFlow};
use crate::types::{InnerFirst, InnerLast, InnerMiddle, StackTypes, TrainableUnits};
use crate::unit::Unit;

/// The frozen units of a [`UnitRange`](crate::UnitRange), in inner-backend
/// form, in order.
///
/// A frozen unit is stored as [`AutodiffModule::valid`]'s result, so its
/// parameters live on the inner backend: an optimizer built for the trainable
/// units never sees them, they never get a gradient, and dropout inside them
/// is off (Burn's dropout only acts when the backend records gradients). Their
/// output re-enters autodiff as a fresh leaf, so a training step records
/// nothing for them.
///
/// Frozen units always form a prefix of the range (and of the stack): the
/// range's first unit, when it is the stack's unit 0, then middle units, and
/// the stack's last unit only when the whole stack is frozen.
pub struct FrozenUnits<S: StackTypes> {
    /// Stack index of the range's first unit.
    start: usize,
    pub(crate) first: Option<InnerFirst<S>>,
    pub(crate) middle: Vec<InnerMiddle<S>>,
    pub(crate) last: Option<InnerLast<S>>,
}

impl<S: StackTypes> FrozenUnits<S> {
    pub(crate) fn empty(start: usize) -> Self {
        Self {
            start,
            first: None,
            middle: Vec::new(),
            last: None,
        }
    }

    /// Number of frozen units.
    pub fn len(&self) -> usize {
        usize::from(self.first.is_some()) + self.middle.len() + usize::from(self.last.is_some())
    }

    /// True when no unit is frozen.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Stack indices of the frozen units.
    pub fn units(&self) -> std::ops::Range<usize> {
        self.start..self.start + self.len()
    }

    /// The frozen first unit (stack unit 0), if this range holds it frozen.
    pub fn first(&self) -> Option<&InnerFirst<S>> {
        self.first.as_ref()
    }

    /// The frozen middle units, in order.
    pub fn middle(&self) -> &[InnerMiddle<S>] {
        &self.middle
    }

    /// The frozen last unit, when the whole stack is frozen.
    pub fn last(&self) -> Option<&InnerLast<S>> {
        self.last.as_ref()
    }

    /// Parameters held by frozen units (none of them is trained).
    pub fn num_params(&self) -> usize {
        self.first.as_ref().map_or(0, |u| u.num_params())
            + self.middle.iter().map(|u| u.num_params()).sum::<usize>()
            + self.last.as_ref().map_or(0, |u| u.num_params())
    }

    /// Runs every frozen unit on `flow`. Records nothing. With no frozen unit
    /// the flow passes through unchanged.
    pub fn forward(&self, flow: InnerFlow<S>) -> InnerFlow<S> {
        let units = self.units();
        self.forward_units(flow, units.start, units.end)
    }

    /// Runs frozen units `from..to` (stack indices) on `flow`. Records nothing.
    ///
    /// # Panics
    /// When a unit in `from..to` is not frozen here, or `flow` is not what
    /// unit `from` takes.
    pub fn forward_units(&self, flow: InnerFlow<S>, from: usize, to: usize) -> InnerFlow<S> {
        let frozen = self.units();
        assert!(
            frozen.start <= from && from <= to && to <= frozen.end,
            "units {from}..{to} are not all frozen here (frozen: {frozen:?})"
        );
        let first_middle = self.start.max(1);
        let mut flow = flow;
        for unit in from..to {
            flow = if unit == 0 {
                let first = self.first.as_ref().expect("unit 0 is frozen");
                Flow::Hidden(S::First::forward_inner(first, flow.expect_input(unit)))
            } else if unit < first_middle + self.middle.len() {
                let middle = &self.middle[unit - first_middle];
                Flow::Hidden(S::Middle::forward_inner(middle, flow.expect_hidden(unit)))
            } else {
                let last = self.last.as_ref().expect("the last unit is frozen");
                Flow::Output(S::Last::forward_inner(last, flow.expect_hidden(unit)))
            };
        }
        flow
    }

    /// Moves every frozen unit to `device`, keeping each parameter's
    /// `require_grad` flag, so that a unit moved while frozen trains again
    /// when it thaws. (Burn's `to_device` on an inner-backend module resets
    /// the flag: its tensors never require gradients; so each unit goes
    /// through the autodiff backend, forked there, and back.)
    pub fn to_device(self, device: &burn::tensor::Device<S::Backend>) -> Self {
        Self {
            start: self.start,
            first: self
                .first
                .map(|u| S::First::from_inner(u).fork(device).valid()),
            middle: self
                .middle
                .into_iter()
                .map(|u| S::Middle::from_inner(u).fork(device).valid())
                .collect(),
            last: self
                .last
                .map(|u| S::Last::from_inner(u).fork(device).valid()),
        }
    }

    /// Unfreezes every unit: `(first, middle, last)` back on the autodiff backend.
    pub(crate) fn thaw(self) -> TrainableUnits<S> {
        (
            self.first.map(S::First::from_inner),
            self.middle.into_iter().map(S::Middle::from_inner).collect(),
            self.last.map(S::Last::from_inner),
        )
    }
}

impl<S: StackTypes> Clone for FrozenUnits<S> {
    fn clone(&self) -> Self {
        Self {
            start: self.start,
            first: self.first.clone(),
            middle: self.middle.clone(),
            last: self.last.clone(),
        }
    }
}

impl<S: StackTypes> fmt::Debug for FrozenUnits<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FrozenUnits")
            .field("units", &self.units())
            .finish()
    }
}
