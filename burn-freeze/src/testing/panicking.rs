//! An optimizer whose step panics when a test says so: a failing part (an
//! optimizer of the user's own, a device that fails) inside an optimizer step.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use burn::module::AutodiffModule;
use burn::optim::{GradientsParams, LearningRate, MultiGradientsParams, Optimizer};
use burn::tensor::backend::AutodiffBackend;

/// Which optimizers of a factory panic: each optimizer made through
/// [`wrap`](Self::wrap) is numbered in the order it was made (a pipeline
/// makes one per stage, in stage order; a replica group one per stage of
/// each replica, replica after replica), and an armed number panics once,
/// at its next step, after stepping (so its weights and state had changed).
#[derive(Debug, Default)]
pub struct Tripwire {
    made: AtomicUsize,
    armed: Mutex<Vec<usize>>,
}

impl Tripwire {
    /// A tripwire with nothing armed.
    pub fn new() -> Arc<Self> {
        Arc::default()
    }

    /// `inner`, numbered as the next optimizer made.
    pub fn wrap<O>(self: &Arc<Self>, inner: O) -> PanickingOptimizer<O> {
        PanickingOptimizer {
            inner,
            number: self.made.fetch_add(1, Ordering::SeqCst),
            tripwire: Arc::clone(self),
        }
    }

    /// Arms the optimizers numbered `numbers`: each panics at its next step.
    pub fn arm(&self, numbers: &[usize]) {
        *self.armed.lock().unwrap_or_else(PoisonError::into_inner) = numbers.to_vec();
    }

    /// Whether every armed optimizer has panicked.
    pub fn fired(&self) -> bool {
        self.armed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_empty()
    }

    /// Whether optimizer `number` panics now (once).
    fn trips(&self, number: usize) -> bool {
        let mut armed = self.armed.lock().unwrap_or_else(PoisonError::into_inner);
        let position = armed.iter().position(|&n| n == number);
        position.map(|i| armed.swap_remove(i)).is_some()
    }
}

/// An optimizer that steps as its inner one does, then panics when its
/// [`Tripwire`] says so.
///
/// ```
/// use burn::backend::{Autodiff, Flex};
/// use burn::nn::{Linear, LinearConfig};
/// use burn::optim::{GradientsParams, Optimizer, SgdConfig};
/// use burn::prelude::*;
/// use burn_freeze::testing::Tripwire;
///
/// type B = Autodiff<Flex>;
/// let device = Default::default();
/// let linear: Linear<B> = LinearConfig::new(2, 1).init(&device);
/// let tripwire = Tripwire::new();
/// let mut optimizer = tripwire.wrap(SgdConfig::new().init::<B, Linear<B>>());
/// tripwire.arm(&[0]);
/// let x = Tensor::<B, 2>::ones([1, 2], &device);
/// let grads = GradientsParams::from_grads(linear.forward(x).sum().backward(), &linear);
/// let panic = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
///     optimizer.step(0.1, linear, grads)
/// }));
/// assert!(panic.is_err() && tripwire.fired());
/// ```
#[derive(Clone)]
pub struct PanickingOptimizer<O> {
    inner: O,
    number: usize,
    tripwire: Arc<Tripwire>,
}

impl<O> PanickingOptimizer<O> {
    fn check(&self) {
        if self.tripwire.trips(self.number) {
            panic!("optimizer {} failed on purpose", self.number);
        }
    }
}

impl<M, B, O> Optimizer<M, B> for PanickingOptimizer<O>
where
    M: AutodiffModule<B>,
    B: AutodiffBackend,
    O: Optimizer<M, B>,
{
    type Record = O::Record;

    fn step(&mut self, lr: LearningRate, module: M, grads: GradientsParams) -> M {
        let module = self.inner.step(lr, module, grads);
        self.check();
        module
    }

    fn step_multi(&mut self, lr: LearningRate, module: M, grads: MultiGradientsParams) -> M {
        let module = self.inner.step_multi(lr, module, grads);
        self.check();
        module
    }

    fn to_record(&self) -> Self::Record {
        self.inner.to_record()
    }

    fn load_record(self, record: Self::Record) -> Self {
        Self {
            inner: self.inner.load_record(record),
            ..self
        }
    }
}
