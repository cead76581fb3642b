//! The freeze front: a layer stack whose first units are frozen.

use std::collections::BTreeMap;
use std::fmt;

use burn::module::AutodiffModule;
use burn::optim::GradientsParams;
use burn::tensor::backend::AutodiffBackend;

use crate::activation::{Activation, AutodiffActivation};
use crate::cache::{ActivationCache, Cacheable};
use crate::error::{CacheError, FreezeError};
use crate::frozen::{FrozenUnits, freeze, thaw};
use crate::policy::stats::{GradNorm, unit_grad_norm};
use crate::stack::LayerStack;
use crate::unit::{InnerOf, Unit};

/// The trainable units of a [`FreezableStack`]: the first unit unless frozen,
/// the middle units after the front, and the last unit unless the whole stack
/// is frozen.
///
/// It is a Burn module (tuples, `Option` and `Vec` of modules are modules), so
/// an optimizer is built for it and only ever sees trainable parameters.
pub type ActiveUnits<F, M, L> = (Option<F>, Vec<M>, Option<L>);

/// The cache type a [`FreezableStack`] uses: hidden activations on the inner backend.
pub type StackCache<B, F> =
    ActivationCache<<B as AutodiffBackend>::InnerBackend, InnerOf<B, <F as Unit<B>>::Output>>;

/// A [`LayerStack`] with a freeze front: units `0..front` are frozen and run on
/// the inner backend with no autodiff graph, the rest train.
///
/// It works on any stack that follows the contract, a user's own as well as the
/// models of this workspace. The front only moves up through
/// [`freeze_to`](Self::freeze_to); [`unfreeze_to`](Self::unfreeze_to) moves it
/// down on explicit request. The optimizer is built for
/// [`ActiveUnits`] and stepped through [`map_active`](Self::map_active).
///
/// ```
/// use burn::backend::{Autodiff, Flex};
/// use burn::nn::{Linear, LinearConfig};
/// use burn::optim::{GradientsParams, Optimizer, SgdConfig};
/// use burn::prelude::*;
/// use burn::tensor::backend::AutodiffBackend;
/// use burn_freeze::{ActiveUnits, FreezableStack, InnerOf, LayerStack, Unit};
///
/// #[derive(Module, Debug)]
/// pub struct Dense<B: Backend> { linear: Linear<B> }
///
/// impl<B: AutodiffBackend> Unit<B> for Dense<B> {
///     type Input = Tensor<B, 2>;
///     type Output = Tensor<B, 2>;
///     fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> { self.linear.forward(x).tanh() }
///     fn forward_inner(u: &Dense<B::InnerBackend>, x: InnerOf<B, Tensor<B, 2>>) -> InnerOf<B, Tensor<B, 2>> {
///         u.linear.forward(x).tanh()
///     }
/// }
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
/// let mut optim = SgdConfig::new().init::<B, ActiveUnits<Dense<B>, Dense<B>, Dense<B>>>();
/// let x = Tensor::<B, 2>::ones([4, 3], &device);
/// let loss = stack.forward(x).powi_scalar(2).mean();
/// let grads = stack.gradients(loss.backward());
/// stack.map_active(|active| optim.step(0.1, active, grads));
/// ```
pub struct FreezableStack<B, F, M, L>
where
    B: AutodiffBackend,
    F: Unit<B>,
    M: Unit<B>,
    L: Unit<B>,
{
    frozen: FrozenUnits<B, F, M, L>,
    active: ActiveUnits<F, M, L>,
    len: usize,
    cache: Option<StackCache<B, F>>,
}

impl<B, F, M, L> FreezableStack<B, F, M, L>
where
    B: AutodiffBackend,
    F: Unit<B>,
    M: Unit<B, Input = F::Output, Output = F::Output>,
    L: Unit<B, Input = F::Output>,
{
    /// A stack with nothing frozen.
    pub fn new(stack: LayerStack<F, M, L>) -> Self {
        let len = stack.len();
        let (first, middle, last) = stack.into_parts();
        Self {
            frozen: FrozenUnits::empty(),
            active: (Some(first), middle, Some(last)),
            len,
            cache: None,
        }
    }

    /// Number of units, frozen or not.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: a stack has at least two units.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The freeze front: units `0..front()` are frozen.
    pub fn front(&self) -> usize {
        self.frozen.len()
    }

    /// Whether unit `index` is frozen.
    pub fn is_frozen(&self, index: usize) -> bool {
        index < self.front()
    }

    /// The frozen units, in inner-backend form.
    pub fn frozen(&self) -> &FrozenUnits<B, F, M, L> {
        &self.frozen
    }

    /// The trainable units: build the optimizer for this type.
    pub fn active(&self) -> &ActiveUnits<F, M, L> {
        &self.active
    }

    /// Replaces the trainable units by `f(units)`, e.g. an optimizer step.
    ///
    /// # Panics
    /// When `f` returns another number of units.
    pub fn map_active(&mut self, f: impl FnOnce(ActiveUnits<F, M, L>) -> ActiveUnits<F, M, L>) {
        let counts = |a: &ActiveUnits<F, M, L>| (a.0.is_some(), a.1.len(), a.2.is_some());
        let before = counts(&self.active);
        let active = std::mem::take(&mut self.active);
        self.active = f(active);
        assert_eq!(
            before,
            counts(&self.active),
            "map_active must keep every unit"
        );
    }

    /// Gradients of the trainable parameters only, from a step's backward pass.
    /// Frozen parameters have none: they are not on the autodiff backend.
    pub fn gradients(&self, mut grads: B::Gradients) -> GradientsParams {
        GradientsParams::from_module(&mut grads, &self.active)
    }

    /// Freezes units up to (not including) `front`. The front only moves up:
    /// asking for fewer units than are frozen is an error, and so is a front
    /// beyond the stack. On error nothing changes.
    pub fn freeze_to(&mut self, front: usize) -> Result<(), FreezeError> {
        let frozen = self.front();
        if front > self.len {
            return Err(FreezeError::BeyondStack {
                requested: front,
                len: self.len,
            });
        }
        if front < frozen {
            return Err(FreezeError::WouldUnfreeze {
                frozen,
                requested: front,
            });
        }
        if front == frozen {
            return Ok(());
        }
        if frozen == 0 {
            let first = self.active.0.take().expect("first unit is active");
            self.frozen.first = Some(freeze::<B, F>(first));
        }
        let middle_to = front.saturating_sub(1).min(self.len - 2);
        let middle_from = self.frozen.middle.len();
        if middle_to > middle_from {
            let moved: Vec<M> = self.active.1.drain(..middle_to - middle_from).collect();
            self.frozen
                .middle
                .extend(moved.into_iter().map(freeze::<B, M>));
        }
        if front == self.len {
            let last = self.active.2.take().expect("last unit is active");
            self.frozen.last = Some(freeze::<B, L>(last));
        }
        tracing::debug!(
            from = frozen,
            to = front,
            units = self.len,
            "freeze front moved up"
        );
        Ok(())
    }

    /// Unfreezes units `front..`: they train again. Cached activations that
    /// passed through any of them are dropped. On error nothing changes.
    pub fn unfreeze_to(&mut self, front: usize) -> Result<(), FreezeError> {
        let frozen = self.front();
        if front > frozen {
            return Err(FreezeError::WouldFreeze {
                frozen,
                requested: front,
            });
        }
        if front == frozen {
            return Ok(());
        }
        if let Some(last) = self.frozen.last.take() {
            self.active.2 = Some(thaw::<B, L>(last));
        }
        let keep = front.saturating_sub(1).min(self.frozen.middle.len());
        let thawed: Vec<M> = self.frozen.middle.drain(keep..).map(thaw::<B, M>).collect();
        self.active.1.splice(0..0, thawed);
        if front == 0
            && let Some(first) = self.frozen.first.take()
        {
            self.active.0 = Some(thaw::<B, F>(first));
        }
        if let Some(cache) = self.cache.as_mut() {
            cache.invalidate_above(front);
        }
        tracing::debug!(
            from = frozen,
            to = front,
            "freeze front moved down (explicit unfreeze)"
        );
        Ok(())
    }

    /// The whole stack back, every unit trainable.
    pub fn into_layer_stack(mut self) -> LayerStack<F, M, L> {
        self.unfreeze_to(0).expect("0 is never above the front");
        let (first, middle, last) = self.active;
        LayerStack::new(first.expect("first unit"), middle, last.expect("last unit"))
    }

    /// Runs the stack: frozen units on the inner backend (no graph), their
    /// output entering autodiff as a fresh leaf, then the trainable units.
    pub fn forward(&self, input: F::Input) -> L::Output {
        let front = self.front();
        if front == 0 {
            let first = self.active.0.as_ref().expect("first unit is active");
            return self.run_active(first.forward(input));
        }
        let hidden = self
            .frozen
            .run_from_input(input.inner(), front.min(self.len - 1));
        self.finish(hidden)
    }

    /// Runs what follows the cached part (`min(front, len - 1)` units) from its
    /// inner-backend output.
    fn finish(&self, hidden: InnerOf<B, F::Output>) -> L::Output {
        if self.front() == self.len {
            return <L::Output as AutodiffActivation<B>>::from_inner(self.frozen.run_last(hidden));
        }
        self.run_active(<F::Output as AutodiffActivation<B>>::from_inner(hidden))
    }

    fn run_active(&self, hidden: F::Output) -> L::Output {
        let hidden = self
            .active
            .1
            .iter()
            .fold(hidden, |hidden, unit| unit.forward(hidden));
        self.active
            .2
            .as_ref()
            .expect("last unit is active")
            .forward(hidden)
    }

    /// Gradient norms of each unit's parameters in `grads` (from
    /// [`gradients`](Self::gradients)); `None` for frozen units and for units
    /// whose parameters got no gradient. No extra backward pass is run.
    pub fn unit_gradient_norms(&self, grads: &GradientsParams) -> Vec<Option<GradNorm>> {
        let mut norms = vec![None; self.front()];
        if let Some(first) = &self.active.0 {
            norms.push(unit_grad_norm::<B, _>(first, grads));
        }
        norms.extend(
            self.active
                .1
                .iter()
                .map(|u| unit_grad_norm::<B, _>(u, grads)),
        );
        if let Some(last) = &self.active.2 {
            norms.push(unit_grad_norm::<B, _>(last, grads));
        }
        norms
    }

    /// Parameters of the trainable units.
    pub fn trainable_params(&self) -> usize {
        use burn::module::Module;
        self.active.num_params()
    }

    /// Attaches an AutoCache, replacing (and returning) any attached before.
    pub fn attach_cache(&mut self, cache: StackCache<B, F>) -> Option<StackCache<B, F>> {
        self.cache.replace(cache)
    }

    /// The attached cache.
    pub fn cache(&self) -> Option<&StackCache<B, F>> {
        self.cache.as_ref()
    }

    /// Detaches the cache (dropping it removes its spill files).
    pub fn detach_cache(&mut self) -> Option<StackCache<B, F>> {
        self.cache.take()
    }
}

impl<B, F, M, L> FreezableStack<B, F, M, L>
where
    B: AutodiffBackend,
    F: Unit<B>,
    M: Unit<B, Input = F::Output, Output = F::Output>,
    L: Unit<B, Input = F::Output>,
    InnerOf<B, F::Input>: Cacheable<B::InnerBackend>,
    InnerOf<B, F::Output>: Cacheable<B::InnerBackend>,
{
    /// [`forward`](Self::forward) with the frozen prefix served by the
    /// attached cache: `ids[i]` names sample `i` of the batch, the same id for
    /// the same sample in every epoch.
    ///
    /// A sample cached at the current front skips the frozen units; one cached
    /// at a lower front runs only the units frozen since; others run the whole
    /// prefix, and every computed output is cached. The result equals
    /// [`forward`](Self::forward)'s. Without a cache, or with nothing frozen,
    /// this is `forward`.
    ///
    /// Fails, changing nothing, when `ids` does not match the batch (count or
    /// duplicates) or a sample id comes back with inputs of another shape.
    pub fn forward_cached(
        &mut self,
        ids: &[u64],
        input: F::Input,
    ) -> Result<L::Output, CacheError> {
        let batch = input.batch_size();
        if ids.len() != batch {
            return Err(CacheError::IdCount {
                batch,
                ids: ids.len(),
            });
        }
        let mut seen = std::collections::HashSet::with_capacity(ids.len());
        if let Some(dup) = ids.iter().find(|id| !seen.insert(**id)) {
            return Err(CacheError::DuplicateId(*dup));
        }
        let cached_units = self.front().min(self.len - 1);
        if cached_units == 0 || self.cache.is_none() {
            return Ok(self.forward(input));
        }
        let mut cache = self.cache.take().expect("checked above");
        let result = self.serve_prefix(&mut cache, ids, input.inner(), cached_units);
        self.cache = Some(cache);
        Ok(self.finish(result?))
    }

    fn serve_prefix(
        &self,
        cache: &mut StackCache<B, F>,
        ids: &[u64],
        input: InnerOf<B, F::Input>,
        cached_units: usize,
    ) -> Result<InnerOf<B, F::Output>, CacheError> {
        let mut input_shapes = input.shapes();
        for shape in &mut input_shapes {
            shape[0] = 1;
        }
        for &id in ids {
            cache.check_input(id, &input_shapes)?;
        }
        let device = input.device();
        // Where each sample starts: 0 (from the input) or a cached front.
        let mut outputs: Vec<Option<InnerOf<B, F::Output>>> = vec![None; ids.len()];
        let mut groups: BTreeMap<usize, Vec<(usize, Option<InnerOf<B, F::Output>>)>> =
            BTreeMap::new();
        for (i, &id) in ids.iter().enumerate() {
            match cache.lookup(id, cached_units, &device) {
                Some((front, value)) if front == cached_units => {
                    cache.count_hit(true);
                    outputs[i] = Some(value);
                }
                Some((front, value)) => {
                    cache.count_hit(false);
                    groups.entry(front).or_default().push((i, Some(value)));
                }
                None => {
                    cache.count_miss();
                    groups.entry(0).or_default().push((i, None));
                }
            }
        }
        let mut computed = Vec::new();
        let mut singles = None;
        for (start, members) in groups {
            let sizes = vec![1; members.len()];
            let result = if start == 0 {
                let singles =
                    singles.get_or_insert_with(|| input.clone().split_batch(&vec![1; ids.len()]));
                let rows = members.iter().map(|(i, _)| singles[*i].clone()).collect();
                self.frozen
                    .run_from_input(Activation::cat_batch(rows), cached_units)
            } else {
                let rows = members
                    .iter()
                    .map(|(_, value)| value.clone().expect("cached value"))
                    .collect();
                self.frozen
                    .run_hidden(Activation::cat_batch(rows), start, cached_units)
            };
            for ((i, _), value) in members.iter().zip(result.split_batch(&sizes)) {
                computed.push((*i, value));
            }
        }
        // Check every new entry before storing any, so an error changes nothing.
        for (i, value) in &computed {
            cache.check_output(ids[*i], value)?;
        }
        let reference = computed
            .first()
            .map(|(_, v)| v.shapes())
            .or_else(|| outputs.iter().flatten().next().map(|v| v.shapes()));
        for (i, value) in outputs.iter().enumerate() {
            if let (Some(value), Some(reference)) = (value, &reference)
                && &value.shapes() != reference
            {
                return Err(CacheError::ShapeMismatch {
                    sample: ids[i],
                    cached: value.shapes(),
                    found: reference.clone(),
                });
            }
        }
        for (i, value) in computed {
            cache.insert(ids[i], cached_units, value.clone(), &input_shapes)?;
            outputs[i] = Some(value);
        }
        Ok(Activation::cat_batch(
            outputs
                .into_iter()
                .map(|v| v.expect("every sample served"))
                .collect(),
        ))
    }
}

impl<B, F, M, L> Clone for FreezableStack<B, F, M, L>
where
    B: AutodiffBackend,
    F: Unit<B>,
    M: Unit<B>,
    L: Unit<B>,
{
    /// Clones the units; the clone has no cache attached.
    fn clone(&self) -> Self {
        Self {
            frozen: self.frozen.clone(),
            active: self.active.clone(),
            len: self.len,
            cache: None,
        }
    }
}

impl<B, F, M, L> fmt::Debug for FreezableStack<B, F, M, L>
where
    B: AutodiffBackend,
    F: Unit<B>,
    M: Unit<B>,
    L: Unit<B>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FreezableStack")
            .field("len", &self.len)
            .field("front", &self.frozen.len())
            .field("cache", &self.cache.is_some())
            .finish()
    }
}

/// Freeze-front operations on a plain [`LayerStack`], for code that holds one.
impl<F, M, L> LayerStack<F, M, L> {
    /// Wraps the stack in a [`FreezableStack`] with units `0..front` frozen.
    pub fn freeze_to<B>(self, front: usize) -> Result<FreezableStack<B, F, M, L>, FreezeError>
    where
        B: AutodiffBackend,
        F: Unit<B>,
        M: Unit<B, Input = F::Output, Output = F::Output>,
        L: Unit<B, Input = F::Output>,
    {
        if front > self.len() {
            return Err(FreezeError::BeyondStack {
                requested: front,
                len: self.len(),
            });
        }
        let mut stack = FreezableStack::new(self);
        stack.freeze_to(front)?;
        Ok(stack)
    }
}

/// Keeps only the optimizer state of parameters still in `module`: after the
/// front moves up, the state of newly frozen parameters is dropped.
///
/// Works with Burn's optimizers (`OptimizerAdaptor`), whose record is a map
/// from parameter id to state.
pub fn retain_optimizer_state<O, Mo, B, R, S>(optim: O, module: &Mo) -> O
where
    B: AutodiffBackend,
    Mo: AutodiffModule<B>,
    O: burn::optim::Optimizer<Mo, B, Record = hashbrown::HashMap<burn::module::ParamId, R, S>>,
{
    let keep: std::collections::HashSet<_> =
        burn::module::list_param_ids(module).into_iter().collect();
    let mut record = optim.to_record();
    record.retain(|id, _| keep.contains(id));
    optim.load_record(record)
}
