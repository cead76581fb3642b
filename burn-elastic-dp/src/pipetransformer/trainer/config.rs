//! What a PipeTransformer run is asked to do: one serde `Config`, checked
//! before any work.

use std::path::PathBuf;

use burn::config::Config;
use burn::tensor::Device;
use burn_freeze::{
    Activation, AlphaArgmin, CacheConfig, ChangeRate, Evidence, EvidenceConfig, FixedSchedule,
    FreezePolicy, LayerMap, LayerStack, StackTypes,
};
use burn_pipe::{MicroBatchLoss, UnitCosts, UnitMemory};

use super::Trainer;
use super::bounds::TrainerTypesOf;
use super::error::{TrainerError, invalid};
use super::rules::{CostModel, FreezeRule, LayerSpec, Parts, argmin_config, change_rate_config};
use crate::ReplicaConfig;
use crate::pipetransformer::shape::{PipelineShape, ShapeRule, ShapeSettings};
use crate::sampler::BatchPolicy;
use burn_freeze::StackOptimizer;

/// Configuration of a [`Trainer`]: PipeTransformer's loop, in which
/// AutoFreeze, AutoPipe, AutoDP and AutoCache drive one training run.
///
/// ```
/// use burn_elastic_dp::{BatchPolicy, FreezeRule, Parts, TrainerConfig};
///
/// let config = TrainerConfig::new()
///     .with_freeze(FreezeRule::AlphaSchedule { alpha: 1.0 / 3.0 })
///     .with_batch(BatchPolicy::FixedGlobal { batch: 64 })
///     .with_parts(Parts::new().with_dp(false)); // an ablation: no AutoDP
/// assert!(config.validate(4).is_ok());
/// assert!(config.clone().with_lr(0.0).validate(4).is_err());
/// ```
#[derive(Config, Debug)]
pub struct TrainerConfig {
    /// Which parts run.
    #[config(default = "Parts::new()")]
    pub parts: Parts,
    /// The freeze policy.
    #[config(default = "FreezeRule::Evidence { rule: EvidenceConfig::new() }")]
    pub freeze: FreezeRule,
    /// Samples of the training data never trained on, carved out once (by
    /// the seed) when the freeze rule reads a held-out loss
    /// ([`FreezeRule::Evidence`]): `None` takes a sixteenth of the data, at
    /// most 256 samples; `Some(0)` carves none, for a run that gives a
    /// validation batch instead
    /// ([`Trainer::set_validation`](super::Trainer::set_validation)); without
    /// either, the rule sees no held-out loss and Evidence freezes nothing.
    /// The rest is trained on, each sample exactly once per epoch.
    #[config(default = "None")]
    pub held_out: Option<usize>,
    /// The policy's layers in units.
    #[config(default = "LayerSpec::PerUnit")]
    pub layers: LayerSpec,
    /// Pipeline stages at the start (1 to the device count); `None`:
    /// memory-aware AutoPipe picks the fewest stages whose every stage fits
    /// [`memory`](Self::memory)'s budget (without one: 1 stage on every
    /// device, pure data parallelism), and later shapes keep that fit. The
    /// paper starts at one pipeline over every device: `Some(devices)`.
    #[config(default = "None")]
    pub stages: Option<usize>,
    /// The per-device memory budget of memory-aware AutoPipe.
    #[config(default = "super::MemoryConfig::new()")]
    pub memory: super::MemoryConfig,
    /// Samples per step as replicas come and go.
    #[config(default = "BatchPolicy::FixedGlobal { batch: 32 }")]
    pub batch: BatchPolicy,
    /// Learning rate for the starting replica count (scaled linearly with
    /// the global batch under [`BatchPolicy::PerReplica`]); positive, finite.
    #[config(default = 1e-3)]
    pub lr: f64,
    /// AutoCache's memory budget and spill directory.
    #[config(default = "CacheConfig::new(256 << 20)")]
    pub cache: CacheConfig,
    /// AutoPipe's unit costs.
    #[config(default = "CostModel::Profiled { repeats: 3 }")]
    pub costs: CostModel,
    /// Each replica group's settings: the pipeline's schedule, micro-batches
    /// (`Some(m)`: the user's count for every shape; `None`: chosen for each
    /// shape, see [`measure_micro_batches`](Self::measure_micro_batches))
    /// and waits, the all-reduce.
    #[config(default = "ReplicaConfig::new()")]
    pub replicas: ReplicaConfig,
    /// With no micro-batch count given, M is chosen for every shape the run
    /// takes from each unit's forward and backward time measured at a few
    /// micro-batch sizes on the first batch (under any cost model: the
    /// shapes stay those the costs decide, only M is measured), the count
    /// with the fastest predicted step; the times go into the checkpoints,
    /// so a resumed run chooses as the run it continues. Off: the paper's
    /// count for each K, reproducible bit for bit.
    #[config(default = true)]
    pub measure_micro_batches: bool,
    /// Seed of the sample order.
    #[config(default = 0)]
    pub seed: u64,
    /// Directory for `transitions.jsonl` and `epochs.jsonl` (made if
    /// missing); `None` writes nothing. In a group across processes each
    /// rank writes into `rank-<rank>` under it (checkpoints likewise).
    #[config(default = "None")]
    pub output_dir: Option<PathBuf>,
    /// When a replica fails its part of a step (a panic or an error of its
    /// own), shrink the group to the survivors and go on: a failed forward
    /// and backward pass is run again on the survivors (nothing of it was
    /// applied), a failed optimizer step is not (the survivors applied it).
    /// Replicas stuck in their own computation past the step's bound have
    /// left the group already ([`ElasticError::Timeout`](crate::ElasticError::Timeout)'s
    /// `lost`); with this on the survivors redo the step. With one replica
    /// left (or none), or this off, or a group across processes (which
    /// cannot shrink), the step fails.
    #[config(default = true)]
    pub recover_replicas: bool,
    /// Checkpoints (and where [`Trainer::resume`] reads them); `None`
    /// writes none.
    #[config(default = "None")]
    pub checkpoint: Option<super::CheckpointConfig>,
}

impl TrainerConfig {
    /// Checks every value against a run on `devices` devices, before any
    /// work: one error naming the field and the accepted range.
    pub fn validate(&self, devices: usize) -> Result<(), TrainerError> {
        self.validate_on(devices, 1)
    }

    /// [`validate`](Self::validate) for a group across `processes` processes of
    /// `devices` devices each (a rank of an MPI job with
    /// [`ReplicaConfig::nodes`]): every shape the run can reach must give
    /// every replica of every process a sample per micro-batch. Every
    /// process runs the same shape rule on its own devices (AutoDP in
    /// lockstep), so the whole group holds `processes` times one process's
    /// replicas.
    ///
    /// ```
    /// use burn_elastic_dp::{BatchPolicy, ReplicaConfig, TrainerConfig};
    /// use burn_pipe::PipelineConfig;
    ///
    /// // 4 devices a process, 1 micro-batch: K = 1 gives 4 replicas each.
    /// let one = ReplicaConfig::new().with_pipeline(PipelineConfig::new().with_micro_batches(Some(1)));
    /// let config = TrainerConfig::new()
    ///     .with_batch(BatchPolicy::FixedGlobal { batch: 8 })
    ///     .with_replicas(one);
    /// assert!(config.validate_on(4, 2).is_ok());
    /// assert!(config.validate_on(4, 3).is_err()); // 12 replicas, 8 samples
    /// ```
    pub fn validate_on(&self, devices: usize, processes: usize) -> Result<(), TrainerError> {
        if processes == 0 {
            return Err(invalid("processes", 0, "at least 1 process"));
        }
        if devices == 0 {
            return Err(invalid("devices", 0, "at least 1 device"));
        }
        self.freeze.validate()?;
        self.layers.validate()?;
        self.memory.validate()?;
        if let Some(stages) = self.stages
            && !(1..=devices).contains(&stages)
        {
            return Err(invalid(
                "stages",
                stages,
                "1 to the number of devices (the pipeline's length at the start)",
            ));
        }
        let batch = match self.batch {
            BatchPolicy::FixedGlobal { batch } | BatchPolicy::PerReplica { batch } => batch,
        };
        if batch == 0 {
            return Err(invalid("batch", 0, "at least 1 sample"));
        }
        if !(self.lr.is_finite() && self.lr > 0.0) {
            return Err(invalid("lr", self.lr, "a finite number above 0"));
        }
        self.costs.validate()?;
        if let Some(checkpoint) = &self.checkpoint {
            checkpoint.validate()?;
        }
        self.replicas.validate()?;
        if self.replicas.pipeline.balance.is_some() {
            return Err(invalid(
                "replicas.pipeline.balance",
                "a fixed balance",
                "None (AutoPipe balances the stages)",
            ));
        }
        self.validate_reachable(devices, processes)
    }

    /// Checks that every shape the run can reach gives every replica of
    /// every process a sample per micro-batch.
    fn validate_reachable(&self, devices: usize, processes: usize) -> Result<(), TrainerError> {
        // Every shape the run can reach must have a sample per micro-batch
        // of every replica: K halves from its start (the paper's rule) or
        // falls to any divisor of the devices (memory-aware), R = devices /
        // K; the start is at most every device.
        let start = self.stages.unwrap_or(devices);
        let moves = self.parts.freeze && self.parts.pipe;
        let mut reachable: Vec<usize> =
            std::iter::successors(Some(start), |&k| (k > 1 && moves).then_some(k / 2)).collect();
        if self.stages.is_none() || (moves && self.memory.device_bytes.is_some()) {
            reachable.extend(crate::pipetransformer::shape::stage_counts(devices, start));
        }
        reachable.sort_unstable();
        reachable.dedup();
        for stages in reachable {
            // A memory-aware start (`stages` unset) at `stages` runs
            // devices / stages replicas, whether AutoDP runs or not.
            let memory_start = self.stages.is_none().then(|| (devices / stages).max(1));
            for local in
                std::iter::once(self.replicas_for(stages, start, devices)).chain(memory_start)
            {
                let replicas = local * processes;
                let micro = self.replicas.pipeline.micro_batches_for(stages);
                if self.batch.global_batch(replicas) < ShapeRule::min_batch(replicas, micro) {
                    return Err(TrainerError::BatchTooSmall {
                        batch: self.batch.global_batch(replicas),
                        stages,
                        replicas,
                        micro_batches: micro,
                    });
                }
            }
        }
        Ok(())
    }

    /// The configuration one rank of a group across processes runs: its
    /// logs and checkpoints in `rank-<rank>` under the configured
    /// directories, so that ranks on one machine never write the same file.
    pub(crate) fn for_rank(mut self, rank: Option<usize>) -> Self {
        let Some(rank) = rank.filter(|_| self.replicas.nodes.is_some()) else {
            return self;
        };
        let sub = format!("rank-{rank}");
        self.output_dir = self.output_dir.map(|dir| dir.join(&sub));
        if let Some(checkpoint) = self.checkpoint.as_mut() {
            checkpoint.dir = checkpoint.dir.join(&sub);
        }
        self
    }

    /// Whether a run of this configuration at `stages` stages chooses its
    /// micro-batch count by measurement: a pipeline (one stage has no
    /// bubble: M = 1), no count configured, measuring on (under any cost
    /// model).
    ///
    /// ```
    /// use burn_elastic_dp::{CostModel, TrainerConfig};
    ///
    /// let config = TrainerConfig::new().with_costs(CostModel::Parameters { frozen_factor: 1.0 / 3.0 });
    /// assert!(config.measures_micro_batches(2) && !config.measures_micro_batches(1));
    /// let paper = config.with_measure_micro_batches(false);
    /// assert!(!paper.measures_micro_batches(2));
    /// ```
    pub fn measures_micro_batches(&self, stages: usize) -> bool {
        stages > 1 && self.replicas.pipeline.micro_batches.is_none() && self.measure_micro_batches
    }

    /// What the shape rule ([`ShapeRule`]) is asked on `devices` devices
    /// (one process's).
    pub fn shape_settings(&self, devices: usize) -> ShapeSettings {
        ShapeSettings {
            devices,
            stages: self.stages,
            pipe: self.parts.pipe,
            dp: self.parts.dp,
            cache: self.parts.caches(),
            device_bytes: self.memory.device_bytes,
            optimizer_slots: self.memory.optimizer_slots,
            batch: self.batch,
            micro_batches: self.replicas.pipeline.micro_batches,
            measure_micro_batches: self.measure_micro_batches,
            schedule: self.replicas.pipeline.schedule,
            shared_cores: None,
        }
    }

    /// What the freeze rule's evidence keeps beside the training units of
    /// `memory`, added to it: one copy of the parameters of every unit for
    /// the running gradient sums (the consistency signals, the paper's
    /// accumulated-gradient argmin), one of every unit from the first
    /// layer's on for the default rule's weight snapshot (update gains; the
    /// embedding below the layers is not measured). Memory-aware AutoPipe
    /// counts it with the optimizer's state.
    ///
    /// ```
    /// use burn_elastic_dp::{FreezeRule, LayerSpec, Parts, TrainerConfig};
    /// use burn_pipe::UnitMemory;
    ///
    /// let units = UnitMemory::new(vec![100; 4], vec![0; 4]);
    /// let blocks = LayerSpec::Uniform { offset: 1, per_layer: 1, layers: 2 };
    /// let default = TrainerConfig::new().with_layers(blocks);
    /// assert_eq!(default.with_evidence(&units).evidence, [0, 100, 100, 100]);
    /// let schedule = default.clone().with_freeze(FreezeRule::AlphaSchedule { alpha: 0.5 });
    /// assert!(schedule.with_evidence(&units).evidence.iter().all(|&b| b == 0));
    /// let no_freeze = default.with_parts(Parts::new().with_freeze(false));
    /// assert!(no_freeze.with_evidence(&units).evidence.iter().all(|&b| b == 0));
    /// ```
    pub fn with_evidence(&self, memory: &UnitMemory) -> UnitMemory {
        let memory = memory.clone().with_evidence(0, 0.0);
        if !self.parts.freeze {
            return memory;
        }
        // A rule refused by its check reads nothing (the run refuses it).
        let Ok(policy) = self.policy(1) else {
            return memory;
        };
        let memory = match policy.needs_gradient_sums() {
            true => memory.with_evidence(0, 1.0),
            false => memory,
        };
        match policy.needs_update_gains() {
            true => {
                let from = self.evidence_from(memory.len());
                memory.with_evidence(from, 1.0)
            }
            false => memory,
        }
    }

    /// The first unit whose update gains the default rule measures: the
    /// first layer's (0 when the map does not fit `units` units).
    pub(crate) fn evidence_from(&self, units: usize) -> usize {
        self.layer_map(units).map_or(0, |map| map.first_unit())
    }

    /// Checks, before any work, that a stack whose units hold `unit_params`
    /// parameters of `element_bytes` bytes each has a start that fits the
    /// budget on `devices` devices (on parameters, gradients and optimizer
    /// state: activations are measured on the first batch, which checks
    /// again); returns that start, balanced on parameter counts.
    ///
    /// ```
    /// use burn_elastic_dp::{MemoryConfig, TrainerConfig, TrainerError};
    ///
    /// let config = TrainerConfig::new().with_memory(MemoryConfig::new().with_device_bytes(Some(1000)));
    /// // Each unit: 100 parameters of 4 bytes, with gradients and Adam 1600 bytes.
    /// let error = config.validate_memory(&[100; 8], 4, 4).unwrap_err();
    /// assert!(matches!(error, TrainerError::DoesNotFit { unit: 0, alone: true, .. }));
    /// let start = TrainerConfig::new().validate_memory(&[100; 8], 4, 4).unwrap();
    /// assert_eq!((start.stages(), start.replicas), (1, 4));
    /// ```
    pub fn validate_memory(
        &self,
        unit_params: &[usize],
        element_bytes: usize,
        devices: usize,
    ) -> Result<PipelineShape, TrainerError> {
        self.validate(devices)?;
        let memory = UnitMemory::from_param_counts(unit_params, element_bytes);
        let costs = UnitCosts::from_params(unit_params, 1.0 / 3.0);
        let memory = self.with_evidence(&memory);
        Ok(ShapeRule::new(self.shape_settings(devices), costs, memory).start()?)
    }

    /// Replicas for a pipeline of `stages` stages: as many as the devices
    /// hold under AutoDP, else as many as at the start.
    pub(crate) fn replicas_for(&self, stages: usize, start: usize, devices: usize) -> usize {
        if self.parts.dp {
            (devices / stages).max(1)
        } else {
            (devices / start).max(1)
        }
    }

    /// The layer map for a stack of `units` units.
    pub(crate) fn layer_map(&self, units: usize) -> Result<LayerMap, TrainerError> {
        Ok(match self.layers {
            LayerSpec::PerUnit => LayerMap::per_unit(units),
            LayerSpec::Uniform {
                offset,
                per_layer,
                layers,
            } => LayerMap::uniform(offset, per_layer, layers, units)?,
        })
    }

    /// The configured freeze policy for a model of `layers` layers; the
    /// rule's error ([`FreezeRule::validate`]) on a value out of range.
    ///
    /// With [`ArgminStatistic::AccumulatedGradient`] every stage of every
    /// replica keeps a running sum of its trainable parameters' gradients
    /// (one copy of its active weights, on its device) for the epoch.
    pub(crate) fn policy(
        &self,
        layers: usize,
    ) -> Result<Box<dyn FreezePolicy + Send>, TrainerError> {
        self.freeze.validate()?;
        let refused = |error| TrainerError::InvalidFreezeRule {
            path: "freeze",
            error,
        };
        Ok(match &self.freeze {
            FreezeRule::AlphaSchedule { alpha } => Box::new(FixedSchedule::alpha(layers, *alpha)),
            FreezeRule::AlphaArgmin { alpha, statistic } => {
                Box::new(AlphaArgmin::new(argmin_config(*alpha, *statistic)).map_err(refused)?)
            }
            FreezeRule::ChangeRate {
                every_steps,
                percentile,
            } => Box::new(
                ChangeRate::new(change_rate_config(*every_steps, *percentile)).map_err(refused)?,
            ),
            FreezeRule::Evidence { rule } => Box::new(Evidence::new(rule.clone())),
            FreezeRule::Fronts { layers } => Box::new(FixedSchedule::Fronts(layers.clone())),
        })
    }

    /// Builds the trainer of `stack` over `devices` (logical devices on a
    /// CPU: the same device several times), each pipeline stage with an
    /// optimizer made by `make_optimizer`, every step scored by `loss` (a
    /// micro-batch's output and targets to the mean loss over its samples;
    /// owned, as every replica runs on a thread of its own, and given once:
    /// the trainer shares it). The pipeline starts balanced on
    /// parameter counts; with [`CostModel::Profiled`] the units are timed
    /// on the first batch and the pipeline rebalanced on those times before
    /// the first step.
    ///
    /// Fails, before any work, on a value outside its range (see
    /// [`validate`](Self::validate)), more stages than units, a layer map that
    /// does not fit the stack, an output directory that cannot be made or
    /// an unusable cache spill directory.
    pub fn init<S, O, T>(
        &self,
        stack: LayerStack<S>,
        devices: Vec<Device<S::Backend>>,
        make_optimizer: impl Fn() -> O + Clone + Send + Sync + 'static,
        loss: impl MicroBatchLoss<S, T> + Send + 'static,
    ) -> Result<Trainer<TrainerTypesOf<S, O, T>>, TrainerError>
    where
        S: StackTypes,
        O: StackOptimizer<S>,
        T: Activation<S::Backend> + Send + 'static,
    {
        let config = self
            .clone()
            .for_rank(crate::group::nodes::OtherNodes::job_rank());
        Trainer::new(stack, devices, config, make_optimizer, loss, false, None)
    }
}
