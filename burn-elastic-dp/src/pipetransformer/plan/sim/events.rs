//! The simulation's event loop: passes start when their inputs have arrived
//! and their stage is free, and advance at their device's share until they end.

use burn_pipe::schedule::{Op, stage_ops};

use super::{OpSpan, PipelineSim, PipelineTrace, shares};
use crate::pipetransformer::plan::error::PlanError;

/// A pass in progress.
struct Running {
    stage: usize,
    device: usize,
    /// When its work starts (after its overhead).
    work_from: f64,
    /// Work left, in seconds at full speed.
    left: f64,
    start: f64,
    op: Op,
}

/// Where the simulated step stands.
struct Events {
    k: usize,
    ops: Vec<Vec<Op>>,
    next: Vec<usize>,
    stage_free: Vec<f64>,
    running_on: Vec<bool>,
    forward_end: Vec<Vec<f64>>,
    backward_end: Vec<Vec<f64>>,
    spans: Vec<Vec<OpSpan>>,
    busy: Vec<f64>,
    running: Vec<Running>,
    now: f64,
    done: usize,
}

impl PipelineSim {
    /// Runs the step: events are a pass becoming ready and a pass ending;
    /// between events every running pass advances at its device's share.
    pub fn run(&self) -> Result<PipelineTrace, PlanError> {
        self.validate()?;
        let (k, m) = (self.stages.len(), self.micro_batches);
        let mut state = Events {
            k,
            ops: (0..k).map(|s| stage_ops(self.schedule, s, k, m)).collect(),
            next: vec![0usize; k],
            stage_free: vec![0.0f64; k],
            running_on: vec![false; k],
            forward_end: vec![vec![f64::NAN; m]; k],
            backward_end: vec![vec![f64::NAN; m]; k],
            spans: vec![Vec::with_capacity(2 * m); k],
            busy: vec![0.0; k],
            running: Vec::new(),
            now: 0.0f64,
            done: 0,
        };
        let total_ops = 2 * m * k;
        while state.done < total_ops {
            state.start_ready(self);
            if state.done == total_ops {
                break;
            }
            let speeds = state.speeds(self);
            let Some(next_time) = state.next_event(&speeds) else {
                return Err(PlanError::Invalid(format!(
                    "the {:?} schedule of {k} stages and {m} micro-batches stalled",
                    self.schedule
                )));
            };
            state.advance(speeds, next_time);
            state.finish_due();
        }
        Ok(PipelineTrace {
            makespan: state.now,
            busy: state.busy,
            spans: state.spans,
        })
    }
}

impl Events {
    /// Starts every pass whose inputs have arrived and whose stage is free
    /// (skipped backward passes may free a stage at once).
    fn start_ready(&mut self, sim: &PipelineSim) {
        let mut progressed = true;
        while progressed {
            progressed = false;
            for s in 0..self.k {
                if self.running_on[s] || self.next[s] == self.ops[s].len() {
                    continue;
                }
                progressed |= self.try_start(sim, s);
            }
        }
    }

    /// Starts (or skips) stage `s`'s next pass if it can; whether it did.
    fn try_start(&mut self, sim: &PipelineSim, s: usize) -> bool {
        let op = self.ops[s][self.next[s]];
        if matches!(op, Op::Backward(_)) && sim.stages[s].backward == 0.0 {
            let n = match op {
                Op::Backward(n) | Op::Forward(n) => n,
            };
            self.backward_end[s][n] = self.forward_end[s][n];
            self.next[s] += 1;
            self.done += 1;
            return true;
        }
        let Some(arrival) = self.arrival(sim, s, op) else {
            return false;
        };
        let start = arrival.max(self.stage_free[s]);
        let work = match op {
            Op::Forward(_) => sim.stages[s].forward,
            Op::Backward(_) => sim.stages[s].backward,
        };
        self.running.push(Running {
            stage: s,
            device: sim.stages[s].device,
            work_from: start + sim.pass_overhead,
            left: work,
            start,
            op,
        });
        self.busy[s] += work + sim.pass_overhead;
        self.running_on[s] = true;
        self.next[s] += 1;
        true
    }

    /// When pass `op` of stage `s` has its input, if it has arrived yet.
    fn arrival(&self, sim: &PipelineSim, s: usize, op: Op) -> Option<f64> {
        match op {
            Op::Forward(_) if s == 0 => Some(0.0),
            Op::Forward(n) => {
                let t = self.forward_end[s - 1][n];
                (!t.is_nan()).then(|| t + sim.send(s - 1))
            }
            Op::Backward(n) if s + 1 == self.k => Some(self.forward_end[s][n]),
            Op::Backward(n) => {
                let t = self.backward_end[s + 1][n];
                (!t.is_nan()).then(|| t + sim.send(s))
            }
        }
    }

    /// Whether pass `r` is working (past its overhead).
    fn working(&self, r: &Running) -> bool {
        r.work_from <= self.now
    }

    /// Each running pass's speed (its share of its device over its
    /// parallelism); passes still in their overhead do not work.
    fn speeds(&self, sim: &PipelineSim) -> Vec<f64> {
        let running = &self.running;
        let mut speeds = vec![0.0; running.len()];
        let mut devices: Vec<usize> = running
            .iter()
            .filter(|r| self.working(r))
            .map(|r| r.device)
            .collect();
        devices.sort_unstable();
        devices.dedup();
        for device in devices {
            let on: Vec<usize> = (0..running.len())
                .filter(|&i| running[i].device == device && self.working(&running[i]))
                .collect();
            let caps: Vec<f64> = on
                .iter()
                .map(|&i| sim.stage_parallelism(running[i].stage))
                .collect();
            let given = shares(&caps, sim.capacity(device));
            for ((&i, cap), share) in on.iter().zip(&caps).zip(given) {
                speeds[i] = share / cap;
            }
        }
        speeds
    }

    /// The next event: a pass's work starting or a pass ending; `None`
    /// when nothing can happen (a stalled schedule).
    fn next_event(&self, speeds: &[f64]) -> Option<f64> {
        let mut next_time = f64::INFINITY;
        for (r, &speed) in self.running.iter().zip(speeds) {
            let t = if self.working(r) {
                self.now + r.left / speed
            } else {
                r.work_from
            };
            next_time = next_time.min(t);
        }
        next_time.is_finite().then_some(next_time)
    }

    /// Every running pass advanced to `next_time` at its speed.
    fn advance(&mut self, speeds: Vec<f64>, next_time: f64) {
        let dt = next_time - self.now;
        for (r, speed) in self.running.iter_mut().zip(speeds) {
            r.left -= speed * dt;
        }
        self.now = next_time;
    }

    /// Ends every pass whose work is done by now.
    fn finish_due(&mut self) {
        let now = self.now;
        let tolerance = 1e-12 * now.max(1e-9);
        let mut i = 0;
        while i < self.running.len() {
            let r = &self.running[i];
            if r.work_from <= now + tolerance && r.left <= tolerance {
                let r = self.running.swap_remove(i);
                match r.op {
                    Op::Forward(n) => self.forward_end[r.stage][n] = now,
                    Op::Backward(n) => self.backward_end[r.stage][n] = now,
                }
                self.spans[r.stage].push(OpSpan {
                    op: r.op,
                    start: r.start,
                    end: now,
                });
                self.stage_free[r.stage] = now;
                self.running_on[r.stage] = false;
                self.done += 1;
            } else {
                i += 1;
            }
        }
    }
}
