//! A layer stack with a freeze front, trained on one device.

use std::fmt;

use burn::module::Module;
use burn::optim::GradientsParams;

use crate::cache::{BatchStart, CacheHolder, Cacheable, StackCache, cached_prefix, serve_cached};
use crate::error::{CacheError, FreezeError};
use crate::flow::{Flow, InnerFlow, flow_from_inner};
use crate::freeze_front::{FreezeFront, above_front};
use crate::frozen::FrozenUnits;
use crate::grad_sums::GradientSums;
use crate::policy::GradNorm;
use crate::range::{UnitRange, check_freeze, check_unfreeze};
use crate::stack::LayerStack;
use crate::types::{
    InnerBackendOf, InnerHidden, InnerInput, InnerOutput, StackTypes, TrainableUnits,
};
use crate::update_gain::{WeightSnapshot, set_gains_from};

/// A [`LayerStack`] with a freeze front: units `0..front` are frozen and run on
/// the inner backend with no autodiff graph, the rest train.
///
/// It works on any stack that follows the contract, a user's own as well as the
/// models of this workspace. The front moves up through
/// [`freeze_to`](Self::freeze_to) and down through
/// [`unfreeze_to`](Self::unfreeze_to). The optimizer is built for
/// [`TrainableUnits`] and stepped through [`map_trainable`](Self::map_trainable).
///
/// ```
/// use burn::backend::{Autodiff, Flex};
/// use burn::nn::{Linear, LinearConfig};
/// use burn::optim::{Optimizer, SgdConfig};
/// use burn::prelude::*;
/// use burn_freeze::{FreezableStack, FreezeFront, LayerStack, StackMarker, TrainableUnits};
///
/// #[derive(Module, Debug)]
/// pub struct Dense<B: Backend> { linear: Linear<B> }
/// impl<B: Backend> Dense<B> {
///     fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> { self.linear.forward(x).tanh() }
/// }
/// burn_freeze::unit!(Dense<B>: Tensor<B, 2> => Tensor<B, 2>);
/// type Types = StackMarker<B, Dense<B>, Dense<B>, Dense<B>>;
///
/// type B = Autodiff<Flex>;
/// let device = Default::default();
/// let dense = |i, o| Dense::<B> { linear: LinearConfig::new(i, o).init(&device) };
/// let stack = LayerStack::new(dense(3, 8), vec![dense(8, 8), dense(8, 8)], dense(8, 2));
/// let mut stack = FreezableStack::new(stack);
/// stack.freeze_to(2).unwrap(); // units 0 and 1
/// assert_eq!(stack.front(), 2);
/// assert!(stack.is_frozen(1) && !stack.is_frozen(2));
/// assert!(stack.freeze_to(9).is_err()); // beyond the stack: nothing changes
/// assert!(stack.freeze_to(1).is_err()); // the front only moves up
///
/// let mut optim = SgdConfig::new().init::<B, TrainableUnits<Types>>();
/// let x = Tensor::<B, 2>::ones([4, 3], &device);
/// let loss = stack.forward(x).powi_scalar(2).mean();
/// let grads = stack.gradients(loss.backward());
/// stack.map_trainable(|units| optim.step(0.1, units, grads));
/// assert_eq!(stack.last_gradient_norms()[1], None); // frozen
/// assert!(stack.last_gradient_norms()[2].is_some());
/// ```
pub struct FreezableStack<S: StackTypes> {
    units: UnitRange<S>,
    cache: Option<StackCache<S>>,
    norms: Vec<Option<GradNorm>>,
    /// Running sums of the trainable parameters' gradients, when kept.
    sums: Option<GradientSums<InnerBackendOf<S>>>,
    /// Whether update gains are measured, the weights they are measured
    /// against, whether the next step takes new ones, and the gains of the
    /// last step.
    gains_from: Option<usize>,
    snapshot: Option<WeightSnapshot<InnerBackendOf<S>>>,
    retake_snapshot: bool,
    gains: Vec<Option<f64>>,
}

impl<S: StackTypes> FreezableStack<S> {
    /// A stack with nothing frozen.
    pub fn new(stack: LayerStack<S>) -> Self {
        let len = stack.num_units();
        Self {
            units: UnitRange::whole(stack),
            cache: None,
            norms: vec![None; len],
            sums: None,
            gains_from: None,
            snapshot: None,
            retake_snapshot: false,
            gains: vec![None; len],
        }
    }

    /// Whether unit `index` is frozen.
    pub fn is_frozen(&self, index: usize) -> bool {
        index < self.front()
    }

    /// The units, frozen and trainable.
    pub fn units(&self) -> &UnitRange<S> {
        &self.units
    }

    /// The frozen units, in inner-backend form.
    pub fn frozen(&self) -> &FrozenUnits<S> {
        self.units.frozen()
    }

    /// The trainable units: build the optimizer for this type.
    pub fn trainable(&self) -> &TrainableUnits<S> {
        self.units.trainable()
    }

    /// Replaces the trainable units by `f(units)`, e.g. an optimizer step.
    ///
    /// # Panics
    /// When `f` returns another number of units.
    pub fn map_trainable(&mut self, f: impl FnOnce(TrainableUnits<S>) -> TrainableUnits<S>) {
        self.units.map_trainable(f);
    }

    /// Gradients of the trainable parameters only, from a step's backward
    /// pass (frozen parameters have none: they are not on the autodiff
    /// backend). Also records each unit's gradient norm for
    /// [`last_gradient_norms`](FreezeFront::last_gradient_norms) and, when
    /// gradient sums are kept ([`set_gradient_sums`](FreezeFront::set_gradient_sums)),
    /// adds the gradients to them; when update gains are measured
    /// ([`set_update_gains`](FreezeFront::set_update_gains)), reads them
    /// against the weights snapshot, taken at the first call and again at
    /// the first call after each
    /// [`restart_update_gains`](FreezeFront::restart_update_gains): pass
    /// each step's gradients here once, before its optimizer step.
    pub fn gradients(
        &mut self,
        mut grads: <S::Backend as burn::tensor::backend::AutodiffBackend>::Gradients,
    ) -> GradientsParams {
        let params = GradientsParams::from_module(&mut grads, self.units.trainable());
        self.norms = self.units.unit_gradient_norms(&params);
        if let Some(sums) = self.sums.as_mut() {
            self.units.add_gradient_sums(sums, &params);
        }
        if let Some(from) = self.gains_from {
            self.gains = match &self.snapshot {
                Some(before) => self.units.unit_update_gains(&params, before),
                None => vec![None; self.num_units()],
            };
            if self.snapshot.is_none() || self.retake_snapshot {
                self.snapshot = Some(self.units.weight_snapshot(from));
                self.retake_snapshot = false;
            }
        }
        params
    }

    /// The whole stack back, every unit trainable.
    pub fn into_layer_stack(self) -> LayerStack<S> {
        UnitRange::join(vec![self.units]).expect("one range covers the stack")
    }

    /// A copy of the whole stack, every unit on the autodiff backend, to
    /// evaluate or save the model while training goes on (Burn tensors
    /// share storage, so this copies no weights).
    pub fn to_layer_stack(&self) -> LayerStack<S> {
        UnitRange::join(vec![self.units.clone()]).expect("one range covers the stack")
    }

    /// Runs the stack: frozen units on the inner backend (no graph), their
    /// output entering autodiff as a fresh leaf, then the trainable units.
    pub fn forward(&self, input: S::Input) -> S::Output {
        match self.units.forward(Flow::Input(input)) {
            Flow::Output(output) => output,
            other => unreachable!(
                "a whole stack returns the model output, not {}",
                other.kind()
            ),
        }
    }

    /// The model's output for evaluation: every unit on the inner backend,
    /// no graph, dropout off.
    pub fn forward_inner(&self, input: InnerInput<S>) -> InnerOutput<S> {
        match self.units.forward_inner(Flow::Input(input)) {
            Flow::Output(output) => output,
            other => unreachable!(
                "a whole stack returns the model output, not {}",
                other.kind()
            ),
        }
    }

    /// Parameters of the trainable units.
    pub fn trainable_params(&self) -> usize {
        self.units.trainable().num_params()
    }

    /// [`forward`](Self::forward) with the frozen prefix served by the
    /// attached cache ([`serve_cached`]): `ids[i]` names sample `i` of the
    /// batch, the same id for the same sample in every epoch.
    ///
    /// The result equals [`forward`](Self::forward)'s. Without a cache, or
    /// with nothing frozen, this is `forward`.
    ///
    /// Fails, changing nothing, when `ids` does not match the batch (count or
    /// duplicates) or a sample id comes back with inputs of another shape.
    pub fn forward_cached(&mut self, ids: &[u64], input: S::Input) -> Result<S::Output, CacheError>
    where
        InnerInput<S>: Cacheable<InnerBackendOf<S>>,
        InnerHidden<S>: Cacheable<InnerBackendOf<S>>,
    {
        let len = self.num_units();
        let entry = cached_prefix(self.front(), &[len]);
        let (cache, frozen) = (self.cache.as_mut(), self.units.frozen());
        let (cached_units, hidden) = match serve_cached(cache, frozen, entry, ids, input, None)? {
            BatchStart::Input(input) => return Ok(self.forward(input)),
            BatchStart::Hidden { entry, hidden } => (entry, hidden),
        };
        let flow: InnerFlow<S> = Flow::Hidden(hidden);
        let flow = if self.front() == len {
            self.units.frozen().forward_units(flow, len - 1, len)
        } else {
            flow
        };
        let flow = flow_from_inner::<S>(flow);
        let flow = UnitRange::<S>::forward_trainable(self.units.trainable(), cached_units, flow);
        match flow {
            Flow::Output(output) => Ok(output),
            other => unreachable!(
                "a whole stack returns the model output, not {}",
                other.kind()
            ),
        }
    }
}

impl<S: StackTypes> CacheHolder for FreezableStack<S> {
    type Stack = S;

    fn cache_slot(&mut self) -> Option<&mut Option<StackCache<S>>> {
        Some(&mut self.cache)
    }

    fn cache(&self) -> Option<&StackCache<S>> {
        self.cache.as_ref()
    }
}

impl<S: StackTypes> FreezeFront for FreezableStack<S> {
    type Error = FreezeError;

    fn num_units(&self) -> usize {
        self.units.num_units()
    }

    fn front(&self) -> usize {
        self.units.frozen().len()
    }

    /// Freezes units up to (not including) `front`. The front only moves up:
    /// asking for fewer units than are frozen is an error, and so is a front
    /// beyond the stack ([`check_freeze`]). On error nothing changes.
    fn freeze_to(&mut self, front: usize) -> Result<(), FreezeError> {
        let frozen = self.front();
        check_freeze(front, frozen, self.num_units())?;
        if front > frozen {
            self.units.freeze_to(front);
            if let Some(sums) = self.sums.as_mut() {
                sums.retain(self.units.trainable());
            }
            tracing::debug!(
                from = frozen,
                to = front,
                units = self.num_units(),
                "freeze front moved up"
            );
        }
        Ok(())
    }

    /// Thaws units `front..front()`: they move back to the autodiff backend
    /// and train again. Cached activations that passed through any of them
    /// (entries above `front`) are dropped; the thawed units have no
    /// gradient sum and no gradient norm until their next step. The front
    /// only moves down ([`check_unfreeze`]); on error nothing changes.
    ///
    /// The optimizer is the caller's, so this stack cannot drop its state:
    /// to give the thawed units a fresh state (as [`FreezeFront::unfreeze_to`]
    /// describes), remove their parameters
    /// from the optimizer's record when they freeze or thaw
    /// (`to_record`, remove the ids, `load_record`).
    ///
    /// ```
    /// use burn::backend::{Autodiff, Flex};
    /// use burn::nn::{Linear, LinearConfig};
    /// use burn::prelude::*;
    /// use burn_freeze::{FreezableStack, FreezeError, FreezeFront, LayerStack};
    ///
    /// #[derive(Module, Debug)]
    /// pub struct Dense<B: Backend> { linear: Linear<B> }
    /// impl<B: Backend> Dense<B> {
    ///     fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> { self.linear.forward(x) }
    /// }
    /// burn_freeze::unit!(Dense<B>: Tensor<B, 2> => Tensor<B, 2>);
    ///
    /// let device = Default::default();
    /// let dense = |i, o| Dense::<Autodiff<Flex>> { linear: LinearConfig::new(i, o).init(&device) };
    /// let stack = LayerStack::new(dense(3, 4), vec![dense(4, 4)], dense(4, 2));
    /// let mut stack = FreezableStack::new(stack);
    /// stack.freeze_to(2).unwrap();
    /// stack.unfreeze_to(1).unwrap(); // unit 1 trains again
    /// assert_eq!(stack.front(), 1);
    /// let refused = stack.unfreeze_to(2); // above the front: nothing changes
    /// assert_eq!(refused, Err(FreezeError::WouldFreeze { frozen: 1, requested: 2 }));
    /// assert_eq!(stack.front(), 1);
    /// ```
    fn unfreeze_to(&mut self, front: usize) -> Result<(), FreezeError> {
        let frozen = self.front();
        check_unfreeze(front, frozen)?;
        if front == frozen {
            return Ok(());
        }
        self.units.unfreeze_to(front);
        if let Some(cache) = self.cache.as_mut() {
            cache.invalidate_above(front);
        }
        if let Some(sums) = self.sums.as_mut() {
            sums.retain(self.units.trainable());
        }
        for norm in self.norms.iter_mut().take(frozen).skip(front) {
            *norm = None;
        }
        tracing::debug!(from = frozen, to = front, "freeze front moved down (thaw)");
        Ok(())
    }

    fn last_gradient_norms(&self) -> Vec<Option<GradNorm>> {
        above_front(&self.norms, self.front())
    }

    fn set_gradient_sums(&mut self, keep: bool) {
        match (keep, self.sums.is_some()) {
            (true, false) => self.sums = Some(GradientSums::new()),
            (false, true) => self.sums = None,
            _ => {}
        }
    }

    fn gradient_sum_norms(&self) -> Vec<Option<GradNorm>> {
        match &self.sums {
            Some(sums) => self.units.unit_gradient_sum_norms(sums),
            None => vec![None; self.num_units()],
        }
    }

    fn reset_gradient_sums(&mut self) {
        if let Some(sums) = self.sums.as_mut() {
            sums.clear();
        }
    }

    /// Measured in [`gradients`](FreezableStack::gradients), against a
    /// snapshot of the trainable weights taken at its first call and at the
    /// first after each restart.
    fn set_update_gains(&mut self, from: Option<usize>) {
        if set_gains_from(&mut self.gains_from, &mut self.gains, from) {
            self.snapshot = None;
        }
    }

    fn restart_update_gains(&mut self) {
        self.retake_snapshot = true;
    }

    fn last_update_gains(&self) -> Vec<Option<f64>> {
        above_front(&self.gains, self.front())
    }
}

impl<S: StackTypes> Clone for FreezableStack<S> {
    /// Clones the units; the clone has no cache attached.
    fn clone(&self) -> Self {
        Self {
            units: self.units.clone(),
            cache: None,
            norms: self.norms.clone(),
            sums: self.sums.clone(),
            gains_from: self.gains_from,
            snapshot: self.snapshot.clone(),
            retake_snapshot: self.retake_snapshot,
            gains: self.gains.clone(),
        }
    }
}

impl<S: StackTypes> fmt::Debug for FreezableStack<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FreezableStack")
            .field("units", &self.num_units())
            .field("front", &self.front())
            .field("cache", &self.cache.is_some())
            .finish()
    }
}

/// Freeze-front operations on a plain [`LayerStack`], for code that holds one.
impl<S: StackTypes> LayerStack<S> {
    /// Wraps the stack in a [`FreezableStack`] with units `0..front` frozen.
    pub fn freeze_to(self, front: usize) -> Result<FreezableStack<S>, FreezeError> {
        check_freeze(front, 0, self.num_units())?;
        let mut stack = FreezableStack::new(self);
        stack.freeze_to(front)?;
        Ok(stack)
    }
}
