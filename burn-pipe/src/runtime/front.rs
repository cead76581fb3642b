//! The pipeline's freeze front and AutoCache, through the traits every
//! level implements ([`FreezeFront`], [`CacheHolder`]): the state lives in
//! the stages (units, optimizer, gradient sums, weight snapshots) and the
//! cache serves stage 0.

use burn_freeze::plumbing::{
    GradientSums, StatePool, above_front, optimizer_for, pool_optimizer_state, set_gains_from,
};
use burn_freeze::{
    CacheHolder, FreezeFront, GradNorm, StackCache, StackOptimizer, StackTypes, TrainableUnits,
    check_freeze, check_unfreeze,
};

use crate::runtime::error::PipeError;
use crate::runtime::pipeline::Pipeline;
use crate::runtime::placement::Stage;

impl<S: StackTypes, O> CacheHolder for Pipeline<S, O> {
    type Stack = S;

    /// Stage 0's: it serves the frozen units it holds
    /// ([`serve_prefix`](Pipeline::serve_prefix)).
    fn cache_slot(&mut self) -> Option<&mut Option<StackCache<S>>> {
        Some(&mut self.cache)
    }

    fn cache(&self) -> Option<&StackCache<S>> {
        self.cache.as_ref()
    }
}

impl<S: StackTypes, O: StackOptimizer<S>> FreezeFront for Pipeline<S, O> {
    type Error = PipeError;

    fn num_units(&self) -> usize {
        Pipeline::num_units(self)
    }

    fn front(&self) -> usize {
        self.front
    }

    /// Freezes units `0..front`: they move to the inner backend on the stage
    /// that holds them, run forward only, and lose their optimizer state. The
    /// front only moves up, to at most every unit
    /// ([`check_freeze`](burn_freeze::check_freeze), the rule
    /// [`FreezableStack`](burn_freeze::FreezableStack) follows too); with
    /// every unit frozen a training step fails with
    /// [`PipeError::NothingToTrain`].
    ///
    /// Fails, changing nothing, when `front` is below the current front or
    /// beyond the stack, or when gradients are pending.
    fn freeze_to(&mut self, front: usize) -> Result<(), PipeError> {
        if self.stages.iter().any(|s| s.pending.is_some()) {
            return Err(PipeError::GradientsPending("freeze_to"));
        }
        check_freeze(front, self.front, self.num_units())?;
        for stage in &mut self.stages {
            if stage.units_mut().freeze_to(front) == 0 {
                continue;
            }
            retrain(stage, &*self.make_optimizer);
        }
        self.move_front(front);
        Ok(())
    }

    /// Thaws units `front..front()`: on the stage that holds them they move
    /// back to the autodiff backend and train again. The front only moves
    /// down ([`check_unfreeze`](burn_freeze::check_unfreeze)).
    ///
    /// A thawed unit starts with a *fresh* optimizer state, as its state
    /// was dropped when it froze ([`freeze_to`](Self::freeze_to)): frozen
    /// units hold no optimizer state, which is what freezing frees and what
    /// memory-aware AutoPipe counts, and moments from before the freeze
    /// describe a model whose upper layers have moved since. Its gradient
    /// sums (when kept) start empty, and the attached cache drops every
    /// entry above `front`, so a cached prefix longer than the front is
    /// never served.
    ///
    /// Fails, changing nothing, when `front` is above the current front or
    /// when gradients are pending.
    ///
    /// ```
    /// use burn::backend::{Autodiff, Flex};
    /// use burn::nn::{Linear, LinearConfig};
    /// use burn::optim::SgdConfig;
    /// use burn::prelude::*;
    /// use burn_freeze::{FreezeFront, LayerStack};
    /// use burn_pipe::{PipeError, PipelineConfig};
    ///
    /// #[derive(Module, Debug)]
    /// pub struct Dense<B: Backend> { linear: Linear<B> }
    /// impl<B: Backend> Dense<B> {
    ///     pub fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> { self.linear.forward(x) }
    /// }
    /// burn_freeze::unit!(Dense<B>: Tensor<B, 2> => Tensor<B, 2>);
    ///
    /// type B = Autodiff<Flex>;
    /// let device = Default::default();
    /// let dense = |i, o| Dense::<B> { linear: LinearConfig::new(i, o).init(&device) };
    /// let stack = LayerStack::new(dense(3, 4), vec![dense(4, 4), dense(4, 4)], dense(4, 2));
    /// let mut pipe = PipelineConfig::new()
    ///     .with_balance(Some(vec![2, 2]))
    ///     .init(stack, vec![device; 2], || SgdConfig::new().init())?;
    /// pipe.freeze_to(3)?;
    /// pipe.unfreeze_to(1)?; // units 1 and 2 train again, on their stages
    /// assert_eq!(pipe.front(), 1);
    /// assert!(matches!(pipe.unfreeze_to(2), Err(PipeError::Freeze(_))));
    /// assert_eq!(pipe.front(), 1);
    /// # Ok::<(), PipeError>(())
    /// ```
    fn unfreeze_to(&mut self, front: usize) -> Result<(), PipeError> {
        if self.stages.iter().any(|s| s.pending.is_some()) {
            return Err(PipeError::GradientsPending("unfreeze_to"));
        }
        check_unfreeze(front, self.front)?;
        if front == self.front {
            return Ok(());
        }
        for stage in &mut self.stages {
            if stage.units_mut().unfreeze_to(front) == 0 {
                continue;
            }
            retrain(stage, &*self.make_optimizer);
        }
        if let Some(cache) = self.cache.as_mut() {
            cache.invalidate_above(front);
        }
        for norm in self.norms.iter_mut().take(self.front).skip(front) {
            *norm = None;
        }
        self.move_front(front);
        Ok(())
    }

    fn last_gradient_norms(&self) -> Vec<Option<GradNorm>> {
        above_front(&self.norms, self.front)
    }

    /// Every stage keeps the sums of its own units' gradients, on its
    /// device; they follow the units through
    /// [`repartition`](Pipeline::repartition) and
    /// [`replicate`](Pipeline::replicate), and a frozen unit's are dropped.
    fn set_gradient_sums(&mut self, keep: bool) {
        if keep == self.keep_sums {
            return;
        }
        self.keep_sums = keep;
        for stage in &mut self.stages {
            stage.sums = keep.then(GradientSums::new);
        }
    }

    fn gradient_sum_norms(&self) -> Vec<Option<GradNorm>> {
        if !self.keep_sums {
            return vec![None; self.num_units()];
        }
        // Once an epoch: stage after stage, each read from its device once.
        let front = self.front;
        self.stages
            .iter()
            .flat_map(|stage| match &stage.sums {
                None => vec![None; stage.range.len()],
                Some(sums) => stage.units().unit_gradient_sum_norms(sums),
            })
            .enumerate()
            .map(|(unit, norm)| norm.filter(|_| unit >= front))
            .collect()
    }

    fn reset_gradient_sums(&mut self) {
        for stage in &mut self.stages {
            if let Some(sums) = stage.sums.as_mut() {
                sums.clear();
            }
        }
    }

    /// Every stage keeps a snapshot of its trainable weights (of units
    /// `from..`), taken before its first step and again after each
    /// restart (one more copy of them); a repartition drops the
    /// snapshots, so the first step after it reads no gain.
    fn set_update_gains(&mut self, from: Option<usize>) {
        if set_gains_from(&mut self.gains_from, &mut self.gains, from) {
            for stage in &mut self.stages {
                stage.snapshot = None;
            }
        }
    }

    fn restart_update_gains(&mut self) {
        self.retake_snapshot = true;
    }

    fn last_update_gains(&self) -> Vec<Option<f64>> {
        above_front(&self.gains, self.front)
    }
}

impl<S: StackTypes, O> Pipeline<S, O> {
    /// Records the new freeze front, once every stage has moved its units.
    fn move_front(&mut self, front: usize) {
        let up = front > self.front;
        tracing::debug!(
            from = self.front,
            to = front,
            up,
            "pipeline freeze front moved"
        );
        self.front = front;
    }
}

/// After some of `stage`'s units froze or thawed: its optimizer keeps the
/// state of the units that trained before and still train (a frozen unit's
/// is dropped, a thawed unit starts fresh: none is in the pool), and its
/// gradient sums keep those units' only.
fn retrain<S, O>(stage: &mut Stage<S, O>, make_optimizer: &dyn Fn() -> O)
where
    S: StackTypes,
    O: StackOptimizer<S>,
{
    let mut pool = StatePool::<O, TrainableUnits<S>, S::Backend>::new();
    pool_optimizer_state(&stage.optimizer, &mut pool);
    stage.optimizer = optimizer_for(make_optimizer(), stage.units().trainable(), &mut pool);
    if let (Some(sums), Some(units)) = (stage.sums.as_mut(), stage.units.as_ref()) {
        sums.retain(units.trainable());
    }
}
