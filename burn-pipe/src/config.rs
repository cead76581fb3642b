//! How a pipeline runs: stages, schedule, micro-batches, and the bound on
//! every wait.

use burn::config::Config;
use burn::optim::Optimizer;
use burn::tensor::Device;
use burn_freeze::{LayerStack, StackTypes, TrainableUnits};

use crate::error::PipeError;
use crate::pipeline::Pipeline;

/// Order in which each stage runs the forward and backward passes of its
/// micro-batches. Both give the same gradients.
#[derive(Config, Debug, Copy, PartialEq, Eq)]
pub enum Schedule {
    /// Fill-drain (GPipe): every forward pass, then every backward pass.
    /// Stage `s` holds the activations of all `M` micro-batches at its peak
    /// (with a single stage, one: see [`stage_ops`](crate::stage_ops)).
    GPipe,
    /// One-forward-one-backward (PipeDream-Flush): after a warm-up of
    /// `K - s - 1` forward passes, stage `s` alternates forward and backward,
    /// so it never holds more than `K - s` micro-batches of activations.
    OneFOneB,
}

/// Configuration of a [`Pipeline`]; [`init`](PipelineConfig::init) builds one.
///
/// ```
/// use burn_pipe::{PipelineConfig, Schedule};
///
/// let config = PipelineConfig::new()
///     .with_schedule(Schedule::GPipe)
///     .with_micro_batches(Some(8));
/// assert_eq!(config.micro_batches_for(4), 8);
/// assert_eq!(PipelineConfig::new().micro_batches_for(4), 16);
/// ```
#[derive(Config, Debug)]
pub struct PipelineConfig {
    /// Forward/backward order.
    #[config(default = "Schedule::OneFOneB")]
    pub schedule: Schedule,
    /// Micro-batches per mini-batch. `Some(m)` always holds, at every
    /// number of stages. `None`: the paper's choice for the number of stages
    /// ([`default_micro_batches`](crate::default_micro_batches)), here and
    /// wherever costs are not measured (the planner, and burn-elastic-dp's
    /// trainer with parameter-count costs); burn-elastic-dp's trainer with
    /// profiled costs instead chooses M for each shape from unit times
    /// measured at several micro-batch sizes
    /// ([`choose_micro_batches`](crate::choose_micro_batches)) and sets it
    /// with [`Pipeline::set_micro_batches`].
    #[config(default = "None")]
    pub micro_batches: Option<usize>,
    /// Units per stage; `None` balances the stages by parameter count with
    /// the exact partitioner ([`balance_exact`](crate::balance_exact)), one
    /// stage per device.
    #[config(default = "None")]
    pub balance: Option<Vec<usize>>,
    /// Longest a stage waits for a neighbour's activation or gradient before
    /// the step fails, in milliseconds (at least 1).
    #[config(default = 120_000)]
    pub timeout_ms: u64,
}

impl<S: StackTypes, O> Pipeline<S, O> {
    /// Sets the micro-batch count of the passes that follow (`None`: the
    /// paper's count for the number of stages, see
    /// [`PipelineConfig::micro_batches`]); gradients already accumulated are
    /// kept. Fails, changing nothing, on `Some(0)`.
    ///
    /// ```
    /// use burn::backend::{Autodiff, Flex};
    /// use burn::nn::{Linear, LinearConfig};
    /// use burn::optim::SgdConfig;
    /// use burn::prelude::*;
    /// use burn_freeze::LayerStack;
    /// use burn_pipe::PipelineConfig;
    ///
    /// #[derive(Module, Debug)]
    /// pub struct Dense<B: Backend> { linear: Linear<B> }
    /// impl<B: Backend> Dense<B> {
    ///     pub fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> { self.linear.forward(x) }
    /// }
    /// burn_freeze::unit!(Dense<B>: Tensor<B, 2> => Tensor<B, 2>);
    /// type B = Autodiff<Flex>;
    /// let device = Default::default();
    /// let dense = || Dense::<B> { linear: LinearConfig::new(4, 4).init(&device) };
    /// let stack = LayerStack::new(dense(), vec![dense()], dense());
    /// let mut pipeline = PipelineConfig::new().init(stack, vec![device; 3], || SgdConfig::new().init())?;
    /// assert_eq!(pipeline.micro_batches(), 16);
    /// pipeline.set_micro_batches(Some(3))?;
    /// assert_eq!(pipeline.micro_batches(), 3);
    /// assert!(pipeline.set_micro_batches(Some(0)).is_err());
    /// # Ok::<(), burn_pipe::PipeError>(())
    /// ```
    pub fn set_micro_batches(&mut self, micro_batches: Option<usize>) -> Result<(), PipeError> {
        if micro_batches == Some(0) {
            return Err(PipeError::NoMicroBatches);
        }
        self.config.micro_batches = micro_batches;
        Ok(())
    }

    /// The micro-batch count of the next pass, at the current number of
    /// stages.
    pub fn micro_batches(&self) -> usize {
        self.config.micro_batches_for(self.stages.len())
    }
}

impl PipelineConfig {
    /// The micro-batch count used with `stages` stages.
    pub fn micro_batches_for(&self, stages: usize) -> usize {
        self.micro_batches
            .unwrap_or_else(|| crate::partition::default_micro_batches(stages))
    }

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
                crate::partition::balance_exact(&crate::partition::unit_param_costs(&stack), stages)
            }
        };
        Pipeline::build(stack, &balance, devices, self.clone(), make_optimizer)
    }
}
