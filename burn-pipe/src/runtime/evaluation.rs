//! Evaluation through a pipeline: every unit on the inner backend (no graph,
//! dropout off), stage after stage, from the input or from an activation a
//! caller kept after the frozen units of stage 0; and a copy of the stages
//! that another thread can run.

use burn::optim::Optimizer;
use burn::prelude::*;
use burn_freeze::plumbing::{Flow, InnerFlow, cached_prefix, flow_to_device};
use burn_freeze::{InnerBackendOf, InnerInput, InnerOutput, StackTypes, TrainableUnits, UnitRange};

use crate::runtime::error::PipeError;
use crate::runtime::pipeline::Pipeline;

/// A pipeline's stages for evaluation, owned: the units (Burn tensors share
/// their storage, so no weight is copied) and their devices. Made by
/// [`Pipeline::evaluation_copy`], it runs on any thread, so that several
/// replicas of a pipeline can score parts of one batch at once.
#[derive(Clone)]
pub struct EvaluationCopy<S: StackTypes> {
    stages: Vec<(UnitRange<S>, Device<S::Backend>)>,
}

impl<S: StackTypes> EvaluationCopy<S> {
    /// The frozen units at the start of stage 0: the furthest a kept
    /// activation enters.
    pub fn cached_prefix(&self) -> usize {
        let frozen = (self.stages.first()).map_or(0, |(units, _)| units.frozen().units().end);
        let balance: Vec<usize> = self
            .stages
            .iter()
            .map(|(units, _)| units.num_units())
            .collect();
        cached_prefix(frozen, &balance)
    }

    /// The model's output for a batch that enters at stack unit `entry`:
    /// `flow` is the input (`entry` 0) or the output of units `0..entry`,
    /// all of them frozen on stage 0 (`entry <= `[`cached_prefix`](Self::cached_prefix)).
    /// Fails, running nothing, on another entry or a flow that unit `entry`
    /// does not take.
    pub fn forward_inner_from(
        &self,
        flow: InnerFlow<S>,
        entry: usize,
    ) -> Result<InnerOutput<S>, PipeError> {
        check_entry::<S>(&flow, entry, entry, self.cached_prefix())?;
        let stages = self.stages.iter().map(|(units, device)| (units, device));
        Ok(run_stages(stages, flow, entry))
    }

    /// Runs frozen units `from..to` of stage 0 on `flow` (the input for
    /// `from` 0, else the output of units `0..from`) on stage 0's device:
    /// the activation at unit `to` that
    /// [`forward_inner_from`](Self::forward_inner_from) takes. Fails,
    /// running nothing, unless `from <= to <= `[`cached_prefix`](Self::cached_prefix)
    /// and `flow` is what unit `from` takes.
    pub fn forward_frozen_inner(
        &self,
        flow: InnerFlow<S>,
        from: usize,
        to: usize,
    ) -> Result<InnerFlow<S>, PipeError> {
        check_entry::<S>(&flow, from, to, self.cached_prefix())?;
        let (units, device) = &self.stages[0];
        let moved = flow_to_device::<InnerBackendOf<S>, _, _, _>(flow, device);
        Ok(units.frozen().forward_units(moved, from, to))
    }
}

/// `flow` enters at unit `from` and runs frozen units of stage 0 up to
/// unit `to`, of the `prefix` frozen there.
fn check_entry<S: StackTypes>(
    flow: &InnerFlow<S>,
    from: usize,
    to: usize,
    prefix: usize,
) -> Result<(), PipeError> {
    if from > to || to > prefix {
        return Err(PipeError::BadEntry {
            entry: from.max(to),
            frozen_on_first: prefix,
        });
    }
    let fits = match flow {
        Flow::Input(_) => from == 0,
        Flow::Hidden(_) => from > 0,
        Flow::Output(_) => false,
    };
    if !fits {
        return Err(PipeError::FlowMismatch {
            entry: from,
            given: flow.kind(),
            takes: if from == 0 {
                "model input"
            } else {
                "hidden activation"
            },
        });
    }
    Ok(())
}

impl<S, O> Pipeline<S, O>
where
    S: StackTypes,
    O: Optimizer<TrainableUnits<S>, S::Backend>,
{
    /// The stages' units and devices, owned, to evaluate on another thread
    /// while this pipeline stays where it is.
    pub fn evaluation_copy(&self) -> EvaluationCopy<S> {
        EvaluationCopy {
            stages: (self.stages.iter())
                .map(|stage| (stage.units().clone(), stage.device.clone()))
                .collect(),
        }
    }

    /// The model's output for `input`, for evaluation: every unit runs on the
    /// inner backend (no graph, dropout off), stage after stage on the
    /// calling thread, the activation moving to each stage's device.
    pub fn forward_inner(&self, input: InnerInput<S>) -> InnerOutput<S> {
        let stages = self
            .stages
            .iter()
            .map(|stage| (stage.units(), &stage.device));
        run_stages(stages, Flow::Input(input), 0)
    }
}

/// Runs `stages` in order on `flow`, which enters stage 0 at stack unit
/// `entry` (checked by the caller), each stage on its device: the model's
/// output.
fn run_stages<'a, S: StackTypes>(
    stages: impl Iterator<Item = (&'a UnitRange<S>, &'a Device<S::Backend>)>,
    flow: InnerFlow<S>,
    entry: usize,
) -> InnerOutput<S> {
    let mut flow = flow;
    for (index, (units, device)) in stages.enumerate() {
        let moved = flow_to_device::<InnerBackendOf<S>, _, _, _>(flow, device);
        flow = match index {
            0 => units.forward_inner_from(moved, entry),
            _ => units.forward_inner(moved),
        };
    }
    match flow {
        Flow::Output(output) => output,
        other => unreachable!(
            "the last stage returns the model output, not {}",
            other.kind()
        ),
    }
}
