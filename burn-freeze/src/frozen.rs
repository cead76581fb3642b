//! Frozen execution: units held in their inner-backend form and run with no
//! autodiff graph.
//!
//! A frozen unit is stored as [`AutodiffModule::valid`]'s result, so its
//! parameters live on `B::InnerBackend`: an optimizer built for the trainable
//! part never sees them, they never get a gradient, and dropout inside them is
//! off (Burn's dropout only acts when the backend records gradients). Their
//! output re-enters autodiff through
//! [`AutodiffActivation::from_inner`](crate::AutodiffActivation::from_inner) as a
//! fresh leaf, so a training step records nothing for them.

use std::fmt;
use std::marker::PhantomData;

use burn::module::AutodiffModule;
use burn::tensor::backend::AutodiffBackend;

use crate::unit::{InnerOf, Unit};

/// The frozen prefix of a stack: its units in inner-backend form, in order.
///
/// Held by [`FreezableStack`](crate::FreezableStack); units are numbered as in
/// [`LayerStack`](crate::LayerStack). The prefix holds the first unit when at
/// least one unit is frozen, then middle units, and the last unit only when
/// the whole stack is frozen.
pub struct FrozenUnits<B, F, M, L>
where
    B: AutodiffBackend,
    F: Unit<B>,
    M: Unit<B>,
    L: Unit<B>,
{
    pub(crate) first: Option<F::InnerModule>,
    pub(crate) middle: Vec<M::InnerModule>,
    pub(crate) last: Option<L::InnerModule>,
    _backend: PhantomData<fn() -> B>,
}

impl<B, F, M, L> FrozenUnits<B, F, M, L>
where
    B: AutodiffBackend,
    F: Unit<B>,
    M: Unit<B>,
    L: Unit<B>,
{
    pub(crate) fn empty() -> Self {
        Self {
            first: None,
            middle: Vec::new(),
            last: None,
            _backend: PhantomData,
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

    /// The frozen first unit, if frozen.
    pub fn first(&self) -> Option<&F::InnerModule> {
        self.first.as_ref()
    }

    /// The frozen middle units, in order (unit `1 + i` is `middle()[i]`).
    pub fn middle(&self) -> &[M::InnerModule] {
        &self.middle
    }

    /// The frozen last unit, when the whole stack is frozen.
    pub fn last(&self) -> Option<&L::InnerModule> {
        self.last.as_ref()
    }

    /// Parameters held by frozen units (none of them is trained).
    pub fn num_params(&self) -> usize {
        use burn::module::Module;
        self.first.as_ref().map_or(0, |u| u.num_params())
            + self.middle.iter().map(|u| u.num_params()).sum::<usize>()
            + self.last.as_ref().map_or(0, |u| u.num_params())
    }
}

impl<B, F, M, L> FrozenUnits<B, F, M, L>
where
    B: AutodiffBackend,
    F: Unit<B>,
    M: Unit<B, Input = F::Output, Output = F::Output>,
    L: Unit<B, Input = F::Output>,
{
    /// Runs frozen units `0..to` on the model input (`1 <= to`, and `to` stops
    /// before the last unit). Records nothing.
    ///
    /// # Panics
    /// When unit `to - 1` is not frozen or `to` is 0.
    pub fn run_from_input(&self, input: InnerOf<B, F::Input>, to: usize) -> InnerOf<B, F::Output> {
        assert!(to >= 1, "run_from_input needs at least one unit");
        let first = self
            .first
            .as_ref()
            .expect("run_from_input: the first unit is not frozen");
        let hidden = F::forward_inner(first, input);
        self.run_hidden(hidden, 1, to)
    }

    /// Runs frozen middle units `from..to` (unit numbers, `1 <= from <= to`)
    /// on a hidden activation. Records nothing.
    ///
    /// # Panics
    /// When a unit in `from..to` is not a frozen middle unit.
    pub fn run_hidden(
        &self,
        hidden: InnerOf<B, F::Output>,
        from: usize,
        to: usize,
    ) -> InnerOf<B, F::Output> {
        assert!(
            from >= 1 && from <= to,
            "run_hidden: bad unit range {from}..{to}"
        );
        assert!(
            to - 1 <= self.middle.len(),
            "run_hidden: unit {} is not frozen",
            to - 1
        );
        self.middle[from - 1..to - 1]
            .iter()
            .fold(hidden, |hidden, unit| M::forward_inner(unit, hidden))
    }

    /// Runs the frozen last unit. Records nothing.
    ///
    /// # Panics
    /// When the last unit is not frozen.
    pub fn run_last(&self, hidden: InnerOf<B, F::Output>) -> InnerOf<B, L::Output> {
        let last = self
            .last
            .as_ref()
            .expect("run_last: the last unit is not frozen");
        L::forward_inner(last, hidden)
    }
}

impl<B, F, M, L> Clone for FrozenUnits<B, F, M, L>
where
    B: AutodiffBackend,
    F: Unit<B>,
    M: Unit<B>,
    L: Unit<B>,
{
    fn clone(&self) -> Self {
        Self {
            first: self.first.clone(),
            middle: self.middle.clone(),
            last: self.last.clone(),
            _backend: PhantomData,
        }
    }
}

impl<B, F, M, L> fmt::Debug for FrozenUnits<B, F, M, L>
where
    B: AutodiffBackend,
    F: Unit<B>,
    M: Unit<B>,
    L: Unit<B>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FrozenUnits")
            .field("units", &self.len())
            .finish()
    }
}

/// Freezes one unit: its inner-backend form, with no autodiff state.
pub(crate) fn freeze<B: AutodiffBackend, U: AutodiffModule<B>>(unit: U) -> U::InnerModule {
    unit.valid()
}

/// Unfreezes one unit: back on the autodiff backend, trainable again.
pub(crate) fn thaw<B: AutodiffBackend, U: AutodiffModule<B>>(unit: U::InnerModule) -> U {
    U::from_inner(unit)
}
