//! What the strategy tells burn-train after each step: a training item of the model's own output
//! type, from the step's figures and the outputs and targets its micro-batches scored.

use std::sync::{Arc, Mutex};

use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;
use burn::train::ClassificationOutput;
use burn_freeze::Activation;

/// A step's figures, as the strategy reports them.
#[derive(Debug, Clone, PartialEq)]
pub struct StepInfo {
    /// The step's mean loss.
    pub loss: f32,
    /// Its learning rate.
    pub learning_rate: f64,
    /// Its samples.
    pub samples: usize,
    /// Samples per second over the epoch so far.
    pub samples_per_second: f64,
    /// Frozen layers (F) at the epoch's start.
    pub frozen_layers: usize,
    /// Pipeline stages (K) it ran with.
    pub stages: usize,
    /// Data-parallel replicas (R) it ran with.
    pub replicas: usize,
    /// Micro-batches per replica (M) it ran with.
    pub micro_batches: usize,
}

/// A model's training item (its `TrainStep::Output`) made from one
/// PipeTransformer step: its figures, and each micro-batch's output and
/// targets (moved to one device), in no particular order across replicas
/// but each output with its own targets. Implemented for burn-train's
/// [`ClassificationOutput`]; implement it for your own output type.
///
/// ```
/// use burn::backend::{Autodiff, Flex};
/// use burn::prelude::*;
/// use burn::train::ClassificationOutput;
/// use burn_elastic_dp::burn_train::{FromTrainStep, StepInfo};
///
/// type B = Autodiff<Flex>;
/// let device = Default::default();
/// let info = StepInfo { loss: 0.5, learning_rate: 1e-3, samples: 3, samples_per_second: 10.0, frozen_layers: 0, stages: 1, replicas: 2, micro_batches: 1 };
/// let parts = vec![
///     (Tensor::<B, 2>::zeros([2, 4], &device), Tensor::<B, 1, Int>::from_ints([1, 2], &device)),
///     (Tensor::<B, 2>::zeros([1, 4], &device), Tensor::<B, 1, Int>::from_ints([3], &device)),
/// ];
/// let item = ClassificationOutput::<B>::from_train_step(&info, parts, &device);
/// assert_eq!(item.output.dims(), [3, 4]);
/// assert_eq!(item.loss.into_scalar(), 0.5);
/// ```
pub trait FromTrainStep<B: Backend, Output, Targets>: Sized {
    /// The item of the step `info` whose micro-batches scored `parts`,
    /// its tensors on `device`.
    fn from_train_step(info: &StepInfo, parts: Vec<(Output, Targets)>, device: &B::Device) -> Self;
}

impl<B: AutodiffBackend> FromTrainStep<B, Tensor<B, 2>, Tensor<B, 1, Int>>
    for ClassificationOutput<B>
{
    fn from_train_step(
        info: &StepInfo,
        parts: Vec<(Tensor<B, 2>, Tensor<B, 1, Int>)>,
        device: &B::Device,
    ) -> Self {
        let (output, targets): (Vec<_>, Vec<_>) = parts
            .into_iter()
            .map(|(o, t)| (o.detach().to_device(device), t.to_device(device)))
            .unzip();
        ClassificationOutput::new(
            Tensor::from_floats([info.loss], device),
            Tensor::cat(output, 0),
            Tensor::cat(targets, 0),
        )
    }
}

/// The outputs and targets the loss scored, shared with the replicas'
/// threads.
pub(super) struct Scored<Output, Targets>(Arc<Mutex<Vec<(Output, Targets)>>>);

impl<Output, Targets> Clone for Scored<Output, Targets> {
    fn clone(&self) -> Self {
        Self(Arc::clone(&self.0))
    }
}

impl<Output, Targets> Default for Scored<Output, Targets> {
    fn default() -> Self {
        Self(Arc::default())
    }
}

impl<Output, Targets> Scored<Output, Targets> {
    /// Keeps what one micro-batch scored.
    pub(super) fn push(&self, output: Output, targets: Targets) {
        self.lock().push((output, targets));
    }

    /// What the last step scored: the last micro-batches that hold its
    /// `samples` targets (a step run again after a replica failed also
    /// scored the failed try's, which came first); the rest is dropped.
    pub(super) fn take_step<B: Backend>(&self, samples: usize) -> Vec<(Output, Targets)>
    where
        Targets: Activation<B>,
    {
        let mut all = std::mem::take(&mut *self.lock());
        let mut held = 0;
        let mut start = all.len();
        while start > 0 && held < samples {
            start -= 1;
            held += all[start].1.batch_size();
        }
        all.split_off(start)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(Output, Targets)>> {
        // A replica that panicked while pushing leaves a whole entry or
        // none: the data is still consistent.
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}
