//! The learning rate of each optimizer step: [`TrainerConfig::lr`](super::TrainerConfig::lr), or a
//! schedule (a burn-train `LrScheduler`, a closure) asked once per step, checkpointed.

use std::marker::PhantomData;

use burn::lr_scheduler::LrScheduler;
use burn::prelude::*;
use burn::record::{BinBytesRecorder, FullPrecisionSettings, Recorder};

use super::error::TrainerError;

/// Where a schedule's rates come from.
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

/// A trainer's schedule: its source, the rate last given, and a saved
/// state that waits for its source (a resumed run sets the schedule after
/// [`Trainer::resume`](super::Trainer::resume)).
#[derive(Default)]
pub(super) struct Schedule {
    source: Option<Box<dyn LrSource>>,
    /// The step last asked for and its rate.
    asked: Option<(usize, f64)>,
    /// A checkpoint's state, kept until a source is set.
    waiting: Option<Vec<u8>>,
}

impl Schedule {
    /// The rate of step `step`: the source's, else `fixed`. The source is
    /// asked once per optimizer step, in order; a step that fails is taken
    /// again with the rate it was given: the source is asked once per step
    /// index, however many times the step runs.
    pub(super) fn rate(&mut self, step: usize, fixed: f64) -> Result<f64, TrainerError> {
        let Some(source) = self.source.as_mut() else {
            if self.waiting.take().is_some() {
                tracing::warn!(
                    "the checkpoint holds a learning-rate schedule, but none was set after \
                     resuming: training on at the configured lr"
                );
            }
            return Ok(fixed);
        };
        if let Some((asked, lr)) = self.asked
            && asked == step
        {
            return Ok(lr);
        }
        let lr = source.next(step);
        if !(lr.is_finite() && lr >= 0.0) {
            return Err(TrainerError::InvalidConfig {
                field: "learning-rate schedule",
                value: format!("{lr} at step {step}"),
                accepted: "a finite number of at least 0",
            });
        }
        self.asked = Some((step, lr));
        Ok(lr)
    }

    /// Sets the source, restoring a checkpoint's state waiting for it.
    pub(super) fn set(&mut self, mut source: Box<dyn LrSource>) -> Result<(), TrainerError> {
        if let Some(bytes) = self.waiting.take() {
            source.load(bytes).map_err(|e| {
                TrainerError::Checkpoint(format!("the learning-rate schedule's state: {e}"))
            })?;
        }
        self.source = Some(source);
        self.asked = None;
        Ok(())
    }

    /// The state for a checkpoint.
    pub(super) fn save(&self) -> Result<Option<Vec<u8>>, TrainerError> {
        match &self.source {
            Some(source) => source.save().map_err(|e| {
                TrainerError::Checkpoint(format!("the learning-rate schedule's state: {e}"))
            }),
            None => Ok(None),
        }
    }

    /// A checkpoint's state, applied when the schedule is set.
    pub(super) fn restore(&mut self, state: Option<Vec<u8>>) {
        self.waiting = state;
    }
}
