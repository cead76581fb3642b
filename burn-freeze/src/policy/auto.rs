//! AutoFreeze: a policy driving a stack's freeze front.

use burn::optim::GradientsParams;
use burn::tensor::backend::AutodiffBackend;

use super::{FreezePolicy, FreezeState, LayerMap};
use crate::error::FreezeError;
use crate::front::FreezableStack;
use crate::unit::Unit;

/// Drives a [`FreezableStack`]'s front with a [`FreezePolicy`], in layers
/// mapped to units by a [`LayerMap`].
///
/// Call [`after_step`](Self::after_step) with each step's gradients (the ones
/// given to the optimizer; no extra backward pass) and
/// [`after_epoch`](Self::after_epoch) at the end of each epoch.
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
        Self { policy, map, state }
    }

    /// Layers frozen now.
    pub fn frozen_layers(&self) -> usize {
        self.state.frozen_layers
    }

    /// The layer map.
    pub fn map(&self) -> &LayerMap {
        &self.map
    }

    /// The policy.
    pub fn policy(&self) -> &P {
        &self.policy
    }

    /// Feeds the policy this step's per-layer gradient norms (read from
    /// `grads`) and applies its decision. Returns the new layer front when it moved.
    pub fn after_step<B, F, M, L>(
        &mut self,
        stack: &mut FreezableStack<B, F, M, L>,
        grads: &GradientsParams,
    ) -> Result<Option<usize>, FreezeError>
    where
        B: AutodiffBackend,
        F: Unit<B>,
        M: Unit<B, Input = F::Output, Output = F::Output>,
        L: Unit<B, Input = F::Output>,
    {
        self.check(stack.len())?;
        self.state.step += 1;
        let norms = self.map.layer_norms(&stack.unit_gradient_norms(grads));
        let decision = self.policy.after_step(self.state, &norms);
        self.apply(stack, decision)
    }

    /// Asks the policy at the end of an epoch and applies its decision.
    /// Returns the new layer front when it moved.
    pub fn after_epoch<B, F, M, L>(
        &mut self,
        stack: &mut FreezableStack<B, F, M, L>,
    ) -> Result<Option<usize>, FreezeError>
    where
        B: AutodiffBackend,
        F: Unit<B>,
        M: Unit<B, Input = F::Output, Output = F::Output>,
        L: Unit<B, Input = F::Output>,
    {
        self.check(stack.len())?;
        let decision = self.policy.after_epoch(self.state);
        self.state.epoch += 1;
        self.apply(stack, decision)
    }

    fn check(&self, len: usize) -> Result<(), FreezeError> {
        if self.map.num_units() != len {
            return Err(FreezeError::MapBeyondStack {
                map_end: self.map.num_units(),
                len,
            });
        }
        Ok(())
    }

    fn apply<B, F, M, L>(
        &mut self,
        stack: &mut FreezableStack<B, F, M, L>,
        decision: Option<usize>,
    ) -> Result<Option<usize>, FreezeError>
    where
        B: AutodiffBackend,
        F: Unit<B>,
        M: Unit<B, Input = F::Output, Output = F::Output>,
        L: Unit<B, Input = F::Output>,
    {
        let Some(layers) = decision else {
            return Ok(None);
        };
        let layers = layers.min(self.state.num_layers);
        if layers <= self.state.frozen_layers {
            return Ok(None);
        }
        let units = self.map.unit_front(layers);
        if units > stack.front() {
            stack.freeze_to(units)?;
        }
        tracing::info!(
            from = self.state.frozen_layers,
            to = layers,
            units,
            "AutoFreeze moved the front"
        );
        self.state.frozen_layers = layers;
        Ok(Some(layers))
    }
}
