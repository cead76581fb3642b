//! One pipelined pass: a worker thread per stage, joined before returning.

use std::thread;
use std::time::{Duration, Instant};

use burn_freeze::plumbing::InnerFlow;
use burn_freeze::{Activation, StackTypes, UnitRange};

use crate::config::PipelineConfig;
use crate::error::PipeError;
use crate::loss::MicroBatchLoss;
use crate::placement::Stage;
use crate::schedule::stage_ops;
use crate::wiring::wire;
use crate::worker::{Job, StageReport, run_stage};

/// Runs the micro-batches `inputs`, entering stage 0 at stack unit `entry`
/// (with `targets` and their weights), through `stages`, each on a scoped
/// thread of its own (a single stage on this thread), and returns each
/// stage's result in stage order with the wall time. Every stage's units are
/// back in place when this returns, whatever happened.
pub(crate) fn run_pass<S, O, T, LossFn>(
    stages: &mut [Stage<S, O>],
    front: usize,
    config: &PipelineConfig,
    inputs: Vec<InnerFlow<S>>,
    entry: usize,
    targets: Vec<(T, f32)>,
    loss: &LossFn,
) -> (Vec<Result<StageReport, PipeError>>, Duration)
where
    S: StackTypes,
    T: Activation<S::Backend>,
    LossFn: MicroBatchLoss<S, T>,
{
    let count = stages.len();
    let micro_batches = inputs.len();
    let ranges: Vec<_> = stages.iter().map(|s| s.range.clone()).collect();
    let mut links = wire::<S>(&ranges, front).into_iter();
    let mut inputs = Some(inputs);
    let mut targets = Some(targets);
    let timeout = Duration::from_millis(config.timeout_ms);
    let start = Instant::now();

    if count == 1 {
        // One stage waits for no neighbour: run it on this thread.
        let stage = &mut stages[0];
        let units = stage.units.take().expect("units present between calls");
        let links = links.next().expect("one link set per stage");
        let job = Job {
            stage: 0,
            device: stage.device.clone(),
            ops: stage_ops(config.schedule, 0, 1, micro_batches),
            timeout,
            inputs: inputs.take().unwrap_or_default(),
            entry,
            targets: targets.take().unwrap_or_default(),
        };
        let result = run_stage(&units, job, links, loss);
        stage.units = Some(units);
        return (vec![result], start.elapsed());
    }
    let outcomes: Vec<(UnitRange<S>, Result<StageReport, PipeError>)> = thread::scope(|scope| {
        let handles: Vec<_> = stages
            .iter_mut()
            .enumerate()
            .map(|(s, stage)| {
                let units = stage.units.take().expect("units present between calls");
                let links = links.next().expect("one link set per stage");
                let job = Job {
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
    let results = stages
        .iter_mut()
        .zip(outcomes)
        .map(|(stage, (units, result))| {
            stage.units = Some(units);
            result
        })
        .collect();
    (results, wall)
}
