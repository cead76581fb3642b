//! A discrete-event simulation of one training step of one pipeline replica ([`PipelineSim`]).

use burn_pipe::Schedule;
use burn_pipe::schedule::Op;

use crate::pipetransformer::plan::error::{PlanError, check};

mod events;

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

/// One step of one pipeline, to simulate: every stage runs the passes
/// [`burn_pipe::schedule::stage_ops`] gives it, in that order, each pass waiting for its
/// neighbour's message (an activation forward, a gradient back) and for its
/// device; stages that share a device share its throughput. The all-reduce
/// of the gradients that follows is costed by
/// [`step_time`](crate::pipetransformer::plan::step_time).
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
}

#[cfg(test)]
mod tests;
