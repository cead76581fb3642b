//! Anything with a freeze front, so that one policy drives a stack, a
//! pipeline or a group of replicas alike.

use crate::error::FreezeError;
use crate::policy::GradNorm;

/// A model whose units `0..front()` are frozen, whose front moves up
/// ([`freeze_to`](Self::freeze_to)) and down ([`unfreeze_to`](Self::unfreeze_to)),
/// and which remembers the per-unit gradient norms of its last training step.
///
/// [`AutoFreeze`](crate::AutoFreeze) drives any implementation with any
/// [`FreezePolicy`](crate::FreezePolicy): [`FreezableStack`](crate::FreezableStack)
/// in this crate, and whatever crates built on it implement it for (a
/// pipeline of stages, a group of data-parallel replicas).
///
/// ```
/// use burn_freeze::{FreezeFront, FreezeError, GradNorm};
///
/// /// A stand-in with 4 units and fixed norms.
/// struct Toy { front: usize }
/// impl FreezeFront for Toy {
///     type Error = FreezeError;
///     fn num_units(&self) -> usize { 4 }
///     fn front(&self) -> usize { self.front }
///     fn freeze_to(&mut self, front: usize) -> Result<(), FreezeError> {
///         burn_freeze::check_freeze(front, self.front, 4)?;
///         self.front = front;
///         Ok(())
///     }
///     fn unfreeze_to(&mut self, front: usize) -> Result<(), FreezeError> {
///         burn_freeze::check_unfreeze(front, self.front)?;
///         self.front = front;
///         Ok(())
///     }
///     fn last_gradient_norms(&self) -> Vec<Option<GradNorm>> { vec![None; 4] }
/// }
///
/// let mut toy = Toy { front: 0 };
/// toy.freeze_to(2).unwrap();
/// assert!(toy.freeze_to(1).is_err()); // freeze_to only moves up
/// toy.unfreeze_to(1).unwrap(); // unit 1 trains again
/// assert_eq!(toy.front(), 1);
/// assert!(toy.unfreeze_to(3).is_err()); // unfreeze_to only moves down
/// assert_eq!(toy.front(), 1);
/// ```
pub trait FreezeFront {
    /// What a refused [`freeze_to`](Self::freeze_to) or
    /// [`unfreeze_to`](Self::unfreeze_to) returns.
    type Error: std::error::Error + From<FreezeError>;

    /// Number of units, frozen or not.
    fn num_units(&self) -> usize;

    /// The freeze front: units `0..front()` are frozen.
    fn front(&self) -> usize;

    /// Freezes units `0..front`. The front only moves up, to at most
    /// [`num_units`](Self::num_units) ([`check_freeze`](crate::check_freeze)
    /// is the rule); on error nothing changes.
    fn freeze_to(&mut self, front: usize) -> Result<(), Self::Error>;

    /// Thaws units `front..front()`: they train again. The front only moves
    /// down ([`check_unfreeze`](crate::check_unfreeze) is the rule: a
    /// `front` above the current one is
    /// [`FreezeError::WouldFreeze`]); on error nothing changes.
    ///
    /// A thawed unit starts with a *fresh* optimizer state (where the
    /// target holds the optimizer, as a pipeline and a replica group do)
    /// and no gradient sum. Frozen units hold no optimizer state: dropping it is what
    /// freezing frees, and what memory-aware AutoPipe counts; and moments
    /// from before the freeze describe a model whose upper layers have
    /// moved since. Cached activations that passed through a thawed unit
    /// (entries above `front`) are dropped, so a cached prefix longer than
    /// the front is never served again.
    fn unfreeze_to(&mut self, front: usize) -> Result<(), Self::Error>;

    /// Per-unit gradient norms of the last training step, one entry per
    /// unit; `None` for frozen units, for units that got no gradient, and
    /// for every unit before the first step.
    fn last_gradient_norms(&self) -> Vec<Option<GradNorm>>;

    /// Starts (`true`) or stops (`false`, dropping them) keeping a running
    /// sum of each trainable parameter's gradients, the gradients the
    /// optimizer sees, for [`gradient_sum_norms`](Self::gradient_sum_norms).
    /// Starting when they are kept already changes nothing. A policy whose
    /// [`needs_gradient_sums`](crate::FreezePolicy::needs_gradient_sums) is
    /// true needs them; [`AutoFreeze::prepare`](crate::AutoFreeze::prepare)
    /// starts them.
    ///
    /// The default ignores the request: a target that keeps no sums
    /// reports none, and a policy that needs them then keeps its front.
    fn set_gradient_sums(&mut self, keep: bool) {
        let _ = keep;
    }

    /// Per-unit norms of the gradients summed since the sums were started
    /// or last [reset](Self::reset_gradient_sums), one entry per unit:
    /// `None` for frozen units, units that got no gradient, and every unit
    /// when no sums are kept (the default).
    fn gradient_sum_norms(&self) -> Vec<Option<GradNorm>> {
        vec![None; self.num_units()]
    }

    /// Drops the sums so far (they stay kept): the next step starts a new
    /// accumulation. The default does nothing.
    fn reset_gradient_sums(&mut self) {}

    /// Starts (`Some(from)`: units `from..` on) or stops (`None`)
    /// measuring each unit's update gain,
    /// [`last_update_gains`](Self::last_update_gains): a snapshot of those
    /// trainable units' weights, taken before the first optimizer step and
    /// again after each [`restart_update_gains`](Self::restart_update_gains)
    /// (one more copy of them); asking for what is measured already changes
    /// nothing. A
    /// policy whose
    /// [`needs_update_gains`](crate::FreezePolicy::needs_update_gains) is
    /// true needs them; [`AutoFreeze::prepare`](crate::AutoFreeze::prepare)
    /// starts them from the first layer's unit. The default ignores the
    /// request.
    fn set_update_gains(&mut self, from: Option<usize>) {
        let _ = from;
    }

    /// Starts a new span of update gains: the next step reads its gain
    /// against the snapshot as it is, then takes a new one (its weights
    /// before its optimizer step), which the steps after read against. A
    /// policy calls it at each of its checks, so that a gain measures the
    /// move since the last check. The default ignores it.
    fn restart_update_gains(&mut self) {}

    /// Per-unit update gains of the last training step, one entry per
    /// unit: minus the dot product of the step's gradient with the unit's
    /// move since the snapshot (`-<g_t, W_t - W_s>`, `s` the step of the
    /// last [`restart_update_gains`](Self::restart_update_gains): how much,
    /// to first order, the moves since then lowered the loss on this step's
    /// batch, which none of them saw; see
    /// [`plumbing::WeightSnapshot`](crate::plumbing::WeightSnapshot)).
    /// `None` for frozen units, units without a gradient or a snapshot, and
    /// every unit when gains are not measured (the default).
    fn last_update_gains(&self) -> Vec<Option<f64>> {
        vec![None; self.num_units()]
    }
}

/// Per-unit readings of the last step (`values[u]`: unit `u`'s) with the
/// units below `front` cleared: a frozen unit reports none. What every
/// [`FreezeFront`] returns from [`last_gradient_norms`](FreezeFront::last_gradient_norms)
/// and [`last_update_gains`](FreezeFront::last_update_gains).
///
/// ```
/// use burn_freeze::plumbing::above_front;
///
/// assert_eq!(above_front(&[Some(1.0), Some(2.0), None, Some(4.0)], 2), [None, None, None, Some(4.0)]);
/// ```
pub fn above_front<T: Copy>(values: &[Option<T>], front: usize) -> Vec<Option<T>> {
    values
        .iter()
        .enumerate()
        .map(|(unit, value)| value.filter(|_| unit >= front))
        .collect()
}
