//! A pipelined training pass: the batch split into micro-batches, streamed
//! through the stages, each stage's gradients accumulated until the step.

use burn::optim::{GradientsAccumulator, Optimizer};
use burn_freeze::plumbing::{CachedStart, Flow, InnerFlow, serve_cached};
use burn_freeze::{
    Activation, AutodiffActivation, Cacheable, InnerBackendOf, InnerHidden, InnerInput, StackTypes,
    TrainableUnits,
};

use crate::runtime::error::PipeError;
use crate::runtime::hook::StageGradients;
use crate::runtime::loss::MicroBatchLoss;
use crate::runtime::pass::run_pass;
use crate::runtime::pipeline::Pipeline;
use crate::runtime::report::StepReport;
use crate::runtime::split::micro_batch_sizes;

/// A whole batch as a flow, with its size.
fn flow_batch<S: StackTypes>(flow: InnerFlow<S>) -> (InnerFlow<S>, usize) {
    let batch = match &flow {
        Flow::Input(x) => x.batch_size(),
        Flow::Hidden(x) => x.batch_size(),
        Flow::Output(x) => x.batch_size(),
    };
    (flow, batch)
}

/// A flow split into micro-batches of `sizes`.
fn split_flow<S: StackTypes>(flow: InnerFlow<S>, sizes: &[usize]) -> Vec<InnerFlow<S>> {
    match flow {
        Flow::Input(x) => x.split_batch(sizes).into_iter().map(Flow::Input).collect(),
        Flow::Hidden(x) => x.split_batch(sizes).into_iter().map(Flow::Hidden).collect(),
        Flow::Output(x) => x.split_batch(sizes).into_iter().map(Flow::Output).collect(),
    }
}

impl<S, O> Pipeline<S, O>
where
    S: StackTypes,
    O: Optimizer<TrainableUnits<S>, S::Backend>,
{
    /// Runs the forward and backward passes of one mini-batch through the
    /// pipeline and adds each stage's parameter gradients to its accumulated
    /// gradients (so several calls before [`step`](Pipeline::step) accumulate).
    ///
    /// `loss` (a [`MicroBatchLoss`]: any `Fn + Sync` closure, borrowing or
    /// owning) maps the last unit's output for a micro-batch and that
    /// micro-batch's targets to the *mean* loss over its samples; the pipeline
    /// weights each micro-batch by its share of the batch, so the gradients are
    /// those of the mean loss over the whole batch.
    ///
    /// On error (every unit frozen, a stage panicked or failed, a wait
    /// exceeded the configured timeout, bad batch sizes) every worker has
    /// stopped, no gradient of this pass is kept, and the weights are
    /// unchanged.
    pub fn forward_backward<T, LossFn>(
        &mut self,
        input: S::Input,
        targets: T,
        loss: LossFn,
    ) -> Result<StepReport, PipeError>
    where
        T: Activation<S::Backend>,
        LossFn: MicroBatchLoss<S, T>,
    {
        self.forward_backward_hooked(input, targets, loss, None)
    }

    /// [`forward_backward`](Pipeline::forward_backward) where each stage
    /// hands its gradients of the pass to `hook` on its own thread as soon
    /// as it has finished the backward of its last micro-batch (the last
    /// stage first), and keeps what the hook returns: a data-parallel group
    /// all-reduces them there while the earlier stages still compute. A
    /// hook that fails fails the pass ([`PipeError::GradientHook`]; no
    /// gradient kept). `hook: None` is `forward_backward`.
    ///
    /// Refused, before any work, while gradients of an earlier pass are
    /// pending: the hook would see this pass's gradients only.
    pub fn forward_backward_hooked<T, LossFn>(
        &mut self,
        input: S::Input,
        targets: T,
        loss: LossFn,
        hook: Option<&dyn StageGradients>,
    ) -> Result<StepReport, PipeError>
    where
        T: Activation<S::Backend>,
        LossFn: MicroBatchLoss<S, T>,
    {
        self.check_hook(hook)?;
        self.check_sizes(input.batch_size(), targets.batch_size())?;
        let flows = flow_batch::<S>(Flow::Input(input.inner()));
        self.run(flows, 0, targets, loss, hook)
    }

    /// [`forward_backward`](Pipeline::forward_backward) with the frozen
    /// units of stage 0 served by the attached AutoCache
    /// ([`serve_cached`](burn_freeze::plumbing::serve_cached)): `ids[i]` names sample
    /// `i` of the batch, the same id for the same sample in every epoch.
    /// The cache holds the output of the frozen units on stage 0 (at most
    /// every unit but the last); frozen units on later stages run as usual.
    /// Gradients and loss equal `forward_backward`'s. Without a cache, or
    /// with no frozen unit on stage 0, this is `forward_backward`.
    ///
    /// Fails, changing nothing, when `ids` does not name the batch (count or
    /// duplicates) or a sample comes back with another shape, and as
    /// `forward_backward` does.
    pub fn forward_backward_cached<T, LossFn>(
        &mut self,
        ids: &[u64],
        input: S::Input,
        targets: T,
        loss: LossFn,
    ) -> Result<StepReport, PipeError>
    where
        T: Activation<S::Backend>,
        LossFn: MicroBatchLoss<S, T>,
        InnerInput<S>: Cacheable<InnerBackendOf<S>>,
        InnerHidden<S>: Cacheable<InnerBackendOf<S>>,
    {
        self.check_sizes(input.batch_size(), targets.batch_size())?;
        match self.serve_prefix(ids, input)? {
            CachedStart::Input(input) => self.forward_backward(input, targets, loss),
            CachedStart::Hidden { entry, hidden } => {
                self.forward_backward_from(entry, hidden, targets, loss)
            }
        }
    }

    /// Where a cached pass of the batch `input` starts: the output of the
    /// frozen units of stage 0 ([`cached_prefix`](Self::cached_prefix)
    /// units) served by the attached AutoCache on stage 0's device, or the
    /// input itself without a cache or frozen unit there (see
    /// [`serve_cached`]); `ids` name the samples, as in
    /// [`forward_backward_cached`](Self::forward_backward_cached). A group of
    /// replicas serves its batch from its first replica's cache this way,
    /// then shares the served batch among every replica.
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

    /// [`forward_backward`](Pipeline::forward_backward) for a batch that
    /// enters the pipeline at unit `entry` as `hidden`, the output of units
    /// `0..entry` computed elsewhere (served from a cache shared by several
    /// pipelines, say): those units do not run. Gradients and loss equal
    /// `forward_backward`'s on the input that gave `hidden`.
    ///
    /// Fails, before any work, when units `0..entry` are not frozen units of
    /// stage 0 or `entry` is 0, and as `forward_backward` does.
    pub fn forward_backward_from<T, LossFn>(
        &mut self,
        entry: usize,
        hidden: InnerHidden<S>,
        targets: T,
        loss: LossFn,
    ) -> Result<StepReport, PipeError>
    where
        T: Activation<S::Backend>,
        LossFn: MicroBatchLoss<S, T>,
    {
        self.forward_backward_from_hooked(entry, hidden, targets, loss, None)
    }

    /// [`forward_backward_from`](Pipeline::forward_backward_from) with each
    /// stage's gradients handed to `hook` as in
    /// [`forward_backward_hooked`](Pipeline::forward_backward_hooked).
    pub fn forward_backward_from_hooked<T, LossFn>(
        &mut self,
        entry: usize,
        hidden: InnerHidden<S>,
        targets: T,
        loss: LossFn,
        hook: Option<&dyn StageGradients>,
    ) -> Result<StepReport, PipeError>
    where
        T: Activation<S::Backend>,
        LossFn: MicroBatchLoss<S, T>,
    {
        self.check_hook(hook)?;
        if entry == 0 || entry > self.cached_prefix() {
            return Err(PipeError::BadEntry {
                entry,
                frozen_on_first: self.stages[0].units().frozen().units().end,
            });
        }
        self.check_sizes(hidden.batch_size(), targets.batch_size())?;
        let flows = flow_batch::<S>(Flow::Hidden(hidden));
        self.run(flows, entry, targets, loss, hook)
    }

    /// A hook sees one pass's gradients: none may be pending.
    fn check_hook(&self, hook: Option<&dyn StageGradients>) -> Result<(), PipeError> {
        if hook.is_some() && self.stages.iter().any(|stage| stage.pending.is_some()) {
            return Err(PipeError::GradientsPending("forward_backward_hooked"));
        }
        Ok(())
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

    /// One pass over `flows` (the whole batch, entering stage 0 at unit
    /// `entry`) split into micro-batches, each stage's gradients handed to
    /// `hook` if any.
    fn run<T, LossFn>(
        &mut self,
        flows: (InnerFlow<S>, usize),
        entry: usize,
        targets: T,
        loss: LossFn,
        hook: Option<&dyn StageGradients>,
    ) -> Result<StepReport, PipeError>
    where
        T: Activation<S::Backend>,
        LossFn: MicroBatchLoss<S, T>,
    {
        let (flow, batch) = flows;
        let micro_batches = self.config.micro_batches_for(self.stages.len());
        let sizes = micro_batch_sizes(batch, micro_batches)?;
        let inputs = split_flow::<S>(flow, &sizes);
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

    /// [`forward_backward`](Pipeline::forward_backward) then [`step`](Pipeline::step).
    pub fn train_step<T, LossFn>(
        &mut self,
        input: S::Input,
        targets: T,
        loss: LossFn,
        lr: f64,
    ) -> Result<StepReport, PipeError>
    where
        T: Activation<S::Backend>,
        LossFn: MicroBatchLoss<S, T>,
    {
        let report = self.forward_backward(input, targets, loss)?;
        self.step(lr)?;
        Ok(report)
    }
}
