//! Where a run's learning rates come from when not from
//! [`TrainerConfig::lr`](super::TrainerConfig::lr): a burn-train `LrScheduler` or a closure of
//! the step ([`LrSource`]), asked once per step by the trainer's
//! [`LearningRate`](super::learning_rate::LearningRate), their state checkpointed.

use std::marker::PhantomData;

use burn::lr_scheduler::LrScheduler;
use burn::prelude::*;
use burn::record::{BinBytesRecorder, FullPrecisionSettings, Recorder};

/// Where a run's scheduled rates come from.
pub(crate) trait LrSource: Send {
    /// The rate of optimizer step `step` (counted from 0); asked once per
    /// step, in order.
    fn next(&mut self, step: usize) -> f64;

    /// The source's state for a checkpoint (`None`: it has none).
    fn save(&self) -> Result<Option<Vec<u8>>, String>;

    /// Restores a state [`save`](Self::save) wrote.
    fn load(&mut self, bytes: Vec<u8>) -> Result<(), String>;
}

/// A burn-train scheduler; its record is held for backend `B` (a
/// scheduler's record holds no tensor, so the backend only names its type).
pub(super) struct Scheduler<L, B> {
    scheduler: L,
    backend: PhantomData<fn() -> B>,
}

impl<L, B> Scheduler<L, B> {
    /// `scheduler`, its record held for backend `B`.
    pub(super) fn new(scheduler: L) -> Self {
        Self {
            scheduler,
            backend: PhantomData,
        }
    }
}

impl<L: LrScheduler + 'static, B: Backend> LrSource for Scheduler<L, B> {
    fn next(&mut self, _step: usize) -> f64 {
        self.scheduler.step()
    }

    fn save(&self) -> Result<Option<Vec<u8>>, String> {
        let recorder = BinBytesRecorder::<FullPrecisionSettings>::default();
        let record = self.scheduler.to_record::<B>();
        Recorder::<B>::record(&recorder, record, ())
            .map(Some)
            .map_err(|e| e.to_string())
    }

    fn load(&mut self, bytes: Vec<u8>) -> Result<(), String> {
        let recorder = BinBytesRecorder::<FullPrecisionSettings>::default();
        let record: L::Record<B> = Recorder::<B>::load(&recorder, bytes, &Default::default())
            .map_err(|e| e.to_string())?;
        self.scheduler = self.scheduler.clone().load_record::<B>(record);
        Ok(())
    }
}

/// A closure of the step: its state is the trainer's step counter, which
/// the checkpoints hold already.
pub(super) struct Closure<F>(pub(super) F);

impl<F: FnMut(usize) -> f64 + Send> LrSource for Closure<F> {
    fn next(&mut self, step: usize) -> f64 {
        (self.0)(step)
    }

    fn save(&self) -> Result<Option<Vec<u8>>, String> {
        Ok(None)
    }

    fn load(&mut self, _bytes: Vec<u8>) -> Result<(), String> {
        Ok(())
    }
}
