//! Checkpoints of a PipeTransformer run: a directory per checkpoint, written
//! under a temporary name and renamed when complete (a crash never leaves a
//! half-written checkpoint under a real name), every file's CRC-32 in its
//! `state.json`, and the newest checkpoint that verifies used on resume.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use burn::config::Config;
use burn_freeze::{FreezeState, PolicyState};
use serde::{Deserialize, Serialize};

use super::error::TrainerError;
use crate::shape::{Shape, UnitCosts};

/// When and where a [`Trainer`](super::Trainer) writes checkpoints.
///
/// ```
/// use burn_elastic_dp::trainer::CheckpointConfig;
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

/// Format of `state.json`.
const FORMAT: u32 = 1;
const MODEL: &str = "model.bin";
const OPTIMIZER: &str = "optimizer.bin";
const STATE: &str = "state.json";

/// Everything of a run but its weights and optimizer state.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct RunState {
    pub format: u32,
    /// Optimizer steps taken.
    pub steps: usize,
    /// Epochs finished.
    pub epoch: usize,
    /// Whether the checkpoint falls inside an epoch.
    pub mid_epoch: bool,
    /// The sampler's epoch and position, and the dataset's length.
    pub sampler: Option<(usize, usize, usize)>,
    pub freeze: FreezeState,
    pub policy: Option<PolicyState>,
    pub front: usize,
    pub shape: Shape,
    pub costs: UnitCosts,
    pub initial_largest: f64,
    pub base_replicas: usize,
    pub profile_pending: bool,
    /// (file, CRC-32, length) of the weights and optimizer files.
    pub files: Vec<(String, u32, u64)>,
}

/// What a checkpoint holds, read back and verified.
pub(crate) struct Loaded {
    pub path: PathBuf,
    pub state: RunState,
    pub model: Vec<u8>,
    pub optimizer: Vec<u8>,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> TrainerError + '_ {
    move |source| TrainerError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn write_synced(path: &Path, bytes: &[u8]) -> Result<(), TrainerError> {
    let mut file = fs::File::create(path).map_err(io(path))?;
    file.write_all(bytes).map_err(io(path))?;
    file.sync_all().map_err(io(path))
}

/// Name of the checkpoint after `steps` steps (sorts by step).
fn name(steps: usize) -> String {
    format!("step-{steps:012}")
}

/// Writes a checkpoint into `config.dir` atomically and removes the oldest
/// beyond `config.keep`; returns its directory.
pub(crate) fn write(
    config: &CheckpointConfig,
    mut state: RunState,
    model: &[u8],
    optimizer: &[u8],
) -> Result<PathBuf, TrainerError> {
    fs::create_dir_all(&config.dir).map_err(io(&config.dir))?;
    let final_dir = config.dir.join(name(state.steps));
    let temporary = config.dir.join(format!(".tmp-{}", name(state.steps)));
    let _ = fs::remove_dir_all(&temporary);
    fs::create_dir(&temporary).map_err(io(&temporary))?;
    state.format = FORMAT;
    state.files = vec![
        (MODEL.into(), crc32fast::hash(model), model.len() as u64),
        (
            OPTIMIZER.into(),
            crc32fast::hash(optimizer),
            optimizer.len() as u64,
        ),
    ];
    write_synced(&temporary.join(MODEL), model)?;
    write_synced(&temporary.join(OPTIMIZER), optimizer)?;
    let json = serde_json::to_vec_pretty(&state).expect("the run state serialises");
    write_synced(&temporary.join(STATE), &json)?;
    let _ = fs::remove_dir_all(&final_dir);
    fs::rename(&temporary, &final_dir).map_err(io(&final_dir))?;
    let mut all = list(&config.dir)?;
    while all.len() > config.keep.max(1) {
        let oldest = all.remove(0);
        let _ = fs::remove_dir_all(oldest);
    }
    Ok(final_dir)
}

/// The checkpoint directories in `dir`, oldest first.
fn list(dir: &Path) -> Result<Vec<PathBuf>, TrainerError> {
    let mut found: Vec<PathBuf> = fs::read_dir(dir)
        .map_err(io(dir))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            p.is_dir()
                && p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("step-"))
        })
        .collect();
    found.sort();
    Ok(found)
}

/// Reads and verifies one checkpoint.
fn read(path: &Path) -> Result<Loaded, String> {
    let json = fs::read(path.join(STATE)).map_err(|e| format!("{STATE}: {e}"))?;
    let state: RunState =
        serde_json::from_slice(&json).map_err(|e| format!("{STATE} is not valid: {e}"))?;
    if state.format != FORMAT {
        return Err(format!(
            "format {} (this version reads {FORMAT})",
            state.format
        ));
    }
    let mut bytes = Vec::new();
    for name in [MODEL, OPTIMIZER] {
        let Some((_, crc, len)) = state.files.iter().find(|(n, _, _)| n == name) else {
            return Err(format!("{STATE} lists no {name}"));
        };
        let data = fs::read(path.join(name)).map_err(|e| format!("{name}: {e}"))?;
        if data.len() as u64 != *len || crc32fast::hash(&data) != *crc {
            return Err(format!(
                "{name} is truncated or corrupted ({} bytes, expected {len}; checksum mismatch)",
                data.len()
            ));
        }
        bytes.push(data);
    }
    let optimizer = bytes.pop().expect("two files");
    let model = bytes.pop().expect("two files");
    Ok(Loaded {
        path: path.to_path_buf(),
        state,
        model,
        optimizer,
    })
}

/// The newest checkpoint in `dir` that verifies; every one rejected is
/// logged with the reason.
pub(crate) fn read_latest(dir: &Path) -> Result<Loaded, TrainerError> {
    let all = if dir.exists() { list(dir)? } else { Vec::new() };
    let mut reasons = Vec::new();
    for path in all.iter().rev() {
        match read(path) {
            Ok(loaded) => return Ok(loaded),
            Err(reason) => {
                tracing::error!(checkpoint = %path.display(), %reason, "checkpoint rejected; trying the previous one");
                reasons.push(format!("{}: {reason}", path.display()));
            }
        }
    }
    Err(TrainerError::NoCheckpoint {
        dir: dir.to_path_buf(),
        rejected: reasons,
    })
}
