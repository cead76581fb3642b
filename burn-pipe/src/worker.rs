//! One stage's share of a pipelined step, run on its own thread: receive,
//! compute, send, in the order the schedule gives.

use std::any::Any;
use std::cell::Cell;
use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::{Duration, Instant};

use burn::optim::{GradientsAccumulator, GradientsParams};
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;
use burn_freeze::{Activation, AutodiffActivation, Differentiable, InnerOf, Unit};
use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};

use crate::error::PipeError;
use crate::schedule::Op;
use crate::stage::{StageInput, StageModule, StageOutput, StageUnits};

/// A message between neighbouring stages: a micro-batch number and an
/// activation (forward) or its gradient (backward), on the inner backend.
pub(crate) type Message<B, H> = (usize, InnerOf<B, H>);

/// The channel ends a stage uses. Stage 0 has no `from_previous` and the last
/// stage no `to_next`.
pub(crate) struct Links<B: AutodiffBackend, H: AutodiffActivation<B>> {
    pub from_previous: Option<Receiver<Message<B, H>>>,
    pub to_next: Option<Sender<Message<B, H>>>,
    pub grads_from_next: Option<Receiver<Message<B, H>>>,
    pub grads_to_previous: Option<Sender<Message<B, H>>>,
}

/// What a stage needs besides its links.
pub(crate) struct Job<B: AutodiffBackend, F: Unit<B>, T> {
    pub stage: usize,
    pub device: B::Device,
    pub ops: Vec<Op>,
    pub timeout: Duration,
    /// Micro-batches of the model input (stage 0 only).
    pub inputs: Vec<InnerOf<B, F::Input>>,
    /// Micro-batches of the targets with each one's weight in the mean loss
    /// (last stage only).
    pub targets: Vec<(T, f32)>,
    /// Whether the previous stage trains, so this stage's input needs a
    /// gradient to send back.
    pub grads_upstream: bool,
}

/// What a stage reports after its share of a step.
pub(crate) struct StageReport {
    pub grads: GradientsParams,
    /// Per micro-batch loss (last stage only), weighted by its share of the batch.
    pub losses: Vec<f32>,
    /// Time spent computing (not waiting).
    pub busy: Duration,
    /// Most micro-batches whose activations were held at once.
    pub peak_saved: usize,
    /// Messages sent.
    pub messages: usize,
}

/// What a micro-batch's backward pass needs from its forward pass.
struct Saved<B: AutodiffBackend, S, H> {
    /// The stage's parameters as fresh leaves of this micro-batch's graph
    /// (same ids, shared storage), so no two live graphs share a node: Burn's
    /// autodiff frees what one backward pass consumed.
    params: S,
    /// The input leaf (none on stage 0, whose input is data).
    input: Option<H>,
    /// The stage output, or the weighted loss on the last stage.
    result: SavedResult<B, H>,
}

enum SavedResult<B: AutodiffBackend, H> {
    Hidden(H),
    Loss(Tensor<B, 1>),
}

/// Runs `job` on `units`, turning a panic into [`PipeError::StageFailed`]
/// naming the stage and micro-batch.
pub(crate) fn run_stage<B, F, M, L, T, LossFn>(
    units: &StageUnits<B, F, M, L>,
    job: Job<B, F, T>,
    links: Links<B, F::Output>,
    loss_fn: &LossFn,
) -> Result<StageReport, PipeError>
where
    B: AutodiffBackend,
    F: Unit<B>,
    F::Output: Differentiable<B>,
    M: Unit<B, Input = F::Output, Output = F::Output>,
    L: Unit<B, Input = F::Output>,
    T: Activation<B>,
    LossFn: Fn(L::Output, T) -> Tensor<B, 1> + Sync,
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

fn panic_message(panic: &(dyn Any + Send)) -> String {
    if let Some(message) = panic.downcast_ref::<&str>() {
        (*message).to_string()
    } else if let Some(message) = panic.downcast_ref::<String>() {
        message.clone()
    } else {
        "panic with a non-string payload".to_string()
    }
}

/// Waits for micro-batch `expected` on `receiver`, within `timeout`.
fn receive<B: AutodiffBackend, H: AutodiffActivation<B>>(
    receiver: &Receiver<Message<B, H>>,
    timeout: Duration,
    stage: usize,
    from: usize,
    expected: usize,
    phase: &'static str,
) -> Result<InnerOf<B, H>, PipeError> {
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

fn send<B: AutodiffBackend, H: AutodiffActivation<B>>(
    sender: &Sender<Message<B, H>>,
    message: Message<B, H>,
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

fn run_ops<B, F, M, L, T, LossFn>(
    units: &StageUnits<B, F, M, L>,
    job: Job<B, F, T>,
    links: Links<B, F::Output>,
    loss_fn: &LossFn,
    current: &Cell<Op>,
) -> Result<StageReport, PipeError>
where
    B: AutodiffBackend,
    F: Unit<B>,
    F::Output: Differentiable<B>,
    M: Unit<B, Input = F::Output, Output = F::Output>,
    L: Unit<B, Input = F::Output>,
    T: Activation<B>,
    LossFn: Fn(L::Output, T) -> Tensor<B, 1> + Sync,
{
    let Job {
        stage,
        device,
        ops,
        timeout,
        inputs,
        targets,
        grads_upstream,
    } = job;
    let module = &units.trainable;
    let mut inputs = inputs.into_iter();
    let mut targets = targets.into_iter();
    let mut saved: VecDeque<Saved<B, StageModule<B, F, M, L>, F::Output>> = VecDeque::new();
    let mut accumulator = GradientsAccumulator::<StageModule<B, F, M, L>>::new();
    let mut report = StageReport {
        grads: GradientsParams::new(),
        losses: Vec::new(),
        busy: Duration::ZERO,
        peak_saved: 0,
        messages: 0,
    };

    for op in ops {
        current.set(op);
        match op {
            // A stage whose units are all frozen has no backward pass.
            Op::Backward(_) if module.is_empty() => {}
            Op::Forward(n) => {
                let input = match &links.from_previous {
                    None => StageInput::Input(
                        inputs
                            .next()
                            .expect("one input per micro-batch")
                            .to_device(&device),
                    ),
                    Some(receiver) => {
                        let hidden = receive::<B, F::Output>(
                            receiver,
                            timeout,
                            stage,
                            stage - 1,
                            n,
                            "forward",
                        )?;
                        StageInput::Hidden(hidden.to_device(&device))
                    }
                };
                let start = Instant::now();
                let input = units.frozen.forward(input);
                if module.is_empty() {
                    let StageInput::Hidden(hidden) = input else {
                        unreachable!("a stage of frozen units holds at least one unit")
                    };
                    let to_next = links
                        .to_next
                        .as_ref()
                        .expect("the last unit is never frozen");
                    report.busy += start.elapsed();
                    send::<B, F::Output>(to_next, (n, hidden), stage, stage + 1, "forward")?;
                    report.messages += 1;
                    continue;
                }
                let (stage_input, input_leaf) = match input {
                    StageInput::Input(input) => {
                        (StageInput::Input(F::Input::from_inner(input)), None)
                    }
                    StageInput::Hidden(hidden) if grads_upstream => {
                        let leaf = F::Output::from_inner(hidden).require_grad();
                        (StageInput::Hidden(leaf.clone()), Some(leaf))
                    }
                    StageInput::Hidden(hidden) => {
                        (StageInput::Hidden(F::Output::from_inner(hidden)), None)
                    }
                };
                let params = module.clone().fork(&device);
                let result = match params.forward(stage_input) {
                    StageOutput::Hidden(output) => {
                        let to_next = links
                            .to_next
                            .as_ref()
                            .expect("a stage without the last unit has a next stage");
                        let message = (n, output.clone().inner());
                        report.busy += start.elapsed();
                        send::<B, F::Output>(to_next, message, stage, stage + 1, "forward")?;
                        report.messages += 1;
                        SavedResult::Hidden(output)
                    }
                    StageOutput::Output(output) => {
                        let (target, weight) = targets.next().expect("one target per micro-batch");
                        let loss = loss_fn(output, target.to_device(&device)).mul_scalar(weight);
                        report.busy += start.elapsed();
                        report.losses.push(loss.clone().into_scalar().elem::<f32>());
                        SavedResult::Loss(loss)
                    }
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
                            .expect("a stage before the last has a next stage");
                        let grad = receive::<B, F::Output>(
                            receiver,
                            timeout,
                            stage,
                            stage + 1,
                            n,
                            "backward",
                        )?;
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
                    send::<B, F::Output>(sender, (n, grad), stage, stage - 1, "backward")?;
                    report.messages += 1;
                }
            }
        }
    }
    report.grads = accumulator.grads();
    Ok(report)
}
