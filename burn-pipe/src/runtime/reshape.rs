//! Moving units between stages, to the inner backend (freezing) and back
//! (thawing) or onto other devices (a replica), with the optimizer state
//! that follows them.

use burn::optim::Optimizer;
use burn::prelude::*;
use burn_freeze::fault;
use burn_freeze::plumbing::{GradientSums, StatePool, optimizer_for, pool_optimizer_state};
use burn_freeze::{ParamStates, StackOptimizer, StackTypes, TrainableUnits, UnitRange};

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
            retake_snapshot: false,
            gain_time: std::time::Duration::ZERO,
        })
    }
}
