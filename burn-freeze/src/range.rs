//! A contiguous range of a stack's units: its frozen prefix on the inner
//! backend and its trainable rest as one Burn module for one optimizer.

use std::fmt;
use std::ops::Range;

use burn::module::{AutodiffModule, Module};
use burn::optim::GradientsParams;

use crate::error::{FreezeError, StackError};
use crate::flow::{Flow, InnerFlow, TrainFlow, flow_from_inner, flow_into_inner};
use crate::frozen::FrozenUnits;
use crate::grad_sums::GradientSums;
use crate::policy::layer_map::{GradNorm, GradSource, NormCollector, UnitReader};
use crate::stack::LayerStack;
use crate::types::{InnerBackendOf, StackTypes, TrainableUnits};
use crate::unit::Unit;
use crate::update_gain::{GainCollector, WeightSnapshot};

/// The one rule for what may be frozen, in a stack or a pipeline of `len`
/// units with `frozen` units frozen: the front moves up only, to at most
/// `len` (every unit frozen; a training step then has nothing to train).
pub fn check_freeze(requested: usize, frozen: usize, len: usize) -> Result<(), FreezeError> {
    if requested > len {
        return Err(FreezeError::BeyondStack { requested, len });
    }
    if requested < frozen {
        return Err(FreezeError::WouldUnfreeze { frozen, requested });
    }
    Ok(())
}

/// The rule for thawing, the other half of [`check_freeze`]: with `frozen`
/// units frozen, an unfreeze may ask for any front up to `frozen` (units
/// `requested..frozen` train again); asking for more is
/// [`FreezeError::WouldFreeze`].
///
/// ```
/// use burn_freeze::{FreezeError, check_unfreeze};
///
/// assert!(check_unfreeze(1, 3).is_ok());
/// assert!(check_unfreeze(3, 3).is_ok()); // nothing to thaw
/// assert_eq!(check_unfreeze(4, 3), Err(FreezeError::WouldFreeze { frozen: 3, requested: 4 }));
/// ```
pub fn check_unfreeze(requested: usize, frozen: usize) -> Result<(), FreezeError> {
    if requested > frozen {
        return Err(FreezeError::WouldFreeze { frozen, requested });
    }
    Ok(())
}

/// Units `range` of a stack of `stack_len` units: frozen ones (a prefix) on
/// the inner backend, the others trainable in one module.
///
/// [`FreezableStack`](crate::FreezableStack) holds one range (the whole
/// stack); every stage of a pipeline built on this crate holds one, so
/// the way units are frozen, run and joined is written once, here, and
/// follows the one rule for what may be frozen ([`check_freeze`]).
///
/// ```
/// use burn::backend::{Autodiff, Flex};
/// use burn::nn::{Linear, LinearConfig};
/// use burn::prelude::*;
/// use burn_freeze::{LayerStack, UnitRange};
///
/// #[derive(Module, Debug)]
/// pub struct Dense<B: Backend> { linear: Linear<B> }
/// impl<B: Backend> Dense<B> {
///     fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> { self.linear.forward(x).tanh() }
/// }
/// burn_freeze::unit!(Dense<B>: Tensor<B, 2> => Tensor<B, 2>);
///
/// type B = Autodiff<Flex>;
/// let device = Default::default();
/// let dense = |i, o| Dense::<B> { linear: LinearConfig::new(i, o).init(&device) };
/// let stack = LayerStack::new(dense(3, 8), vec![dense(8, 8), dense(8, 8)], dense(8, 2));
/// let mut ranges = UnitRange::split(stack, &[2, 2]).unwrap();
/// assert_eq!(ranges[1].units(), 2..4);
/// ranges[0].freeze_to(1);
/// assert_eq!(ranges[0].frozen().len(), 1);
/// let stack = UnitRange::join(ranges).unwrap(); // frozen units train again
/// assert_eq!(stack.num_units(), 4);
/// ```
pub struct UnitRange<S: StackTypes> {
    units: Range<usize>,
    stack_len: usize,
    frozen: FrozenUnits<S>,
    trainable: TrainableUnits<S>,
}

impl<S: StackTypes> UnitRange<S> {
    /// The whole stack as one range, nothing frozen.
    pub fn whole(stack: LayerStack<S>) -> Self {
        let len = stack.num_units();
        let (first, middle, last) = stack.into_parts();
        Self {
            units: 0..len,
            stack_len: len,
            frozen: FrozenUnits::empty(0),
            trainable: (Some(first), middle, Some(last)),
        }
    }

    /// Cuts a stack into consecutive ranges of `balance[i]` units each,
    /// nothing frozen. Fails on an empty range or a total other than the
    /// stack's length.
    pub fn split(stack: LayerStack<S>, balance: &[usize]) -> Result<Vec<Self>, StackError> {
        let len = stack.num_units();
        if balance.is_empty() || balance.contains(&0) || balance.iter().sum::<usize>() != len {
            return Err(StackError::BadBalance {
                balance: balance.to_vec(),
                units: len,
            });
        }
        let (first, middle, last) = stack.into_parts();
        let mut first = Some(first);
        let mut last = Some(last);
        let mut middle = middle.into_iter();
        let mut start = 0;
        Ok(balance
            .iter()
            .map(|&n| {
                let units = start..start + n;
                start += n;
                let holds_first = units.start == 0;
                let holds_last = units.end == len;
                let middles = n - usize::from(holds_first) - usize::from(holds_last);
                Self {
                    frozen: FrozenUnits::empty(units.start),
                    trainable: (
                        if holds_first { first.take() } else { None },
                        middle.by_ref().take(middles).collect(),
                        if holds_last { last.take() } else { None },
                    ),
                    units,
                    stack_len: len,
                }
            })
            .collect())
    }

    /// Joins consecutive ranges covering a whole stack back into it; frozen
    /// units train again.
    pub fn join(ranges: Vec<Self>) -> Result<LayerStack<S>, StackError> {
        let mut expected = 0;
        let stack_len = ranges.first().map_or(0, |r| r.stack_len);
        for range in &ranges {
            if range.units.start != expected || range.stack_len != stack_len {
                return Err(StackError::NotContiguous {
                    expected,
                    found: range.units.clone(),
                });
            }
            expected = range.units.end;
        }
        if expected != stack_len || ranges.is_empty() {
            return Err(StackError::WrongLength {
                found: expected,
                expected_description: format!("{stack_len} units"),
            });
        }
        let mut first = None;
        let mut middle = Vec::with_capacity(stack_len.saturating_sub(2));
        let mut last = None;
        for range in ranges {
            let (f, m, l) = range.into_parts();
            first = first.or(f);
            middle.extend(m);
            last = last.or(l);
        }
        Ok(LayerStack::from_parts(
            first.expect("the range at 0 holds the first unit"),
            middle,
            last.expect("the range at the end holds the last unit"),
        ))
    }

    /// This range's units, frozen and trainable, back on the autodiff
    /// backend: `(first, middle, last)`.
    fn into_parts(self) -> TrainableUnits<S> {
        let (first, mut middle, last) = self.frozen.thaw();
        let (t_first, t_middle, t_last) = self.trainable;
        middle.extend(t_middle);
        (first.or(t_first), middle, last.or(t_last))
    }

    /// Stack indices of the units held.
    pub fn units(&self) -> Range<usize> {
        self.units.clone()
    }

    /// Number of units held, frozen or not.
    pub fn num_units(&self) -> usize {
        self.units.len()
    }

    /// Number of units in the whole stack.
    pub fn stack_len(&self) -> usize {
        self.stack_len
    }

    /// Whether the range holds the stack's unit 0.
    pub fn holds_first(&self) -> bool {
        self.units.start == 0
    }

    /// Whether the range holds the stack's last unit.
    pub fn holds_last(&self) -> bool {
        self.units.end == self.stack_len
    }

    /// The frozen units (a prefix of the range).
    pub fn frozen(&self) -> &FrozenUnits<S> {
        &self.frozen
    }

    /// The trainable units: build an optimizer for [`TrainableUnits`].
    pub fn trainable(&self) -> &TrainableUnits<S> {
        &self.trainable
    }

    /// Number of trainable units.
    pub fn num_trainable(&self) -> usize {
        self.units.len() - self.frozen.len()
    }

    /// Stack index of the first trainable unit (`units().end` when every
    /// unit is frozen).
    pub fn first_trainable(&self) -> usize {
        self.units.start + self.frozen.len()
    }

    /// Replaces the trainable units by `f(units)`, e.g. an optimizer step.
    ///
    /// # Panics
    /// When `f` returns another number of units.
    pub fn map_trainable(&mut self, f: impl FnOnce(TrainableUnits<S>) -> TrainableUnits<S>) {
        let counts = |t: &TrainableUnits<S>| (t.0.is_some(), t.1.len(), t.2.is_some());
        let before = counts(&self.trainable);
        let trainable = std::mem::take(&mut self.trainable);
        self.trainable = f(trainable);
        assert_eq!(
            before,
            counts(&self.trainable),
            "map_trainable must keep every unit"
        );
    }

    /// Freezes the range's units below stack index `front` (those not frozen
    /// yet); returns how many it froze. Units at or above `front` are left
    /// as they are: use [`unfreeze_to`](Self::unfreeze_to) to move down.
    pub fn freeze_to(&mut self, front: usize) -> usize {
        let from = self.first_trainable();
        let to = front.min(self.units.end);
        if to <= from {
            return 0;
        }
        let mut count = to - from;
        let newly = count;
        if count > 0
            && let Some(first) = self.trainable.0.take()
        {
            self.frozen.first = Some(first.valid());
            count -= 1;
        }
        let middles = count.min(self.trainable.1.len());
        let moved: Vec<S::Middle> = self.trainable.1.drain(..middles).collect();
        self.frozen
            .middle
            .extend(moved.iter().map(|unit| unit.valid()));
        count -= middles;
        if count > 0 {
            let last = self.trainable.2.take().expect("the last unit trains");
            self.frozen.last = Some(last.valid());
        }
        newly
    }

    /// Unfreezes the range's units at or above stack index `front`: they
    /// train again. Returns how many it unfroze.
    pub fn unfreeze_to(&mut self, front: usize) -> usize {
        let keep = front.max(self.units.start).saturating_sub(self.units.start);
        let frozen = self.frozen.len();
        if keep >= frozen {
            return 0;
        }
        let mut count = frozen - keep;
        let unfrozen = count;
        if let Some(last) = self.frozen.last.take() {
            self.trainable.2 = Some(S::Last::from_inner(last));
            count -= 1;
        }
        let keep_middle = self.frozen.middle.len() - count.min(self.frozen.middle.len());
        let thawed: Vec<S::Middle> = self
            .frozen
            .middle
            .drain(keep_middle..)
            .map(S::Middle::from_inner)
            .collect();
        count -= thawed.len();
        self.trainable.1.splice(0..0, thawed);
        if count > 0 {
            let first = self.frozen.first.take().expect("unit 0 is frozen");
            self.trainable.0 = Some(S::First::from_inner(first));
        }
        unfrozen
    }

    /// Runs the range for training: frozen units on the inner backend (no
    /// graph), their result entering autodiff as a fresh leaf, then the
    /// trainable units.
    pub fn forward(&self, flow: TrainFlow<S>) -> TrainFlow<S> {
        let flow = if self.frozen.is_empty() {
            flow
        } else {
            flow_from_inner::<S>(self.frozen.forward(flow_into_inner::<S>(flow)))
        };
        Self::forward_trainable(&self.trainable, self.first_trainable(), flow)
    }

    /// Runs trainable units `units` (the trainable part of a range, or a
    /// fork of it) on the autodiff backend; `first` is the stack index of
    /// the first of them.
    pub fn forward_trainable(
        units: &TrainableUnits<S>,
        first: usize,
        flow: TrainFlow<S>,
    ) -> TrainFlow<S> {
        let mut index = first;
        let mut flow = flow;
        if let Some(unit) = &units.0 {
            flow = Flow::Hidden(unit.forward(flow.expect_input(index)));
            index += 1;
        }
        for unit in &units.1 {
            flow = Flow::Hidden(unit.forward(flow.expect_hidden(index)));
            index += 1;
        }
        if let Some(unit) = &units.2 {
            flow = Flow::Output(unit.forward(flow.expect_hidden(index)));
        }
        flow
    }

    /// Runs every unit of the range on the inner backend: no graph, dropout
    /// off (evaluation).
    pub fn forward_inner(&self, flow: InnerFlow<S>) -> InnerFlow<S> {
        self.forward_inner_from(flow, self.units.start)
    }

    /// [`forward_inner`](Self::forward_inner) for a flow that enters at
    /// stack unit `entry`: the activation a cache kept of this range's
    /// frozen units before `entry` (`entry` is the range's first unit, or
    /// one of its frozen units, or the first trainable one).
    ///
    /// # Panics
    /// When `entry` is outside `units().start..=first_trainable()`, or
    /// `flow` is not what unit `entry` takes.
    pub fn forward_inner_from(&self, flow: InnerFlow<S>, entry: usize) -> InnerFlow<S> {
        let frozen = self.frozen.units();
        let mut flow = if self.frozen.is_empty() {
            flow
        } else {
            self.frozen.forward_units(flow, entry, frozen.end)
        };
        let mut index = self.first_trainable();
        let (first, middle, last) = &self.trainable;
        if let Some(unit) = first {
            flow = Flow::Hidden(S::First::forward_inner(
                &unit.valid(),
                flow.expect_input(index),
            ));
            index += 1;
        }
        for unit in middle {
            flow = Flow::Hidden(S::Middle::forward_inner(
                &unit.valid(),
                flow.expect_hidden(index),
            ));
            index += 1;
        }
        if let Some(unit) = last {
            flow = Flow::Output(S::Last::forward_inner(
                &unit.valid(),
                flow.expect_hidden(index),
            ));
        }
        flow
    }

    /// Gradient norms of each unit of the range in `grads` (from this
    /// range's trainable units), in order; `None` for frozen units and for
    /// units whose parameters got no gradient. Reads the device once.
    pub fn unit_gradient_norms(&self, grads: &GradientsParams) -> Vec<Option<GradNorm>> {
        self.collect_norms(GradSource::Step(grads))
    }

    /// Norms of each unit's summed gradients in `sums` (as
    /// [`unit_gradient_norms`](Self::unit_gradient_norms) for one step's):
    /// `None` for frozen units and units without a sum. Reads the device
    /// once.
    pub fn unit_gradient_sum_norms(
        &self,
        sums: &GradientSums<InnerBackendOf<S>>,
    ) -> Vec<Option<GradNorm>> {
        self.collect_norms(GradSource::Sums(sums))
    }

    /// Adds `grads` (this range's trainable units' gradients of one step)
    /// to `sums`: one add per parameter tensor.
    pub fn add_gradient_sums(
        &self,
        sums: &mut GradientSums<InnerBackendOf<S>>,
        grads: &GradientsParams,
    ) {
        sums.add(&self.trainable, grads);
    }

    /// The weights now of the trainable units from stack index `from` on,
    /// for the next step's [`unit_update_gains`](Self::unit_update_gains)
    /// (shared storage: no copy until an optimizer step writes new values
    /// beside them; a unit before `from` then reads no gain).
    pub fn weight_snapshot(&self, from: usize) -> WeightSnapshot<InnerBackendOf<S>> {
        let (first, middle, last) = &self.trainable;
        let mut index = self.first_trainable();
        let mut snapshot = WeightSnapshot::empty();
        let mut take = |snapshot: &mut WeightSnapshot<_>, part: WeightSnapshot<_>| {
            if index >= from {
                snapshot.merge(part);
            }
            index += 1;
        };
        if let Some(unit) = first {
            take(&mut snapshot, WeightSnapshot::of(unit));
        }
        for unit in middle {
            take(&mut snapshot, WeightSnapshot::of(unit));
        }
        if let Some(unit) = last {
            take(&mut snapshot, WeightSnapshot::of(unit));
        }
        snapshot
    }

    /// Each unit's update gain (see [`WeightSnapshot`]): minus the dot
    /// product of its gradient in `grads` (this step's) with its move since
    /// `before` (the weights before the last step); `None` for frozen
    /// units and units with no gradient or no snapshot. Reads the device
    /// once.
    pub fn unit_update_gains(
        &self,
        grads: &GradientsParams,
        before: &WeightSnapshot<InnerBackendOf<S>>,
    ) -> Vec<Option<f64>> {
        let mut collector = GainCollector::<S::Backend>::new(grads, before);
        self.read_units(&mut collector);
        collector.finish()
    }

    fn collect_norms(&self, source: GradSource<'_, S::Backend>) -> Vec<Option<GradNorm>> {
        let mut collector = NormCollector::<S::Backend>::new(source);
        self.read_units(&mut collector);
        collector.finish()
    }

    /// Every unit in order to `reader`: the frozen ones skipped.
    fn read_units(&self, reader: &mut impl UnitReader<S::Backend>) {
        for _ in 0..self.frozen.len() {
            reader.skip();
        }
        let (first, middle, last) = &self.trainable;
        if let Some(unit) = first {
            reader.unit(unit);
        }
        middle.iter().for_each(|unit| reader.unit(unit));
        if let Some(unit) = last {
            reader.unit(unit);
        }
    }

    /// The range on `device`: trainable units as fresh leaves there (same
    /// parameter ids), frozen units moved.
    pub fn fork(self, device: &burn::tensor::Device<S::Backend>) -> Self {
        Self {
            frozen: self.frozen.to_device(device),
            trainable: self.trainable.fork(device),
            units: self.units,
            stack_len: self.stack_len,
        }
    }
}

impl<S: StackTypes> Clone for UnitRange<S> {
    /// Clones the units (Burn tensors share their storage until written).
    fn clone(&self) -> Self {
        Self {
            units: self.units.clone(),
            stack_len: self.stack_len,
            frozen: self.frozen.clone(),
            trainable: self.trainable.clone(),
        }
    }
}

impl<S: StackTypes> fmt::Debug for UnitRange<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UnitRange")
            .field("units", &self.units)
            .field("frozen", &self.frozen.len())
            .finish()
    }
}
