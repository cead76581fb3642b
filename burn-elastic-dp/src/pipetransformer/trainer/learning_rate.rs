//! The trainer's learning rate at each step: fixed, scaled with the replicas, or a scheduler's.

use super::Trainer;
use super::bounds::{TrainerBackend, TrainerTypes};
use super::error::TrainerError;
use super::schedule::{Closure, LrSource, Scheduler};
use burn::lr_scheduler::LrScheduler;

impl<TT: TrainerTypes> Trainer<TT> {
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
        self.schedule
            .set(Box::new(Scheduler::<L, TrainerBackend<TT>>::new(scheduler)))
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
