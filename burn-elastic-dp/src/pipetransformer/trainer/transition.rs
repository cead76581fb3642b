//! AutoPipe and AutoDP applied to the group: the shape rule asked ([`shape_rule`]), the group
//! repartitioned and resized to it; the unit costs it reads, profiled on the first batch if set.

use std::time::Instant;

use burn_freeze::{Differentiable, LayerStack, StackTypes};
use burn_pipe::profile_units;

use super::Trainer;
use super::bounds::{TrainerBackend, TrainerInput, TrainerOutput, TrainerTypes};
use super::error::TrainerError;
use super::log::Transition;
use super::rules::{CostModel, Parts};
use crate::error::ElasticError;
use crate::group::ReplicaGroup;
use crate::pipetransformer::shape::{MemoryFit, Shape, reshape};
use burn_pipe::UnitCosts;

/// What the shape rule is asked after the front moved to `front` from
/// `current`, with the parts that run, over `devices` devices: no stage
/// costlier than `initial_largest` (the paper's rule) or, with `memory`,
/// every stage within the memory budget (memory-aware AutoPipe).
pub(super) struct ShapeQuery<'a> {
    pub front: usize,
    pub current: &'a Shape,
    pub parts: Parts,
    pub devices: usize,
    pub initial_largest: f64,
    pub memory: Option<MemoryFit>,
}

/// The trainer's one call of the shape rule after a move (AutoPipe and
/// AutoDP's decision; the start is [`TrainerConfig::start_shape`](super::TrainerConfig)).
pub(super) fn shape_rule(costs: &UnitCosts, query: ShapeQuery<'_>) -> Shape {
    let rules = query
        .parts
        .reshaping(query.devices, query.initial_largest)
        .with_memory(query.memory);
    reshape(costs, query.front, query.current, &rules)
}

/// The unit costs before any profile: parameter counts, and whether a
/// profile on the first batch is still to replace them.
pub(super) fn starting_costs<S: StackTypes>(
    stack: &LayerStack<S>,
    costs: CostModel,
) -> (UnitCosts, bool) {
    // Parameter counts until the first batch is profiled.
    let (frozen_factor, profile_pending) = match costs {
        CostModel::Parameters { frozen_factor } => (frozen_factor, false),
        CostModel::Profiled { .. } => (1.0 / 3.0, true),
    };
    let costs = UnitCosts::from_params(&stack.unit_params(), frozen_factor);
    (costs, profile_pending)
}

/// Device lists of a shape: replica `r` on the next `K` devices.
pub(super) fn device_lists<D: Clone>(devices: &[D], shape: &Shape) -> Vec<Vec<D>> {
    let k = shape.stages();
    (0..shape.replicas)
        .map(|r| devices[r * k..(r + 1) * k].to_vec())
        .collect()
}

impl<TT: TrainerTypes> Trainer<TT> {
    /// The current shape, as the group runs it: units per stage (replica
    /// 0's; every replica has the same), replicas. A group that lost every
    /// replica has no stage.
    pub fn shape(&self) -> Shape {
        let replicas = self.group.num_replicas();
        let balance = match replicas {
            0 => Vec::new(),
            _ => self.group.replica(0).balance(),
        };
        Shape { balance, replicas }
    }

    /// Before the first step, with [`CostModel::Profiled`]: replaces the
    /// parameter-count costs by each unit's time measured on `input` (a copy
    /// of the model on the first device), and rebalances the starting
    /// pipeline on them. A run at one stage that nothing can deepen (the
    /// activations measured, or none to measure) profiles nothing: one
    /// stage has no balance, and no rule lengthens a pipeline (on MiniLM
    /// the profile cost seconds of every run's first epoch).
    pub(super) fn profile_if_pending(
        &mut self,
        input: &TrainerInput<TT>,
    ) -> Result<(), TrainerError>
    where
        TrainerOutput<TT>: Differentiable<TrainerBackend<TT>>,
    {
        let CostModel::Profiled { repeats } = self.config.costs else {
            return Ok(());
        };
        if !self.profile_pending {
            return Ok(());
        }
        if !self.memory_pending && self.shape().stages() == 1 {
            self.profile_pending = false;
            tracing::info!("one stage throughout: unit costs not profiled");
            return Ok(());
        }
        let stack = self.group.to_layer_stack()?;
        let profile = profile_units(&stack, input.clone(), &self.devices[0], repeats);
        // Every process balances on the same times: the slowest's.
        let profile = super::agree::unit_profiles(&self.group, profile)?;
        self.costs = UnitCosts::from_profile(&profile);
        self.profile_pending = false;
        self.restart_shape()?;
        tracing::info!(balance = ?self.shape().balance, "unit costs profiled; pipeline balanced on them");
        Ok(())
    }

    /// Moves the group to `after`: down to replica 0, `on_one` applied to
    /// it, replica 0 repartitioned, then copied to the new replicas (weights,
    /// parameter ids, front, optimizer state). A group across processes
    /// whose replica count stays is not taken down to one (its ranks would
    /// exchange their counts twice for nothing): `on_one` is applied to the
    /// whole group and every replica repartitioned. Across processes every
    /// rank makes the same move at the same step (AutoDP in lockstep).
    pub(super) fn reshape_through_one(
        &mut self,
        after: &Shape,
        on_one: impl FnOnce(&mut ReplicaGroup<TT::Stack, TT::Optimizer>) -> Result<(), ElasticError>,
    ) -> Result<(), TrainerError> {
        let current = self.shape();
        if self.group.spans_processes() && after.replicas == current.replicas {
            on_one(&mut self.group)?;
            self.group
                .repartition(&after.balance, device_lists(&self.devices, after))?;
            return Ok(());
        }
        if current.replicas > 1 {
            self.group
                .resize(device_lists(&self.devices, &current.with_replicas(1)))?;
        }
        on_one(&mut self.group)?;
        self.group.repartition(
            &after.balance,
            device_lists(&self.devices, &after.with_replicas(1)),
        )?;
        if after.replicas > 1 {
            self.group.resize(device_lists(&self.devices, after))?;
        }
        Ok(())
    }

    /// Moves the group from `current` to `target`: repartitioned in place
    /// when K and R stay, else through one replica; whether R changed.
    pub(super) fn move_to(
        &mut self,
        current: &Shape,
        target: &Shape,
    ) -> Result<bool, TrainerError> {
        if target.stages() == current.stages() && target.replicas == current.replicas {
            if target != current {
                self.group
                    .repartition(&target.balance, device_lists(&self.devices, target))?;
            }
            return Ok(false);
        }
        self.reshape_through_one(target, |_| Ok(()))?;
        Ok(target.replicas != current.replicas)
    }

    /// The shape for the front `front`, reached from `front_before` with
    /// the group in `before`. Up (or staying), the shape rule compresses
    /// from `before`. Down (a thaw), it cannot lengthen a pipeline, so the
    /// shape is derived from the start: the start shape (front 0), then
    /// the shape rule to `front`, so that AutoPipe lengthens the pipeline
    /// when the memory budget (or the paper's `initial_largest`) needs it
    /// and AutoDP runs fewer replicas.
    fn shape_after(
        &self,
        front_before: usize,
        front: usize,
        before: &Shape,
    ) -> Result<Shape, TrainerError> {
        let thawed = front < front_before;
        let start = if thawed {
            let devices = self.devices.len();
            let (start, _) = self
                .config
                .start_shape(&self.costs, &self.memory, devices)?;
            if front == 0 {
                return Ok(start);
            }
            Some(start)
        } else {
            None
        };
        Ok(shape_rule(
            &self.costs,
            ShapeQuery {
                front,
                current: start.as_ref().unwrap_or(before),
                parts: self.config.parts,
                devices: self.devices.len(),
                initial_largest: self.initial_largest,
                memory: self.memory_fit(),
            },
        ))
    }

    /// AutoPipe and AutoDP after the front moved from `front_before` (up,
    /// or down: see [`shape_after`](Self::shape_after)): the new shape,
    /// applied, logged and returned as a [`Transition`].
    pub(super) fn transition(&mut self, front_before: usize) -> Result<Transition, TrainerError> {
        let start = Instant::now();
        let front = self.group.front();
        let before = self.shape();
        let total_before = self.group.total_replicas();
        let after = self.shape_after(front_before, front, &before)?;
        self.move_to(&before, &after)?;
        let micro_batch_choice = self.choose_micro_batches();
        let record = Transition {
            epoch: self.epoch,
            step: self.steps,
            frozen_layers: self.auto.frozen_layers(),
            front: (front_before, front),
            stages: (before.stages(), after.stages()),
            replicas: (before.replicas, after.replicas),
            total_replicas: (total_before, self.group.total_replicas()),
            micro_batches: self.micro_batches(after.stages()),
            micro_batch_choice,
            balance: after.balance,
            millis: start.elapsed().as_secs_f64() * 1e3,
        };
        record.log();
        if let Some(log) = self.log.as_mut() {
            log.transition(&record)?;
        }
        Ok(record)
    }
}
