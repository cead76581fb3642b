//! The trainer's place in the run: the sampler (which samples each step draws), the epoch and the
//! optimizer steps, and whether an epoch is under way.

use serde::{Deserialize, Serialize};

use super::error::TrainerError;
use crate::error::ElasticError;
use crate::sampler::ElasticSampler;

/// Where a run stands: made with no sampler (the first epoch makes it, from
/// the dataset's length), then advanced batch by batch.
#[derive(Default)]
pub(super) struct EpochCursor {
    sampler: Option<ElasticSampler>,
    /// Epochs finished.
    epoch: usize,
    /// Optimizer steps taken.
    steps: usize,
    /// Whether an epoch is under way (started, not finished).
    mid_epoch: bool,
}

/// A batch drawn from the sampler, and where the sampler stood before it
/// (to put it back when it is not trained).
pub(super) struct Drawn {
    pub indices: Vec<usize>,
    from: (usize, usize),
}

/// What a checkpoint keeps of the cursor (fields of `state.json`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct CursorState {
    /// Optimizer steps taken.
    pub steps: usize,
    /// Epochs finished.
    pub epoch: usize,
    /// Whether the checkpoint falls inside an epoch.
    pub mid_epoch: bool,
    /// The sampler's epoch and position, and the dataset's length.
    pub sampler: Option<(usize, usize, usize)>,
}

impl EpochCursor {
    /// Epochs finished.
    pub(super) fn epoch(&self) -> usize {
        self.epoch
    }

    /// Optimizer steps taken.
    pub(super) fn steps(&self) -> usize {
        self.steps
    }

    /// Whether an epoch is under way: started, not finished.
    pub(super) fn mid_epoch(&self) -> bool {
        self.mid_epoch
    }

    /// The sampler, once the first epoch made it.
    pub(super) fn sampler(&self) -> Option<&ElasticSampler> {
        self.sampler.as_ref()
    }

    /// The samples held out of training (none before the first epoch).
    pub(super) fn held_out(&self) -> &[usize] {
        self.sampler.as_ref().map_or(&[], |s| s.held_out())
    }

    /// Starts the epoch over a dataset of `len` samples whose steps need
    /// at least `min_batch` samples, unless one is under way (it stopped
    /// part-way: an error, or a checkpoint taken inside it), which goes on
    /// where it stopped. The first epoch makes the sampler with `make`.
    /// Returns the new epoch's steps at `replicas` replicas (the whole
    /// group's), or `None` when an epoch under way goes on.
    pub(super) fn begin(
        &mut self,
        len: usize,
        min_batch: usize,
        replicas: usize,
        make: impl FnOnce(usize) -> Result<ElasticSampler, TrainerError>,
    ) -> Result<Option<usize>, TrainerError> {
        let sampler = match &mut self.sampler {
            Some(sampler) => sampler,
            none => none.insert(make(len)?),
        };
        if sampler.len() != len {
            return Err(TrainerError::DatasetChanged {
                before: sampler.len(),
                now: len,
            });
        }
        let trained = sampler.trained_per_epoch();
        if trained < min_batch {
            return Err(TrainerError::DatasetTooSmall {
                len: trained,
                needed: min_batch,
            });
        }
        let new_epoch = !self.mid_epoch;
        if new_epoch && (self.epoch > 0 || sampler.remaining() != trained) {
            sampler.start_epoch();
        }
        self.mid_epoch = true;
        Ok(new_epoch.then(|| sampler.steps_per_epoch(replicas.max(1))))
    }

    /// The epoch's next batch for `replicas` replicas (the whole group's)
    /// whose step needs at least `min_batch` samples (`None` once every
    /// sample was drawn), the epoch's last batch taking in a remainder too
    /// small.
    pub(super) fn next_batch(
        &mut self,
        replicas: usize,
        min_batch: usize,
    ) -> Result<Option<Drawn>, TrainerError> {
        let sampler = self.sampler.as_mut().ok_or(ElasticError::Sampler(
            "no epoch was begun before its first batch".into(),
        ))?;
        let from = sampler.position();
        let Some(indices) = sampler.next_batch_min(replicas, min_batch) else {
            return Ok(None);
        };
        if indices.len() < min_batch {
            sampler.seek(from.0, from.1)?;
            return Err(TrainerError::DatasetTooSmall {
                len: sampler.len(),
                needed: min_batch,
            });
        }
        Ok(Some(Drawn { indices, from }))
    }

    /// A batch that was not trained goes back to the sampler.
    pub(super) fn put_back(&mut self, drawn: Drawn) -> Result<(), TrainerError> {
        let (epoch, cursor) = drawn.from;
        match self.sampler.as_mut() {
            Some(sampler) => Ok(sampler.seek(epoch, cursor)?),
            None => Ok(()),
        }
    }

    /// Counts an optimizer step.
    pub(super) fn step_taken(&mut self) {
        self.steps += 1;
    }

    /// Whether the epoch under way has samples left.
    pub(super) fn epoch_left(&self) -> bool {
        self.sampler.as_ref().is_some_and(|s| s.remaining() > 0)
    }

    /// Closes the epoch under way.
    pub(super) fn end_epoch(&mut self) {
        self.epoch += 1;
        self.mid_epoch = false;
    }

    /// What a checkpoint keeps.
    pub(super) fn state(&self) -> CursorState {
        CursorState {
            steps: self.steps,
            epoch: self.epoch,
            mid_epoch: self.mid_epoch,
            sampler: self.sampler.as_ref().map(|s| {
                let (epoch, cursor) = s.position();
                (epoch, cursor, s.len())
            }),
        }
    }

    /// The cursor a checkpoint kept; its sampler made by `make` from the
    /// dataset's length and moved to where it stood.
    pub(super) fn restore(
        state: CursorState,
        make: impl FnOnce(usize) -> Result<ElasticSampler, TrainerError>,
    ) -> Result<Self, TrainerError> {
        let sampler = match state.sampler {
            Some((epoch, cursor, len)) => {
                let mut sampler = make(len)?;
                sampler.seek(epoch, cursor)?;
                Some(sampler)
            }
            None => None,
        };
        Ok(Self {
            sampler,
            epoch: state.epoch,
            steps: state.steps,
            mid_epoch: state.mid_epoch,
        })
    }
}
