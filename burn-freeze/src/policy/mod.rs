//! AutoFreeze: when to move the freeze front, and how far.
//!
//! The rules ([`FreezePolicy`] implementations), the default first:
//! - [`Evidence`] (settings [`EvidenceConfig`]), the default: a few checks
//!   an epoch on per-layer evidence ([`LayerSignal`]) and a held-out loss;
//!   a freeze the held-out loss rises after is thawed.
//! - [`AlphaArgmin`] ([`AlphaArgminConfig`], [`ArgminStatistic`]),
//!   PipeTransformer's rule: the alpha bound and the argmin of per-layer
//!   gradient norms, once per epoch.
//! - [`ChangeRate`] ([`ChangeRateConfig`], [`ChangeRateReading`]), the
//!   gradient-change rule of Liu et al., every N steps.
//! - [`FixedSchedule`]: a fixed list of fronts per epoch, or the alpha
//!   closed form ([`alpha_front`]).
//!
//! Each rule's settings are checked by the rule's own `validate`, which
//! returns a [`PolicyConfigError`](crate::PolicyConfigError) naming the
//! field, the value and the range. [`AutoFreeze`] drives a rule, reading
//! per-layer statistics through a [`LayerMap`] ([`GradNorm`]); a rule's
//! checkpoint state is one typed serde value ([`PolicyState`]).

mod alpha;
mod alpha_argmin;
mod auto;
mod change_rate;
mod consistency;
mod evidence;
mod gain_window;
pub(crate) mod layer_map;
mod schedule;

pub use alpha::alpha_front;
pub use alpha_argmin::{AlphaArgmin, AlphaArgminConfig, ArgminStatistic};
pub use auto::AutoFreeze;
pub use change_rate::{ChangeRate, ChangeRateConfig, ChangeRateReading};
pub use evidence::{Evidence, EvidenceConfig, LayerSignal};
pub use layer_map::{GradNorm, LayerMap};
pub use schedule::FixedSchedule;

/// Where training stands when a policy is asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FreezeState {
    /// Layers frozen now.
    pub frozen_layers: usize,
    /// Layers in the model.
    pub num_layers: usize,
    /// Epochs finished so far (0 during the first epoch).
    pub epoch: usize,
    /// Training steps taken so far, this one included.
    pub step: usize,
}

/// A rule that decides how many layers are frozen.
///
/// A policy returns a new layer front, or `None` to keep the current one. A
/// front below the current one thaws: [`AutoFreeze`] moves the target's
/// front down ([`FreezeFront::unfreeze_to`](crate::FreezeFront::unfreeze_to));
/// one beyond the model is clamped to it. The paper's rules
/// ([`AlphaArgmin`], [`ChangeRate`], [`FixedSchedule::Alpha`]) never
/// return a front below the current one; a [`FixedSchedule::Fronts`] list
/// that goes down thaws.
///
/// Every policy decides in *layers* (see [`LayerMap`]); [`AutoFreeze`] feeds
/// a policy the per-layer gradient norms of each step and moves a
/// [`FreezableStack`](crate::FreezableStack)'s front. The policies here:
/// [`Evidence`], the default, a few checks an epoch on per-layer evidence
/// ([`LayerSignal`]) and a held-out loss; [`AlphaArgmin`], the paper's
/// rule, once per epoch; [`ChangeRate`], the
/// gradient-change rule of Liu et al., every N steps; [`FixedSchedule`], a
/// fixed list of fronts per epoch, or the alpha closed form.
pub trait FreezePolicy {
    /// After every training step, with that step's per-layer gradient norms
    /// (`None` for frozen layers).
    fn after_step(&mut self, state: FreezeState, norms: &[Option<GradNorm>]) -> Option<usize> {
        let _ = (state, norms);
        None
    }

    /// Whether the policy reads the norms of each epoch's accumulated
    /// gradients ([`epoch_gradient_sums`](Self::epoch_gradient_sums)); the
    /// target then keeps a running sum per trainable parameter
    /// ([`FreezeFront::set_gradient_sums`](crate::FreezeFront::set_gradient_sums)).
    /// `false` by default.
    fn needs_gradient_sums(&self) -> bool {
        false
    }

    /// At the end of every epoch, just before [`after_epoch`](Self::after_epoch),
    /// when [`needs_gradient_sums`](Self::needs_gradient_sums): per layer,
    /// the norms of the sum of the layer's gradients over the epoch's steps
    /// (`None` for frozen layers and layers without a gradient).
    fn epoch_gradient_sums(&mut self, state: FreezeState, norms: &[Option<GradNorm>]) {
        let _ = (state, norms);
    }

    /// Whether the policy reads each step's update gains
    /// ([`update_gains`](Self::update_gains)); the target then keeps a
    /// snapshot of its trainable weights before each step
    /// ([`FreezeFront::set_update_gains`](crate::FreezeFront::set_update_gains)).
    /// `false` by default.
    fn needs_update_gains(&self) -> bool {
        false
    }

    /// After every training step, before [`after_step`](Self::after_step),
    /// when [`needs_update_gains`](Self::needs_update_gains): per layer, the
    /// update gain of the step (`None` for frozen layers and when there is
    /// none), and the gain of every trainable unit together, the layers'
    /// and the rest's (an embedding, a head), `None` when no unit has one.
    fn update_gains(&mut self, state: FreezeState, layers: &[Option<f64>], total: Option<f64>) {
        let _ = (state, layers, total);
    }

    /// Whether the policy reads its gradient sums at every held-out check
    /// too ([`check_gradient_sums`](Self::check_gradient_sums), the sums
    /// then reset), and before a checkpoint, not only at an epoch's end;
    /// `false` by default.
    fn gradient_sums_per_check(&self) -> bool {
        false
    }

    /// When [`gradient_sums_per_check`](Self::gradient_sums_per_check):
    /// just before each [`held_out_loss`](Self::held_out_loss) and before a
    /// checkpoint ([`AutoFreeze::before_checkpoint`](crate::AutoFreeze::before_checkpoint)),
    /// the per-layer norms of the gradients summed since the sums were last
    /// read (`None` for frozen layers); the sums then start again.
    fn check_gradient_sums(&mut self, state: FreezeState, norms: &[Option<GradNorm>]) {
        let _ = (state, norms);
    }

    /// Before each epoch, its number of steps (as far as the trainer
    /// knows it), for a policy whose checks scale with the run.
    fn epoch_steps(&mut self, steps: usize) {
        let _ = steps;
    }

    /// At the end of every epoch.
    fn after_epoch(&mut self, state: FreezeState) -> Option<usize> {
        let _ = state;
        None
    }

    /// Every how many steps the policy wants a held-out loss
    /// ([`held_out_loss`](Self::held_out_loss)); `None` (the default): never.
    fn held_out_every(&self) -> Option<usize> {
        None
    }

    /// A loss on samples that are never trained on, measured after step
    /// `state.step` with that step's weights (every rank of a job reads the
    /// same). Returns a front, as [`after_step`](Self::after_step) does;
    /// one below the current front thaws.
    fn held_out_loss(&mut self, state: FreezeState, loss: f64) -> Option<usize> {
        let _ = (state, loss);
        None
    }

    /// The statistics gathered since the last decision, for a checkpoint
    /// (`None`: the policy keeps none).
    fn save_state(&self) -> Option<PolicyState> {
        None
    }

    /// Restores what [`save_state`](Self::save_state) gave.
    fn load_state(&mut self, state: PolicyState) {
        let _ = state;
    }
}

/// A policy's statistics between decisions, as a checkpoint stores them.
///
/// Every rule of this crate writes its state as one typed serde value in
/// [`state`](Self::state) ([`PolicyState::typed`], read back by
/// [`PolicyState::read`]). `series` and `counter` are the layout that
/// [`ChangeRate`] and [`AlphaArgmin`] wrote before (ChangeRate: `series[0]`
/// the sums since the last evaluation, `series[1]` the sums at it,
/// `counter` its steps; AlphaArgmin: `series[0]` the summed step norms):
/// they still read a checkpoint written that way, and write them empty.
#[derive(Debug, Clone, PartialEq, Default, serde::Serialize, serde::Deserialize)]
pub struct PolicyState {
    /// Per-layer series (the layout before typed states; empty in new
    /// checkpoints of this crate's rules).
    #[serde(default)]
    pub series: Vec<Vec<Option<f64>>>,
    /// A step counter (the layout before typed states; 0 in new
    /// checkpoints of this crate's rules).
    #[serde(default)]
    pub counter: usize,
    /// A policy's typed state, serialised (`None` in a checkpoint written
    /// before typed states).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<serde_json::Value>,
}

impl PolicyState {
    /// `state`, a policy's typed state, serialised; `None` (with a warning)
    /// when it does not serialise (a map with non-string keys).
    ///
    /// ```
    /// use burn_freeze::PolicyState;
    ///
    /// #[derive(serde::Serialize, serde::Deserialize, PartialEq, Debug)]
    /// struct Mine { steps: usize }
    ///
    /// let saved = PolicyState::typed(&Mine { steps: 3 }).unwrap();
    /// assert_eq!(saved.read::<Mine>(), Some(Mine { steps: 3 }));
    /// ```
    pub fn typed<T: serde::Serialize>(state: &T) -> Option<Self> {
        match serde_json::to_value(state) {
            Ok(value) => Some(Self {
                state: Some(value),
                ..Self::default()
            }),
            Err(error) => {
                tracing::warn!(%error, "a freeze policy's state does not serialise: not checkpointed");
                None
            }
        }
    }

    /// The typed state [`typed`](Self::typed) wrote; `None` when there is
    /// none or it is not a `T` (with a warning: a checkpoint of another
    /// rule, say).
    pub fn read<T: serde::de::DeserializeOwned>(&self) -> Option<T> {
        let value = self.state.clone()?;
        match serde_json::from_value(value) {
            Ok(state) => Some(state),
            Err(error) => {
                tracing::warn!(%error, "a freeze policy's checkpointed state does not read: starting afresh");
                None
            }
        }
    }
}

/// A boxed policy is a policy, so a trainer can hold any of them (or a
/// user's own) behind one type.
///
/// ```
/// use burn_freeze::{FixedSchedule, FreezePolicy, FreezeState};
///
/// let mut policy: Box<dyn FreezePolicy + Send> = Box::new(FixedSchedule::Fronts(vec![0, 2]));
/// let state = FreezeState { frozen_layers: 0, num_layers: 4, epoch: 0, step: 0 };
/// assert_eq!(policy.after_epoch(state), Some(2));
/// ```
impl<P: FreezePolicy + ?Sized> FreezePolicy for Box<P> {
    fn after_step(&mut self, state: FreezeState, norms: &[Option<GradNorm>]) -> Option<usize> {
        (**self).after_step(state, norms)
    }

    fn needs_gradient_sums(&self) -> bool {
        (**self).needs_gradient_sums()
    }

    fn epoch_gradient_sums(&mut self, state: FreezeState, norms: &[Option<GradNorm>]) {
        (**self).epoch_gradient_sums(state, norms)
    }

    fn needs_update_gains(&self) -> bool {
        (**self).needs_update_gains()
    }

    fn update_gains(&mut self, state: FreezeState, layers: &[Option<f64>], total: Option<f64>) {
        (**self).update_gains(state, layers, total)
    }

    fn gradient_sums_per_check(&self) -> bool {
        (**self).gradient_sums_per_check()
    }

    fn check_gradient_sums(&mut self, state: FreezeState, norms: &[Option<GradNorm>]) {
        (**self).check_gradient_sums(state, norms)
    }

    fn epoch_steps(&mut self, steps: usize) {
        (**self).epoch_steps(steps)
    }

    fn after_epoch(&mut self, state: FreezeState) -> Option<usize> {
        (**self).after_epoch(state)
    }

    fn held_out_every(&self) -> Option<usize> {
        (**self).held_out_every()
    }

    fn held_out_loss(&mut self, state: FreezeState, loss: f64) -> Option<usize> {
        (**self).held_out_loss(state, loss)
    }

    fn save_state(&self) -> Option<PolicyState> {
        (**self).save_state()
    }

    fn load_state(&mut self, state: PolicyState) {
        (**self).load_state(state)
    }
}
