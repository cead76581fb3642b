//! A pipelined training pass: the batch split into micro-batches, streamed
//! through the stages, each stage's gradients accumulated until the step.

use burn::optim::{GradientsAccumulator, Optimizer};
use burn_freeze::plumbing::{
    BatchStart, CachedStart, Flow, InnerFlow, flow_batch_size, serve_cached, split_flow,
};
use burn_freeze::{
    Activation, AutodiffActivation, Cacheable, InnerBackendOf, InnerHidden, InnerInput, StackTypes,
    TrainableUnits,
};

use crate::runtime::error::PipeError;
use crate::runtime::hook::StageGradients;
use crate::runtime::loss::MicroBatchLoss;
use crate::runtime::options::StepOptions;
use crate::runtime::pass::run_pass;
use crate::runtime::pipeline::Pipeline;
use crate::runtime::report::StepReport;
use crate::runtime::split::micro_batch_sizes;

impl<S, O> Pipeline<S, O>
where
    S: StackTypes,
    O: Optimizer<TrainableUnits<S>, S::Backend>,
{
    /// Runs the forward and backward passes of one mini-batch through the
    /// pipeline and adds each stage's parameter gradients to its accumulated
    /// gradients (so several calls before [`step`](Pipeline::step) accumulate).
    ///
    /// `batch` is the model's input (as it is: it converts into a
    /// [`BatchStart`]), or where a cached pass starts: what
    /// [`serve_prefix`](Self::serve_prefix) returns, the output of the
    /// frozen units of stage 0 served by the attached AutoCache
    /// ([`BatchStart::Hidden`]: the output of units `0..entry`, entering at
    /// unit `entry`; those units, frozen units of stage 0, do not run; a
    /// group of replicas serves its batch once and hands each replica its
    /// share this way). Gradients and loss equal the plain pass's.
    ///
    /// `loss` (a [`MicroBatchLoss`]: any `Fn + Sync` closure, borrowing or
    /// owning) maps the last unit's output for a micro-batch and that
    /// micro-batch's targets to the *mean* loss over its samples; the pipeline
    /// weights each micro-batch by its share of the batch, so the gradients are
    /// those of the mean loss over the whole batch.
    ///
    /// `options` ([`StepOptions`]) add a gradient hook: each stage's
    /// gradients go through it as soon as the stage is done (a
    /// data-parallel group's all-reduce).
    ///
    /// ```
    /// use burn::backend::{Autodiff, Flex};
    /// use burn::nn::{Linear, LinearConfig};
    /// use burn::optim::SgdConfig;
    /// use burn::prelude::*;
    /// use burn_freeze::{ActivationCache, CacheConfig, CacheHolder, FreezeFront, LayerStack};
    /// use burn_pipe::{PipelineConfig, StepOptions};
    ///
    /// #[derive(Module, Debug)]
    /// pub struct Dense<B: Backend> { linear: Linear<B> }
    /// impl<B: Backend> Dense<B> {
    ///     pub fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> { self.linear.forward(x).tanh() }
    /// }
    /// burn_freeze::unit!(Dense<B>: Tensor<B, 2> => Tensor<B, 2>);
    /// type B = Autodiff<Flex>;
    /// let device = Default::default();
    /// let dense = || Dense::<B> { linear: LinearConfig::new(4, 4).init(&device) };
    /// let stack = LayerStack::new(dense(), vec![dense(), dense()], dense());
    /// let mut pipeline = PipelineConfig::new()
    ///     .with_micro_batches(Some(2))
    ///     .init(stack, vec![device; 2], || SgdConfig::new().init())?;
    /// let mse = |out: Tensor<B, 2>, y: Tensor<B, 2>| (out - y).powf_scalar(2.0).mean();
    /// let (x, y) = (Tensor::<B, 2>::ones([4, 4], &device), Tensor::<B, 2>::zeros([4, 4], &device));
    ///
    /// // A plain pass, then one with units 0 and 1 frozen and served by the cache.
    /// pipeline.forward_backward(x.clone(), y.clone(), mse, StepOptions::new())?;
    /// pipeline.step(0.1)?;
    /// pipeline.freeze_to(2)?;
    /// pipeline.attach_cache(ActivationCache::new(CacheConfig::new(1 << 20))?);
    /// let start = pipeline.serve_prefix(&[0, 1, 2, 3], x)?; // sample ids
    /// let report = pipeline.forward_backward(start, y, mse, StepOptions::new())?;
    /// pipeline.step(0.1)?;
    /// assert_eq!(report.micro_batches, 2);
    /// assert_eq!(pipeline.cache().map(|c| c.len()), Some(4)); // served next time
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// On error (every unit frozen, a stage panicked or failed, a wait
    /// exceeded the configured timeout, bad batch sizes, a refused hook, a
    /// hidden batch entering where it may not ([`PipeError::BadEntry`]))
    /// every worker has stopped, no gradient of this pass is kept, and the
    /// weights are unchanged.
    pub fn forward_backward<T, LossFn>(
        &mut self,
        batch: impl Into<CachedStart<S>>,
        targets: T,
        loss: LossFn,
        options: StepOptions<'_>,
    ) -> Result<StepReport, PipeError>
    where
        T: Activation<S::Backend>,
        LossFn: MicroBatchLoss<S, T>,
    {
        if options.hook.is_some() && self.stages.iter().any(|stage| stage.pending.is_some()) {
            return Err(PipeError::GradientsPending(
                "forward_backward with a gradient hook",
            ));
        }
        let (flow, entry) = match batch.into() {
            BatchStart::Input(input) => {
                self.check_sizes(input.batch_size(), targets.batch_size())?;
                (Flow::Input(input.inner()), 0)
            }
            BatchStart::Hidden { entry, hidden } => {
                if entry == 0 || entry > self.cached_prefix() {
                    return Err(PipeError::BadEntry {
                        entry,
                        frozen_on_first: self.stages[0].units().frozen().units().end,
                    });
                }
                self.check_sizes(hidden.batch_size(), targets.batch_size())?;
                (Flow::Hidden(hidden), entry)
            }
        };
        self.run(flow, entry, targets, loss, options.hook)
    }

    /// [`forward_backward`](Pipeline::forward_backward) (its arguments,
    /// then the learning rate) followed by [`step`](Pipeline::step): one
    /// training step.
    pub fn train_step<T, LossFn>(
        &mut self,
        batch: impl Into<CachedStart<S>>,
        targets: T,
        loss: LossFn,
        options: StepOptions<'_>,
        lr: f64,
    ) -> Result<StepReport, PipeError>
    where
        T: Activation<S::Backend>,
        LossFn: MicroBatchLoss<S, T>,
    {
        let report = self.forward_backward(batch, targets, loss, options)?;
        self.step(lr).map(|()| report)
    }

    /// Where a cached pass of the batch `input` starts: the output of the
    /// frozen units of stage 0 ([`cached_prefix`](Self::cached_prefix)
    /// units) served by the attached AutoCache on stage 0's device, or the
    /// input itself without a cache or frozen unit there (see
    /// [`serve_cached`]); `ids[i]` names sample `i` of the batch, the same
    /// id for the same sample in every epoch. A group of replicas serves its batch from
    /// its first replica's cache this way, then shares the served batch
    /// among every replica ([`forward_backward`](Self::forward_backward)
    /// takes the result as it is).
    ///
    /// Fails, changing nothing, when `ids` does not name the batch or a
    /// sample comes back with another shape.
    pub fn serve_prefix(
        &mut self,
        ids: &[u64],
        input: S::Input,
    ) -> Result<CachedStart<S>, burn_freeze::CacheError>
    where
        InnerInput<S>: Cacheable<InnerBackendOf<S>>,
        InnerHidden<S>: Cacheable<InnerBackendOf<S>>,
    {
        let entry = self.cached_prefix();
        let first = &self.stages[0];
        let (frozen, device) = (first.units().frozen(), &first.device);
        serve_cached(self.cache.as_mut(), frozen, entry, ids, input, Some(device))
    }

    /// Something to train, as many targets as samples, enough samples for
    /// the micro-batches.
    fn check_sizes(&self, batch: usize, targets: usize) -> Result<(), PipeError> {
        if self.front == self.num_units() {
            return Err(PipeError::NothingToTrain {
                units: self.num_units(),
            });
        }
        if targets != batch {
            return Err(PipeError::TargetsMismatch {
                input: batch,
                targets,
            });
        }
        micro_batch_sizes(batch, self.config.micro_batches_for(self.stages.len()))?;
        Ok(())
    }

    /// One pass over `flow` (the whole batch, entering stage 0 at unit
    /// `entry`) split into micro-batches, each stage's gradients handed to
    /// `hook` if any.
    fn run<T, LossFn>(
        &mut self,
        flow: InnerFlow<S>,
        entry: usize,
        targets: T,
        loss: LossFn,
        hook: Option<&dyn StageGradients>,
    ) -> Result<StepReport, PipeError>
    where
        T: Activation<S::Backend>,
        LossFn: MicroBatchLoss<S, T>,
    {
        let batch = flow_batch_size::<InnerBackendOf<S>, _, _, _>(&flow);
        let micro_batches = self.config.micro_batches_for(self.stages.len());
        let sizes = micro_batch_sizes(batch, micro_batches)?;
        let inputs = split_flow::<InnerBackendOf<S>, _, _, _>(flow, &sizes);
        let targets: Vec<(T, f32)> = targets
            .split_batch(&sizes)
            .into_iter()
            .zip(&sizes)
            .map(|(t, &n)| (t, n as f32 / batch as f32))
            .collect();

        let (results, wall) = run_pass(
            &mut self.stages,
            self.front,
            &self.config,
            inputs,
            entry,
            targets,
            &loss,
            hook,
        )
        .inspect_err(
            |error| tracing::warn!(%error, "pipelined pass not started; nothing changed"),
        )?;
        let mut reports = Vec::with_capacity(results.len());
        let mut errors = Vec::new();
        for result in results {
            match result {
                Ok(report) => reports.push(report),
                Err(error) => errors.push(error),
            }
        }
        if let Some(error) = PipeError::root_cause(errors) {
            tracing::warn!(%error, "pipelined pass failed; no gradient kept");
            return Err(error);
        }
        let loss: f32 = reports.iter().map(|r| r.loss).sum();
        if !loss.is_finite() {
            let stage = self.stages.len() - 1;
            tracing::warn!(stage, loss, "non-finite loss: no gradient kept");
            return Err(PipeError::NonFinite {
                what: "loss",
                stage,
                unit: None,
            });
        }

        let mut report = StepReport {
            loss: 0.0,
            micro_batches,
            wall,
            busy: Vec::with_capacity(reports.len()),
            peak_saved: Vec::with_capacity(reports.len()),
            messages: 0,
        };
        for (stage, stage_report) in self.stages.iter_mut().zip(reports) {
            report.loss += stage_report.loss;
            report.busy.push(stage_report.busy);
            report.peak_saved.push(stage_report.peak_saved);
            report.messages += stage_report.messages;
            stage.pending = Some(match stage.pending.take() {
                None => stage_report.grads,
                Some(pending) => {
                    let module = stage.units().trainable();
                    let mut accumulator = GradientsAccumulator::new();
                    accumulator.accumulate(module, pending);
                    accumulator.accumulate(module, stage_report.grads);
                    accumulator.grads()
                }
            });
        }
        Ok(report)
    }
}
