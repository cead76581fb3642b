//! Data across replicas: which samples each step trains on, so that every sample is seen exactly
//! once per epoch whatever the replica count, also when it changes mid-epoch.

use burn::config::Config;
use burn::data::dataset::Dataset;
use rand::SeedableRng;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;

use crate::error::ElasticError;

/// How big a step's global batch is as the replica count changes.
#[derive(Config, Debug, Copy, PartialEq, Eq)]
pub enum BatchPolicy {
    /// The same global batch whatever the replica count (each replica's
    /// share shrinks as replicas are added). Training is the same maths at
    /// every replica count: keep the learning rate.
    FixedGlobal {
        /// Samples per step, over all replicas.
        batch: usize,
    },
    /// The paper's choice: each replica keeps its batch, so the global batch
    /// grows with the replica count. Scale the learning rate with it
    /// ([`ElasticSampler::learning_rate`]: the linear scaling rule of Goyal
    /// et al., 2017, `lr * replicas / base_replicas`).
    PerReplica {
        /// Samples per step and replica.
        batch: usize,
    },
}

impl BatchPolicy {
    /// Samples per step with `replicas` replicas.
    pub fn global_batch(&self, replicas: usize) -> usize {
        match *self {
            BatchPolicy::FixedGlobal { batch } => batch,
            BatchPolicy::PerReplica { batch } => batch * replicas,
        }
    }
}

/// Hands out each epoch's samples in a shuffled order, one global batch per
/// step, the batch size following a [`BatchPolicy`] and the replica count of
/// that step. Every sample comes exactly once per epoch (the last batch of an
/// epoch may be smaller); the order depends only on the seed and the epoch.
///
/// ```
/// use burn_elastic_dp::{BatchPolicy, ElasticSampler};
///
/// let mut sampler = ElasticSampler::new(10, BatchPolicy::PerReplica { batch: 2 }, 7).unwrap();
/// let mut seen = Vec::new();
/// for replicas in [1, 2, 4] {
///     seen.extend(sampler.next_batch(replicas).unwrap()); // 2, then 4, then the last 4
/// }
/// assert!(sampler.next_batch(4).is_none()); // the epoch is over
/// seen.sort();
/// assert_eq!(seen, (0..10).collect::<Vec<_>>());
/// sampler.start_epoch();
/// assert_eq!(sampler.epoch(), 1);
/// ```
#[derive(Debug, Clone)]
pub struct ElasticSampler {
    len: usize,
    policy: BatchPolicy,
    seed: u64,
    epoch: usize,
    order: Vec<usize>,
    cursor: usize,
    /// Samples never handed out (sorted), carved out by
    /// [`with_held_out`](Self::with_held_out).
    held_out: Vec<usize>,
}

/// Mixed into the seed of the held-out draw, so that it differs from every
/// epoch's order.
const HELD_OUT_SALT: u64 = 0x4845_4C44_4F55_5421;

impl ElasticSampler {
    /// A sampler over `len` samples, at epoch 0.
    ///
    /// Fails on an empty dataset or a batch size of 0.
    pub fn new(len: usize, policy: BatchPolicy, seed: u64) -> Result<Self, ElasticError> {
        if len == 0 {
            return Err(ElasticError::Sampler("the dataset has no sample".into()));
        }
        if policy.global_batch(1) == 0 {
            return Err(ElasticError::Sampler(
                "the batch size must be at least 1, got 0".into(),
            ));
        }
        let mut sampler = Self {
            len,
            policy,
            seed,
            epoch: 0,
            order: Vec::new(),
            cursor: 0,
            held_out: Vec::new(),
        };
        sampler.shuffle();
        Ok(sampler)
    }

    /// The same sampler with `samples` samples carved out, drawn once from
    /// the seed: they are never handed out, and every other sample still
    /// comes exactly once per epoch. A loss on them measures the model on
    /// data it never trained on (the default freeze rule's guard reads one).
    /// Restarts the current epoch.
    ///
    /// Fails when fewer than one sample would be left to train on.
    ///
    /// ```
    /// use burn_elastic_dp::{BatchPolicy, ElasticSampler};
    ///
    /// let mut sampler = ElasticSampler::new(10, BatchPolicy::FixedGlobal { batch: 4 }, 3)
    ///     .unwrap()
    ///     .with_held_out(2)
    ///     .unwrap();
    /// let held = sampler.held_out().to_vec();
    /// assert_eq!(held.len(), 2);
    /// let mut seen = Vec::new();
    /// while let Some(batch) = sampler.next_batch(1) {
    ///     seen.extend(batch);
    /// }
    /// assert_eq!(seen.len(), 8);
    /// assert!(seen.iter().all(|i| !held.contains(i)));
    /// ```
    pub fn with_held_out(mut self, samples: usize) -> Result<Self, ElasticError> {
        if samples >= self.len {
            return Err(ElasticError::Sampler(format!(
                "{samples} held-out samples leave none of the dataset's {} to train on",
                self.len
            )));
        }
        let mut all: Vec<usize> = (0..self.len).collect();
        all.shuffle(&mut StdRng::seed_from_u64(self.seed ^ HELD_OUT_SALT));
        all.truncate(samples);
        all.sort_unstable();
        self.held_out = all;
        self.shuffle();
        Ok(self)
    }

    /// The samples never handed out (sorted; empty unless
    /// [`with_held_out`](Self::with_held_out) carved some).
    pub fn held_out(&self) -> &[usize] {
        &self.held_out
    }

    /// Samples handed out per epoch: the dataset's less the held-out ones.
    pub fn trained_per_epoch(&self) -> usize {
        self.len - self.held_out.len()
    }

    /// Steps of an epoch at `replicas` replicas (at least 1), the last
    /// step counted even when it is short.
    ///
    /// ```
    /// use burn_elastic_dp::{BatchPolicy, ElasticSampler};
    ///
    /// let sampler = ElasticSampler::new(100, BatchPolicy::FixedGlobal { batch: 32 }, 1).unwrap();
    /// assert_eq!(sampler.steps_per_epoch(2), 4);
    /// ```
    pub fn steps_per_epoch(&self, replicas: usize) -> usize {
        let batch = self.policy.global_batch(replicas.max(1)).max(1);
        self.trained_per_epoch().div_ceil(batch)
    }

    fn shuffle(&mut self) {
        self.order = (0..self.len)
            .filter(|i| self.held_out.binary_search(i).is_err())
            .collect();
        let mut rng = StdRng::seed_from_u64(
            self.seed ^ (self.epoch as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15),
        );
        self.order.shuffle(&mut rng);
        self.cursor = 0;
    }

    /// The epoch under way (0 first).
    pub fn epoch(&self) -> usize {
        self.epoch
    }

    /// Samples per epoch.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether an epoch has no sample (never: [`new`](Self::new) refuses it).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Samples of this epoch not handed out yet.
    pub fn remaining(&self) -> usize {
        self.order.len() - self.cursor
    }

    /// The batch policy.
    pub fn policy(&self) -> BatchPolicy {
        self.policy
    }

    /// The sample indices of the next step with `replicas` replicas, or
    /// `None` when the epoch is over (call [`start_epoch`](Self::start_epoch)).
    ///
    /// # Panics
    /// When `replicas` is 0.
    pub fn next_batch(&mut self, replicas: usize) -> Option<Vec<usize>> {
        assert!(replicas > 0, "a step needs at least one replica");
        if self.cursor == self.order.len() {
            return None;
        }
        let size = self
            .policy
            .global_batch(replicas)
            .min(self.order.len() - self.cursor);
        let batch = self.order[self.cursor..self.cursor + size].to_vec();
        self.cursor += size;
        Some(batch)
    }

    /// [`next_batch`](Self::next_batch), except that a tail of the epoch
    /// shorter than `min_batch` samples is not left for a last, too small
    /// step: it joins this batch. A trainer whose step needs at least
    /// `replicas x micro-batches` samples passes that, so every sample is
    /// still seen once and no step is too small (unless the whole epoch is).
    ///
    /// ```
    /// use burn_elastic_dp::{BatchPolicy, ElasticSampler};
    ///
    /// let mut sampler = ElasticSampler::new(10, BatchPolicy::FixedGlobal { batch: 4 }, 0).unwrap();
    /// assert_eq!(sampler.next_batch_min(1, 4).unwrap().len(), 4);
    /// assert_eq!(sampler.next_batch_min(1, 4).unwrap().len(), 6); // 4 + the tail of 2
    /// assert!(sampler.next_batch_min(1, 4).is_none());
    /// ```
    ///
    /// # Panics
    /// When `replicas` is 0.
    pub fn next_batch_min(&mut self, replicas: usize, min_batch: usize) -> Option<Vec<usize>> {
        assert!(replicas > 0, "a step needs at least one replica");
        if self.cursor == self.order.len() {
            return None;
        }
        let left = self.order.len() - self.cursor;
        let mut size = self.policy.global_batch(replicas).min(left);
        if left - size < min_batch {
            size = left;
        }
        let batch = self.order[self.cursor..self.cursor + size].to_vec();
        self.cursor += size;
        Some(batch)
    }

    /// The items of the next step from `dataset` (see [`next_batch`](Self::next_batch));
    /// `Ok(None)` at the end of the epoch. A dataset shorter than the
    /// sampler's length is [`ElasticError::MissingItem`] (the step's
    /// indices are handed out all the same).
    ///
    /// ```
    /// use burn::data::dataset::InMemDataset;
    /// use burn_elastic_dp::{BatchPolicy, ElasticError, ElasticSampler};
    ///
    /// let short = InMemDataset::new(vec![10, 20, 30]);
    /// let mut sampler = ElasticSampler::new(8, BatchPolicy::FixedGlobal { batch: 8 }, 1).unwrap();
    /// assert!(matches!(
    ///     sampler.next_items(&short, 1),
    ///     Err(ElasticError::MissingItem { len: 3, .. })
    /// ));
    /// ```
    pub fn next_items<I, D: Dataset<I>>(
        &mut self,
        dataset: &D,
        replicas: usize,
    ) -> Result<Option<Vec<I>>, ElasticError> {
        let Some(indices) = self.next_batch(replicas) else {
            return Ok(None);
        };
        indices
            .into_iter()
            .map(|index| {
                dataset.get(index).ok_or(ElasticError::MissingItem {
                    index,
                    len: dataset.len(),
                })
            })
            .collect::<Result<Vec<I>, _>>()
            .map(Some)
    }

    /// Where the sampler stands: the epoch and the samples of it handed
    /// out (with the seed, all a checkpoint needs).
    pub fn position(&self) -> (usize, usize) {
        (self.epoch, self.cursor)
    }

    /// Moves to `cursor` samples into epoch `epoch` (its order is a function
    /// of the seed and the epoch), as [`position`](Self::position) gave.
    ///
    /// ```
    /// use burn_elastic_dp::{BatchPolicy, ElasticSampler};
    ///
    /// let policy = BatchPolicy::FixedGlobal { batch: 3 };
    /// let mut a = ElasticSampler::new(10, policy, 5).unwrap();
    /// a.start_epoch();
    /// a.next_batch(1);
    /// let mut b = ElasticSampler::new(10, policy, 5).unwrap();
    /// b.seek(1, 3).unwrap();
    /// assert_eq!(a.next_batch(1), b.next_batch(1));
    /// ```
    pub fn seek(&mut self, epoch: usize, cursor: usize) -> Result<(), ElasticError> {
        if cursor > self.trained_per_epoch() {
            return Err(ElasticError::Sampler(format!(
                "position {cursor} is beyond the epoch's {} samples",
                self.trained_per_epoch()
            )));
        }
        self.epoch = epoch;
        self.shuffle();
        self.cursor = cursor;
        Ok(())
    }

    /// Starts the next epoch, in a new shuffled order.
    pub fn start_epoch(&mut self) {
        self.epoch += 1;
        self.shuffle();
    }

    /// The learning rate for `replicas` replicas when `base_lr` was tuned for
    /// `base_replicas`: unchanged under [`BatchPolicy::FixedGlobal`] (the same
    /// global batch), scaled linearly with the global batch under
    /// [`BatchPolicy::PerReplica`].
    ///
    /// ```
    /// use burn_elastic_dp::{BatchPolicy, ElasticSampler};
    ///
    /// let sampler = ElasticSampler::new(100, BatchPolicy::PerReplica { batch: 8 }, 0).unwrap();
    /// assert_eq!(sampler.learning_rate(1e-3, 2, 4), 2e-3);
    /// let fixed = ElasticSampler::new(100, BatchPolicy::FixedGlobal { batch: 32 }, 0).unwrap();
    /// assert_eq!(fixed.learning_rate(1e-3, 2, 4), 1e-3);
    /// ```
    pub fn learning_rate(&self, base_lr: f64, base_replicas: usize, replicas: usize) -> f64 {
        match self.policy {
            BatchPolicy::FixedGlobal { .. } => base_lr,
            BatchPolicy::PerReplica { .. } => {
                base_lr * replicas as f64 / base_replicas.max(1) as f64
            }
        }
    }
}
