//! One stage's share of a pipelined pass, run on its own thread: receive,
//! compute, send, in the order the schedule gives.

use std::cell::Cell;
use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::{Duration, Instant};

use burn::optim::{GradientsAccumulator, GradientsParams};
use burn::prelude::*;
use burn_freeze::fault;
use burn_freeze::plumbing::{Flow, InnerFlow, flow_to_device, fresh_leaves};
use burn_freeze::{
    Activation, AutodiffActivation, Differentiable, InnerBackendOf, StackTypes, TrainableUnits,
    UnitRange,
};
use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};

use crate::error::{PipeError, panic_message};
use crate::loss::MicroBatchLoss;
use crate::schedule::Op;
use crate::wiring::{Links, Message};

/// What a stage needs besides its units and links.
pub(crate) struct Job<S: StackTypes, T> {
    pub stage: usize,
    pub device: Device<S::Backend>,
    pub ops: Vec<Op>,
    pub timeout: Duration,
    /// Micro-batches entering stage 0 at stack unit `entry` (stage 0 only):
    /// the model input at unit 0, or the output of a frozen prefix served
    /// from the cache.
    pub inputs: Vec<InnerFlow<S>>,
    /// The stack unit at which stage 0's inputs enter.
    pub entry: usize,
    /// Micro-batches of the targets with each one's weight in the mean loss
    /// (last stage only).
    pub targets: Vec<(T, f32)>,
}

/// What a stage reports after its share of a pass.
pub(crate) struct StageReport {
    pub grads: GradientsParams,
    /// Sum of the micro-batch losses, each weighted by its share of the
    /// batch (last stage only; 0 elsewhere).
    pub loss: f32,
    /// Time spent computing (not waiting).
    pub busy: Duration,
    /// Most micro-batches whose activations were held at once.
    pub peak_saved: usize,
    /// Messages sent.
    pub messages: usize,
}

/// What a micro-batch's backward pass needs from its forward pass.
struct Saved<S: StackTypes> {
    /// The stage's parameters as fresh leaves of this micro-batch's graph
    /// (same ids, shared storage), so no two live graphs share a node: Burn's
    /// autodiff frees what one backward pass consumed.
    params: TrainableUnits<S>,
    /// The input leaf, when the previous stage needs its gradient.
    input: Option<S::Hidden>,
    /// The stage output, or the weighted loss on the last stage.
    result: SavedResult<S>,
}

enum SavedResult<S: StackTypes> {
    Hidden(S::Hidden),
    Loss(Tensor<S::Backend, 1>),
}

/// Runs `job` on `units`, turning a panic into [`PipeError::StageFailed`]
/// naming the stage and micro-batch.
pub(crate) fn run_stage<S, T, LossFn>(
    units: &UnitRange<S>,
    job: Job<S, T>,
    links: Links<S>,
    loss_fn: &LossFn,
) -> Result<StageReport, PipeError>
where
    S: StackTypes,
    T: Activation<S::Backend>,
    LossFn: MicroBatchLoss<S, T>,
{
    let stage = job.stage;
    let current = Cell::new(Op::Forward(0));
    let result = catch_unwind(AssertUnwindSafe(|| {
        run_ops(units, job, links, loss_fn, &current)
    }));
    result.unwrap_or_else(|panic| {
        let (micro_batch, phase) = match current.get() {
            Op::Forward(n) => (n, "forward"),
            Op::Backward(n) => (n, "backward"),
        };
        Err(PipeError::StageFailed {
            stage,
            micro_batch,
            phase,
            message: panic_message(panic.as_ref()),
        })
    })
}

/// Waits for micro-batch `expected` on `receiver`, within `timeout`.
fn receive<S: StackTypes>(
    receiver: &Receiver<Message<S>>,
    timeout: Duration,
    stage: usize,
    from: usize,
    expected: usize,
    phase: &'static str,
) -> Result<burn_freeze::InnerHidden<S>, PipeError> {
    match receiver.recv_timeout(timeout) {
        Ok((micro_batch, value)) => {
            assert_eq!(
                micro_batch, expected,
                "stage {stage} received the {phase} message of micro-batch {micro_batch} from stage {from}, expected {expected}"
            );
            Ok(value)
        }
        Err(RecvTimeoutError::Timeout) => Err(PipeError::Timeout {
            stage,
            from,
            micro_batch: expected,
            phase,
            waited: timeout,
        }),
        Err(RecvTimeoutError::Disconnected) => Err(PipeError::NeighbourGone {
            stage,
            from,
            micro_batch: expected,
            phase,
        }),
    }
}

fn send<S: StackTypes>(
    sender: &Sender<Message<S>>,
    message: Message<S>,
    stage: usize,
    to: usize,
    phase: &'static str,
) -> Result<(), PipeError> {
    let micro_batch = message.0;
    sender.send(message).map_err(|_| PipeError::NeighbourGone {
        stage,
        from: to,
        micro_batch,
        phase,
    })
}

fn run_ops<S, T, LossFn>(
    units: &UnitRange<S>,
    job: Job<S, T>,
    links: Links<S>,
    loss_fn: &LossFn,
    current: &Cell<Op>,
) -> Result<StageReport, PipeError>
where
    S: StackTypes,
    T: Activation<S::Backend>,
    LossFn: MicroBatchLoss<S, T>,
{
    let Job {
        stage,
        device,
        ops,
        timeout,
        inputs,
        entry,
        targets,
    } = job;
    let module = units.trainable();
    let trains = units.num_trainable() > 0;
    let first_trainable = units.first_trainable();
    let grads_upstream = links.grads_upstream();
    let mut inputs = inputs.into_iter();
    let mut targets = targets.into_iter();
    let mut saved: VecDeque<Saved<S>> = VecDeque::new();
    let mut accumulator = GradientsAccumulator::<TrainableUnits<S>>::new();
    let mut losses = Vec::new();
    let mut report = StageReport {
        grads: GradientsParams::new(),
        loss: 0.0,
        busy: Duration::ZERO,
        peak_saved: 0,
        messages: 0,
    };

    for op in ops {
        current.set(op);
        let (phase, n) = match op {
            Op::Forward(n) => (fault::Phase::Forward, n),
            Op::Backward(n) => (fault::Phase::Backward, n),
        };
        fault::check(phase, Some(stage), Some(n)).map_err(PipeError::from)?;
        match op {
            // A stage whose units are all frozen has no backward pass.
            Op::Backward(_) if !trains => {}
            Op::Forward(n) => {
                let (input, at) = match &links.from_previous {
                    None => {
                        let flow = inputs.next().expect("one input per micro-batch");
                        (
                            flow_to_device::<InnerBackendOf<S>, _, _, _>(flow, &device),
                            entry,
                        )
                    }
                    Some(receiver) => {
                        let hidden =
                            receive::<S>(receiver, timeout, stage, stage - 1, n, "forward")?;
                        (Flow::Hidden(hidden.to_device(&device)), units.units().start)
                    }
                };
                let start = Instant::now();
                let frozen = units.frozen();
                let input = frozen.forward_units(input, at, frozen.units().end);
                if !trains {
                    let hidden = input.expect_hidden(units.units().end);
                    let to_next = links
                        .to_next
                        .as_ref()
                        .expect("a stage of frozen units has a next stage");
                    report.busy += start.elapsed();
                    send::<S>(to_next, (n, hidden), stage, stage + 1, "forward")?;
                    report.messages += 1;
                    continue;
                }
                let (flow, input_leaf) = match input {
                    Flow::Input(input) => (Flow::Input(S::Input::from_inner(input)), None),
                    Flow::Hidden(hidden) if grads_upstream => {
                        let leaf = S::Hidden::from_inner(hidden).require_grad();
                        (Flow::Hidden(leaf.clone()), Some(leaf))
                    }
                    Flow::Hidden(hidden) => (Flow::Hidden(S::Hidden::from_inner(hidden)), None),
                    Flow::Output(_) => unreachable!("a stage that trains ends after its input"),
                };
                let params = fresh_leaves(module.clone());
                let result = match UnitRange::<S>::forward_trainable(&params, first_trainable, flow)
                {
                    Flow::Hidden(output) => {
                        let to_next = links
                            .to_next
                            .as_ref()
                            .expect("a stage without the last unit has a next stage");
                        let message = (n, output.clone().inner());
                        report.busy += start.elapsed();
                        send::<S>(to_next, message, stage, stage + 1, "forward")?;
                        report.messages += 1;
                        SavedResult::Hidden(output)
                    }
                    Flow::Output(output) => {
                        let (target, weight) = targets.next().expect("one target per micro-batch");
                        let loss = loss_fn(output, target.to_device(&device)).mul_scalar(weight);
                        report.busy += start.elapsed();
                        // Read once at the end of the pass: one device sync, not one per micro-batch.
                        losses.push(loss.clone().inner());
                        SavedResult::Loss(loss)
                    }
                    Flow::Input(_) => unreachable!("units turn the input into a hidden activation"),
                };
                saved.push_back(Saved {
                    params,
                    input: input_leaf,
                    result,
                });
                report.peak_saved = report.peak_saved.max(saved.len());
            }
            Op::Backward(n) => {
                let Saved {
                    params,
                    input,
                    result,
                } = saved.pop_front().expect("forward before backward");
                let (mut grads, start) = match result {
                    SavedResult::Loss(loss) => {
                        let start = Instant::now();
                        (loss.backward(), start)
                    }
                    SavedResult::Hidden(output) => {
                        let receiver = links
                            .grads_from_next
                            .as_ref()
                            .expect("a stage before a training stage receives gradients");
                        let grad =
                            receive::<S>(receiver, timeout, stage, stage + 1, n, "backward")?;
                        let start = Instant::now();
                        (output.seed(grad.to_device(&device)).backward(), start)
                    }
                };
                let upstream = input.map(|input| {
                    input.grad(&grads).unwrap_or_else(|| {
                        panic!("stage {stage}'s output does not depend on its input")
                    })
                });
                let stage_grads = GradientsParams::from_module(&mut grads, &params);
                accumulator.accumulate(module, stage_grads);
                report.busy += start.elapsed();
                if let (Some(grad), Some(sender)) = (upstream, &links.grads_to_previous) {
                    send::<S>(sender, (n, grad), stage, stage - 1, "backward")?;
                    report.messages += 1;
                }
            }
        }
    }
    report.grads = accumulator.grads();
    if !losses.is_empty() {
        report.loss = Tensor::cat(losses, 0).sum().into_scalar().elem::<f32>();
    }
    Ok(report)
}
