//! The public face of burn-pipe: a layer stack trained as a pipeline of stages.

use std::collections::HashMap;
use std::ops::Range;
use std::thread;
use std::time::{Duration, Instant};

use burn::module::{ParamId, list_param_ids};
use burn::optim::{GradientsAccumulator, GradientsParams, Optimizer};
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;
use burn_freeze::{Activation, AutodiffActivation, Differentiable, InnerOf, LayerStack, Unit};
use crossbeam_channel::unbounded;

use crate::config::PipelineConfig;
use crate::error::PipeError;
use crate::microbatch::micro_batch_sizes;
use crate::partition::{balance_exact, unit_param_costs};
use crate::schedule::stage_ops;
use crate::stage::{StageInput, StageModule, StageOutput, StageUnits, join, ranges, split};
use crate::worker::{Job, Links, StageReport, run_stage};

/// What one pipelined forward-backward pass measured.
#[derive(Debug, Clone, PartialEq)]
pub struct StepReport {
    /// Mean loss over the mini-batch (micro-batch losses weighted by size).
    pub loss: f32,
    /// Micro-batches the mini-batch was split into.
    pub micro_batches: usize,
    /// Wall-clock time of the pass.
    pub wall: Duration,
    /// Per stage, time spent computing rather than waiting.
    pub busy: Vec<Duration>,
    /// Per stage, the most micro-batches whose activations it held at once.
    pub peak_saved: Vec<usize>,
    /// Activations and gradients sent between stages.
    pub messages: usize,
}

impl StepReport {
    /// Share of stage-time spent idle: `1 - sum(busy) / (stages * wall)`.
    /// GPipe's theory for equal stages is `(K - 1) / (M + K - 1)`.
    pub fn bubble_fraction(&self) -> f64 {
        let busy: f64 = self.busy.iter().map(Duration::as_secs_f64).sum();
        let capacity = self.busy.len() as f64 * self.wall.as_secs_f64();
        if capacity == 0.0 {
            0.0
        } else {
            (1.0 - busy / capacity).max(0.0)
        }
    }
}

/// One stage: its units, its optimizer, its device.
struct Stage<B: AutodiffBackend, F: Unit<B>, M: Unit<B>, L: Unit<B>, O> {
    /// `None` only while the units are inside a worker or an optimizer step.
    units: Option<StageUnits<B, F, M, L>>,
    optimizer: O,
    device: B::Device,
    /// The units this stage holds.
    range: Range<usize>,
    /// Gradients accumulated since the last optimizer step.
    pending: Option<GradientsParams>,
}

/// A [`LayerStack`] trained as a pipeline of stages, each a contiguous range of
/// units on its own device and worker thread, with its own optimizer.
///
/// A step splits the mini-batch into micro-batches, streams them through the
/// stages under the configured [`Schedule`](crate::Schedule), and accumulates
/// each stage's parameter gradients; [`step`](Pipeline::step) then applies
/// every stage's optimizer with one learning rate. The gradients equal those of
/// plain training on the whole batch when the loss is a mean over samples.
///
/// ```
/// use burn::backend::{Autodiff, Flex};
/// use burn::nn::loss::CrossEntropyLossConfig;
/// use burn::optim::AdamConfig;
/// use burn::prelude::*;
/// use burn_freeze::IntoLayerStack;
/// use burn_pipe::{Pipeline, PipelineConfig};
/// use models::synthetic::BandImages;
/// use models::vit::VitConfig;
///
/// type B = Autodiff<Flex>;
/// let device = Default::default();
/// let stack = VitConfig::tiny(4).init::<B>(&device).into_layer_stack();
/// let config = PipelineConfig::new().with_micro_batches(Some(4));
/// let mut pipeline = Pipeline::new(stack, &[3, 2, 2], vec![device; 3], config, || AdamConfig::new().init())?;
///
/// let (images, labels) = BandImages::new(4, 3, 16, 0).batch::<B>(0, 16, &device);
/// let loss = CrossEntropyLossConfig::new().init(&device);
/// let report = pipeline.forward_backward(images, labels, |logits, labels| loss.forward(logits, labels))?;
/// pipeline.step(1e-3);
/// assert_eq!(report.micro_batches, 4);
/// assert!(report.loss > 0.0);
/// # Ok::<(), burn_pipe::PipeError>(())
/// ```
pub struct Pipeline<B: AutodiffBackend, F: Unit<B>, M: Unit<B>, L: Unit<B>, O> {
    stages: Vec<Stage<B, F, M, L, O>>,
    /// Units `0..front` are frozen.
    front: usize,
    config: PipelineConfig,
    make_optimizer: Box<dyn Fn() -> O + Send + Sync>,
}

/// Checks a balance and device list against a stack of `units` units.
fn validate(
    balance: &[usize],
    units: usize,
    devices: usize,
    config: &PipelineConfig,
) -> Result<(), PipeError> {
    if balance.is_empty() {
        return Err(PipeError::NoStages);
    }
    if balance.len() > units {
        return Err(PipeError::TooManyStages {
            stages: balance.len(),
            units,
        });
    }
    if balance.contains(&0) || balance.iter().sum::<usize>() != units {
        return Err(PipeError::BadBalance {
            balance: balance.to_vec(),
            units,
        });
    }
    if devices != balance.len() {
        return Err(PipeError::DeviceCount {
            devices,
            stages: balance.len(),
        });
    }
    if config.micro_batches == Some(0) {
        return Err(PipeError::NoMicroBatches);
    }
    Ok(())
}

impl<B, F, M, L, O> Pipeline<B, F, M, L, O>
where
    B: AutodiffBackend,
    F: Unit<B>,
    F::Output: Differentiable<B>,
    M: Unit<B, Input = F::Output, Output = F::Output>,
    L: Unit<B, Input = F::Output>,
    O: Optimizer<StageModule<B, F, M, L>, B>,
{
    /// Builds a pipeline of `balance.len()` stages, stage `s` holding the next
    /// `balance[s]` units and living on `devices[s]`, each with an optimizer
    /// made by `make_optimizer`.
    ///
    /// Fails, before touching any unit, when the balance has no stage, more
    /// stages than units, an empty stage or the wrong total; when there is not
    /// exactly one device per stage; or when the config asks for 0 micro-batches.
    pub fn new(
        stack: LayerStack<F, M, L>,
        balance: &[usize],
        devices: Vec<B::Device>,
        config: PipelineConfig,
        make_optimizer: impl Fn() -> O + Send + Sync + 'static,
    ) -> Result<Self, PipeError> {
        validate(balance, stack.len(), devices.len(), &config)?;
        let stages = place(stack, balance, 0, devices, |_| make_optimizer());
        Ok(Self {
            stages,
            front: 0,
            config,
            make_optimizer: Box::new(make_optimizer),
        })
    }

    /// Builds a pipeline of `devices.len()` stages balanced by parameter count
    /// with the exact partitioner ([`balance_exact`]).
    pub fn balanced(
        stack: LayerStack<F, M, L>,
        devices: Vec<B::Device>,
        config: PipelineConfig,
        make_optimizer: impl Fn() -> O + Send + Sync + 'static,
    ) -> Result<Self, PipeError> {
        let stages = devices.len();
        if stages == 0 {
            return Err(PipeError::NoStages);
        }
        if stages > stack.len() {
            return Err(PipeError::TooManyStages {
                stages,
                units: stack.len(),
            });
        }
        let balance = balance_exact(&unit_param_costs::<B, F, M, L>(&stack), stages);
        Self::new(stack, &balance, devices, config, make_optimizer)
    }

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

    /// The configuration.
    pub fn config(&self) -> &PipelineConfig {
        &self.config
    }

    /// The units of stage `stage`.
    ///
    /// # Panics
    /// When `stage >= num_stages()`.
    pub fn stage(&self, stage: usize) -> &StageModule<B, F, M, L> {
        &self.stages[stage]
            .units
            .as_ref()
            .expect("a stage's units are present between calls")
            .trainable
    }

    /// Gradients stage `stage` accumulated since the last optimizer step, if any.
    pub fn gradients(&self, stage: usize) -> Option<&GradientsParams> {
        self.stages[stage].pending.as_ref()
    }

    /// Drops accumulated gradients without applying them.
    pub fn clear_gradients(&mut self) {
        for stage in &mut self.stages {
            stage.pending = None;
        }
    }

    /// Runs the forward and backward passes of one mini-batch through the
    /// pipeline and adds each stage's parameter gradients to its accumulated
    /// gradients (so several calls before [`step`](Pipeline::step) accumulate).
    ///
    /// `loss` maps the last unit's output for a micro-batch and that
    /// micro-batch's targets to the *mean* loss over its samples; the pipeline
    /// weights each micro-batch by its share of the batch, so the gradients are
    /// those of the mean loss over the whole batch.
    ///
    /// On error (a stage panicked or failed, a wait exceeded the configured
    /// timeout, bad batch sizes) every worker has stopped, no gradient of this
    /// pass is kept, and the weights are unchanged.
    pub fn forward_backward<T, LossFn>(
        &mut self,
        input: F::Input,
        targets: T,
        loss: LossFn,
    ) -> Result<StepReport, PipeError>
    where
        T: Activation<B>,
        LossFn: Fn(L::Output, T) -> Tensor<B, 1> + Sync,
    {
        let batch = input.batch_size();
        if targets.batch_size() != batch {
            return Err(PipeError::TargetsMismatch {
                input: batch,
                targets: targets.batch_size(),
            });
        }
        let stages = self.stages.len();
        let micro_batches = self.config.micro_batches_for(stages);
        let sizes = micro_batch_sizes(batch, micro_batches)?;
        let inputs = input.inner().split_batch(&sizes);
        let targets: Vec<(T, f32)> = targets
            .split_batch(&sizes)
            .into_iter()
            .zip(&sizes)
            .map(|(t, &n)| (t, n as f32 / batch as f32))
            .collect();

        // Channel k links stage k and stage k + 1, one each way.
        let (mut forward_tx, mut forward_rx) = (Vec::new(), Vec::new());
        let (mut backward_tx, mut backward_rx) = (Vec::new(), Vec::new());
        for _ in 1..stages {
            let (tx, rx) = unbounded();
            forward_tx.push(Some(tx));
            forward_rx.push(Some(rx));
            let (tx, rx) = unbounded();
            backward_tx.push(Some(tx));
            backward_rx.push(Some(rx));
        }
        let mut inputs = Some(inputs);
        let mut targets = Some(targets);
        let timeout = Duration::from_millis(self.config.timeout_ms);
        let schedule = self.config.schedule;
        let start = Instant::now();
        let loss = &loss;

        let front = self.front;
        let outcomes: Vec<(StageUnits<B, F, M, L>, Result<StageReport, PipeError>)> =
            thread::scope(|scope| {
                let handles: Vec<_> = self
                    .stages
                    .iter_mut()
                    .enumerate()
                    .map(|(s, stage)| {
                        let units = stage.units.take().expect("units present between calls");
                        // Gradients cross the boundary before stage s when the
                        // unit before it trains; frozen units form a prefix.
                        let grads_upstream = s > 0 && stage.range.start > front;
                        let grads_downstream = stage.range.end > front;
                        let links = Links {
                            from_previous: (s > 0).then(|| forward_rx[s - 1].take()).flatten(),
                            to_next: forward_tx.get_mut(s).and_then(Option::take),
                            grads_from_next: backward_rx
                                .get_mut(s)
                                .and_then(Option::take)
                                .filter(|_| grads_downstream),
                            grads_to_previous: (s > 0)
                                .then(|| backward_tx[s - 1].take())
                                .flatten()
                                .filter(|_| grads_upstream),
                        };
                        let job = Job {
                            stage: s,
                            device: stage.device.clone(),
                            ops: stage_ops(schedule, s, stages, micro_batches),
                            timeout,
                            inputs: if s == 0 {
                                inputs.take().unwrap_or_default()
                            } else {
                                Vec::new()
                            },
                            targets: if s + 1 == stages {
                                targets.take().unwrap_or_default()
                            } else {
                                Vec::new()
                            },
                            grads_upstream,
                        };
                        thread::Builder::new()
                            .name(format!("burn-pipe stage {s}"))
                            .spawn_scoped(scope, move || {
                                let result = run_stage(&units, job, links, loss);
                                (units, result)
                            })
                            .expect("spawning a stage worker thread")
                    })
                    .collect();
                handles
                    .into_iter()
                    .map(|handle| {
                        handle
                            .join()
                            .expect("stage workers catch their panics and return their units")
                    })
                    .collect()
            });

        let wall = start.elapsed();
        let mut reports = Vec::with_capacity(stages);
        let mut errors = Vec::new();
        for (stage, (units, result)) in self.stages.iter_mut().zip(outcomes) {
            stage.units = Some(units);
            match result {
                Ok(report) => reports.push(report),
                Err(error) => errors.push(error),
            }
        }
        if let Some(error) = PipeError::root_cause(errors) {
            tracing::warn!(%error, "pipelined pass failed; no gradient kept");
            return Err(error);
        }

        let mut report = StepReport {
            loss: 0.0,
            micro_batches,
            wall,
            busy: Vec::with_capacity(stages),
            peak_saved: Vec::with_capacity(stages),
            messages: 0,
        };
        for (stage, stage_report) in self.stages.iter_mut().zip(reports) {
            report.loss += stage_report.losses.iter().sum::<f32>();
            report.busy.push(stage_report.busy);
            report.peak_saved.push(stage_report.peak_saved);
            report.messages += stage_report.messages;
            stage.pending = Some(match stage.pending.take() {
                None => stage_report.grads,
                Some(pending) => {
                    let module = &stage.units.as_ref().expect("units present").trainable;
                    let mut accumulator = GradientsAccumulator::new();
                    accumulator.accumulate(module, pending);
                    accumulator.accumulate(module, stage_report.grads);
                    accumulator.grads()
                }
            });
        }
        Ok(report)
    }

    /// Applies every stage's optimizer to its accumulated gradients with
    /// learning rate `lr` (one schedule drives all stages), then clears them.
    /// A stage without gradients (nothing trainable) is left as it is.
    pub fn step(&mut self, lr: f64) {
        thread::scope(|scope| {
            for stage in &mut self.stages {
                let Some(grads) = stage.pending.take() else {
                    continue;
                };
                scope.spawn(move || {
                    let units = stage.units.as_mut().expect("units present");
                    let module = std::mem::replace(
                        &mut units.trainable,
                        StageModule::new(None, Vec::new(), None),
                    );
                    units.trainable = stage.optimizer.step(lr, module, grads);
                });
            }
        });
    }

    /// The model's output for `input`, for evaluation: every unit runs on the
    /// inner backend (no graph, dropout off), stage after stage on the
    /// calling thread, the activation moving to each stage's device.
    pub fn forward_inner(&self, input: InnerOf<B, F::Input>) -> InnerOf<B, L::Output> {
        let mut value: StageInput<_, InnerOf<B, F::Output>> = StageInput::Input(input);
        for stage in &self.stages {
            let units = stage.units.as_ref().expect("units present between calls");
            let moved = match value {
                StageInput::Input(input) => StageInput::Input(input.to_device(&stage.device)),
                StageInput::Hidden(hidden) => StageInput::Hidden(hidden.to_device(&stage.device)),
            };
            let after_frozen = units.frozen.forward(moved);
            if units.trainable.is_empty() {
                value = after_frozen;
                continue;
            }
            match units.trainable.forward_inner(after_frozen) {
                StageOutput::Hidden(hidden) => value = StageInput::Hidden(hidden),
                StageOutput::Output(output) => return output,
            }
        }
        unreachable!("the last stage holds the last unit")
    }

    /// [`forward_backward`](Pipeline::forward_backward) then [`step`](Pipeline::step).
    pub fn train_step<T, LossFn>(
        &mut self,
        input: F::Input,
        targets: T,
        loss: LossFn,
        lr: f64,
    ) -> Result<StepReport, PipeError>
    where
        T: Activation<B>,
        LossFn: Fn(L::Output, T) -> Tensor<B, 1> + Sync,
    {
        let report = self.forward_backward(input, targets, loss)?;
        self.step(lr);
        Ok(report)
    }

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
    pub fn repartition<R>(
        &mut self,
        balance: &[usize],
        devices: Vec<B::Device>,
    ) -> Result<(), PipeError>
    where
        O::Record: IntoIterator<Item = (ParamId, R)> + FromIterator<(ParamId, R)>,
    {
        if self.stages.iter().any(|s| s.pending.is_some()) {
            return Err(PipeError::GradientsPending("repartition"));
        }
        validate(balance, self.num_units(), devices.len(), &self.config)?;
        let mut records: HashMap<ParamId, R> = HashMap::new();
        let mut all_units = Vec::with_capacity(self.stages.len());
        for stage in self.stages.drain(..) {
            records.extend(stage.optimizer.to_record());
            all_units.push(stage.units.expect("units present"));
        }
        let make = &self.make_optimizer;
        let stages = place(join(all_units), balance, self.front, devices, |trainable| {
            optimizer_for(make, &mut records, trainable)
        });
        self.stages = stages;
        tracing::info!(?balance, "pipeline repartitioned");
        Ok(())
    }

    /// Freezes units `0..front`: they move to the inner backend on the stage
    /// that holds them, run forward only, and lose their optimizer state. The
    /// front only moves up, and the last unit always trains.
    ///
    /// Fails, changing nothing, when `front` is below the current front or
    /// reaches the last unit, or when gradients are pending.
    pub fn freeze_to<R>(&mut self, front: usize) -> Result<(), PipeError>
    where
        O::Record: IntoIterator<Item = (ParamId, R)> + FromIterator<(ParamId, R)>,
    {
        if self.stages.iter().any(|s| s.pending.is_some()) {
            return Err(PipeError::GradientsPending("freeze_to"));
        }
        let units = self.num_units();
        if front < self.front || front >= units {
            return Err(PipeError::BadFront {
                requested: front,
                front: self.front,
                units,
            });
        }
        for stage in &mut self.stages {
            let stage_units = stage.units.as_mut().expect("units present");
            let first_trainable = stage.range.start + stage_units.frozen.len();
            let count = front.min(stage.range.end).saturating_sub(first_trainable);
            if count == 0 {
                continue;
            }
            stage_units.freeze_next(count);
            let mut records: HashMap<ParamId, R> =
                stage.optimizer.to_record().into_iter().collect();
            stage.optimizer =
                optimizer_for(&self.make_optimizer, &mut records, &stage_units.trainable);
        }
        tracing::info!(
            from = self.front,
            to = front,
            "pipeline freeze front moved up"
        );
        self.front = front;
        Ok(())
    }

    /// Takes the pipeline apart into its layer stack (units stay on their
    /// stages' devices; frozen units train again).
    pub fn into_stack(self) -> LayerStack<F, M, L> {
        join(
            self.stages
                .into_iter()
                .map(|s| s.units.expect("units present"))
                .collect(),
        )
    }
}

/// Places a stack on stages: stage `s` holds the next `balance[s]` units
/// (those before `front` frozen) on `devices[s]`, with the optimizer that
/// `optimizer` gives for its trainable units. `balance` is already validated.
fn place<B, F, M, L, O>(
    stack: LayerStack<F, M, L>,
    balance: &[usize],
    front: usize,
    devices: Vec<B::Device>,
    mut optimizer: impl FnMut(&StageModule<B, F, M, L>) -> O,
) -> Vec<Stage<B, F, M, L, O>>
where
    B: AutodiffBackend,
    F: Unit<B>,
    M: Unit<B, Input = F::Output, Output = F::Output>,
    L: Unit<B, Input = F::Output>,
{
    split(stack, balance, front)
        .into_iter()
        .zip(devices)
        .zip(ranges(balance))
        .map(|((units, device), range)| {
            let units = units.fork(&device);
            Stage {
                optimizer: optimizer(&units.trainable),
                units: Some(units),
                device,
                range,
                pending: None,
            }
        })
        .collect()
}

/// A fresh optimizer holding the state, taken from `records`, of `module`'s parameters.
fn optimizer_for<B, F, M, L, O, R>(
    make: &(dyn Fn() -> O + Send + Sync),
    records: &mut HashMap<ParamId, R>,
    module: &StageModule<B, F, M, L>,
) -> O
where
    B: AutodiffBackend,
    F: Unit<B>,
    F::Output: Differentiable<B>,
    M: Unit<B, Input = F::Output, Output = F::Output>,
    L: Unit<B, Input = F::Output>,
    O: Optimizer<StageModule<B, F, M, L>, B>,
    O::Record: FromIterator<(ParamId, R)>,
{
    let own: O::Record = list_param_ids(module)
        .into_iter()
        .filter_map(|id| records.remove(&id).map(|record| (id, record)))
        .collect();
    make().load_record(own)
}
