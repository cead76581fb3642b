//! What the planner is asked: the devices ([`ClusterConfig`]) and how PipeTransformer runs on them
//! ([`PlanConfig`], in the trainer's vocabulary), checked before any work.

use burn::collective::AllReduceStrategy;
use burn::config::Config;
use burn_freeze::FixedSchedule;
use burn_pipe::Schedule;

use crate::AllReduce;
use crate::pipetransformer::plan::collective_model::Link;
use crate::pipetransformer::plan::error::{PlanError, check, refused};
use crate::pipetransformer::plan::model::ModelSpec;
use crate::pipetransformer::plan::sim::parallelism_at;
use crate::pipetransformer::shape::ShapeSettings;
use crate::pipetransformer::trainer::{CostModel, FreezeRule, Parts};
use crate::sampler::BatchPolicy;

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
    /// flat beyond; empty: 1 for every pass. See
    /// [`PipelineSim::parallelism`](crate::pipetransformer::plan::PipelineSim::parallelism).
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

/// How PipeTransformer runs, for [`plan`](crate::pipetransformer::plan::plan).
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
    /// The freeze rule, as the trainer's: the alpha schedule
    /// (`F_T = ceil(L (1 - (1 - alpha)^T))`; for
    /// [`FreezeRule::AlphaArgmin`] its alpha bound) or fixed fronts per
    /// epoch. [`FreezeRule::ChangeRate`] decides from gradients during the
    /// run: it cannot be planned.
    pub freeze: FreezeRule,
    /// Stages per pipeline at the start, as the trainer's
    /// [`TrainerConfig::stages`](crate::TrainerConfig::stages); `None`:
    /// memory-aware AutoPipe, the fewest stages (a divisor of the devices)
    /// whose every stage fits [`memory`](Self::memory)'s budget (without one:
    /// 1 stage on every device). The paper starts at one node's devices.
    #[config(default = "None")]
    pub stages: Option<usize>,
    /// The per-device memory budget, as the trainer's (the units' memory is
    /// [`ModelSpec::unit_memory`]).
    #[config(default = "crate::MemoryConfig::new()")]
    pub memory: crate::MemoryConfig,
    /// Pass order on each stage.
    #[config(default = "Schedule::OneFOneB")]
    pub schedule: Schedule,
    /// Micro-batches per step; `None`: chosen for each shape by the
    /// trainer's rule ([`ShapeRule::micro_batches`](crate::shape::ShapeRule::micro_batches)): from
    /// [`micro_batch_times`](Self::micro_batch_times) when given, else the
    /// paper's count (`burn_pipe::default_micro_batches(K)`), which the
    /// plan then says it assumes ([`Plan::micro_batches_measured`](super::Plan::micro_batches_measured)).
    #[config(default = "None")]
    pub micro_batches: Option<usize>,
    /// The units' times at several micro-batch sizes that a trainer
    /// measured (see [`Trainer::shape_rule`](crate::Trainer::shape_rule)),
    /// from which the plan chooses M for each shape as the trainer does.
    #[config(default = "None")]
    pub micro_batch_times: Option<burn_pipe::micro::MicroBatchTimes>,
    /// What AutoPipe balances, as the trainer's: parameter counts with a
    /// frozen unit at `frozen_factor` (in [0, 1]) of an active one, or the
    /// units' times ([`ModelSpec::unit_costs`]).
    #[config(default = "CostModel::Parameters { frozen_factor: 1.0 / 3.0 }")]
    pub costs: CostModel,
    /// Which of PipeTransformer's parts run, as the trainer's: with `cache`
    /// the frozen prefix's output is cached once anything is frozen; with
    /// `dp` freed devices become replicas (AutoDP), else the starting
    /// replica count holds; with `pipe` the pipeline compresses.
    #[config(default = "Parts::new()")]
    pub parts: Parts,
    /// Bytes per second between a device and the cache in host memory:
    /// each sample's cached activation is read (and, when the front moves,
    /// the new one written) at this rate; `None`: free.
    #[config(default = "None")]
    pub cache_bandwidth: Option<f64>,
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
    #[config(default = "ReduceTiming::Overlapped")]
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

impl ClusterConfig {
    /// Checks the devices, nodes, links and shared-device figures; the
    /// error names the value and its range.
    pub fn validate(&self) -> Result<(), PlanError> {
        let c = self;
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
        Ok(())
    }
}

impl PlanConfig {
    /// Checks every value against `model`; the error names the value and
    /// its range.
    pub fn validate(&self, model: &ModelSpec) -> Result<(), PlanError> {
        model.validate()?;
        self.cluster.validate()?;
        check(self.samples >= 1, || {
            "samples per epoch must be at least 1, got 0".into()
        })?;
        check((1..=10_000).contains(&self.epochs), || {
            format!("epochs must be in 1..=10000, got {}", self.epochs)
        })?;
        self.validate_freeze(model.layer_map()?.num_layers())?;
        self.validate_shape(model.units.len())?;
        self.validate_costs()
    }

    /// The freeze rule, on a model of `layers` layers: the trainer's check
    /// ([`FreezeRule::check`]), fronts within the model and non-decreasing,
    /// and a rule that can be planned.
    fn validate_freeze(&self, layers: usize) -> Result<(), PlanError> {
        if let FreezeRule::ChangeRate { .. } | FreezeRule::Evidence { .. } = self.freeze {
            return Err(PlanError::Invalid(
                "the freeze rule must be AlphaSchedule, AlphaArgmin or Fronts (ChangeRate and Evidence decide from the run's gradients and cannot be planned)".into(),
            ));
        }
        self.freeze.validate().map_err(refused)?;
        if let FreezeRule::Fronts { layers: fronts } = &self.freeze {
            check(fronts.iter().all(|&f| f <= layers), || {
                format!("fronts must be in 0..={layers} layers, got {fronts:?}")
            })?;
            // The planner models fronts that only move up; the trainer
            // also thaws (a list that goes down), which is not planned.
            check(fronts.windows(2).all(|w| w[0] <= w[1]), || {
                format!("the planner models non-decreasing fronts only, got {fronts:?}")
            })?;
        }
        Ok(())
    }

    /// The start, the memory budget, the batch and the micro-batches, on a
    /// model of `units` units.
    fn validate_shape(&self, units: usize) -> Result<(), PlanError> {
        let c = &self.cluster;
        if let Some(stages) = self.stages {
            // A pipeline stays within a node: each node (an MPI rank) runs
            // its own replicas, the shape rule in lockstep on its devices.
            check(
                stages >= 1 && stages <= units.min(c.devices_per_node),
                || {
                    format!(
                        "stages must be in 1..={} (units and one node's devices), got {stages}",
                        units.min(c.devices_per_node)
                    )
                },
            )?;
        }
        self.memory.validate().map_err(refused)?;
        let batch = match self.batch {
            BatchPolicy::FixedGlobal { batch } | BatchPolicy::PerReplica { batch } => batch,
        };
        check(batch >= 1, || "batch must be at least 1, got 0".into())?;
        if let Some(m) = self.micro_batches {
            check(m >= 1, || "micro-batches must be at least 1, got 0".into())?;
        }
        Ok(())
    }

    /// The cost model, transitions, cache, overheads and buckets.
    fn validate_costs(&self) -> Result<(), PlanError> {
        self.costs.validate().map_err(refused)?;
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

    /// Layers frozen in `epoch` of a model of `layers` layers: nothing with
    /// AutoFreeze off, else the freeze rule's schedule (as burn-freeze's
    /// [`FixedSchedule`] gives it to the trainer).
    pub fn front(&self, layers: usize, epoch: usize) -> usize {
        if !self.parts.freeze {
            return 0;
        }
        let schedule = match &self.freeze {
            FreezeRule::AlphaSchedule { alpha } | FreezeRule::AlphaArgmin { alpha, .. } => {
                FixedSchedule::alpha(layers, *alpha)
            }
            FreezeRule::Fronts { layers } => FixedSchedule::Fronts(layers.clone()),
            FreezeRule::ChangeRate { .. } | FreezeRule::Evidence { .. } => return 0,
        };
        schedule.front(epoch).min(layers)
    }

    /// What the trainer's shape rule is asked: the parts that run, on one
    /// node's devices (every node runs the rule on its own, in lockstep, as
    /// the trainer's ranks do; the whole run holds `nodes` times its
    /// replicas).
    pub fn shape_settings(&self) -> ShapeSettings {
        ShapeSettings {
            devices: self.cluster.devices_per_node,
            stages: self.stages,
            pipe: self.parts.pipe,
            dp: self.parts.dp,
            cache: self.parts.cache,
            device_bytes: self.memory.device_bytes,
            optimizer_slots: self.memory.optimizer_slots,
            batch: self.batch,
            micro_batches: self.micro_batches,
            measure_micro_batches: self.micro_batch_times.is_some(),
            schedule: self.schedule,
            // The cluster's devices are its own (the planner's shared-device
            // model is its own: `ClusterConfig::shared_device_capacity`).
            shared_cores: None,
        }
    }
}

/// When the replicas' gradients are all-reduced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum ReduceTiming {
    /// After the replica's whole pass, stage by stage, one after another
    /// (the replica group before its exchange overlapped the backward).
    AfterPass,
    /// As the replica group does: each stage as soon as its last backward
    /// pass ends, one stage after another from the last (a replica issues
    /// its stages' collectives in that order), so a stage's exchange hides
    /// behind the backward the earlier stages still run.
    Overlapped,
    /// Each stage as soon as its last backward pass ends, all stages at
    /// once (each stage's replicas form their own group, as PyTorch DDP
    /// over a pipeline does).
    PerStage,
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
