//! A checkpoint's records: a group's weights and optimizer state encoded beside the run's state
//! (written by `files.rs`), and decoded into a stack when read back.

use std::path::{Path, PathBuf};

use burn::module::Module;
use burn::prelude::*;
use burn::record::{BinBytesRecorder, FullPrecisionSettings, Recorder};
use burn_freeze::{LayerStack, StackOptimizer, StackTypes};

use super::files::write;
use super::{CheckpointConfig, RunState};
use crate::group::ReplicaGroup;
use crate::pipetransformer::trainer::error::TrainerError;

/// Writes a checkpoint of `group` (weights, optimizer state) and `state`
/// (the rest of the run) into `config`'s directory; returns its directory.
pub(super) fn save<S: StackTypes, O: StackOptimizer<S>>(
    config: &CheckpointConfig,
    group: &ReplicaGroup<S, O>,
    state: RunState,
) -> Result<PathBuf, TrainerError> {
    let recorder = BinBytesRecorder::<FullPrecisionSettings>::default();
    let model = group.to_layer_stack()?.into_parts().into_record();
    let model = recorder
        .record(model, ())
        .map_err(|e| TrainerError::Checkpoint(format!("the weights: {e}")))?;
    let optimizer = recorder
        .record(group.optimizer_record()?, ())
        .map_err(|e| TrainerError::Checkpoint(format!("the optimizer state: {e}")))?;
    let steps = state.cursor.steps;
    let path = write(config, state, &model, &optimizer)?;
    tracing::debug!(checkpoint = %path.display(), steps, "checkpoint written");
    Ok(path)
}

/// A checkpoint's weights loaded into `stack`, and its optimizer state.
pub(super) fn load<S, O>(
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
