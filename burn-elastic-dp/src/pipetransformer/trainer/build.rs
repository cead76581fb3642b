//! A trainer made from its configuration: the checks, the starting shape
//! on the starting costs, the group, its cache and the logs.

use std::sync::Arc;

use burn::prelude::*;
use burn_freeze::{ActivationCache, AutoFreeze, LayerStack};
use burn_pipe::MicroBatchLoss;

use super::Trainer;
use super::bounds::{TrainerBackend, TrainerTypes};
use super::config::TrainerConfig;
use super::error::TrainerError;
use super::log::JsonLog;
use super::memory::{measure_pending, starting_memory};
use super::transition::{device_lists, starting_costs};

impl<TT: TrainerTypes> Trainer<TT> {
    /// See [`TrainerConfig::init`]; `resuming` appends to the output
    /// directory's logs instead of starting them afresh.
    pub(super) fn new(
        stack: LayerStack<TT::Stack>,
        devices: Vec<Device<TrainerBackend<TT>>>,
        config: TrainerConfig,
        make_optimizer: impl Fn() -> TT::Optimizer + Clone + Send + Sync + 'static,
        loss: impl MicroBatchLoss<TT::Stack, TT::Targets> + Send + 'static,
        resuming: bool,
    ) -> Result<Self, TrainerError> {
        // A group across processes: every process runs this rule on its
        // own devices, so the whole group is `processes` times as large.
        let processes = match config.replicas.nodes {
            Some(_) => crate::nodes::job_size().unwrap_or(1),
            None => 1,
        };
        config.check_on(devices.len(), processes)?;
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
        let (costs, profile_pending) = starting_costs(&stack, config.costs);
        let memory = starting_memory(&stack);
        let memory_pending = measure_pending(&config, &memory);
        let (shape, initial_largest) = config.start_shape(&costs, &memory, devices.len())?;
        let pipeline = (config.replicas.pipeline.clone()).with_balance(Some(shape.balance.clone()));
        let mut group = (config.replicas.clone()).with_pipeline(pipeline).init(
            stack,
            device_lists(&devices, &shape),
            make_optimizer,
        )?;
        let auto = AutoFreeze::new(policy, map);
        if config.parts.freeze {
            // The argmin of accumulated gradients: every stage sums its
            // gradients from the first step on.
            auto.prepare(&mut group);
        }
        if config.parts.cache && config.parts.freeze {
            group.attach_cache(ActivationCache::new(config.cache.clone())?);
        }
        // Replicas at the start, in every process (the learning rate's
        // reference).
        let replicas = group.total_replicas();
        tracing::info!(
            K = shape.stages(),
            R = shape.replicas,
            M = config.replicas.pipeline.micro_batches_for(shape.stages()),
            balance = ?shape.balance,
            "PipeTransformer run starts"
        );
        Ok(Self {
            group,
            loss: Arc::new(loss),
            costs,
            profile_pending,
            memory,
            memory_pending,
            initial_largest,
            base_replicas: replicas,
            devices,
            auto,
            sampler: None,
            held_out_batch: None,
            epoch: 0,
            steps: 0,
            mid_epoch: false,
            log,
            micro: Default::default(),
            schedule: Default::default(),
            last_base_lr: config.lr,
            profiling: Default::default(),
            config,
        })
    }
}
