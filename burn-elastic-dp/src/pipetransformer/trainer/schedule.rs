//! The learning rate of each optimizer step: [`TrainerConfig::lr`], or a
//! schedule (any `burn::lr_scheduler::LrScheduler`, or a closure of the
//! step) asked once per optimizer step, in order, and saved in the
//! checkpoints.
//!
//! A step that fails is taken again with the rate it was given: the
//! schedule is asked once per step index, however many times the step runs.
//!
//! [`TrainerConfig::lr`]: super::TrainerConfig::lr

use std::marker::PhantomData;

use burn::lr_scheduler::LrScheduler;
use burn::prelude::*;
use burn::record::{BinBytesRecorder, FullPrecisionSettings, Recorder};
use burn_freeze::{Activation, StackTypes};

use super::error::TrainerError;
use super::{StackOptimizer, Trainer};

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
struct Scheduler<L, B> {
    scheduler: L,
    backend: PhantomData<fn() -> B>,
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
struct Closure<F>(F);

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
/// [`Trainer::resume`]).
#[derive(Default)]
pub(super) struct Schedule {
    source: Option<Box<dyn LrSource>>,
    /// The step last asked for and its rate.
    asked: Option<(usize, f64)>,
    /// A checkpoint's state, kept until a source is set.
    waiting: Option<Vec<u8>>,
}

impl Schedule {
    /// The rate of step `step`: the source's, else `fixed`.
    fn rate(&mut self, step: usize, fixed: f64) -> Result<f64, TrainerError> {
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
    fn set(&mut self, mut source: Box<dyn LrSource>) -> Result<(), TrainerError> {
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

impl<S, O, T> Trainer<S, O, T>
where
    S: StackTypes,
    O: StackOptimizer<S>,
    T: Activation<S::Backend> + Send + 'static,
{
    /// Steps the learning rate with a burn-train scheduler (any
    /// [`LrScheduler`]: `burn::lr_scheduler::cosine`, `linear`, `noam`,
    /// ...), asked once per optimizer step in place of
    /// [`TrainerConfig::lr`](super::TrainerConfig::lr), and saved in the
    /// checkpoints. After [`Trainer::resume`], set the same kind of
    /// scheduler again: it continues from the checkpoint's state. Under
    /// [`BatchPolicy::PerReplica`](crate::BatchPolicy::PerReplica) the
    /// scheduled rate is scaled with the replicas, as the configured one is.
    ///
    /// Fails when a checkpoint's state does not load into `scheduler` (a
    /// scheduler of another kind).
    ///
    /// ```
    /// # use burn::backend::{Autodiff, Flex};
    /// # use burn::data::dataset::InMemDataset;
    /// # use burn::optim::SgdConfig;
    /// # use burn::prelude::*;
    /// # use burn_elastic_dp::{BatchPolicy, Parts, TrainerConfig};
    /// # use burn_freeze::LayerStack;
    /// # type B = Autodiff<Flex>;
    /// # #[derive(Module, Debug)]
    /// # pub struct Dense<B: Backend> { linear: burn::nn::Linear<B> }
    /// # impl<B: Backend> Dense<B> { pub fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> { self.linear.forward(x) } }
    /// # burn_freeze::unit!(Dense<B>: Tensor<B, 2> => Tensor<B, 2>);
    /// # #[derive(Clone)] struct Rows;
    /// # impl burn::data::dataloader::batcher::Batcher<B, f32, (Tensor<B, 2>, Tensor<B, 2>)> for Rows {
    /// #     fn batch(&self, items: Vec<f32>, device: &Device<B>) -> (Tensor<B, 2>, Tensor<B, 2>) {
    /// #         let x = Tensor::<B, 1>::from_floats(items.as_slice(), device).reshape([items.len(), 1]);
    /// #         (x.clone(), x)
    /// #     }
    /// # }
    /// # let device = Default::default();
    /// # let dense = || Dense::<B> { linear: burn::nn::LinearConfig::new(1, 1).init(&device) };
    /// # let stack = LayerStack::new(dense(), vec![dense()], dense());
    /// use burn::lr_scheduler::cosine::CosineAnnealingLrSchedulerConfig;
    ///
    /// let mut trainer = TrainerConfig::new()
    ///     .with_parts(Parts::new().with_freeze(false))
    ///     .with_batch(BatchPolicy::FixedGlobal { batch: 4 })
    ///     .init(stack, vec![device], || SgdConfig::new().init(), |y: Tensor<B, 2>, t: Tensor<B, 2>| (y - t).powi_scalar(2).mean())?;
    /// trainer.set_lr_scheduler(CosineAnnealingLrSchedulerConfig::new(0.1, 4).init().unwrap())?;
    /// trainer.fit_epoch(&InMemDataset::new(vec![0.5f32; 16]), &Rows)?;
    /// assert_eq!(trainer.steps(), 4);
    /// assert!(trainer.learning_rate() < 0.1); // annealed
    /// # Ok::<(), burn_elastic_dp::TrainerError>(())
    /// ```
    pub fn set_lr_scheduler<L: LrScheduler + 'static>(
        &mut self,
        scheduler: L,
    ) -> Result<(), TrainerError> {
        self.schedule.set(Box::new(Scheduler::<L, S::Backend> {
            scheduler,
            backend: PhantomData,
        }))
    }

    /// Steps the learning rate with a closure of the optimizer step
    /// (counted from 0 over the whole run, resumed runs included), in place
    /// of [`TrainerConfig::lr`](super::TrainerConfig::lr); a rate below 0
    /// or not finite fails the step. A warm-up, say:
    /// `trainer.set_lr_fn(|step| 1e-3 * ((step + 1) as f64 / 100.0).min(1.0))`.
    pub fn set_lr_fn(&mut self, schedule: impl FnMut(usize) -> f64 + Send + 'static) {
        self.schedule
            .set(Box::new(Closure(schedule)))
            .expect("a closure has no state to restore");
    }

    /// Sets a crate-internal source (the burn-train strategy's learner).
    #[cfg_attr(not(feature = "burn-train"), allow(dead_code))]
    pub(crate) fn set_lr_source(&mut self, source: Box<dyn LrSource>) -> Result<(), TrainerError> {
        self.schedule.set(source)
    }

    /// The learning rate of step `self.steps` (the schedule asked when it
    /// has not been for this step), scaled as [`Trainer::learning_rate`]
    /// says; remembered as the last rate.
    pub(super) fn next_learning_rate(&mut self) -> Result<f64, TrainerError> {
        let base = self.schedule.rate(self.steps, self.config.lr)?;
        self.last_base_lr = base;
        Ok(self.learning_rate())
    }
}
