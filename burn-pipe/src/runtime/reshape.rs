//! Moving units between stages, to the inner backend (freezing) and back
//! (thawing) or onto other devices (a replica), with the optimizer state
//! that follows them.

use burn::optim::Optimizer;
use burn::prelude::*;
use burn_freeze::fault;
use burn_freeze::plumbing::{GradientSums, StatePool, optimizer_for, pool_optimizer_state};
use burn_freeze::{
    ParamStates, StackOptimizer, StackTypes, TrainableUnits, UnitRange, check_freeze,
    check_unfreeze,
};

use crate::runtime::error::PipeError;
use crate::runtime::pipeline::Pipeline;
use crate::runtime::placement::{Stage, place, validate};

impl<S, O> Pipeline<S, O>
where
    S: StackTypes,
    O: Optimizer<TrainableUnits<S>, S::Backend>,
{
    /// Moves units between stages: afterwards stage `s` holds `balance[s]`
    /// units on `devices[s]`, each unit with its weights and its optimizer
    /// state. Training continues exactly as if the pipeline had always had
    /// this shape.
    ///
    /// Optimizer state is keyed by parameter id (true of every Burn optimizer
    /// through `OptimizerAdaptor`), so each unit's state follows it.
    ///
    /// Fails, changing nothing, on a bad balance or device list, or when
    /// gradients are pending.
    pub fn repartition(
        &mut self,
        balance: &[usize],
        devices: Vec<Device<S::Backend>>,
    ) -> Result<(), PipeError>
    where
        O: StackOptimizer<S>,
    {
        if self.stages.iter().any(|s| s.pending.is_some()) {
            return Err(PipeError::GradientsPending("repartition"));
        }
        fault::check(crate::fault::REPARTITION, None, None)?;
        validate(balance, self.num_units(), devices.len(), &self.config)?;
        let mut pool = StatePool::<O, TrainableUnits<S>, S::Backend>::new();
        let mut sums = GradientSums::new();
        let mut ranges = Vec::with_capacity(self.stages.len());
        for stage in self.stages.drain(..) {
            pool_optimizer_state(&stage.optimizer, &mut pool);
            if let Some(stage_sums) = stage.sums {
                sums.merge(stage_sums);
            }
            ranges.push(stage.units.expect("units present"));
        }
        let stack = UnitRange::join(ranges).expect("the stages cover the stack in order");
        let make = &self.make_optimizer;
        self.stages = place(stack, balance, self.front, devices, |trainable| {
            optimizer_for(make(), trainable, &mut pool)
        });
        if self.keep_sums {
            // Each unit's gradient sums follow it to its new stage.
            for stage in &mut self.stages {
                let taken = sums.take_for(stage.units().trainable(), &stage.device);
                stage.sums = Some(taken);
            }
        }
        tracing::debug!(?balance, "pipeline repartitioned");
        Ok(())
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
    pub fn freeze_to(&mut self, front: usize) -> Result<(), PipeError>
    where
        O: StackOptimizer<S>,
    {
        if self.stages.iter().any(|s| s.pending.is_some()) {
            return Err(PipeError::GradientsPending("freeze_to"));
        }
        check_freeze(front, self.front, self.num_units())?;
        for stage in &mut self.stages {
            if stage.units_mut().freeze_to(front) == 0 {
                continue;
            }
            let mut pool = StatePool::<O, TrainableUnits<S>, S::Backend>::new();
            pool_optimizer_state(&stage.optimizer, &mut pool);
            let fresh = (self.make_optimizer)();
            let trainable = stage.units().trainable();
            stage.optimizer = optimizer_for(fresh, trainable, &mut pool);
            if let Some(sums) = stage.sums.as_mut() {
                sums.retain(stage.units.as_ref().expect("units present").trainable());
            }
        }
        tracing::debug!(
            from = self.front,
            to = front,
            "pipeline freeze front moved up"
        );
        self.front = front;
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
    pub fn unfreeze_to(&mut self, front: usize) -> Result<(), PipeError>
    where
        O: StackOptimizer<S>,
    {
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
            // The units that trained keep their state; the thawed ones
            // have none in the pool, so they start fresh.
            let mut pool = StatePool::<O, TrainableUnits<S>, S::Backend>::new();
            pool_optimizer_state(&stage.optimizer, &mut pool);
            let fresh = (self.make_optimizer)();
            stage.optimizer = optimizer_for(fresh, stage.units().trainable(), &mut pool);
            if let (Some(sums), Some(units)) = (stage.sums.as_mut(), stage.units.as_ref()) {
                sums.retain(units.trainable());
            }
        }
        if let Some(cache) = self.cache.as_mut() {
            cache.invalidate_above(front);
        }
        for norm in self.norms.iter_mut().take(self.front).skip(front) {
            *norm = None;
        }
        tracing::debug!(
            from = self.front,
            to = front,
            "pipeline freeze front moved down (thaw)"
        );
        self.front = front;
        Ok(())
    }

    /// Every stage's optimizer state as one record keyed by parameter id,
    /// to save in a checkpoint (Burn's recorders serialise it).
    pub fn optimizer_record(&self) -> O::Record
    where
        O: StackOptimizer<S>,
    {
        let mut pool = StatePool::<O, TrainableUnits<S>, S::Backend>::new();
        for stage in &self.stages {
            pool_optimizer_state(&stage.optimizer, &mut pool);
        }
        O::Record::from_states(pool.into_iter().collect())
    }

    /// Loads a record of [`optimizer_record`](Self::optimizer_record): each
    /// stage takes the states of its trainable units' parameters (by id);
    /// the others are dropped.
    pub fn load_optimizer_record(&mut self, record: O::Record)
    where
        O: StackOptimizer<S>,
    {
        let mut pool: StatePool<O, TrainableUnits<S>, S::Backend> =
            record.into_states().into_iter().collect();
        for stage in &mut self.stages {
            let fresh = (self.make_optimizer)();
            stage.optimizer = optimizer_for(fresh, stage.units().trainable(), &mut pool);
        }
    }

    /// A copy of this pipeline on `devices` (one per stage): the same units
    /// (weights and parameter ids), freeze front, balance, optimizer state
    /// and configuration, as fresh parameter leaves on the new devices; the
    /// copy has no cache and no gradient. This is how a data-parallel group
    /// adds a replica.
    ///
    /// Fails, changing nothing, when gradients are pending or there is not
    /// one device per stage.
    pub fn replicate(&self, devices: Vec<Device<S::Backend>>) -> Result<Self, PipeError> {
        if self.stages.iter().any(|s| s.pending.is_some()) {
            return Err(PipeError::GradientsPending("replicate"));
        }
        fault::check(crate::fault::REPLICATE, None, None)?;
        if devices.len() != self.stages.len() {
            return Err(PipeError::DeviceCount {
                devices: devices.len(),
                stages: self.stages.len(),
            });
        }
        let stages = self
            .stages
            .iter()
            .zip(devices)
            .map(|(stage, device)| Stage {
                units: Some(stage.units().clone().fork(&device)),
                optimizer: stage.optimizer.clone(),
                range: stage.range.clone(),
                pending: None,
                sums: stage.sums.as_ref().map(|sums| sums.to_device(&device)),
                snapshot: None,
                device,
            })
            .collect();
        Ok(Self {
            stages,
            front: self.front,
            config: self.config.clone(),
            make_optimizer: self.make_optimizer.clone(),
            norms: self.norms.clone(),
            cache: None,
            keep_sums: self.keep_sums,
            gains: self.gains.clone(),
            gains_from: self.gains_from,
            gain_time: std::time::Duration::ZERO,
        })
    }
}
