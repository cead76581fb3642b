//! Building a pipeline: the configuration settles the balance, then the
//! stack is cut into stages on their devices.

use burn::optim::Optimizer;
use burn::tensor::Device;
use burn_freeze::{LayerStack, StackTypes, TrainableUnits};

use crate::balance::costs::unit_param_costs;
use crate::balance::partition::balance_exact;
use crate::runtime::config::PipelineConfig;
use crate::runtime::error::PipeError;
use crate::runtime::pipeline::Pipeline;
use crate::runtime::placement::{place, validate};

impl PipelineConfig {
    /// Builds a pipeline of `stack` with one stage per device, each stage
    /// with an optimizer made by `make_optimizer` (any Burn optimizer,
    /// e.g. `|| AdamConfig::new().init()`). This is the one way to build a
    /// [`Pipeline`], and every field of the configuration holds: the
    /// `balance` (or the exact partitioner's when it is `None`), the
    /// `micro_batches`, the `schedule` and the `timeout_ms`.
    ///
    /// Fails, before touching any unit, on a configuration that does not fit
    /// the stack and devices: no device, more stages than units, a balance
    /// with an empty stage, the wrong total or another number of stages than
    /// devices, 0 micro-batches or a zero timeout.
    ///
    /// Burn initialises parameters lazily, on first read: to compare a
    /// pipeline with plain training from the same weights, read the weights
    /// (a forward pass) before cloning the stack, or the two clones get
    /// different random weights.
    pub fn init<S, O>(
        &self,
        stack: LayerStack<S>,
        devices: Vec<Device<S::Backend>>,
        make_optimizer: impl Fn() -> O + Send + Sync + 'static,
    ) -> Result<Pipeline<S, O>, PipeError>
    where
        S: StackTypes,
        O: Optimizer<TrainableUnits<S>, S::Backend>,
    {
        let balance = match &self.balance {
            Some(balance) => balance.clone(),
            None => {
                let stages = devices.len();
                if stages == 0 {
                    return Err(PipeError::NoStages);
                }
                if stages > stack.num_units() {
                    return Err(PipeError::TooManyStages {
                        stages,
                        units: stack.num_units(),
                    });
                }
                balance_exact(&unit_param_costs(&stack), stages)
            }
        };
        Pipeline::build(stack, &balance, devices, self.clone(), make_optimizer)
    }
}

impl<S, O> Pipeline<S, O>
where
    S: StackTypes,
    O: Optimizer<TrainableUnits<S>, S::Backend>,
{
    /// The one constructor, called by [`PipelineConfig::init`] with the
    /// balance it settled on: stage `s` holds the next `balance[s]` units on
    /// `devices[s]`, each with an optimizer made by `make_optimizer`.
    ///
    /// Fails, before touching any unit, when the balance has no stage, more
    /// stages than units, an empty stage or the wrong total; when there is not
    /// exactly one device per stage; or when the config asks for 0
    /// micro-batches or a zero timeout.
    pub(crate) fn build(
        stack: LayerStack<S>,
        balance: &[usize],
        devices: Vec<Device<S::Backend>>,
        config: PipelineConfig,
        make_optimizer: impl Fn() -> O + Send + Sync + 'static,
    ) -> Result<Self, PipeError> {
        let units = stack.num_units();
        validate(balance, units, devices.len(), &config)?;
        let stages = place(stack, balance, 0, devices, |_| make_optimizer());
        Ok(Self {
            stages,
            front: 0,
            config,
            make_optimizer: std::sync::Arc::new(make_optimizer),
            norms: vec![None; units],
            cache: None,
            keep_sums: false,
            gains: vec![None; units],
            gains_from: None,
            retake_snapshot: false,
            gain_time: std::time::Duration::ZERO,
        })
    }
}
