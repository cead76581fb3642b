//! The per-epoch PipeTransformer schedule and its predicted time: the freeze
//! front from the alpha schedule (AutoFreeze), the stage count and
//! boundaries from burn-pipe's own partitioner (AutoPipe), the replica count
//! (AutoDP), the cache, and each epoch's steps simulated ([`PipelineSim`])
//! with the all-reduce costed ([`ReduceGroup`]).

use burn::collective::AllReduceStrategy;
use burn::config::Config;
use burn_freeze::alpha_front;
use burn_pipe::{
    Schedule, balance_exact, compress, default_micro_batches, freeze_aware_costs, largest_stage,
};
use serde::{Deserialize, Serialize};

use crate::config::AllReduce;
use crate::plan::collective_model::{Link, ReduceGroup};
use crate::plan::costs::ModelCosts;
use crate::plan::error::{PlanError, check};
use crate::plan::sim::{PipelineSim, ReduceTiming, StageWork, StepTime, parallelism_at, step_time};
use crate::sampler::BatchPolicy;

/// What AutoPipe balances: what the real pipeline uses by default, or time.
#[derive(Config, Debug, Copy, PartialEq, Eq)]
pub enum CostBasis {
    /// Parameter counts (the paper's rule, and `burn_pipe::unit_param_costs`
    /// as the training loop uses it).
    Params,
    /// Profiled forward plus backward time.
    Time,
}

/// The devices: `nodes` nodes of `devices_per_node` each, and their links.
///
/// ```
/// use burn_elastic_dp::plan::{ClusterConfig, Link};
///
/// let cluster = ClusterConfig::new(8, 2, Link::new(12e9, 1e-5), Link::new(12.5e9, 5e-6));
/// assert_eq!(cluster.devices(), 16);
/// ```
#[derive(Config, Debug)]
pub struct ClusterConfig {
    /// Devices per node (at least 1).
    pub devices_per_node: usize,
    /// Nodes (at least 1).
    pub nodes: usize,
    /// Link between devices of one node.
    pub intra: Link,
    /// Link between nodes.
    pub inter: Link,
    /// `Some(c)`: every stage of a replica runs on one shared device that
    /// runs `c` passes at full speed at once (a CPU, where the pipeline's
    /// stages are threads, and `intra` is the hand-over between them);
    /// `None`: one device per stage.
    #[config(default = "None")]
    pub shared_device_capacity: Option<f64>,
    /// On a shared device: how much of it one pass takes alone (a CPU's
    /// pass spread over its cores by the backend's thread pool), as
    /// `[samples per pass, parallelism]` points, linear between them and
    /// flat beyond; empty: 1 for every pass. See [`PipelineSim::parallelism`].
    #[config(default = "Vec::new()")]
    pub shared_device_parallelism: Vec<[f64; 2]>,
    /// On a shared device: how many times longer a pass takes on a
    /// pipeline's worker thread than where its cost was measured, as
    /// `[samples per pass, factor]` points (interpolated as
    /// [`shared_device_parallelism`](ClusterConfig::shared_device_parallelism));
    /// applied with 2 or more stages only, since burn-pipe runs a single
    /// stage on the calling thread. Empty: 1.
    #[config(default = "Vec::new()")]
    pub shared_device_thread_factor: Vec<[f64; 2]>,
}

impl ClusterConfig {
    /// All devices.
    pub fn devices(&self) -> usize {
        self.devices_per_node * self.nodes
    }

    /// The parallelism of a pass over `samples` on the shared device
    /// (interpolated in [`shared_device_parallelism`], 1 when empty).
    ///
    /// ```
    /// use burn_elastic_dp::plan::{ClusterConfig, Link};
    ///
    /// let link = Link::new(1e9, 0.0);
    /// let cpu = ClusterConfig::new(2, 1, link, link)
    ///     .with_shared_device_capacity(Some(2.0))
    ///     .with_shared_device_parallelism(vec![[2.0, 1.2], [8.0, 1.8]]);
    /// assert!((cpu.pass_parallelism(1.0) - 1.2).abs() < 1e-12);
    /// assert!((cpu.pass_parallelism(4.0) - 1.4).abs() < 1e-12);
    /// assert!((cpu.pass_parallelism(32.0) - 1.8).abs() < 1e-12);
    /// ```
    ///
    /// [`shared_device_parallelism`]: ClusterConfig::shared_device_parallelism
    pub fn pass_parallelism(&self, samples: f64) -> f64 {
        parallelism_at(&self.shared_device_parallelism, samples)
    }
}

/// What a change of pipeline or replica group costs.
#[derive(Config, Debug)]
pub struct TransitionCost {
    /// Seconds to rebuild a pipeline with new stage boundaries (the paper's
    /// logs: 4 to 18 s to copy the model).
    #[config(default = 0.0)]
    pub pipeline_rebuild: f64,
    /// Seconds to re-form the data-parallel group when the replica count
    /// changes (the paper's logs: 5 to 23 s).
    #[config(default = 0.0)]
    pub group_rebuild: f64,
    /// Optimizer state bytes per parameter byte sent to a new replica
    /// (Adam: 2).
    #[config(default = 2.0)]
    pub optimizer_state_factor: f64,
}

/// How PipeTransformer runs, for [`plan`].
#[derive(Config, Debug)]
pub struct PlanConfig {
    /// The devices.
    pub cluster: ClusterConfig,
    /// Samples per step (fixed per replica, the paper's choice, or global).
    pub batch: BatchPolicy,
    /// Samples per epoch (at least 1).
    pub samples: usize,
    /// Epochs (1 to 10,000).
    pub epochs: usize,
    /// AutoFreeze's alpha, in (0, 1): `F_T = ceil(L (1 - (1 - alpha)^T))`.
    pub alpha: f64,
    /// Layers frozen in each epoch instead of the alpha schedule (the last
    /// entry holds afterwards).
    #[config(default = "None")]
    pub fronts: Option<Vec<usize>>,
    /// Stages per pipeline at the start; `None`: one node's devices (at
    /// most the unit count).
    #[config(default = "None")]
    pub stages: Option<usize>,
    /// Pass order on each stage.
    #[config(default = "Schedule::OneFOneB")]
    pub schedule: Schedule,
    /// Micro-batches per step; `None`: `burn_pipe::default_micro_batches(K)`.
    #[config(default = "None")]
    pub micro_batches: Option<usize>,
    /// What the stages are balanced by.
    #[config(default = "CostBasis::Params")]
    pub balance_by: CostBasis,
    /// Cost of a frozen, uncached unit relative to an active one, in
    /// [0, 1] (the training loop's 1/3: forward only).
    #[config(default = "1.0 / 3.0")]
    pub frozen_factor: f64,
    /// Cache the frozen prefix's output once this many layers are frozen
    /// (the paper: 3 for ViT, 5 for BERT); `None`: never.
    #[config(default = "None")]
    pub cache_from: Option<usize>,
    /// Bytes per second between a device and the cache in host memory:
    /// each sample's cached activation is read (and, when the front moves,
    /// the new one written) at this rate; `None`: free.
    #[config(default = "None")]
    pub cache_bandwidth: Option<f64>,
    /// Spend freed devices on more replicas (AutoDP); `false` keeps the
    /// starting replica count.
    #[config(default = true)]
    pub auto_dp: bool,
    /// burn-collective's algorithm within a node.
    #[config(default = "AllReduceStrategy::Ring")]
    pub local_strategy: AllReduceStrategy,
    /// burn-collective's algorithm between nodes.
    #[config(default = "AllReduceStrategy::Ring")]
    pub global_strategy: AllReduceStrategy,
    /// Per tensor or bucketed, as the replica group does it.
    #[config(default = "AllReduce::PerTensor")]
    pub all_reduce: AllReduce,
    /// When the all-reduce runs.
    #[config(default = "ReduceTiming::AfterPass")]
    pub reduce_timing: ReduceTiming,
    /// What transitions cost.
    #[config(default = "TransitionCost::new()")]
    pub transitions: TransitionCost,
    /// Fixed seconds per pass on top of the unit costs (dispatch).
    #[config(default = 0.0)]
    pub pass_overhead: f64,
    /// Seconds per trainable parameter tensor of a stage added to each of
    /// its backward passes: collecting and accumulating that micro-batch's
    /// gradients (burn-pipe accumulates them micro-batch by micro-batch).
    #[config(default = 0.0)]
    pub backward_per_tensor: f64,
    /// Optimizer step seconds per trainable tensor of a stage (counted in
    /// compute; stages on their own devices step at once, stages sharing
    /// a device one after another).
    #[config(default = 0.0)]
    pub optimizer_per_tensor: f64,
    /// Optimizer step seconds per trainable parameter byte of a stage.
    #[config(default = 0.0)]
    pub optimizer_per_byte: f64,
    /// Fixed seconds per step outside the pipeline (loading the batch),
    /// counted in compute.
    #[config(default = 0.0)]
    pub step_overhead: f64,
}

/// One epoch's seconds, split.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct EpochTime {
    /// The steps: compute, bubble and exposed all-reduce.
    pub steps: StepTime,
    /// Rebuilding pipelines and the replica group before the epoch.
    pub transition: f64,
}

impl EpochTime {
    /// The whole epoch.
    pub fn total(&self) -> f64 {
        self.steps.total() + self.transition
    }
}

/// What PipeTransformer does in one epoch, and how long it takes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EpochPlan {
    /// The epoch.
    pub epoch: usize,
    /// Layers frozen (F).
    pub frozen_layers: usize,
    /// Units frozen.
    pub frozen_units: usize,
    /// Whether the frozen prefix's output comes from the cache.
    pub cached: bool,
    /// Stages per pipeline (K).
    pub stages: usize,
    /// Units per stage, first to last.
    pub balance: Vec<usize>,
    /// Pipeline replicas (R).
    pub replicas: usize,
    /// Micro-batches per step (M).
    pub micro_batches: usize,
    /// Samples per replica per step.
    pub replica_batch: usize,
    /// Steps in the epoch.
    pub steps: usize,
    /// One step, split.
    pub step: StepTime,
    /// The simulated pipeline's bubble fraction.
    pub bubble_fraction: f64,
    /// The epoch, split.
    pub time: EpochTime,
}

/// A whole run and the baseline's (pipeline plus data parallel, nothing
/// frozen, no cache, same devices and epochs).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    /// PipeTransformer, epoch by epoch.
    pub epochs: Vec<EpochPlan>,
    /// The baseline, epoch by epoch.
    pub baseline: Vec<EpochPlan>,
}

impl Plan {
    /// Seconds of the whole PipeTransformer run.
    pub fn total(&self) -> f64 {
        self.epochs.iter().map(|e| e.time.total()).sum()
    }

    /// Seconds of the whole baseline run.
    pub fn baseline_total(&self) -> f64 {
        self.baseline.iter().map(|e| e.time.total()).sum()
    }

    /// Baseline time over PipeTransformer time.
    pub fn speedup(&self) -> f64 {
        self.baseline_total() / self.total()
    }

    /// The run's seconds summed by kind.
    pub fn breakdown(&self) -> EpochTime {
        sum_times(&self.epochs)
    }

    /// The baseline's seconds summed by kind.
    pub fn baseline_breakdown(&self) -> EpochTime {
        sum_times(&self.baseline)
    }
}

fn sum_times(epochs: &[EpochPlan]) -> EpochTime {
    epochs
        .iter()
        .fold(EpochTime::default(), |acc, e| EpochTime {
            steps: acc.steps.plus(&e.time.steps),
            transition: acc.transition + e.time.transition,
        })
}

impl PlanConfig {
    /// Checks every value against `costs`; the error names the value and
    /// its range.
    pub fn validate(&self, costs: &ModelCosts) -> Result<(), PlanError> {
        costs.validate()?;
        let c = &self.cluster;
        check((1..=4096).contains(&c.devices_per_node), || {
            format!(
                "devices per node must be in 1..=4096, got {}",
                c.devices_per_node
            )
        })?;
        check((1..=65_536).contains(&c.nodes), || {
            format!("nodes must be in 1..=65536, got {}", c.nodes)
        })?;
        c.intra.validate("intra-node")?;
        c.inter.validate("inter-node")?;
        if let Some(capacity) = c.shared_device_capacity {
            check(capacity.is_finite() && capacity > 0.0, || {
                format!("shared device capacity must be > 0, got {capacity}")
            })?;
            check(
                c.shared_device_parallelism
                    .iter()
                    .chain(&c.shared_device_thread_factor)
                    .all(|p| p[0].is_finite() && p[0] > 0.0 && p[1].is_finite() && p[1] > 0.0),
                || {
                    "shared device parallelism and thread factor points must be [samples > 0, value > 0]".into()
                },
            )?;
        }
        check(self.samples >= 1, || {
            "samples per epoch must be at least 1, got 0".into()
        })?;
        check((1..=10_000).contains(&self.epochs), || {
            format!("epochs must be in 1..=10000, got {}", self.epochs)
        })?;
        check(self.alpha > 0.0 && self.alpha < 1.0, || {
            format!("alpha must be in (0, 1), got {}", self.alpha)
        })?;
        if let Some(fronts) = &self.fronts {
            check(fronts.iter().all(|&f| f <= costs.layers), || {
                format!(
                    "fronts must be in 0..={} layers, got {fronts:?}",
                    costs.layers
                )
            })?;
        }
        let units = costs.units.len();
        let stages = self.initial_stages(costs);
        check(stages >= 1 && stages <= units.min(c.devices()), || {
            format!(
                "stages must be in 1..={} (units and devices), got {stages}",
                units.min(c.devices())
            )
        })?;
        let batch = match self.batch {
            BatchPolicy::FixedGlobal { batch } | BatchPolicy::PerReplica { batch } => batch,
        };
        check(batch >= 1, || "batch must be at least 1, got 0".into())?;
        if let Some(m) = self.micro_batches {
            check(m >= 1, || "micro-batches must be at least 1, got 0".into())?;
        }
        check((0.0..=1.0).contains(&self.frozen_factor), || {
            format!(
                "frozen factor must be in [0, 1], got {}",
                self.frozen_factor
            )
        })?;
        let t = &self.transitions;
        let ok = |x: f64| x.is_finite() && x >= 0.0;
        check(
            ok(t.pipeline_rebuild) && ok(t.group_rebuild) && ok(t.optimizer_state_factor),
            || "transition costs must be >= 0".into(),
        )?;
        if let Some(bw) = self.cache_bandwidth {
            check(bw.is_finite() && bw > 0.0, || {
                format!("cache bandwidth must be bytes per second > 0, got {bw}")
            })?;
        }
        check(ok(self.pass_overhead), || {
            format!(
                "pass overhead must be seconds >= 0, got {}",
                self.pass_overhead
            )
        })?;
        if let AllReduce::Bucketed { bucket_bytes } = self.all_reduce {
            check(bucket_bytes >= 1, || {
                "bucket bytes must be at least 1".into()
            })?;
        }
        Ok(())
    }

    /// Stages per pipeline at the start.
    pub fn initial_stages(&self, costs: &ModelCosts) -> usize {
        self.stages.unwrap_or_else(|| {
            self.cluster
                .devices_per_node
                .min(costs.units.len())
                .min(self.cluster.devices())
        })
    }

    /// Layers frozen in `epoch`.
    pub fn front(&self, layers: usize, epoch: usize) -> usize {
        match &self.fronts {
            Some(fronts) => fronts.get(epoch).or(fronts.last()).copied().unwrap_or(0),
            None => alpha_front(layers, self.alpha, epoch),
        }
    }
}

/// Plans every epoch of `config` on `costs`, and the baseline.
///
/// ```
/// use burn_elastic_dp::BatchPolicy;
/// use burn_elastic_dp::plan::{ClusterConfig, Link, ModelCosts, PlanConfig, UnitCost, plan};
///
/// let unit = |name: String| UnitCost {
///     name, forward: 1e-3, backward: 2e-3, forward_fixed: 0.0, backward_fixed: 0.0,
///     measured: vec![], activation_bytes: 1 << 12, param_tensors: vec![1 << 20],
/// };
/// let costs = ModelCosts {
///     model: "toy".into(), source: "made up".into(), layers: 4,
///     first_layer_unit: 1, units_per_layer: 2,
///     units: (0..10).map(|u| unit(format!("unit {u}"))).collect(),
/// };
/// let link = Link::new(10e9, 1e-5);
/// let config = PlanConfig::new(
///     ClusterConfig::new(4, 1, link, link), BatchPolicy::PerReplica { batch: 64 }, 6400, 4, 0.5,
/// );
/// let plan = plan(&config, &costs).unwrap();
/// assert_eq!(plan.epochs[0].stages, 4);
/// assert!(plan.epochs.last().unwrap().replicas > 1);
/// assert!(plan.speedup() > 1.0);
/// ```
pub fn plan(config: &PlanConfig, costs: &ModelCosts) -> Result<Plan, PlanError> {
    config.validate(costs)?;
    Ok(Plan {
        epochs: run(config, costs, false)?,
        baseline: run(config, costs, true)?,
    })
}

/// The epochs of PipeTransformer, or of the baseline.
fn run(
    config: &PlanConfig,
    costs: &ModelCosts,
    baseline: bool,
) -> Result<Vec<EpochPlan>, PlanError> {
    let map = costs.layer_map()?;
    let devices = config.cluster.devices();
    let k0 = config.initial_stages(costs);
    let r0 = devices / k0;
    let basis = match config.balance_by {
        CostBasis::Params => costs.param_costs(),
        CostBasis::Time => costs.time_costs(),
    };
    let initial_largest = largest_stage(&basis, &balance_exact(&basis, k0));
    let mut epochs: Vec<EpochPlan> = Vec::with_capacity(config.epochs);
    for epoch in 0..config.epochs {
        let frozen_layers = if baseline {
            0
        } else {
            config.front(costs.layers, epoch)
        };
        let frozen_units = map.unit_front(frozen_layers);
        let cached = !baseline
            && frozen_layers > 0
            && config.cache_from.is_some_and(|from| frozen_layers >= from);
        let previous = epochs.last();
        let prev_stages = previous.map_or(k0, |p| p.stages);
        let partition = freeze_aware_costs(&basis, frozen_units, config.frozen_factor, cached);
        let stages = if baseline {
            k0
        } else {
            compress(&partition, prev_stages, initial_largest)
        };
        let balance = balance_exact(&partition, stages);
        let replicas = if config.auto_dp && !baseline {
            devices / stages
        } else {
            r0
        };
        let micro_batches = config
            .micro_batches
            .unwrap_or_else(|| default_micro_batches(stages));
        let (replica_batch, global_batch) = match config.batch {
            BatchPolicy::PerReplica { batch } => (batch, batch * replicas),
            BatchPolicy::FixedGlobal { batch } => (batch / replicas, batch),
        };
        check(replica_batch >= micro_batches, || {
            format!(
                "epoch {epoch}: {replicas} replicas get {replica_batch} samples each per step, fewer than the {micro_batches} micro-batches of K={stages}: raise the batch (at least {}) or lower the micro-batches",
                micro_batches * replicas
            )
        })?;
        let steps = config.samples.div_ceil(global_batch);
        // The cache holds the previous epoch's frozen output when it was
        // cached then; the first cached epoch computes the prefix to fill it.
        let cache_front = match previous {
            Some(p) if cached && p.cached => p.frozen_units,
            _ => 0,
        };
        let layout = Layout {
            stages,
            replicas,
            balance: &balance,
            frozen_units,
            cache_front,
            cached,
            micro_batch: replica_batch as f64 / micro_batches as f64,
            micro_batches,
        };
        let (step, bubble_fraction) = simulate_step(config, costs, &layout)?;
        let transition = match previous {
            None => 0.0,
            Some(p) => transition_cost(config, costs, p, stages, replicas, &balance, frozen_units),
        };
        epochs.push(EpochPlan {
            epoch,
            frozen_layers,
            frozen_units,
            cached,
            stages,
            balance,
            replicas,
            micro_batches,
            replica_batch,
            steps,
            step,
            bubble_fraction,
            time: EpochTime {
                steps: step.scaled(steps as f64),
                transition,
            },
        });
    }
    Ok(epochs)
}

/// One epoch's pipeline layout.
struct Layout<'a> {
    stages: usize,
    replicas: usize,
    balance: &'a [usize],
    frozen_units: usize,
    cache_front: usize,
    cached: bool,
    micro_batch: f64,
    micro_batches: usize,
}

/// Replica `r`'s stage `s` runs on device `r * K + s`; its node.
fn node_of(config: &PlanConfig, stages: usize, replica: usize, stage: usize) -> usize {
    (replica * stages + stage) / config.cluster.devices_per_node
}

/// One step of one replica, simulated, with its stages' all-reduce.
fn simulate_step(
    config: &PlanConfig,
    costs: &ModelCosts,
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
        .map(|(s, units)| {
            let mut work = StageWork {
                forward: 0.0,
                backward: 0.0,
                device: if shared.is_some() { 0 } else { s },
            };
            for u in units.clone() {
                let unit = &costs.units[u];
                if u >= layout.frozen_units {
                    work.forward += unit.forward_time(mb);
                } else if u >= layout.cache_front {
                    // A frozen unit runs on the inner backend.
                    work.forward += unit.frozen_forward_time(mb);
                }
                if u >= layout.frozen_units {
                    work.backward += unit.backward_time(mb)
                        + unit.param_tensors.len() as f64 * config.backward_per_tensor;
                }
            }
            if shared.is_some() && layout.stages > 1 {
                let factor = parallelism_at(&cluster.shared_device_thread_factor, mb);
                work.forward *= factor;
                work.backward *= factor;
            }
            if s == 0 {
                work.forward += cache_traffic(config, costs, layout) * mb;
            }
            work
        })
        .collect();
    // Stages sharing a device hand messages over through memory: the
    // intra-node link then stands for that hand-over (its latency: a
    // thread waking up).
    let sends: Vec<f64> = (0..layout.stages.saturating_sub(1))
        .map(|s| {
            let last_unit = starts[s].end - 1;
            let bytes = costs.units[last_unit].activation_bytes as f64 * mb;
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
        .collect();
    let mut sim = PipelineSim::new(config.schedule, layout.micro_batches, stages);
    sim.sends = sends;
    sim.device_capacity = shared.map_or_else(Vec::new, |c| vec![c]);
    if shared.is_some() {
        sim.parallelism = vec![cluster.pass_parallelism(mb); layout.stages];
    }
    sim.pass_overhead = config.pass_overhead;
    let trace = sim.run()?;
    let reduce: Vec<f64> = starts
        .iter()
        .enumerate()
        .map(|(s, units)| {
            if layout.replicas <= 1 {
                return 0.0;
            }
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
                .clone()
                .filter(|&u| u >= layout.frozen_units)
                .flat_map(|u| costs.units[u].param_tensors.iter().copied())
                .collect();
            group.bucketed_cost(&tensors, config.all_reduce)
        })
        .collect();
    let updates = starts.iter().map(|units| {
        units
            .clone()
            .filter(|&u| u >= layout.frozen_units)
            .map(|u| {
                let unit = &costs.units[u];
                unit.param_tensors.len() as f64 * config.optimizer_per_tensor
                    + unit.param_bytes() as f64 * config.optimizer_per_byte
            })
            .sum::<f64>()
    });
    let update = if shared.is_some() {
        updates.sum()
    } else {
        updates.fold(0.0, f64::max)
    };
    let mut step = step_time(&trace, &reduce, config.reduce_timing);
    step.compute += update + config.step_overhead;
    Ok((step, trace.bubble_fraction()))
}

/// Seconds per sample that stage 0 spends moving cached activations: the
/// read of the cached output at the cache front, and the write of the new
/// frozen output when the front moved past it.
fn cache_traffic(config: &PlanConfig, costs: &ModelCosts, layout: &Layout) -> f64 {
    let Some(bandwidth) = config.cache_bandwidth else {
        return 0.0;
    };
    let bytes_at = |front: usize| costs.units[front - 1].activation_bytes as f64;
    let read = if layout.cache_front > 0 {
        bytes_at(layout.cache_front)
    } else {
        0.0
    };
    let write = if layout.cached && layout.frozen_units > layout.cache_front {
        bytes_at(layout.frozen_units)
    } else {
        0.0
    };
    (read + write) / bandwidth
}

/// Seconds between two epochs: a pipeline rebuild when the boundaries move,
/// plus a group rebuild and copies of the weights and optimizer state to
/// the new replicas when the replica count grows.
fn transition_cost(
    config: &PlanConfig,
    costs: &ModelCosts,
    previous: &EpochPlan,
    stages: usize,
    replicas: usize,
    balance: &[usize],
    frozen_units: usize,
) -> f64 {
    let t = &config.transitions;
    let mut cost = 0.0;
    if previous.stages != stages || previous.balance != balance {
        cost += t.pipeline_rebuild;
    }
    if previous.replicas != replicas {
        cost += t.group_rebuild;
        if replicas > previous.replicas {
            let weights: usize = costs.units.iter().map(|u| u.param_bytes()).sum();
            let active: usize = costs.units[frozen_units..]
                .iter()
                .map(|u| u.param_bytes())
                .sum();
            let bytes = weights as f64 + t.optimizer_state_factor * active as f64;
            let link = if config.cluster.nodes > 1 {
                config.cluster.inter
            } else {
                config.cluster.intra
            };
            // New replicas copy from live ones in parallel, one each.
            cost += link.transfer(bytes);
        }
    }
    cost
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ViT-B/16's 27 units by parameter bytes (fp32), timed by a flat
    /// 1 ms per million parameters per sample.
    fn vit_b16() -> ModelCosts {
        let d = 768usize;
        let attention = vec![
            d * 4,
            d * 4,
            d * d * 4,
            d * 4,
            d * d * 4,
            d * 4,
            d * d * 4,
            d * 4,
            d * d * 4,
            d * 4,
        ];
        let mlp = vec![d * 4, d * 4, d * 4 * d * 4, 4 * d * 4, 4 * d * d * 4, d * 4];
        let embedding = vec![3 * 16 * 16 * d * 4, d * 4, d * 4, 197 * d * 4];
        let head = vec![d * 1000 * 4, 1000 * 4];
        let norm = vec![d * 4, d * 4];
        let mut units = vec![("embedding".to_string(), embedding)];
        for l in 0..12 {
            units.push((format!("attention {l}"), attention.clone()));
            units.push((format!("mlp {l}"), mlp.clone()));
        }
        units.push(("norm".into(), norm));
        units.push(("head".into(), head));
        ModelCosts {
            model: "ViT-B/16".into(),
            source: "test".into(),
            layers: 12,
            first_layer_unit: 1,
            units_per_layer: 2,
            units: units
                .into_iter()
                .map(|(name, param_tensors)| {
                    let params = param_tensors.iter().sum::<usize>() as f64 / 4.0;
                    crate::plan::UnitCost {
                        name,
                        forward: params * 1e-9,
                        backward: 2.0 * params * 1e-9,
                        forward_fixed: 0.0,
                        backward_fixed: 0.0,
                        measured: vec![],
                        activation_bytes: 197 * d * 4,
                        param_tensors,
                    }
                })
                .collect(),
        }
    }

    fn paper(epochs: usize) -> PlanConfig {
        let link = Link::new(12e9, 1e-5);
        PlanConfig::new(
            ClusterConfig::new(8, 2, link, Link::new(12.5e9, 5e-6)),
            BatchPolicy::PerReplica { batch: 256 },
            1_281_167,
            epochs,
            1.0 / 3.0,
        )
        .with_cache_from(Some(3))
    }

    #[test]
    fn paper_setting_compresses_8_4_2_1_as_replicas_grow() {
        let plan = plan(&paper(10), &vit_b16()).unwrap();
        let fronts: Vec<usize> = plan.epochs.iter().map(|e| e.frozen_layers).collect();
        assert_eq!(fronts, [0, 4, 7, 9, 10, 11, 11, 12, 12, 12]);
        let mut ks: Vec<usize> = plan.epochs.iter().map(|e| e.stages).collect();
        ks.dedup();
        assert_eq!(ks, [8, 4, 2, 1]);
        for e in &plan.epochs {
            assert_eq!(e.replicas * e.stages, 16);
            assert_eq!(e.balance.iter().sum::<usize>(), 27);
        }
        assert!(
            plan.baseline
                .iter()
                .all(|e| e.stages == 8 && e.replicas == 2)
        );
        assert!(plan.speedup() > 1.5, "speed-up {}", plan.speedup());
    }

    #[test]
    fn freezing_without_autodp_or_cache_gains_less() {
        let costs = vit_b16();
        let full = plan(&paper(10), &costs).unwrap().speedup();
        let no_dp = plan(&paper(10).with_auto_dp(false), &costs)
            .unwrap()
            .speedup();
        let no_dp_no_cache = plan(&paper(10).with_auto_dp(false).with_cache_from(None), &costs)
            .unwrap()
            .speedup();
        assert!(full > no_dp, "{full} vs {no_dp}");
        assert!(no_dp >= no_dp_no_cache, "{no_dp} vs {no_dp_no_cache}");
    }

    #[test]
    fn transitions_are_charged_when_k_or_r_change() {
        let costs = vit_b16();
        let config = paper(10).with_transitions(
            TransitionCost::new()
                .with_pipeline_rebuild(10.0)
                .with_group_rebuild(15.0),
        );
        let plan = plan(&config, &costs).unwrap();
        for pair in plan.epochs.windows(2) {
            let changed = pair[0].replicas != pair[1].replicas;
            assert_eq!(pair[1].time.transition >= 25.0, changed);
        }
        assert_eq!(plan.epochs[0].time.transition, 0.0);
    }

    /// ViT-B/16's costs measured at one batch size, each frozen forward a
    /// `frozen` share of its forward.
    fn measured_vit(batch: usize, frozen: f64) -> ModelCosts {
        let mut costs = vit_b16();
        for unit in &mut costs.units {
            let forward = unit.forward_time(batch as f64);
            unit.measured = vec![crate::plan::MeasuredPass {
                batch,
                forward,
                backward: unit.backward_time(batch as f64),
                frozen_forward: Some(frozen * forward),
            }];
        }
        costs
    }

    /// 4 stages as threads of one 2-core CPU, no transitions, no cache.
    fn on_a_cpu(parallelism: f64) -> PlanConfig {
        let link = Link::new(1e15, 0.0);
        PlanConfig::new(
            ClusterConfig::new(4, 1, link, link)
                .with_shared_device_capacity(Some(2.0))
                .with_shared_device_parallelism(vec![[1.0, parallelism]]),
            BatchPolicy::FixedGlobal { batch: 64 },
            64 * 8,
            4,
            1.0 / 3.0,
        )
        .with_auto_dp(false)
        .with_transitions(TransitionCost::new())
    }

    #[test]
    fn frozen_units_cost_their_measured_inner_forward() {
        let autodiff = plan(&on_a_cpu(1.0), &measured_vit(4, 1.0)).unwrap();
        let inner = plan(&on_a_cpu(1.0), &measured_vit(4, 0.5)).unwrap();
        // Nothing frozen in epoch 0: the same; frozen units later: cheaper.
        assert_eq!(autodiff.epochs[0].time, inner.epochs[0].time);
        for (a, i) in autodiff.epochs.iter().zip(&inner.epochs).skip(1) {
            assert!(a.frozen_units > 0 && i.time.total() < a.time.total());
        }
    }

    #[test]
    fn passes_taking_more_of_the_shared_cpu_overlap_less() {
        let costs = vit_b16();
        let times: Vec<f64> = [1.0, 1.5, 2.0]
            .iter()
            .map(|&p| plan(&on_a_cpu(p), &costs).unwrap().epochs[0].time.total())
            .collect();
        assert!(times[0] < times[1] && times[1] < times[2], "{times:?}");
    }

    #[test]
    fn worker_threads_slow_only_pipelines_of_two_or_more_stages() {
        let costs = vit_b16();
        let slow = |config: PlanConfig| PlanConfig {
            cluster: config
                .cluster
                .clone()
                .with_shared_device_thread_factor(vec![[1.0, 2.0]]),
            ..config
        };
        let time = |config: &PlanConfig| plan(config, &costs).unwrap().epochs[0].time.steps;
        let four = on_a_cpu(1.0);
        assert!(
            (time(&slow(four.clone())).compute - 2.0 * time(&four).compute).abs()
                < 1e-9 * time(&four).compute
        );
        let one = on_a_cpu(1.0).with_stages(Some(1));
        assert_eq!(time(&slow(one.clone())), time(&one));
    }

    #[test]
    fn bad_values_name_their_range() {
        let costs = vit_b16();
        let err = plan(
            &PlanConfig {
                alpha: 1.5,
                ..paper(10)
            },
            &costs,
        )
        .unwrap_err();
        assert!(err.to_string().contains("alpha must be in (0, 1)"));
        let err = plan(&paper(0), &costs).unwrap_err();
        assert!(err.to_string().contains("epochs must be in 1..=10000"));
        let err = plan(&paper(3).with_stages(Some(40)), &costs).unwrap_err();
        assert!(err.to_string().contains("stages must be in 1..=16"));
        let err = plan(
            &PlanConfig {
                batch: BatchPolicy::PerReplica { batch: 4 },
                ..paper(3)
            },
            &costs,
        )
        .unwrap_err();
        assert!(err.to_string().contains("fewer than the 16 micro-batches"));
    }
}
