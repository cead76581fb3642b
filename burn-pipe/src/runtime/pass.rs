//! One pipelined pass: a worker thread per stage, joined before returning.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use burn_freeze::plumbing::InnerFlow;
use burn_freeze::{Activation, StackTypes, UnitRange};

use crate::runtime::config::PipelineConfig;
use crate::runtime::error::{PipeError, panic_message};
use crate::runtime::hook::StageGradients;
use crate::runtime::loss::MicroBatchLoss;
use crate::runtime::placement::Stage;
use crate::runtime::schedule::stage_ops;
use crate::runtime::stage_worker::{Job, StageReport, run_stage};
use crate::runtime::threads;
use crate::runtime::wiring::{Links, wire};

/// Runs the micro-batches `inputs`, entering stage 0 at stack unit `entry`
/// (with `targets` and their weights), through `stages`, each on a scoped
/// thread of its own (a single stage on this thread), and returns each
/// stage's result in stage order with the wall time. With a `hook`, each
/// stage hands its gradients to it on its own thread as soon as its passes
/// are done ([`StageGradients`]). Every stage's units are back in place when
/// this returns, whatever happened.
///
/// Fails before any stage runs when a stage's worker thread cannot be
/// started ([`PipeError::Spawn`]; the hook is told that every stage failed).
#[allow(clippy::too_many_arguments)]
pub(crate) fn run_pass<S, O, T, LossFn>(
    stages: &mut [Stage<S, O>],
    front: usize,
    config: &PipelineConfig,
    inputs: Vec<InnerFlow<S>>,
    entry: usize,
    targets: Vec<(T, f32)>,
    loss: &LossFn,
    hook: Option<&dyn StageGradients>,
) -> Result<(Vec<Result<StageReport, PipeError>>, Duration), PipeError>
where
    S: StackTypes,
    T: Activation<S::Backend>,
    LossFn: MicroBatchLoss<S, T>,
{
    let count = stages.len();
    let ranges: Vec<_> = stages.iter().map(|s| s.range.clone()).collect();
    let links = wire::<S>(&ranges, front);
    let timeout = Duration::from_millis(config.timeout_ms);
    let start = Instant::now();
    let jobs = stage_jobs(stages, config, timeout, inputs, entry, targets);
    let finished = AtomicUsize::new(0);
    let handed = Handing {
        hook,
        finished: &finished,
        stages: count,
    };

    if count == 1 {
        // One stage waits for no neighbour: run it on this thread.
        let stage = &mut stages[0];
        let units = stage.units.take().expect("units present between calls");
        let (job, links) = jobs
            .into_iter()
            .zip(links)
            .next()
            .expect("one job per stage");
        let result = handed.hand_on(0, run_stage(&units, job, links, loss));
        stage.units = Some(units);
        return Ok((vec![result], start.elapsed()));
    }
    let outcomes = thread::scope(|scope| {
        // Every stage's thread first, each waiting for its work: a thread
        // that cannot start loses no stage's units.
        let run = move |s, (units, job, links): (UnitRange<S>, Job<S, T>, Links<S>)| {
            let result = handed.hand_on(s, run_stage(&units, job, links, loss));
            (units, result)
        };
        let started = threads::start(scope, "stage", count, run)?;
        let handles: Vec<_> = started
            .into_iter()
            .zip(stages.iter_mut())
            .zip(jobs.into_iter().zip(links))
            .map(|((worker, stage), (job, links))| {
                let units = stage.units.take().expect("units present between calls");
                worker.hand((units, job, links))
            })
            .collect();
        Ok::<_, PipeError>(handles.into_iter().map(threads::join).collect::<Vec<_>>())
    });
    let outcomes = outcomes.inspect_err(|_| (0..count).for_each(|s| handed.failed(s)))?;
    let wall = start.elapsed();
    let results = stages
        .iter_mut()
        .zip(outcomes)
        .map(|(stage, (units, result))| {
            stage.units = Some(units);
            result
        })
        .collect();
    Ok((results, wall))
}

/// Each stage's job: every stage runs the schedule's passes, the inputs go
/// to the first stage and the targets to the last.
fn stage_jobs<S: StackTypes, O, T>(
    stages: &[Stage<S, O>],
    config: &PipelineConfig,
    timeout: Duration,
    inputs: Vec<InnerFlow<S>>,
    entry: usize,
    targets: Vec<(T, f32)>,
) -> Vec<Job<S, T>> {
    let count = stages.len();
    let micro_batches = inputs.len();
    let mut inputs = Some(inputs);
    let mut targets = Some(targets);
    stages
        .iter()
        .enumerate()
        .map(|(s, stage)| Job {
            stage: s,
            device: stage.device.clone(),
            ops: stage_ops(config.schedule, s, count, micro_batches),
            timeout,
            inputs: if s == 0 {
                inputs.take().unwrap_or_default()
            } else {
                Vec::new()
            },
            entry,
            targets: if s + 1 == count {
                targets.take().unwrap_or_default()
            } else {
                Vec::new()
            },
        })
        .collect()
}

/// A pass's hook, if any, and how many stages have finished their passes.
#[derive(Clone, Copy)]
struct Handing<'a> {
    hook: Option<&'a dyn StageGradients>,
    finished: &'a AtomicUsize,
    stages: usize,
}

impl Handing<'_> {
    /// Stage `s`'s result after its passes, its gradients handed to the
    /// hook (the last stage to finish first says that all have); a failed
    /// stage is reported to the hook instead. A panic in the hook is the
    /// stage's [`PipeError::GradientHook`].
    fn hand_on(
        &self,
        s: usize,
        result: Result<StageReport, PipeError>,
    ) -> Result<StageReport, PipeError> {
        let Some(hook) = self.hook else {
            return result;
        };
        let mut report = match result {
            Ok(report) => report,
            Err(error) => {
                self.failed(s);
                return Err(error);
            }
        };
        let grads = std::mem::replace(&mut report.grads, burn::optim::GradientsParams::new());
        let handed = catch_unwind(AssertUnwindSafe(|| {
            if self.finished.fetch_add(1, Ordering::AcqRel) + 1 == self.stages {
                hook.all_computed();
            }
            hook.stage_done(s, grads)
        }))
        .unwrap_or_else(|panic| {
            Err(format!(
                "the hook panicked: {}",
                panic_message(panic.as_ref())
            ))
        });
        report.grads = handed.map_err(|message| PipeError::GradientHook { stage: s, message })?;
        Ok(report)
    }

    /// Tells the hook, if any, that stage `s` failed; a panic in the hook
    /// is logged (the stage's own error is what the pass reports).
    fn failed(&self, s: usize) {
        if let Some(hook) = self.hook
            && let Err(panic) = catch_unwind(AssertUnwindSafe(|| hook.stage_failed(s)))
        {
            tracing::warn!(
                stage = s,
                panic = panic_message(panic.as_ref()),
                "the gradient hook panicked when told that a stage failed"
            );
        }
    }
}
