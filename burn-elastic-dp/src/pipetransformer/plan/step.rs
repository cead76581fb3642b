//! One step of one replica in an epoch: its stages' work ([`UnitState`]), the hand-overs, the
//! simulated pipeline, each stage's all-reduce and optimizer step; the step's seconds, split.

use std::ops::Range;

use burn_pipe::balance::UnitState;

use crate::pipetransformer::plan::collective_model::ReduceGroup;
use crate::pipetransformer::plan::config::{PlanConfig, ReduceTiming};
use crate::pipetransformer::plan::error::PlanError;
use crate::pipetransformer::plan::model::ModelSpec;
use crate::pipetransformer::plan::sim::{PipelineSim, PipelineTrace, StageWork, parallelism_at};

/// One step's seconds, split.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct StepTime {
    /// The mean stage's work.
    pub compute: f64,
    /// The pipeline's idle time (makespan less compute).
    pub bubble: f64,
    /// All-reduce time not hidden behind compute (the exposed
    /// communication).
    pub all_reduce: f64,
    /// The all-reduces' whole time, hidden or not (the stages' exchanges
    /// summed).
    #[serde(default)]
    pub exchange: f64,
}

impl StepTime {
    /// The whole step.
    pub fn total(&self) -> f64 {
        self.compute + self.bubble + self.all_reduce
    }

    /// This step `times` times over.
    pub fn scaled(&self, times: f64) -> Self {
        Self {
            compute: self.compute * times,
            bubble: self.bubble * times,
            all_reduce: self.all_reduce * times,
            exchange: self.exchange * times,
        }
    }

    /// The sum of two splits.
    pub fn plus(&self, other: &Self) -> Self {
        Self {
            compute: self.compute + other.compute,
            bubble: self.bubble + other.bubble,
            all_reduce: self.all_reduce + other.all_reduce,
            exchange: self.exchange + other.exchange,
        }
    }
}

/// The step of `trace` with each stage's all-reduce of `reduce[s]` seconds
/// run as `timing` says: the exposed part is what ends after the pass
/// (`max(0, exchange - the backward still to run once it can start)`).
///
/// ```
/// use burn_elastic_dp::plan::{PipelineSim, ReduceTiming, StageWork, step_time};
/// use burn_pipe::Schedule;
///
/// let stages = (0..2).map(|d| StageWork { forward: 1.0, backward: 2.0, device: d }).collect();
/// let trace = PipelineSim::new(Schedule::OneFOneB, 4, stages).run().unwrap();
/// let after = step_time(&trace, &[0.5, 0.5], ReduceTiming::AfterPass);
/// assert!((after.total() - (trace.makespan + 1.0)).abs() < 1e-12);
/// // Overlapped, the last stage's exchange hides behind stage 0's last
/// // backward (2 s): only stage 0's is exposed.
/// let overlapped = step_time(&trace, &[0.5, 0.5], ReduceTiming::Overlapped);
/// assert!((overlapped.all_reduce - 0.5).abs() < 1e-12);
/// assert!((overlapped.exchange - 1.0).abs() < 1e-12);
/// ```
pub fn step_time(trace: &PipelineTrace, reduce: &[f64], timing: ReduceTiming) -> StepTime {
    let k = trace.busy.len();
    let compute = trace.busy.iter().sum::<f64>() / k as f64;
    let end = match timing {
        ReduceTiming::AfterPass => trace.makespan + reduce.iter().sum::<f64>(),
        // One stage after another from the last, each once its own passes
        // have ended and the stage after it has exchanged.
        ReduceTiming::Overlapped => (0..k)
            .rev()
            .fold(f64::NEG_INFINITY, |previous, s| {
                trace.stage_end(s).max(previous) + reduce.get(s).copied().unwrap_or(0.0)
            })
            .max(trace.makespan),
        ReduceTiming::PerStage => (0..k)
            .map(|s| trace.stage_end(s) + reduce.get(s).copied().unwrap_or(0.0))
            .fold(trace.makespan, f64::max),
    };
    StepTime {
        compute,
        bubble: trace.makespan - compute,
        all_reduce: end - trace.makespan,
        exchange: reduce.iter().sum(),
    }
}

/// One epoch's pipeline layout.
pub(crate) struct Layout<'a> {
    pub(crate) stages: usize,
    pub(crate) replicas: usize,
    pub(crate) balance: &'a [usize],
    pub(crate) front: usize,
    pub(crate) cache_front: usize,
    pub(crate) cached: bool,
    pub(crate) micro_batch: f64,
    pub(crate) micro_batches: usize,
}

/// Replica `r`'s stage `s` runs on device `r * K + s`; its node.
fn node_of(config: &PlanConfig, stages: usize, replica: usize, stage: usize) -> usize {
    (replica * stages + stage) / config.cluster.devices_per_node
}

/// One step of one replica, simulated, with its stages' all-reduce.
pub(crate) fn simulate_step(
    config: &PlanConfig,
    model: &ModelSpec,
    layout: &Layout,
) -> Result<(StepTime, f64), PlanError> {
    let cluster = &config.cluster;
    let shared = cluster.shared_device_capacity;
    let mut starts = Vec::with_capacity(layout.stages);
    let mut start = 0;
    for &n in layout.balance {
        starts.push(start..start + n);
        start += n;
    }
    let mb = layout.micro_batch;
    let stages: Vec<StageWork> = starts
        .iter()
        .enumerate()
        .map(|(s, units)| stage_work(config, model, layout, s, units.clone()))
        .collect();
    let mut sim = PipelineSim::new(config.schedule, layout.micro_batches, stages);
    sim.sends = sends(config, model, layout, &starts);
    sim.device_capacity = shared.map_or_else(Vec::new, |c| vec![c]);
    if shared.is_some() {
        sim.parallelism = vec![cluster.pass_parallelism(mb); layout.stages];
    }
    sim.pass_overhead = config.pass_overhead;
    let trace = sim.run()?;
    let reduce: Vec<f64> = starts
        .iter()
        .enumerate()
        .map(|(s, units)| stage_all_reduce(config, model, layout, s, units.clone()))
        .collect();
    let update = optimizer_update(config, model, layout, &starts);
    let mut step = step_time(&trace, &reduce, config.reduce_timing);
    step.compute += update + config.step_overhead;
    Ok((step, trace.bubble_fraction()))
}

/// Stage `s`'s work per micro-batch, on its `units`.
fn stage_work(
    config: &PlanConfig,
    model: &ModelSpec,
    layout: &Layout,
    s: usize,
    units: Range<usize>,
) -> StageWork {
    let cluster = &config.cluster;
    let shared = cluster.shared_device_capacity;
    let mb = layout.micro_batch;
    let mut work = StageWork {
        forward: 0.0,
        backward: 0.0,
        device: if shared.is_some() { 0 } else { s },
    };
    for u in units {
        let unit = &model.units[u];
        match UnitState::of(u, layout.front, layout.cache_front) {
            UnitState::Training => {
                work.forward += unit.forward_time(mb);
                work.backward += unit.backward_time(mb)
                    + unit.param_tensors.len() as f64 * config.backward_per_tensor;
            }
            // A frozen unit runs on the inner backend.
            UnitState::Frozen => work.forward += unit.frozen_forward_time(mb),
            UnitState::Cached => {}
        }
    }
    if shared.is_some() && layout.stages > 1 {
        let factor = parallelism_at(&cluster.shared_device_thread_factor, mb);
        work.forward *= factor;
        work.backward *= factor;
    }
    if s == 0 {
        work.forward += cache_traffic(config, model, layout) * mb;
    }
    work
}

/// Seconds to send a micro-batch's activation over each stage boundary.
/// Stages sharing a device hand messages over through memory: the
/// intra-node link then stands for that hand-over (its latency: a thread
/// waking up).
fn sends(
    config: &PlanConfig,
    model: &ModelSpec,
    layout: &Layout,
    starts: &[Range<usize>],
) -> Vec<f64> {
    let cluster = &config.cluster;
    let shared = cluster.shared_device_capacity;
    let mb = layout.micro_batch;
    (0..layout.stages.saturating_sub(1))
        .map(|s| {
            let last_unit = starts[s].end - 1;
            let bytes = model.units[last_unit].activation_bytes as f64 * mb;
            let crosses = shared.is_none()
                && (0..layout.replicas).any(|r| {
                    node_of(config, layout.stages, r, s) != node_of(config, layout.stages, r, s + 1)
                });
            let link = if crosses {
                cluster.inter
            } else {
                cluster.intra
            };
            link.transfer(bytes)
        })
        .collect()
}

/// Seconds of stage `s`'s all-reduce of its trainable `units`' gradients
/// across the replicas.
fn stage_all_reduce(
    config: &PlanConfig,
    model: &ModelSpec,
    layout: &Layout,
    s: usize,
    units: Range<usize>,
) -> f64 {
    if layout.replicas <= 1 {
        return 0.0;
    }
    let cluster = &config.cluster;
    let mut per_node = std::collections::BTreeMap::<usize, usize>::new();
    for r in 0..layout.replicas {
        *per_node
            .entry(node_of(config, layout.stages, r, s))
            .or_default() += 1;
    }
    let group = ReduceGroup {
        per_node: per_node.values().copied().max().unwrap_or(1),
        nodes: per_node.len(),
        intra: cluster.intra,
        inter: cluster.inter,
        local: config.local_strategy,
        global: config.global_strategy,
    };
    let tensors: Vec<usize> = units
        .filter(|&u| u >= layout.front)
        .flat_map(|u| model.units[u].param_tensors.iter().copied())
        .collect();
    group.bucketed_cost(&tensors, config.all_reduce)
}

/// Seconds of the optimizer's update: every stage's, summed where the
/// stages share a device, the slowest's otherwise.
fn optimizer_update(
    config: &PlanConfig,
    model: &ModelSpec,
    layout: &Layout,
    starts: &[Range<usize>],
) -> f64 {
    let updates = starts.iter().map(|units| {
        units
            .clone()
            .filter(|&u| u >= layout.front)
            .map(|u| {
                let unit = &model.units[u];
                unit.param_tensors.len() as f64 * config.optimizer_per_tensor
                    + unit.param_bytes() as f64 * config.optimizer_per_byte
            })
            .sum::<f64>()
    });
    if config.cluster.shared_device_capacity.is_some() {
        updates.sum()
    } else {
        updates.fold(0.0, f64::max)
    }
}

/// Seconds per sample that stage 0 spends moving cached activations: the
/// read of the cached output at the cache front, and the write of the new
/// frozen output when the front moved past it.
fn cache_traffic(config: &PlanConfig, model: &ModelSpec, layout: &Layout) -> f64 {
    let Some(bandwidth) = config.cache_bandwidth else {
        return 0.0;
    };
    let bytes_at = |front: usize| model.units[front - 1].activation_bytes as f64;
    let read = if layout.cache_front > 0 {
        bytes_at(layout.cache_front)
    } else {
        0.0
    };
    let write = if layout.cached && layout.front > layout.cache_front {
        bytes_at(layout.front)
    } else {
        0.0
    };
    (read + write) / bandwidth
}
