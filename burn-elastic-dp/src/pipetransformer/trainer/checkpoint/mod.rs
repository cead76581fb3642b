//! A run's checkpoints, in one place: what one holds ([`RunState`] beside the weights and the
//! optimizer state), writing one ([`Trainer::save_checkpoint`]), choosing, agreeing across ranks
//! and reading one back ([`load`]), and a new trainer taking its state (`Trainer::restore`).
//! The files (`files.rs`) and the records of the weights (`records.rs`) sit below.

mod files;
mod records;

use std::path::PathBuf;

use burn::config::Config;
use burn::prelude::*;
use burn_freeze::{FreezeFront, FreezeState, LayerStack, PolicyState, StackOptimizer, StackTypes};
use serde::{Deserialize, Serialize};

use super::Trainer;
use super::bounds::{OptimizerRecord, TrainerTypes};
use super::config::TrainerConfig;
use super::cursor::{CursorState, EpochCursor};
use super::error::{TrainerError, invalid};
use super::learning_rate::RateState;
use super::measure::MeasuredState;
use super::transition::through_one;
use crate::group::nodes::OtherNodes;
use crate::pipetransformer::shape::PipelineShape;

/// When and where a [`Trainer`](super::Trainer) writes checkpoints.
///
/// ```
/// use burn_elastic_dp::CheckpointConfig;
///
/// let config = CheckpointConfig::new("runs/ckpt".into()).with_every_steps(50);
/// assert_eq!(config.keep, 2);
/// ```
#[derive(Config, Debug)]
pub struct CheckpointConfig {
    /// Directory of the checkpoints (made if missing).
    pub dir: PathBuf,
    /// Steps between checkpoints (at least 1); one is also written after
    /// every transition.
    #[config(default = 100)]
    pub every_steps: usize,
    /// Checkpoints kept, the newest (at least 1); older ones are removed.
    #[config(default = 2)]
    pub keep: usize,
}

impl CheckpointConfig {
    /// Checks the values; the error names the field and its range.
    pub fn validate(&self) -> Result<(), TrainerError> {
        if self.every_steps == 0 {
            return Err(invalid("checkpoint.every_steps", 0, "at least 1"));
        }
        if self.keep == 0 {
            return Err(invalid("checkpoint.keep", 0, "at least 1"));
        }
        Ok(())
    }
}

/// Format of `state.json`: the one place it is set (a state is made with
/// it, and a checkpoint of another format is refused when read).
const FORMAT: u32 = 1;

/// Everything of a run but its weights and optimizer state: a field per
/// part of the trainer, the parts' own fields flattened into one object.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct RunState {
    /// [`FORMAT`], set by [`Trainer::run_state`].
    pub format: u32,
    /// Steps, epochs and the sampler's place.
    #[serde(flatten)]
    pub cursor: CursorState,
    pub freeze: FreezeState,
    pub policy: Option<PolicyState>,
    pub front: usize,
    pub shape: PipelineShape,
    /// Costs, memory and what is still to measure.
    #[serde(flatten)]
    pub measured: MeasuredState,
    /// The learning rate's reference and schedule.
    #[serde(flatten)]
    pub rate: RateState,
    /// Processes of the group that wrote it (1 for one process).
    #[serde(default = "one")]
    pub processes: usize,
    /// Replicas of the whole group, every process's.
    #[serde(default)]
    pub total_replicas: usize,
    /// (file, CRC-32, length) of the weights and optimizer files.
    pub files: Vec<(String, u32, u64)>,
}

fn one() -> usize {
    1
}

/// A checkpoint read back for a resume: where it was, the run's state, the
/// weights loaded into the stack and the optimizer state; across
/// processes, the link the ranks agreed on it over (the group is built on
/// it).
pub(super) struct Resumed<S: StackTypes, O: StackOptimizer<S>> {
    pub path: PathBuf,
    pub state: RunState,
    pub stack: LayerStack<S>,
    pub optimizer: O::Record,
    pub nodes: Option<OtherNodes>,
}

/// The one way in: the checkpoint a run of `config` resumes from (the
/// newest in its directory that verifies; across processes, the newest
/// every rank holds, agreed over a link then kept for the group), its
/// weights loaded into `stack` on `device`.
pub(super) fn load<S: StackTypes, O: StackOptimizer<S>>(
    config: &TrainerConfig,
    stack: LayerStack<S>,
    device: &Device<S::Backend>,
) -> Result<Resumed<S, O>, TrainerError> {
    let Some(checkpoint) = &config.checkpoint else {
        return Err(TrainerError::InvalidConfig {
            field: "checkpoint",
            value: "None".into(),
            accepted: "a checkpoint directory to resume from",
        });
    };
    // Across processes, the ranks agree on the checkpoint over the link
    // the group is then built on.
    let (loaded, nodes) = if config.replicas.nodes.is_some() && OtherNodes::job_size().is_some() {
        let nodes = OtherNodes::join(&config.replicas, 1)?;
        let timeout = std::time::Duration::from_millis(config.replicas.timeout_ms);
        let loaded = files::read_agreed(&checkpoint.dir, &nodes, timeout)?;
        (loaded, Some(nodes))
    } else {
        let dir = files::one_process_dir(&checkpoint.dir)?;
        (files::read_latest(&dir)?, None)
    };
    let files::Loaded {
        path,
        state,
        model,
        optimizer,
    } = loaded;
    let (stack, optimizer) = records::load::<S, O>(stack, model, optimizer, &path, device)?;
    Ok(Resumed {
        path,
        state,
        stack,
        optimizer,
        nodes,
    })
}

/// The way out, and a new trainer taking a checkpoint's state.
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
    pub fn save_checkpoint(&mut self) -> Result<Option<PathBuf>, TrainerError> {
        if self.config.checkpoint.is_none() {
            return Ok(None);
        }
        // The freeze rule's evidence in the running gradient sums (not
        // saved) closed into its state, which is.
        self.auto.before_checkpoint(&mut self.group);
        let Some(config) = &self.config.checkpoint else {
            return Ok(None);
        };
        let state = self.run_state()?;
        records::save(config, &self.group, state).map(Some)
    }

    /// Everything of the run but its weights and optimizer state.
    fn run_state(&self) -> Result<RunState, TrainerError> {
        let (freeze, policy) = self.auto.save_state();
        Ok(RunState {
            format: FORMAT,
            cursor: self.cursor.state(),
            freeze,
            policy,
            front: self.group.front(),
            shape: self.shape(),
            measured: self.measured.state(),
            rate: self.rate.state()?,
            processes: self.group.processes(),
            total_replicas: self.group.total_replicas(),
            files: Vec::new(),
        })
    }

    /// A trainer just built takes a checkpoint's state: front, shape,
    /// optimizer state, measurements, freeze policy, rate, sampler, counts.
    /// On another number of processes or devices the replicas are derived
    /// again (under AutoDP), or the checkpoint is refused, naming its shape
    /// and the devices given.
    pub(in crate::pipetransformer::trainer) fn restore(
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
        self.held_out.forget_prefix();
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
