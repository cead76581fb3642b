//! A checkpoint's files: written under a temporary name and renamed when complete, verified by
//! CRC-32 when read back.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use burn::config::Config;
use burn_freeze::{FreezeState, PolicyState};
use serde::{Deserialize, Serialize};

use super::cursor::CursorState;
use super::error::{TrainerError, invalid, io};
use super::learning_rate::RateState;
use super::measure::MeasuredState;
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

/// Format of `state.json`.
pub(super) const FORMAT: u32 = 1;
pub(super) const MODEL: &str = "model.bin";
pub(super) const OPTIMIZER: &str = "optimizer.bin";
pub(super) const STATE: &str = "state.json";

/// Everything of a run but its weights and optimizer state: a field per
/// part of the trainer, the parts' own fields flattened into one object.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct RunState {
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

/// What a checkpoint holds, read back and verified.
pub(super) struct Loaded {
    pub path: PathBuf,
    pub state: RunState,
    pub model: Vec<u8>,
    pub optimizer: Vec<u8>,
}

/// Flushes a directory's entries (a rename in it) to disk; a no-op where
/// directories cannot be opened as files (Windows).
fn sync_dir(dir: &Path) -> Result<(), TrainerError> {
    #[cfg(unix)]
    fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io(dir))?;
    #[cfg(not(unix))]
    let _ = dir;
    Ok(())
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
pub(super) fn write(
    config: &CheckpointConfig,
    mut state: RunState,
    model: &[u8],
    optimizer: &[u8],
) -> Result<PathBuf, TrainerError> {
    fs::create_dir_all(&config.dir).map_err(io(&config.dir))?;
    let final_dir = config.dir.join(name(state.cursor.steps));
    let temporary = config
        .dir
        .join(format!(".tmp-{}", name(state.cursor.steps)));
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
    // The rename is durable only once the directory holding it is synced.
    sync_dir(&config.dir)?;
    let mut all = list(&config.dir)?;
    while all.len() > config.keep.max(1) {
        let oldest = all.remove(0);
        let _ = fs::remove_dir_all(oldest);
    }
    Ok(final_dir)
}

/// The checkpoint directories in `dir`, oldest first.
pub(super) fn list(dir: &Path) -> Result<Vec<PathBuf>, TrainerError> {
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

/// Most checkpoint steps a process tells the others when they agree where
/// to resume.
pub(super) const AGREED_STEPS: usize = 32;

/// The step a checkpoint directory is named after.
fn step_of(path: &Path) -> Option<i64> {
    path.file_name()?
        .to_str()?
        .strip_prefix("step-")?
        .parse()
        .ok()
}

/// Across the processes of an MPI job: the newest checkpoint that every
/// process holds, verified, in its own `dir` (its `rank-<r>`), agreed by
/// one small all-gather of each process's verified steps. A process whose
/// newest checkpoint is newer than that (it wrote one more before the job
/// ended) resumes from the common one too, so that every process resumes
/// at the same step; with no common step the resume is refused on every
/// process, naming each one's steps. The gather goes over `nodes` (the
/// link the group is then built on), waiting at most `timeout`.
pub(super) fn read_agreed(
    dir: &Path,
    nodes: &OtherNodes,
    timeout: std::time::Duration,
) -> Result<Loaded, TrainerError> {
    let all = if dir.exists() { list(dir)? } else { Vec::new() };
    let mut verified: Vec<(i64, Loaded)> = Vec::new();
    for path in all.iter().rev() {
        let Some(step) = step_of(path) else { continue };
        match read(path) {
            Ok(loaded) if verified.len() < AGREED_STEPS => verified.push((step, loaded)),
            Ok(_) => break,
            Err(reason) => {
                tracing::error!(checkpoint = %path.display(), %reason, "checkpoint rejected");
            }
        }
    }
    let mut record: Vec<i64> = verified.iter().map(|(step, _)| *step).collect();
    record.resize(AGREED_STEPS, -1);
    let Some(steps) = nodes.gather(record, std::time::Instant::now() + timeout)? else {
        return read_latest(dir);
    };
    let held =
        |rank: usize| -> Vec<i64> { steps[rank].iter().copied().filter(|&s| s >= 0).collect() };
    let common = held(0)
        .into_iter()
        .filter(|step| (1..steps.len()).all(|rank| held(rank).contains(step)))
        .max();
    let Some(common) = common else {
        let each: Vec<String> = (0..steps.len())
            .map(|rank| format!("rank {rank} holds {:?}", held(rank)))
            .collect();
        return Err(TrainerError::ResumeDisagrees(format!(
            "no checkpoint step is held, verified, by every rank ({}); a rank without one cannot join the others' step",
            each.join(", ")
        )));
    };
    let ahead: Vec<usize> = (0..steps.len())
        .filter(|&rank| held(rank).first().is_some_and(|&newest| newest > common))
        .collect();
    if !ahead.is_empty() {
        tracing::warn!(
            step = common,
            ?ahead,
            "some ranks hold a newer checkpoint; every rank resumes from the newest they all hold"
        );
    }
    // The common step is held by every rank, this one included (its own
    // record is among those gathered); a link that gave another record
    // back is an error, not a panic.
    let (_, loaded) = (verified.into_iter())
        .find(|(step, _)| *step == common)
        .ok_or_else(|| {
            TrainerError::ResumeDisagrees(format!(
                "the ranks agreed on step {common}, which this rank does not hold verified"
            ))
        })?;
    Ok(loaded)
}

/// Where one process resumes: `dir`, or, when `dir` holds no checkpoint of
/// its own but the ranks of a job across processes wrote theirs into
/// `rank-<r>` under it, rank 0's (every rank holds the same model): a run
/// of several ranks resumes on one.
pub(super) fn one_process_dir(dir: &Path) -> Result<PathBuf, TrainerError> {
    let ranks = dir.join("rank-0");
    if dir.exists() && list(dir)?.is_empty() && ranks.is_dir() {
        tracing::info!(dir = %ranks.display(), "resuming one process from rank 0's checkpoints");
        return Ok(ranks);
    }
    Ok(dir.to_path_buf())
}

/// The newest checkpoint in `dir` that verifies; every one rejected is
/// logged with the reason.
pub(super) fn read_latest(dir: &Path) -> Result<Loaded, TrainerError> {
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
