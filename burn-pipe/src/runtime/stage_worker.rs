//! One stage's share of a pipelined pass, run on its own thread: receive,
//! compute, send, in the order the schedule gives.

use std::cell::Cell;
use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::{Duration, Instant};

use burn::optim::{GradientsAccumulator, GradientsParams};
use burn::prelude::*;
use burn_freeze::fault;
use burn_freeze::plumbing::{Flow, InnerFlow, TrainFlow, flow_to_device, fresh_leaves};
use burn_freeze::{
    Activation, AutodiffActivation, Differentiable, InnerBackendOf, InnerHidden, StackTypes,
    TrainableUnits, UnitRange,
};
use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};

use crate::runtime::error::{PipeError, panic_message};
use crate::runtime::loss::MicroBatchLoss;
use crate::runtime::schedule::Op;
use crate::runtime::wiring::{Links, Message};

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
) -> Result<InnerHidden<S>, PipeError> {
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

/// Runs the job's passes in the schedule's order, recording in `current`
/// the pass under way.
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
    let (mut worker, ops) = StageWorker::new(units, job, links, loss_fn);
    for op in ops {
        current.set(op);
        worker.run(op)?;
    }
    Ok(worker.finish())
}

/// A stage's state between its passes. Each pass first waits at its fence
/// (the activation or gradient it needs from a neighbour), then computes,
/// then sends what the neighbour on the other side waits for.
struct StageWorker<'a, S: StackTypes, T, LossFn> {
    units: &'a UnitRange<S>,
    links: Links<S>,
    loss_fn: &'a LossFn,
    stage: usize,
    device: Device<S::Backend>,
    timeout: Duration,
    /// The stack unit at which stage 0's inputs enter.
    entry: usize,
    inputs: std::vec::IntoIter<InnerFlow<S>>,
    targets: std::vec::IntoIter<(T, f32)>,
    /// Whether the stage has a trainable unit (else it has no backward pass).
    trains: bool,
    /// Whether the stage's input needs a gradient sent back.
    grads_upstream: bool,
    /// What each micro-batch in flight keeps for its backward pass, oldest
    /// first.
    saved: VecDeque<Saved<S>>,
    accumulator: GradientsAccumulator<TrainableUnits<S>>,
    /// The weighted loss of each micro-batch (last stage only), read once at
    /// the end of the pass: one device sync, not one per micro-batch.
    losses: Vec<Tensor<InnerBackendOf<S>, 1>>,
    report: StageReport,
}

impl<'a, S, T, LossFn> StageWorker<'a, S, T, LossFn>
where
    S: StackTypes,
    T: Activation<S::Backend>,
    LossFn: MicroBatchLoss<S, T>,
{
    /// A worker at the start of `job`, and the passes it is to run.
    fn new(
        units: &'a UnitRange<S>,
        job: Job<S, T>,
        links: Links<S>,
        loss_fn: &'a LossFn,
    ) -> (Self, Vec<Op>) {
        let Job {
            stage,
            device,
            ops,
            timeout,
            inputs,
            entry,
            targets,
        } = job;
        let worker = Self {
            units,
            trains: units.num_trainable() > 0,
            grads_upstream: links.grads_upstream(),
            links,
            loss_fn,
            stage,
            device,
            timeout,
            entry,
            inputs: inputs.into_iter(),
            targets: targets.into_iter(),
            saved: VecDeque::new(),
            accumulator: GradientsAccumulator::new(),
            losses: Vec::new(),
            report: StageReport {
                grads: GradientsParams::new(),
                loss: 0.0,
                busy: Duration::ZERO,
                peak_saved: 0,
                messages: 0,
            },
        };
        (worker, ops)
    }

    /// One pass, after any fault injected there.
    fn run(&mut self, op: Op) -> Result<(), PipeError> {
        let (phase, n) = match op {
            Op::Forward(n) => (crate::fault::FORWARD, n),
            Op::Backward(n) => (crate::fault::BACKWARD, n),
        };
        fault::check(phase, Some(self.stage), Some(n)).map_err(PipeError::from)?;
        match op {
            // A stage whose units are all frozen has no backward pass.
            Op::Backward(_) if !self.trains => Ok(()),
            Op::Forward(n) => self.forward(n),
            Op::Backward(n) => self.backward(n),
        }
    }

    /// The forward pass of micro-batch `n`: its input, the frozen units,
    /// then the trainable ones (or straight on, when none trains).
    fn forward(&mut self, n: usize) -> Result<(), PipeError> {
        let (input, at) = self.fence_forward(n)?;
        let start = Instant::now();
        let frozen = self.units.frozen();
        let input = frozen.forward_units(input, at, frozen.units().end);
        if !self.trains {
            let hidden = input.expect_hidden(self.units.units().end);
            let to_next = self
                .links
                .to_next
                .as_ref()
                .expect("a stage of frozen units has a next stage");
            self.report.busy += start.elapsed();
            send::<S>(to_next, (n, hidden), self.stage, self.stage + 1, "forward")?;
            self.report.messages += 1;
            return Ok(());
        }
        self.forward_trainable(n, input, start)
    }

    /// The fence of a forward pass: micro-batch `n`'s input, on this
    /// stage's device, and the unit it enters at.
    fn fence_forward(&mut self, n: usize) -> Result<(InnerFlow<S>, usize), PipeError> {
        Ok(match &self.links.from_previous {
            None => {
                let flow = self.inputs.next().expect("one input per micro-batch");
                (
                    flow_to_device::<InnerBackendOf<S>, _, _, _>(flow, &self.device),
                    self.entry,
                )
            }
            Some(receiver) => {
                let (stage, from) = (self.stage, self.stage - 1);
                let hidden = receive::<S>(receiver, self.timeout, stage, from, n, "forward")?;
                (
                    Flow::Hidden(hidden.to_device(&self.device)),
                    self.units.units().start,
                )
            }
        })
    }

    /// The trainable units' forward pass of micro-batch `n` (begun at
    /// `start`), on fresh parameter leaves; sends the output on, or takes
    /// the weighted loss on the last stage, and saves what the backward pass
    /// needs.
    fn forward_trainable(
        &mut self,
        n: usize,
        input: InnerFlow<S>,
        start: Instant,
    ) -> Result<(), PipeError> {
        let (flow, input_leaf) = train_leaves::<S>(input, self.grads_upstream);
        let params = fresh_leaves(self.units.trainable().clone());
        let first_trainable = self.units.first_trainable();
        let result = match UnitRange::<S>::forward_trainable(&params, first_trainable, flow) {
            Flow::Hidden(output) => {
                let to_next = self
                    .links
                    .to_next
                    .as_ref()
                    .expect("a stage without the last unit has a next stage");
                let message = (n, output.clone().inner());
                self.report.busy += start.elapsed();
                send::<S>(to_next, message, self.stage, self.stage + 1, "forward")?;
                self.report.messages += 1;
                SavedResult::Hidden(output)
            }
            Flow::Output(output) => {
                let (target, weight) = self.targets.next().expect("one target per micro-batch");
                let loss =
                    (self.loss_fn)(output, target.to_device(&self.device)).mul_scalar(weight);
                self.report.busy += start.elapsed();
                self.losses.push(loss.clone().inner());
                SavedResult::Loss(loss)
            }
            Flow::Input(_) => unreachable!("units turn the input into a hidden activation"),
        };
        self.saved.push_back(Saved {
            params,
            input: input_leaf,
            result,
        });
        self.report.peak_saved = self.report.peak_saved.max(self.saved.len());
        Ok(())
    }

    /// The backward pass of micro-batch `n` (the oldest in flight): from its
    /// loss, or from the output's gradient the next stage sends; the
    /// parameter gradients accumulate, the input's go back.
    fn backward(&mut self, n: usize) -> Result<(), PipeError> {
        let Saved {
            params,
            input,
            result,
        } = self.saved.pop_front().expect("forward before backward");
        let (mut grads, start) = match result {
            SavedResult::Loss(loss) => {
                let start = Instant::now();
                (loss.backward(), start)
            }
            SavedResult::Hidden(output) => {
                let grad = self.fence_backward(n)?;
                let start = Instant::now();
                (output.seed(grad.to_device(&self.device)).backward(), start)
            }
        };
        let stage = self.stage;
        let upstream = input
            .map(|input| {
                input.grad(&grads).ok_or(PipeError::OutputIgnoresInput {
                    stage,
                    micro_batch: n,
                })
            })
            .transpose()?;
        let stage_grads = GradientsParams::from_module(&mut grads, &params);
        self.accumulator
            .accumulate(self.units.trainable(), stage_grads);
        self.report.busy += start.elapsed();
        if let (Some(grad), Some(sender)) = (upstream, &self.links.grads_to_previous) {
            send::<S>(sender, (n, grad), stage, stage - 1, "backward")?;
            self.report.messages += 1;
        }
        Ok(())
    }

    /// The fence of a backward pass: the gradient of micro-batch `n`'s
    /// output, from the next stage.
    fn fence_backward(&self, n: usize) -> Result<InnerHidden<S>, PipeError> {
        let receiver = self
            .links
            .grads_from_next
            .as_ref()
            .expect("a stage before a training stage receives gradients");
        receive::<S>(
            receiver,
            self.timeout,
            self.stage,
            self.stage + 1,
            n,
            "backward",
        )
    }

    /// The stage's report once every pass has run.
    fn finish(mut self) -> StageReport {
        let mut report = self.report;
        report.grads = self.accumulator.grads();
        if !self.losses.is_empty() {
            report.loss = Tensor::cat(self.losses, 0)
                .sum()
                .into_scalar()
                .elem::<f32>();
        }
        report
    }
}

/// A micro-batch's input to the trainable units, on the autodiff backend:
/// a hidden activation as a leaf that keeps its gradient when the previous
/// stage needs it (returned too).
fn train_leaves<S: StackTypes>(
    input: InnerFlow<S>,
    grads_upstream: bool,
) -> (TrainFlow<S>, Option<S::Hidden>) {
    match input {
        Flow::Input(input) => (Flow::Input(S::Input::from_inner(input)), None),
        Flow::Hidden(hidden) if grads_upstream => {
            let leaf = S::Hidden::from_inner(hidden).require_grad();
            (Flow::Hidden(leaf.clone()), Some(leaf))
        }
        Flow::Hidden(hidden) => (Flow::Hidden(S::Hidden::from_inner(hidden)), None),
        Flow::Output(_) => unreachable!("a stage that trains ends after its input"),
    }
}
