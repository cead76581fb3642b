//! A trainer made: afresh from its configuration (the checks, the starting shape on the starting
//! measurements, the group, its cache and the logs), or from a checkpoint (that, then the
//! checkpoint's state taken by every part).

use std::path::PathBuf;
use std::sync::Arc;

use burn::prelude::*;
use burn_freeze::{
    Activation, ActivationCache, AutoFreeze, LayerStack, StackOptimizer, StackTypes,
};
use burn_pipe::MicroBatchLoss;

use super::Trainer;
use super::bounds::{OptimizerRecord, TrainerBackend, TrainerTypes, TrainerTypesOf};
use super::checkpoint::load_weights;
use super::checkpoint_files::{Loaded, RunState, one_process_dir, read_agreed, read_latest};
use super::config::TrainerConfig;
use super::cursor::EpochCursor;
use super::error::TrainerError;
use super::held_out::HeldOut;
use super::learning_rate::LearningRate;
use super::log::JsonLog;
use super::measure::Measurements;
use super::transition::{device_lists, through_one};
use crate::group::nodes::OtherNodes;
use crate::pipetransformer::shape::PipelineShape;
use burn_freeze::CacheHolder;
use burn_freeze::FreezeFront;

impl<TT: TrainerTypes> Trainer<TT> {
    /// See [`TrainerConfig::init`]; `resuming` appends to the output
    /// directory's logs instead of starting them afresh; the group is built
    /// on the link to the other processes `joined` (the one a checkpoint was
    /// agreed on), if given.
    pub(super) fn new(
        stack: LayerStack<TT::Stack>,
        devices: Vec<Device<TrainerBackend<TT>>>,
        config: TrainerConfig,
        make_optimizer: impl Fn() -> TT::Optimizer + Clone + Send + Sync + 'static,
        loss: impl MicroBatchLoss<TT::Stack, TT::Targets> + Send + 'static,
        resuming: bool,
        joined: Option<OtherNodes>,
    ) -> Result<Self, TrainerError> {
        // A group across processes: every process runs this rule on its
        // own devices, so the whole group is `processes` times as large.
        let processes = match config.replicas.nodes {
            Some(_) => OtherNodes::job_size().unwrap_or(1),
            None => 1,
        };
        config.validate_on(devices.len(), processes)?;
        let units = stack.num_units();
        if let Some(stages) = config.stages
            && stages > units
        {
            return Err(TrainerError::TooManyStages { stages, units });
        }
        let map = config.layer_map(units)?;
        let policy = config.policy(map.num_layers());
        let log = match &config.output_dir {
            Some(dir) => Some(JsonLog::create(dir, resuming)?),
            None => None,
        };
        let mut measured = Measurements::start(&stack, &config);
        let shape = measured.start_shape(&config, devices.len())?;
        let pipeline = (config.replicas.pipeline.clone()).with_balance(Some(shape.balance.clone()));
        let mut group = (config.replicas.clone())
            .with_pipeline(pipeline)
            .init_joined(
                stack,
                device_lists(&devices, &shape),
                make_optimizer,
                joined,
            )?;
        let auto = AutoFreeze::new(policy, map);
        if config.parts.freeze {
            // The argmin of accumulated gradients: every stage sums its
            // gradients from the first step on.
            auto.prepare(&mut group);
        }
        if config.parts.caches() {
            group.attach_cache(ActivationCache::new(config.cache.clone())?);
        }
        tracing::info!(
            K = shape.stages(),
            R = shape.replicas,
            M = config.replicas.pipeline.micro_batches_for(shape.stages()),
            balance = ?shape.balance,
            "PipeTransformer run starts"
        );
        let held_out = HeldOut::new(&config, auto.policy().held_out_every().is_some());
        Ok(Self {
            loss: Arc::new(loss),
            measured,
            // Replicas at the start, in every process (the learning rate's
            // reference).
            rate: LearningRate::new(config.lr, group.total_replicas()),
            cursor: EpochCursor::default(),
            held_out,
            group,
            devices,
            auto,
            log,
            config,
        })
    }

    /// A trainer just built takes a checkpoint's state: front, shape,
    /// optimizer state, measurements, freeze policy, rate, sampler, counts.
    /// On another number of processes or devices the replicas are derived
    /// again (under AutoDP), or the checkpoint is refused, naming its shape
    /// and the devices given.
    fn restore(
        &mut self,
        state: RunState,
        optimizer: OptimizerRecord<TT>,
    ) -> Result<(), TrainerError>
    where
        OptimizerRecord<TT>: Clone,
    {
        let shape = self.resumed_shape(&state)?;
        let front = state.front;
        through_one(&mut self.group, &self.devices, &shape, |group| {
            if front > 0 {
                group.freeze_to(front)?;
            }
            Ok(())
        })?;
        self.group.load_optimizer_record(optimizer);
        self.measured.restore(state.measured);
        self.rate.restore(state.rate);
        self.auto.load_state(state.freeze, state.policy);
        let (held_out, config) = (&self.held_out, &self.config);
        self.cursor = EpochCursor::restore(state.cursor, |len| held_out.sampler(config, len))?;
        Ok(())
    }

    /// The shape a checkpoint resumes at: its own, or on another number of
    /// processes or devices, under AutoDP as many replicas as the devices
    /// hold at the saved K (the global batch is shared among them all);
    /// without AutoDP the saved R must fit.
    fn resumed_shape(&self, state: &RunState) -> Result<PipelineShape, TrainerError> {
        let mut shape = state.shape.clone();
        let processes = self.group.processes();
        let devices = self.devices.len();
        let saved_devices = shape.stages() * shape.replicas;
        if processes == state.processes && devices == saved_devices {
            return Ok(shape);
        }
        let dp = self.config.parts.dp;
        let needed = if dp { shape.stages() } else { saved_devices };
        if devices < needed {
            return Err(TrainerError::Checkpoint(format!(
                "it was written at K={}, R={} ({saved_devices} devices); {devices} device(s) given: resume on at least {needed}{}",
                shape.stages(),
                shape.replicas,
                if dp { "" } else { ", or turn AutoDP on" },
            )));
        }
        if dp {
            shape.replicas = devices / shape.stages();
        }
        tracing::info!(
            written_by = state.processes,
            resumed_on = processes,
            devices_before = saved_devices,
            devices_now = devices,
            total_replicas_before = state.total_replicas,
            replicas_here = shape.replicas,
            "resuming on another number of processes or devices"
        );
        Ok(shape)
    }
}

/// Resuming takes the parts a trainer is made of, as
/// [`TrainerConfig::init`] does.
impl<S, O, T> Trainer<TrainerTypesOf<S, O, T>>
where
    S: StackTypes,
    O: StackOptimizer<S>,
    T: Activation<S::Backend> + Send + 'static,
{
    /// Resumes a run from the newest checkpoint in `config.checkpoint`'s
    /// directory that verifies (a truncated or corrupted one is rejected,
    /// with the reason logged, and the one before it used). `stack` gives
    /// the architecture (its weights are replaced by the checkpoint's);
    /// `devices`, `make_optimizer` and `loss` as for
    /// [`TrainerConfig::init`]. The run then goes on exactly where the
    /// checkpoint was taken: the same losses, step for step, as a run never
    /// stopped (for a model without dropout). Returns the trainer and the
    /// checkpoint used.
    pub fn resume(
        stack: LayerStack<S>,
        devices: Vec<Device<S::Backend>>,
        config: TrainerConfig,
        make_optimizer: impl Fn() -> O + Clone + Send + Sync + 'static,
        loss: impl MicroBatchLoss<S, T> + Send + 'static,
    ) -> Result<(Self, PathBuf), TrainerError>
    where
        O::Record: Clone,
    {
        let config = config.for_rank(OtherNodes::job_rank());
        let Some(checkpoint) = &config.checkpoint else {
            return Err(TrainerError::InvalidConfig {
                field: "checkpoint",
                value: "None".into(),
                accepted: "a checkpoint directory to resume from",
            });
        };
        // Across processes, the ranks agree on the checkpoint over the link
        // the group is then built on.
        let (loaded, nodes) = if config.replicas.nodes.is_some() && OtherNodes::job_size().is_some()
        {
            let nodes = OtherNodes::join(&config.replicas, 1)?;
            let timeout = std::time::Duration::from_millis(config.replicas.timeout_ms);
            (read_agreed(&checkpoint.dir, &nodes, timeout)?, Some(nodes))
        } else {
            (read_latest(&one_process_dir(&checkpoint.dir)?)?, None)
        };
        let device = devices.first().cloned().unwrap_or_default();
        let Loaded {
            path,
            state,
            model,
            optimizer,
        } = loaded;
        let (stack, optimizer) = load_weights::<S, O>(stack, model, optimizer, &path, &device)?;
        let mut trainer = Self::new(stack, devices, config, make_optimizer, loss, true, nodes)?;
        trainer.restore(state, optimizer)?;
        tracing::info!(
            checkpoint = %path.display(),
            steps = trainer.cursor.steps(),
            epoch = trainer.cursor.epoch(),
            "run resumed"
        );
        Ok((trainer, path))
    }
}
