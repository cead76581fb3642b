//! Checkpoints of a PipeTransformer run: [`Trainer::save_checkpoint`] and [`Trainer::resume`] (from
//! the newest checkpoint that verifies).

use std::path::{Path, PathBuf};

use burn::module::Module;
use burn::prelude::*;
use burn::record::{BinBytesRecorder, FullPrecisionSettings, Recorder};
use burn_freeze::{Activation, LayerStack, StackTypes};
use burn_pipe::MicroBatchLoss;

use super::Trainer;
use super::bounds::{OptimizerRecord, TrainerParts, TrainerTypes};
use super::checkpoint_files::{Loaded, RunState, one_process_dir, read_agreed, read_latest, write};
use super::config::TrainerConfig;
use super::error::TrainerError;
use burn_freeze::StackOptimizer;

/// Resuming takes the parts a trainer is made of, as
/// [`TrainerConfig::init`] does.
impl<S, O, T> Trainer<TrainerParts<S, O, T>>
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
        let config = config.for_rank(crate::nodes::job_rank());
        let Some(checkpoint) = &config.checkpoint else {
            return Err(TrainerError::InvalidConfig {
                field: "checkpoint",
                value: "None".into(),
                accepted: "a checkpoint directory to resume from",
            });
        };
        let across = config.replicas.nodes.is_some() && crate::nodes::job_size().is_some();
        let loaded = if across {
            read_agreed(&checkpoint.dir, &config)?
        } else {
            read_latest(&one_process_dir(&checkpoint.dir)?)?
        };
        let device = devices.first().cloned().unwrap_or_default();
        let Loaded {
            path,
            state,
            model,
            optimizer,
        } = loaded;
        let (stack, optimizer) = load_weights::<S, O>(stack, model, optimizer, &path, &device)?;
        let mut trainer = Self::new(stack, devices, config, make_optimizer, loss, true)?;
        trainer.restore(state, optimizer)?;
        tracing::info!(
            checkpoint = %path.display(),
            steps = trainer.steps,
            epoch = trainer.epoch,
            "run resumed"
        );
        Ok((trainer, path))
    }
}

impl<TT: TrainerTypes> Trainer<TT> {
    /// Writes a checkpoint of the run into the configured directory (see
    /// [`CheckpointConfig`](crate::CheckpointConfig); the trainer also does so every `every_steps`
    /// steps, after each transition and at each epoch's end): weights,
    /// optimizer state, freeze front and policy statistics, pipeline shape
    /// and costs, replica count, the sampler's place in the epoch and the
    /// step and epoch counters. Returns its directory, or `None` without a
    /// checkpoint configuration.
    ///
    /// A directory per checkpoint, written under a temporary name and renamed
    /// when complete (a crash never leaves a half-written checkpoint under a
    /// real name), every file's CRC-32 in its `state.json`.
    ///
    /// Not saved: the AutoCache's entries (a resumed run recomputes them,
    /// exactly) and the backend's random state (Burn has no API for it: a
    /// model with dropout resumes with other dropout masks).
    pub fn save_checkpoint(&self) -> Result<Option<PathBuf>, TrainerError> {
        let Some(config) = &self.config.checkpoint else {
            return Ok(None);
        };
        let recorder = BinBytesRecorder::<FullPrecisionSettings>::default();
        let model = self.group.to_layer_stack()?.into_parts().into_record();
        let model = recorder
            .record(model, ())
            .map_err(|e| TrainerError::Checkpoint(format!("the weights: {e}")))?;
        let optimizer = recorder
            .record(self.group.optimizer_record()?, ())
            .map_err(|e| TrainerError::Checkpoint(format!("the optimizer state: {e}")))?;
        let (freeze, policy) = self.auto.save_state();
        let state = RunState {
            format: 0,
            steps: self.steps,
            epoch: self.epoch,
            mid_epoch: self.mid_epoch,
            sampler: self.sampler.as_ref().map(|s| {
                let (epoch, cursor) = s.position();
                (epoch, cursor, s.len())
            }),
            freeze,
            policy,
            front: self.group.front(),
            shape: self.shape(),
            costs: self.costs.clone(),
            initial_largest: self.initial_largest,
            base_replicas: self.base_replicas,
            profile_pending: self.profile_pending,
            memory: Some(self.memory.clone()),
            memory_pending: self.memory_pending,
            processes: self.group.processes(),
            total_replicas: self.group.total_replicas(),
            lr_schedule: self.schedule.save()?,
            files: Vec::new(),
        };
        let path = write(config, state, &model, &optimizer)?;
        tracing::debug!(checkpoint = %path.display(), steps = self.steps, "checkpoint written");
        Ok(Some(path))
    }

    /// After a step that left some of the epoch to run: a checkpoint when
    /// the front `moved` or every `every_steps` steps (the epoch's last step
    /// is saved by the epoch's end, at once).
    pub(super) fn checkpoint_after_step(&self, moved: bool) -> Result<(), TrainerError> {
        if let Some(checkpoint) = &self.config.checkpoint
            && self.epoch_left()
            && (moved || self.steps.is_multiple_of(checkpoint.every_steps))
        {
            self.save_checkpoint()?;
        }
        Ok(())
    }

    /// A trainer just built takes a checkpoint's state: front, shape,
    /// optimizer state, costs, memory, freeze policy, rate, sampler, counts.
    fn restore(
        &mut self,
        state: RunState,
        optimizer: OptimizerRecord<TT>,
    ) -> Result<(), TrainerError>
    where
        OptimizerRecord<TT>: Clone,
    {
        let trainer = self;
        // The saved front and shape, then the saved optimizer state in
        // every replica. On another number of processes each one's share is
        // derived again: under AutoDP as many replicas as its devices hold
        // at the saved K (the global batch is shared among them all).
        // The same on fewer or more devices in one process.
        let mut shape = state.shape.clone();
        let processes = trainer.group.processes();
        let devices = trainer.devices.len();
        let saved_devices = shape.stages() * shape.replicas;
        if processes != state.processes || devices != saved_devices {
            // Under AutoDP K devices suffice (R = devices / K, derived again);
            // without it the saved R must fit.
            let dp = trainer.config.parts.dp;
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
        }
        trainer.reshape_through_one(&shape, |group| {
            if state.front > 0 {
                group.freeze_to(state.front)?;
            }
            Ok(())
        })?;
        trainer.group.load_optimizer_record(optimizer);
        trainer.costs = state.costs;
        trainer.initial_largest = state.initial_largest;
        trainer.base_replicas = state.base_replicas;
        trainer.profile_pending = state.profile_pending;
        if let Some(memory) = state.memory {
            trainer.memory = memory;
            trainer.memory_pending = state.memory_pending;
        }
        trainer.auto.load_state(state.freeze, state.policy);
        trainer.schedule.restore(state.lr_schedule);
        if let Some((epoch, cursor, len)) = state.sampler {
            let mut sampler = trainer.make_sampler(len)?;
            sampler.seek(epoch, cursor)?;
            trainer.sampler = Some(sampler);
        }
        trainer.epoch = state.epoch;
        trainer.steps = state.steps;
        trainer.mid_epoch = state.mid_epoch;
        Ok(())
    }
}

/// A checkpoint's weights loaded into `stack`, and its optimizer state.
fn load_weights<S, O>(
    stack: LayerStack<S>,
    model: Vec<u8>,
    optimizer: Vec<u8>,
    path: &Path,
    device: &Device<S::Backend>,
) -> Result<(LayerStack<S>, O::Record), TrainerError>
where
    S: StackTypes,
    O: StackOptimizer<S>,
{
    let recorder = BinBytesRecorder::<FullPrecisionSettings>::default();
    let record = recorder
        .load(model, device)
        .map_err(|e| TrainerError::Checkpoint(format!("{}: the weights: {e}", path.display())))?;
    let (first, middle, last) = stack.into_parts().load_record(record);
    let stack = LayerStack::from_parts(first, middle, last);
    let optimizer: O::Record = recorder.load(optimizer, device).map_err(|e| {
        TrainerError::Checkpoint(format!("{}: the optimizer state: {e}", path.display()))
    })?;
    Ok((stack, optimizer))
}
