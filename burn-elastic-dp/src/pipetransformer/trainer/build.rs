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
use super::bounds::{TrainerBackend, TrainerTypes, TrainerTypesOf};
use super::checkpoint::{self, Resumed};
use super::config::TrainerConfig;
use super::cursor::EpochCursor;
use super::error::TrainerError;
use super::held_out::HeldOut;
use super::learning_rate::LearningRate;
use super::log::JsonLog;
use super::measure::Measurements;
use super::transition::device_lists;
use crate::group::nodes::OtherNodes;
use burn_freeze::CacheHolder;

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
        let policy = config.policy(map.num_layers())?;
        let log = match &config.output_dir {
            Some(dir) => Some(JsonLog::create(dir, resuming)?),
            None => None,
        };
        let mut measured = Measurements::start(&stack, &config, &devices);
        let shape = measured.rule_mut().start()?;
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
        // The rule's M from the first step on (the user's, or the paper's
        // until the first batch measures the micro-batch times).
        measured.apply_micro_batches(&mut group)?;
        tracing::info!(
            K = shape.stages(),
            R = shape.replicas,
            M = group.micro_batches(),
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
        let device = devices.first().cloned().unwrap_or_default();
        let Resumed {
            path,
            state,
            stack,
            optimizer,
            nodes,
        } = checkpoint::load::<S, O>(&config, stack, &device)?;
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
