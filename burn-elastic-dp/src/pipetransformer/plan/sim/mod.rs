//! A discrete-event simulation of one training step of one pipeline replica:
//! every stage runs the passes [`burn_pipe::stage_ops`] gives it, in that
//! order, each pass waiting for its neighbour's message (an activation
//! forward, a gradient back) and for its device; stages that share a device
//! share its throughput. Then the gradients are all-reduced.

use burn_pipe::{Op, Schedule, stage_ops};

use crate::pipetransformer::plan::error::{PlanError, check};

/// The work of one stage per micro-batch, at its device's full speed. A
/// stage whose backward work is 0 (every unit frozen) has no backward pass
/// at all, as burn-pipe's worker skips it: it neither waits for a gradient
/// nor pays the pass overhead.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StageWork {
    /// Seconds of one micro-batch's forward pass.
    pub forward: f64,
    /// Seconds of one micro-batch's backward pass.
    pub backward: f64,
    /// Index of the device the stage runs on.
    pub device: usize,
}

/// One step of one pipeline, to simulate.
///
/// ```
/// use burn_elastic_dp::plan::{PipelineSim, StageWork};
/// use burn_pipe::Schedule;
///
/// // 4 uniform stages on 4 devices, 12 micro-batches, free messages.
/// let stages = (0..4).map(|d| StageWork { forward: 1.0, backward: 2.0, device: d }).collect();
/// let trace = PipelineSim::new(Schedule::GPipe, 12, stages).run().unwrap();
/// assert!((trace.bubble_fraction() - 3.0 / 15.0).abs() < 1e-9);
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct PipelineSim {
    /// Order of passes on each stage.
    pub schedule: Schedule,
    /// Micro-batches per step (at least 1).
    pub micro_batches: usize,
    /// The stages, first to last (at least one).
    pub stages: Vec<StageWork>,
    /// Seconds to send one micro-batch's activation from stage `s` to
    /// `s + 1` (and its gradient back): one entry per boundary, or empty
    /// for free messages.
    pub sends: Vec<f64>,
    /// Each device's throughput, in the units of [`parallelism`]: a GPU 1;
    /// a CPU its cores. Devices not listed have capacity 1. With every
    /// pass's parallelism 1 (the default) this is how many passes the
    /// device runs at full speed at once.
    ///
    /// [`parallelism`]: PipelineSim::parallelism
    pub device_capacity: Vec<f64>,
    /// Per stage, how much of its device one of its passes takes when it
    /// runs alone (a pass on a CPU spread over `p` cores by the backend's
    /// thread pool: `p`); its work is timed alone, at that rate. Passes
    /// running at once on one device share its capacity evenly, none above
    /// its own parallelism (processor sharing, capped per pass), and
    /// advance in proportion: a pass given `share` of the device runs at
    /// `share / p` of its speed alone. Empty: 1 for every stage.
    pub parallelism: Vec<f64>,
    /// Fixed seconds each pass takes on top of its work without using its
    /// device (dispatch, thread hand-over, graph bookkeeping).
    pub pass_overhead: f64,
}

/// When one pass ran.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OpSpan {
    /// The pass.
    pub op: Op,
    /// When it was started (its overhead first, then its work).
    pub start: f64,
    /// When it finished.
    pub end: f64,
}

/// The simulated step.
#[derive(Debug, Clone, PartialEq)]
pub struct PipelineTrace {
    /// Seconds from the first pass's start to the last pass's end.
    pub makespan: f64,
    /// Seconds of work (passes at full speed, with overhead) per stage.
    pub busy: Vec<f64>,
    /// Every stage's passes in the order they ran.
    pub spans: Vec<Vec<OpSpan>>,
}

impl PipelineTrace {
    /// Share of the stages' time spent idle: `1 - sum(busy) / (K * makespan)`
    /// (GPipe's `(K - 1) / (M + K - 1)` for uniform stages).
    pub fn bubble_fraction(&self) -> f64 {
        if self.makespan <= 0.0 {
            return 0.0;
        }
        1.0 - self.busy.iter().sum::<f64>() / (self.busy.len() as f64 * self.makespan)
    }

    /// When stage `s` ran its last pass.
    pub fn stage_end(&self, s: usize) -> f64 {
        self.spans[s].last().map_or(0.0, |span| span.end)
    }
}

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

/// How `capacity` is shared by passes that each take at most `caps[i]`:
/// evenly, none above its cap, what a capped pass leaves going to the
/// others (water-filling); all of it when the caps add up to more.
///
/// ```
/// use burn_elastic_dp::plan::shares;
///
/// assert_eq!(shares(&[1.0, 1.0], 2.0), vec![1.0, 1.0]);
/// assert_eq!(shares(&[2.0, 2.0], 2.0), vec![1.0, 1.0]);
/// assert_eq!(shares(&[0.5, 2.0], 2.0), vec![0.5, 1.5]);
/// assert_eq!(shares(&[0.5, 0.5], 2.0), vec![0.5, 0.5]);
/// ```
pub fn shares(caps: &[f64], capacity: f64) -> Vec<f64> {
    let mut out = vec![0.0; caps.len()];
    let mut order: Vec<usize> = (0..caps.len()).collect();
    order.sort_by(|&a, &b| caps[a].total_cmp(&caps[b]));
    let (mut left, mut count) = (capacity, caps.len());
    for (done, &i) in order.iter().enumerate() {
        let even = left / count as f64;
        if caps[i] <= even {
            out[i] = caps[i];
            left -= caps[i];
            count -= 1;
        } else {
            for &j in &order[done..] {
                out[j] = even;
            }
            break;
        }
    }
    out
}

/// The parallelism of a pass over `samples` from `[samples, parallelism]`
/// points: linear between them, flat beyond; 1 without points.
///
/// ```
/// use burn_elastic_dp::plan::parallelism_at;
///
/// let points = [[8.0, 1.8], [2.0, 1.2]];
/// assert!((parallelism_at(&points, 4.0) - 1.4).abs() < 1e-12);
/// assert_eq!(parallelism_at(&points, 1.0), 1.2);
/// assert_eq!(parallelism_at(&points, 64.0), 1.8);
/// assert_eq!(parallelism_at(&[], 64.0), 1.0);
/// ```
pub fn parallelism_at(points: &[[f64; 2]], samples: f64) -> f64 {
    let mut points = points.to_vec();
    points.sort_by(|a, b| a[0].total_cmp(&b[0]));
    let (Some(first), Some(last)) = (points.first(), points.last()) else {
        return 1.0;
    };
    if samples <= first[0] {
        return first[1];
    }
    if samples >= last[0] {
        return last[1];
    }
    let right = points
        .iter()
        .position(|p| p[0] >= samples)
        .unwrap_or(points.len() - 1);
    let (a, b) = (points[right - 1], points[right]);
    a[1] + (samples - a[0]) / (b[0] - a[0]) * (b[1] - a[1])
}

impl PipelineSim {
    /// A step of `stages` under `schedule` with `micro_batches`, free
    /// messages, devices of capacity 1 and no pass overhead.
    pub fn new(schedule: Schedule, micro_batches: usize, stages: Vec<StageWork>) -> Self {
        Self {
            schedule,
            micro_batches,
            stages,
            sends: Vec::new(),
            device_capacity: Vec::new(),
            parallelism: Vec::new(),
            pass_overhead: 0.0,
        }
    }

    /// Checks the inputs: at least one stage and micro-batch, finite
    /// non-negative times, one send per boundary (or none), capacities > 0,
    /// one parallelism > 0 per stage (or none).
    pub fn validate(&self) -> Result<(), PlanError> {
        check(!self.stages.is_empty(), || {
            "a pipeline needs at least 1 stage, got 0".into()
        })?;
        check(self.micro_batches >= 1, || {
            "micro-batches must be at least 1, got 0".into()
        })?;
        let time_ok = |t: f64| t.is_finite() && t >= 0.0;
        for (s, w) in self.stages.iter().enumerate() {
            check(time_ok(w.forward) && time_ok(w.backward), || {
                format!(
                    "stage {s}: pass times must be seconds >= 0, got forward {} backward {}",
                    w.forward, w.backward
                )
            })?;
        }
        check(
            self.sends.is_empty() || self.sends.len() + 1 == self.stages.len(),
            || {
                format!(
                    "{} send times given for {} stages: give one per boundary ({}) or none",
                    self.sends.len(),
                    self.stages.len(),
                    self.stages.len() - 1
                )
            },
        )?;
        check(self.sends.iter().all(|&t| time_ok(t)), || {
            "send times must be seconds >= 0".into()
        })?;
        check(
            self.device_capacity
                .iter()
                .all(|&c| c.is_finite() && c > 0.0),
            || "device capacities must be > 0".into(),
        )?;
        check(
            self.parallelism.is_empty() || self.parallelism.len() == self.stages.len(),
            || {
                format!(
                    "{} parallelisms given for {} stages: give one per stage or none",
                    self.parallelism.len(),
                    self.stages.len()
                )
            },
        )?;
        check(
            self.parallelism.iter().all(|&p| p.is_finite() && p > 0.0),
            || "pass parallelisms must be > 0".into(),
        )?;
        check(time_ok(self.pass_overhead), || {
            format!(
                "pass overhead must be seconds >= 0, got {}",
                self.pass_overhead
            )
        })
    }

    fn send(&self, boundary: usize) -> f64 {
        self.sends.get(boundary).copied().unwrap_or(0.0)
    }

    fn capacity(&self, device: usize) -> f64 {
        self.device_capacity.get(device).copied().unwrap_or(1.0)
    }

    fn stage_parallelism(&self, stage: usize) -> f64 {
        self.parallelism.get(stage).copied().unwrap_or(1.0)
    }

    /// Runs the step: events are a pass becoming ready and a pass ending;
    /// between events every running pass advances at its device's share.
    pub fn run(&self) -> Result<PipelineTrace, PlanError> {
        self.validate()?;
        let (k, m) = (self.stages.len(), self.micro_batches);
        let ops: Vec<Vec<Op>> = (0..k).map(|s| stage_ops(self.schedule, s, k, m)).collect();
        let mut next = vec![0usize; k];
        let mut stage_free = vec![0.0f64; k];
        let mut running_on = vec![false; k];
        let mut forward_end = vec![vec![f64::NAN; m]; k];
        let mut backward_end = vec![vec![f64::NAN; m]; k];
        let mut spans: Vec<Vec<OpSpan>> = vec![Vec::with_capacity(2 * m); k];
        let mut busy = vec![0.0; k];
        let mut running: Vec<Running> = Vec::new();
        let mut now = 0.0f64;
        let total_ops = 2 * m * k;
        let mut done = 0;
        while done < total_ops {
            // Start every pass whose inputs have arrived and whose stage is
            // free (skipped backward passes may free a stage at once).
            let mut progressed = true;
            while progressed {
                progressed = false;
                for s in 0..k {
                    if running_on[s] || next[s] == ops[s].len() {
                        continue;
                    }
                    let op = ops[s][next[s]];
                    if matches!(op, Op::Backward(_)) && self.stages[s].backward == 0.0 {
                        let n = match op {
                            Op::Backward(n) | Op::Forward(n) => n,
                        };
                        backward_end[s][n] = forward_end[s][n];
                        next[s] += 1;
                        done += 1;
                        progressed = true;
                        continue;
                    }
                    let arrival = match op {
                        Op::Forward(_) if s == 0 => Some(0.0),
                        Op::Forward(n) => {
                            let t = forward_end[s - 1][n];
                            (!t.is_nan()).then(|| t + self.send(s - 1))
                        }
                        Op::Backward(n) if s + 1 == k => Some(forward_end[s][n]),
                        Op::Backward(n) => {
                            let t = backward_end[s + 1][n];
                            (!t.is_nan()).then(|| t + self.send(s))
                        }
                    };
                    if let Some(arrival) = arrival {
                        let start = arrival.max(stage_free[s]);
                        let work = match op {
                            Op::Forward(_) => self.stages[s].forward,
                            Op::Backward(_) => self.stages[s].backward,
                        };
                        running.push(Running {
                            stage: s,
                            device: self.stages[s].device,
                            work_from: start + self.pass_overhead,
                            left: work,
                            start,
                            op,
                        });
                        busy[s] += work + self.pass_overhead;
                        running_on[s] = true;
                        next[s] += 1;
                        progressed = true;
                    }
                }
            }
            if done == total_ops {
                break;
            }
            // Each working pass's speed (its share of its device over its
            // parallelism); passes still in their overhead do not work.
            let working = |r: &Running| r.work_from <= now;
            let mut speeds = vec![0.0; running.len()];
            let mut devices: Vec<usize> = running
                .iter()
                .filter(|r| working(r))
                .map(|r| r.device)
                .collect();
            devices.sort_unstable();
            devices.dedup();
            for device in devices {
                let on: Vec<usize> = (0..running.len())
                    .filter(|&i| running[i].device == device && working(&running[i]))
                    .collect();
                let caps: Vec<f64> = on
                    .iter()
                    .map(|&i| self.stage_parallelism(running[i].stage))
                    .collect();
                let given = shares(&caps, self.capacity(device));
                for ((&i, cap), share) in on.iter().zip(&caps).zip(given) {
                    speeds[i] = share / cap;
                }
            }
            // The next event: a pass's work starting or a pass ending.
            let mut next_time = f64::INFINITY;
            for (r, &speed) in running.iter().zip(&speeds) {
                let t = if working(r) {
                    now + r.left / speed
                } else {
                    r.work_from
                };
                next_time = next_time.min(t);
            }
            if !next_time.is_finite() {
                return Err(PlanError::Invalid(format!(
                    "the {:?} schedule of {k} stages and {m} micro-batches stalled",
                    self.schedule
                )));
            }
            let dt = next_time - now;
            for (r, speed) in running.iter_mut().zip(speeds) {
                r.left -= speed * dt;
            }
            now = next_time;
            let tolerance = 1e-12 * now.max(1e-9);
            let mut i = 0;
            while i < running.len() {
                let r = &running[i];
                if r.work_from <= now + tolerance && r.left <= tolerance {
                    let r = running.swap_remove(i);
                    match r.op {
                        Op::Forward(n) => forward_end[r.stage][n] = now,
                        Op::Backward(n) => backward_end[r.stage][n] = now,
                    }
                    spans[r.stage].push(OpSpan {
                        op: r.op,
                        start: r.start,
                        end: now,
                    });
                    stage_free[r.stage] = now;
                    running_on[r.stage] = false;
                    done += 1;
                } else {
                    i += 1;
                }
            }
        }
        Ok(PipelineTrace {
            makespan: now,
            busy,
            spans,
        })
    }
}

#[cfg(test)]
mod tests;
