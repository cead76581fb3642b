//! AutoFreeze: a policy driving a stack's freeze front.

use super::{FreezePolicy, FreezeState, LayerMap};
use crate::error::FreezeError;
use crate::freeze_front::FreezeFront;

/// Drives the front of anything with a [`FreezeFront`] (a
/// [`FreezableStack`](crate::FreezableStack), a pipeline, a replica group)
/// with a [`FreezePolicy`], in layers mapped to units by a [`LayerMap`].
///
/// Call [`prepare`](Self::prepare) once before training,
/// [`after_step`](Self::after_step) after each optimizer step (it reads
/// the step's per-unit gradient norms from the target: no extra backward
/// pass) and [`after_epoch`](Self::after_epoch) at the end of each epoch.
///
/// ```
/// use burn_freeze::{AutoFreeze, FixedSchedule, LayerMap};
///
/// let auto = AutoFreeze::new(FixedSchedule::alpha(12, 0.5), LayerMap::uniform(1, 2, 12, 27).unwrap());
/// assert_eq!(auto.frozen_layers(), 0);
/// ```
#[derive(Debug, Clone)]
pub struct AutoFreeze<P> {
    policy: P,
    map: LayerMap,
    state: FreezeState,
    /// Whether the policy wants a held-out loss after the step just taken
    /// (decided by [`after_step`](Self::after_step)).
    held_out_due: bool,
}

impl<P: FreezePolicy> AutoFreeze<P> {
    /// Starts with nothing frozen.
    pub fn new(policy: P, map: LayerMap) -> Self {
        let state = FreezeState {
            frozen_layers: 0,
            num_layers: map.num_layers(),
            epoch: 0,
            step: 0,
        };
        Self {
            policy,
            map,
            state,
            held_out_due: false,
        }
    }

    /// Layers frozen now.
    pub fn frozen_layers(&self) -> usize {
        self.state.frozen_layers
    }

    /// Where training stands: layers frozen, epochs and steps so far.
    pub fn state(&self) -> FreezeState {
        self.state
    }

    /// The layer map.
    pub fn map(&self) -> &LayerMap {
        &self.map
    }

    /// The most layers a decision freezes: every layer but those whose
    /// freezing would leave no unit to train (a stack with every unit
    /// frozen cannot step). With a layer per unit, that spares the last.
    ///
    /// ```
    /// use burn_freeze::{AutoFreeze, FixedSchedule, LayerMap};
    ///
    /// let per_unit = AutoFreeze::new(FixedSchedule::alpha(4, 1.0), LayerMap::per_unit(4));
    /// assert_eq!(per_unit.most_frozen_layers(), 3);
    /// // A BERT's blocks: the head after them always trains.
    /// let blocks = AutoFreeze::new(FixedSchedule::alpha(12, 1.0), LayerMap::uniform(1, 2, 12, 27).unwrap());
    /// assert_eq!(blocks.most_frozen_layers(), 12);
    /// ```
    pub fn most_frozen_layers(&self) -> usize {
        (0..=self.state.num_layers)
            .rev()
            .find(|&layers| self.map.unit_front(layers) < self.map.num_units())
            .unwrap_or(0)
    }

    /// The policy.
    pub fn policy(&self) -> &P {
        &self.policy
    }

    /// Where training stands and the policy's statistics, for a checkpoint.
    pub fn save_state(&self) -> (FreezeState, Option<super::PolicyState>) {
        (self.state, self.policy.save_state())
    }

    /// Restores what [`save_state`](Self::save_state) gave (the target's
    /// front is restored separately).
    pub fn load_state(&mut self, state: FreezeState, policy: Option<super::PolicyState>) {
        self.state = state;
        self.held_out_due = false;
        if let Some(policy) = policy {
            self.policy.load_state(policy);
        }
    }

    /// Prepares `target` for the policy before the first step: when the
    /// policy [needs the epoch's accumulated gradients](FreezePolicy::needs_gradient_sums),
    /// the target starts keeping a running sum per trainable parameter
    /// ([`FreezeFront::set_gradient_sums`]); when it
    /// [needs update gains](FreezePolicy::needs_update_gains), the target
    /// measures them from the first layer's unit on
    /// ([`FreezeFront::set_update_gains`]). [`after_step`](Self::after_step)
    /// does it too (asking again changes nothing), so a target never
    /// prepared misses only its first steps.
    pub fn prepare<T: FreezeFront>(&self, target: &mut T) {
        if self.policy.needs_gradient_sums() {
            target.set_gradient_sums(true);
        }
        if self.policy.needs_update_gains() {
            target.set_update_gains(Some(self.map.first_unit()));
        }
    }

    /// Feeds the policy the per-layer gradient norms of the step `target`
    /// just took and applies its decision (a front below the current one
    /// thaws). Returns the new layer front when it moved.
    pub fn after_step<T: FreezeFront>(
        &mut self,
        target: &mut T,
    ) -> Result<Option<usize>, T::Error> {
        self.validate(target.num_units())?;
        self.prepare(target);
        self.state.step += 1;
        if self.policy.needs_update_gains() {
            let units = target.last_update_gains();
            let total = units.iter().flatten().copied().reduce(|a, b| a + b);
            let layers = self.map.layer_sums(&units);
            self.policy.update_gains(self.state, &layers, total);
        }
        let norms = self.map.layer_norms(&target.last_gradient_norms());
        let decision = self.policy.after_step(self.state, &norms);
        self.held_out_due = self.policy.held_out_every().is_some_and(|every| {
            self.state.step > 0 && self.state.step.is_multiple_of(every.max(1))
        });
        if self.held_out_due && self.policy.needs_update_gains() {
            // The gains from here on measure the moves since this check.
            target.restart_update_gains();
        }
        self.apply(target, decision)
    }

    /// Whether the policy wants a held-out loss after the step just taken
    /// ([`FreezePolicy::held_out_every`]); ask after
    /// [`after_step`](Self::after_step), then give it to
    /// [`held_out_loss`](Self::held_out_loss).
    pub fn wants_held_out_loss(&self) -> bool {
        self.held_out_due
    }

    /// Feeds the policy a held-out loss measured after the last step and
    /// applies its decision (a front below the current one thaws). Returns
    /// the new layer front when it moved.
    pub fn held_out_loss<T: FreezeFront>(
        &mut self,
        target: &mut T,
        loss: f64,
    ) -> Result<Option<usize>, T::Error> {
        self.validate(target.num_units())?;
        self.read_check_sums(target);
        let decision = self.policy.held_out_loss(self.state, loss);
        self.apply(target, decision)
    }

    /// Tells the policy how many steps the epoch about to start has
    /// ([`FreezePolicy::epoch_steps`]): a trainer calls it before each
    /// epoch, so that checks scale with the run.
    pub fn begin_epoch(&mut self, steps: usize) {
        self.policy.epoch_steps(steps);
    }

    /// Before a checkpoint, so that a resumed run decides as the run it
    /// continues: a policy that reads its gradient sums per check
    /// ([`FreezePolicy::gradient_sums_per_check`]) gets them now and they
    /// start again (the sums are not saved, the policy's state is); the
    /// target's weight snapshots for update gains are dropped (not saved
    /// either: the step after a checkpoint reads no gain, in a resumed run
    /// and in the run that goes on alike). Nothing for other policies.
    pub fn before_checkpoint<T: FreezeFront>(&mut self, target: &mut T) {
        self.read_check_sums(target);
        if self.policy.needs_update_gains() {
            target.set_update_gains(None);
            target.set_update_gains(Some(self.map.first_unit()));
        }
    }

    /// The per-check reading of the target's gradient sums, then reset.
    fn read_check_sums<T: FreezeFront>(&mut self, target: &mut T) {
        if self.policy.needs_gradient_sums() && self.policy.gradient_sums_per_check() {
            let norms = self.map.layer_norms(&target.gradient_sum_norms());
            self.policy.check_gradient_sums(self.state, &norms);
            target.reset_gradient_sums();
        }
    }

    /// Asks the policy at the end of an epoch and applies its decision.
    /// Returns the new layer front when it moved.
    ///
    /// A policy that [needs them](FreezePolicy::needs_gradient_sums) first
    /// gets the per-layer norms of the epoch's accumulated gradients
    /// ([`FreezePolicy::epoch_gradient_sums`]), and the target's sums are
    /// reset for the next epoch.
    pub fn after_epoch<T: FreezeFront>(
        &mut self,
        target: &mut T,
    ) -> Result<Option<usize>, T::Error> {
        self.validate(target.num_units())?;
        let sums = self.policy.needs_gradient_sums();
        if sums {
            let norms = self.map.layer_norms(&target.gradient_sum_norms());
            self.policy.epoch_gradient_sums(self.state, &norms);
        }
        let decision = self.policy.after_epoch(self.state);
        self.state.epoch += 1;
        if sums {
            target.reset_gradient_sums();
        }
        self.apply(target, decision)
    }

    fn validate(&self, len: usize) -> Result<(), FreezeError> {
        if self.map.num_units() != len {
            return Err(FreezeError::MapBeyondStack {
                map_end: self.map.num_units(),
                len,
            });
        }
        Ok(())
    }

    /// Applies a decision: a layer front above the current one freezes, one
    /// below thaws ([`FreezeFront::unfreeze_to`]), each moving the target's
    /// unit front to [`LayerMap::unit_front`]; a front that would leave no
    /// unit to train is clamped to [`most_frozen_layers`](Self::most_frozen_layers).
    /// On error neither the target nor the state changes.
    fn apply<T: FreezeFront>(
        &mut self,
        target: &mut T,
        decision: Option<usize>,
    ) -> Result<Option<usize>, T::Error> {
        let Some(layers) = decision else {
            return Ok(None);
        };
        let layers = layers.min(self.most_frozen_layers());
        if layers == self.state.frozen_layers {
            return Ok(None);
        }
        let units = self.map.unit_front(layers);
        if layers > self.state.frozen_layers && units > target.front() {
            target.freeze_to(units)?;
        } else if layers < self.state.frozen_layers && units < target.front() {
            target.unfreeze_to(units)?;
        }
        tracing::debug!(
            from = self.state.frozen_layers,
            to = layers,
            units,
            "AutoFreeze moved the front"
        );
        self.state.frozen_layers = layers;
        Ok(Some(layers))
    }
}
