//! The public face of burn-pipe: a layer stack trained as a pipeline of
//! stages, what it holds, and its optimizer step.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::thread;

use burn::optim::Optimizer;
use burn::prelude::*;
use burn_freeze::fault;
use burn_freeze::plumbing::{GradientSums, WeightSnapshot};
use burn_freeze::{
    GradNorm, InnerBackendOf, LayerStack, StackCache, StackTypes, TrainableUnits, UnitRange,
};

use crate::runtime::config::PipelineConfig;
use crate::runtime::error::{PipeError, panic_message};
use crate::runtime::placement::Stage;
use crate::runtime::threads;

/// A [`LayerStack`] trained as a pipeline of stages, each a contiguous range of
/// units ([`UnitRange`]) on its own device and worker thread, with its own
/// optimizer.
///
/// A pass ([`forward_backward`](Pipeline::forward_backward), the one method
/// that trains, its options in [`StepOptions`](crate::StepOptions)) splits
/// the mini-batch into micro-batches, streams them through the stages under
/// the configured [`Schedule`](crate::Schedule), and accumulates each stage's
/// parameter gradients; [`step`](Pipeline::step) then applies every stage's
/// optimizer with one learning rate ([`train_step`](Pipeline::train_step)
/// does both). Its freeze front and AutoCache are those of every level
/// ([`FreezeFront`](burn_freeze::FreezeFront),
/// [`CacheHolder`](burn_freeze::CacheHolder)). The gradients equal those of
/// plain training on the whole batch when the loss is a mean over samples.
///
/// Your own model, pipelined: its units, the [`unit!`](burn_freeze::unit)
/// lines, and a [`PipelineConfig`]:
///
/// ```
/// use burn::backend::{Autodiff, Flex};
/// use burn::nn::loss::CrossEntropyLossConfig;
/// use burn::nn::{Linear, LinearConfig};
/// use burn::optim::AdamConfig;
/// use burn::prelude::*;
/// use burn_freeze::LayerStack;
/// use burn_pipe::{PipelineConfig, StepOptions};
///
/// // The model: any Burn modules, each with one forward for every backend.
/// #[derive(Module, Debug)]
/// pub struct Block<B: Backend> { linear: Linear<B> }
/// impl<B: Backend> Block<B> {
///     pub fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> { x.clone() + self.linear.forward(x).tanh() }
/// }
/// #[derive(Module, Debug)]
/// pub struct Head<B: Backend> { linear: Linear<B> }
/// impl<B: Backend> Head<B> {
///     pub fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> { self.linear.forward(x) }
/// }
///
/// // Pipelining it:
/// burn_freeze::unit!(Block<B>: Tensor<B, 2> => Tensor<B, 2>);
/// burn_freeze::unit!(Head<B>: Tensor<B, 2> => Tensor<B, 2>);
/// type B = Autodiff<Flex>;
/// let device = Default::default();
/// let block = || Block::<B> { linear: LinearConfig::new(8, 8).init(&device) };
/// let head = Head { linear: LinearConfig::new(8, 3).init(&device) };
/// let stack = LayerStack::new(block(), (0..4).map(|_| block()).collect(), head);
/// let mut pipeline = PipelineConfig::new()
///     .with_micro_batches(Some(4))
///     .init(stack, vec![device; 3], || AdamConfig::new().init())?;
/// let loss = CrossEntropyLossConfig::new().init(&device);
/// let x = Tensor::<B, 2>::ones([16, 8], &device);
/// let y = Tensor::<B, 1, Int>::zeros([16], &device);
/// // One training step: forward and backward (no options), then the optimizer.
/// let loss_fn = |logits, y| loss.forward(logits, y);
/// let report = pipeline.forward_backward(x, y, loss_fn, StepOptions::new())?;
/// pipeline.step(1e-3)?;
/// assert_eq!(pipeline.balance().len(), 3);
/// assert_eq!(report.micro_batches, 4);
/// # Ok::<(), burn_pipe::PipeError>(())
/// ```
///
/// A function generic over the stack and the optimizer carries one bound
/// for each:
///
/// ```
/// use burn::optim::Optimizer;
/// use burn_freeze::{StackTypes, TrainableUnits};
/// use burn_pipe::Pipeline;
///
/// fn describe<S: StackTypes, O: Optimizer<TrainableUnits<S>, S::Backend>>(p: &Pipeline<S, O>) -> String {
///     format!("K={} {:?}, front {}", p.num_stages(), p.balance(), p.front())
/// }
/// ```
pub struct Pipeline<S: StackTypes, O> {
    pub(crate) stages: Vec<Stage<S, O>>,
    /// Units `0..front` are frozen.
    pub(crate) front: usize,
    pub(crate) config: PipelineConfig,
    pub(crate) make_optimizer: std::sync::Arc<dyn Fn() -> O + Send + Sync>,
    /// Per-unit gradient norms of the last optimizer step.
    pub(crate) norms: Vec<Option<GradNorm>>,
    /// AutoCache for stage 0's frozen units.
    pub(crate) cache: Option<StackCache<S>>,
    /// Whether every stage keeps running sums of its gradients
    /// ([`burn_freeze::FreezeFront::set_gradient_sums`]).
    pub(crate) keep_sums: bool,
    /// Per-unit update gains of the last optimizer step
    /// ([`burn_freeze::FreezeFront::last_update_gains`]).
    pub(crate) gains: Vec<Option<f64>>,
    /// From which unit every stage keeps a snapshot of its weights, to
    /// measure update gains
    /// ([`burn_freeze::FreezeFront::set_update_gains`]); `None`: no gains.
    pub(crate) gains_from: Option<usize>,
    /// Whether the next step takes new snapshots after reading its gains
    /// ([`burn_freeze::FreezeFront::restart_update_gains`]).
    pub(crate) retake_snapshot: bool,
    /// Time the last step's slowest stage spent on its update gains and
    /// weight snapshot.
    pub(crate) gain_time: std::time::Duration,
}

impl<S, O> Pipeline<S, O>
where
    S: StackTypes,
    O: Optimizer<TrainableUnits<S>, S::Backend>,
{
    /// Number of stages.
    pub fn num_stages(&self) -> usize {
        self.stages.len()
    }

    /// Units per stage.
    pub fn balance(&self) -> Vec<usize> {
        self.stages.iter().map(|s| s.range.len()).collect()
    }

    /// Number of units, frozen or not.
    pub fn num_units(&self) -> usize {
        self.stages.last().map_or(0, |s| s.range.end)
    }

    /// The freeze front: units `0..front()` are frozen.
    pub fn front(&self) -> usize {
        self.front
    }

    /// The units a cache serves ahead of this pipeline at its front (see
    /// [`cached_prefix`](burn_freeze::plumbing::cached_prefix)).
    pub fn cached_prefix(&self) -> usize {
        burn_freeze::plumbing::cached_prefix(self.front, &self.balance())
    }

    /// The configuration.
    pub fn config(&self) -> &PipelineConfig {
        &self.config
    }

    /// The device of each stage.
    pub fn devices(&self) -> Vec<Device<S::Backend>> {
        self.stages.iter().map(|s| s.device.clone()).collect()
    }

    /// The units of stage `stage`, frozen and trainable.
    ///
    /// # Panics
    /// When `stage >= num_stages()`.
    pub fn stage(&self, stage: usize) -> &UnitRange<S> {
        self.stages[stage].units()
    }

    /// Gradients stage `stage` accumulated since the last optimizer step, if any.
    ///
    /// # Panics
    /// When `stage >= num_stages()`.
    pub fn gradients(&self, stage: usize) -> Option<&burn::optim::GradientsParams> {
        self.stages[stage].pending.as_ref()
    }

    /// Replaces each stage's accumulated gradients by `f(stage, gradients)`
    /// (stages without gradients are skipped), e.g. to all-reduce them across
    /// data-parallel replicas before [`step`](Pipeline::step). On the first
    /// error the remaining stages keep their gradients and the failing
    /// stage's are dropped.
    pub fn map_gradients<E>(
        &mut self,
        mut f: impl FnMut(
            usize,
            burn::optim::GradientsParams,
        ) -> Result<burn::optim::GradientsParams, E>,
    ) -> Result<(), E> {
        for (index, stage) in self.stages.iter_mut().enumerate() {
            if let Some(grads) = stage.pending.take() {
                stage.pending = Some(f(index, grads)?);
            }
        }
        Ok(())
    }

    /// Drops accumulated gradients without applying them.
    pub fn clear_gradients(&mut self) {
        for stage in &mut self.stages {
            stage.pending = None;
        }
    }

    /// Applies every stage's optimizer to its accumulated gradients with
    /// learning rate `lr` (one schedule drives all stages), then clears them,
    /// recording each unit's gradient norm for
    /// [`last_gradient_norms`](burn_freeze::FreezeFront::last_gradient_norms) and, when
    /// kept ([`set_gradient_sums`](burn_freeze::FreezeFront::set_gradient_sums)), adding
    /// the gradients to each stage's running sums (on its own thread and
    /// device). A stage without gradients (nothing trainable) is left as it
    /// is.
    ///
    /// A gradient that is not finite (NaN or infinite) refuses the step:
    /// no stage steps, the gradients are dropped, weights and optimizer
    /// state stay as they were, and the error names the stage and unit.
    ///
    /// A stage whose optimizer step panics (a failing device, an optimizer
    /// of your own) fails the step with [`PipeError::StepPanicked`] naming
    /// it, and the step is undone: every stage gets back the weights,
    /// optimizer state and gradient sums it had before, and the gradients
    /// are dropped. For that, each stage holds its previous weights and
    /// optimizer state while it steps (shared storage: the optimizer writes
    /// the new values beside them, not in place, for the step's duration).
    /// A step thread that cannot start refuses the step the same way
    /// ([`PipeError::Spawn`]).
    #[must_use = "a refused step (non-finite gradient) changes nothing and drops the gradients"]
    pub fn step(&mut self, lr: f64) -> Result<(), PipeError> {
        let result = self.try_step(lr);
        if let Err(error) = &result {
            self.clear_gradients();
            tracing::warn!(%error, "optimizer step refused; nothing changed");
        }
        result
    }

    /// [`step`](Self::step), leaving the gradients to the caller on error.
    fn try_step(&mut self, lr: f64) -> Result<(), PipeError> {
        fault::check(crate::fault::STEP, None, None)?;
        // Every stage's per-unit norms first (one device read per stage), so
        // that a non-finite gradient anywhere stops every stage.
        let norms: Vec<Vec<Option<GradNorm>>> = on_each_stage(&mut self.stages, |_, stage| {
            caught(|| match &stage.pending {
                None => vec![None; stage.range.len()],
                Some(grads) => stage.units().unit_gradient_norms(grads),
            })
        })?
        .into_iter()
        .enumerate()
        .map(|(stage, norms)| norms.map_err(|message| PipeError::StepPanicked { stage, message }))
        .collect::<Result<_, _>>()?;
        let bad = norms.iter().enumerate().find_map(|(stage, units)| {
            units.iter().enumerate().find_map(|(i, norm)| {
                norm.filter(|n| !(n.l1.is_finite() && n.l2.is_finite()))
                    .map(|_| (stage, self.stages[stage].range.start + i))
            })
        });
        if let Some((stage, unit)) = bad {
            return Err(PipeError::NonFinite {
                what: "gradient",
                stage,
                unit: Some(unit),
            });
        }
        let gains_from = self.gains_from;
        let retake = self.retake_snapshot;
        let stepped = on_each_stage(&mut self.stages, |_, stage| {
            step_stage(stage, lr, gains_from, retake)
        })?;
        let panicked = stepped
            .iter()
            .enumerate()
            .find_map(|(stage, s)| s.panicked.clone().map(|message| (stage, message)));
        if let Some((stage, message)) = panicked {
            // Undo the step on every stage, the ones that stepped included.
            for (target, stepped) in self.stages.iter_mut().zip(stepped) {
                if let Some((units, optimizer)) = stepped.before {
                    target.units = Some(units);
                    target.optimizer = optimizer;
                }
            }
            return Err(PipeError::StepPanicked { stage, message });
        }
        let mut gains = Vec::with_capacity(self.norms.len());
        self.gain_time = stepped
            .iter()
            .map(|s| s.gain_time)
            .max()
            .unwrap_or_default();
        for (stage, stepped) in self.stages.iter_mut().zip(stepped) {
            if let (Some(sums), Some(added)) = (stage.sums.as_mut(), stepped.sums) {
                sums.merge(added);
            }
            match stepped.gains.len() == stage.range.len() {
                true => gains.extend(stepped.gains),
                false => gains.extend(vec![None; stage.range.len()]),
            }
            if stepped.snapshot.is_some() {
                stage.snapshot = stepped.snapshot;
            }
        }
        self.norms = norms.into_iter().flatten().collect();
        self.gains = gains;
        self.retake_snapshot = false;
        Ok(())
    }

    /// A copy of the whole model as a layer stack, every unit on the
    /// autodiff backend on its stage's device, to evaluate or save it while
    /// training goes on (Burn tensors share storage, so no weight is copied).
    pub fn to_layer_stack(&self) -> LayerStack<S> {
        UnitRange::join(self.stages.iter().map(|s| s.units().clone()).collect())
            .expect("the stages cover the stack in order")
    }

    /// Takes the pipeline apart into its layer stack (units stay on their
    /// stages' devices; frozen units train again).
    pub fn into_layer_stack(self) -> LayerStack<S> {
        UnitRange::join(
            self.stages
                .into_iter()
                .map(|s| s.units.expect("units present"))
                .collect(),
        )
        .expect("the stages cover the stack in order")
    }
}

/// What one stage's optimizer step left.
struct Stepped<S: StackTypes, O> {
    /// The stage's units and optimizer before the step, to put back when
    /// a stage's step panicked (`None`: it had nothing to step).
    before: Option<(UnitRange<S>, O)>,
    /// This step's gradients, to add to the stage's running sums once
    /// every stage has stepped (when it keeps them).
    sums: Option<GradientSums<InnerBackendOf<S>>>,
    /// The panic's message, when the step panicked.
    panicked: Option<String>,
    /// Each unit's update gain read from this step's gradients (empty when
    /// the stage keeps no snapshot), and the snapshot for the next step.
    gains: Vec<Option<f64>>,
    snapshot: Option<WeightSnapshot<InnerBackendOf<S>>>,
    /// Time spent on `gains` and `snapshot`.
    gain_time: std::time::Duration,
}

/// Applies `stage`'s optimizer to its pending gradients with learning rate
/// `lr`, catching a panic (the stage's units are then left incomplete: the
/// caller puts back [`Stepped::before`]).
fn step_stage<S, O>(
    stage: &mut Stage<S, O>,
    lr: f64,
    gains_from: Option<usize>,
    retake: bool,
) -> Stepped<S, O>
where
    S: StackTypes,
    O: Optimizer<TrainableUnits<S>, S::Backend>,
{
    let Some(grads) = stage.pending.take() else {
        return Stepped {
            before: None,
            sums: None,
            panicked: None,
            gains: Vec::new(),
            snapshot: None,
            gain_time: std::time::Duration::ZERO,
        };
    };
    let before = (stage.units().clone(), stage.optimizer.clone());
    let keep_sums = stage.sums.is_some();
    // Left in place until the step succeeds everywhere: a refused or undone
    // step measures against it again.
    let last_snapshot = stage.snapshot.as_ref();
    let units = stage.units.as_mut().expect("units present");
    let optimizer = &mut stage.optimizer;
    let result = caught(|| {
        let sums = keep_sums.then(|| {
            let mut sums = GradientSums::new();
            units.add_gradient_sums(&mut sums, &grads);
            sums
        });
        // The gain of the move since the snapshot on this step's batch,
        // then (the first time, or after a restart) the weights this step
        // moves from as the next snapshot.
        let measuring = std::time::Instant::now();
        let (gains, snapshot) = match gains_from {
            Some(from) => {
                let gains = match last_snapshot {
                    Some(before) => units.unit_update_gains(&grads, before),
                    None => vec![None; units.units().len()],
                };
                let retake = retake || last_snapshot.is_none();
                (gains, retake.then(|| units.weight_snapshot(from)))
            }
            None => (Vec::new(), None),
        };
        let gain_time = measuring.elapsed();
        units.map_trainable(|module| optimizer.step(lr, module, grads));
        (sums, gains, snapshot, gain_time)
    });
    match result {
        Ok((sums, gains, snapshot, gain_time)) => Stepped {
            before: Some(before),
            sums,
            panicked: None,
            gains,
            snapshot,
            gain_time,
        },
        Err(message) => Stepped {
            before: Some(before),
            sums: None,
            panicked: Some(message),
            gains: Vec::new(),
            snapshot: None,
            gain_time: std::time::Duration::ZERO,
        },
    }
}

/// `f()`, or the message of its panic.
fn caught<R>(f: impl FnOnce() -> R) -> Result<R, String> {
    catch_unwind(AssertUnwindSafe(f)).map_err(|panic| panic_message(panic.as_ref()))
}

/// `f(s, stage)` for every stage `s`, each on a thread of its own, in stage
/// order; fails before any stage is touched when a thread cannot start.
fn on_each_stage<S, O, R, F>(stages: &mut [Stage<S, O>], f: F) -> Result<Vec<R>, PipeError>
where
    S: StackTypes,
    O: Send,
    R: Send,
    F: Fn(usize, &mut Stage<S, O>) -> R + Sync,
{
    let f = &f;
    thread::scope(|scope| {
        let run = move |s, stage: &mut Stage<S, O>| f(s, stage);
        let handles: Vec<_> = threads::start(scope, "step", stages.len(), run)?
            .into_iter()
            .zip(stages.iter_mut())
            .map(|(worker, stage)| worker.hand(stage))
            .collect();
        Ok(handles.into_iter().map(threads::join).collect())
    })
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
        let config = PipelineConfig {
            micro_batches,
            ..self.config.clone()
        };
        config.validate()?;
        self.config = config;
        Ok(())
    }

    /// Time the last optimizer step's slowest stage spent measuring the
    /// update gains and taking its weight snapshot
    /// ([`burn_freeze::FreezeFront::set_update_gains`]); zero when they are not
    /// measured.
    pub fn last_evidence_time(&self) -> std::time::Duration {
        self.gain_time
    }

    /// The micro-batch count of the next pass, at the current number of
    /// stages.
    pub fn micro_batches(&self) -> usize {
        self.config.micro_batches_for(self.stages.len())
    }
}
