//! Loss-change allocation per unit: how much each unit's moves since a snapshot lowered the
//! loss, read from a later step's gradient.
//!
//! A snapshot `W_s` of the trainable weights is taken before the first step and again at the
//! step after each restart (a policy restarts at each of its checks). At step `t` a unit with
//! weights `W_t` gets the gradient `g_t` of a fresh batch. To first order the loss on that batch
//! went down by `-<g_t, W_t - W_s>` because the unit moved since the snapshot: the unit's
//! **update gain**. Summed over a window it is the unit's share of the loss's decrease (Lan et
//! al.'s loss-change allocation, the Taylor importance of ElasticTrainer and GreenTrainer). The
//! gradient comes from a batch none of the moves saw, so a unit whose updates are noise gains
//! nothing on average, however large its gradients; and a unit that still descends gains in
//! proportion to what it adds.
//!
//! Why a span of steps and not each step's own move: an optimizer that oscillates across a
//! sharp valley moves back and forth, and the gradient at the end of each single move points
//! back against it, so step by step the moves read as losses while the loss falls; over a span
//! the oscillations cancel in the displacement and the descent adds up.
//!
//! The cost: a snapshot of the trainable weights per span (one more copy of them) and one
//! product-sum per parameter tensor a step, read from the device once per stage.

use std::collections::HashMap;
use std::fmt;

use burn::module::{AutodiffModule, ModuleVisitor, Param, ParamId};
use burn::optim::GradientsParams;
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;

use crate::grad_sums::flatten;
use crate::policy::layer_map::UnitReader;

/// A stage's trainable weights as they were before its last optimizer
/// step, flattened, by parameter, on the inner backend: what the next
/// step's update gains are measured against.
pub struct WeightSnapshot<B: Backend> {
    weights: HashMap<ParamId, Tensor<B, 1>>,
}

impl<B: Backend> WeightSnapshot<B> {
    /// The weights of `module` now (shared storage: no copy until the
    /// optimizer writes the next values beside them).
    pub fn of<AB, M>(module: &M) -> Self
    where
        AB: AutodiffBackend<InnerBackend = B>,
        M: AutodiffModule<AB>,
    {
        let mut visitor = SnapshotVisitor::<AB> {
            weights: HashMap::new(),
        };
        module.visit(&mut visitor);
        Self {
            weights: visitor.weights,
        }
    }

    /// No weights.
    pub fn empty() -> Self {
        Self {
            weights: HashMap::new(),
        }
    }

    /// Parameters held.
    pub fn len(&self) -> usize {
        self.weights.len()
    }

    /// Whether no parameter is held.
    pub fn is_empty(&self) -> bool {
        self.weights.is_empty()
    }

    /// Adds `other`'s weights (other parameters, as when the stages of a
    /// pipeline pool theirs).
    pub fn merge(&mut self, other: Self) {
        self.weights.extend(other.weights);
    }
}

impl<B: Backend> Clone for WeightSnapshot<B> {
    fn clone(&self) -> Self {
        Self {
            weights: self.weights.clone(),
        }
    }
}

impl<B: Backend> fmt::Debug for WeightSnapshot<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WeightSnapshot")
            .field("params", &self.weights.len())
            .finish()
    }
}

struct SnapshotVisitor<AB: AutodiffBackend> {
    weights: HashMap<ParamId, Tensor<AB::InnerBackend, 1>>,
}

impl<AB: AutodiffBackend> ModuleVisitor<AB> for SnapshotVisitor<AB> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<AB, D>>) {
        self.weights.insert(param.id, flatten(param.val().inner()));
    }
}

/// Per-unit update gains of several units, read from the device once.
pub(crate) struct GainCollector<'a, B: AutodiffBackend> {
    grads: &'a GradientsParams,
    before: &'a WeightSnapshot<B::InnerBackend>,
    units: Vec<Option<usize>>,
    dots: Vec<Tensor<B::InnerBackend, 1>>,
}

struct DotVisitor<'a, B: AutodiffBackend> {
    grads: &'a GradientsParams,
    before: &'a WeightSnapshot<B::InnerBackend>,
    dot: Option<Tensor<B::InnerBackend, 1>>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for DotVisitor<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let (Some(grad), Some(before)) = (
            self.grads.get::<B::InnerBackend, D>(param.id),
            self.before.weights.get(&param.id),
        ) else {
            return;
        };
        let now = flatten(param.val().inner());
        if now.shape() != before.shape() {
            return;
        }
        let moved = now - before.clone();
        let dot = (flatten(grad) * moved).sum();
        self.dot = Some(match self.dot.take() {
            Some(total) => total + dot,
            None => dot,
        });
    }
}

impl<'a, B: AutodiffBackend> GainCollector<'a, B> {
    pub(crate) fn new(
        grads: &'a GradientsParams,
        before: &'a WeightSnapshot<B::InnerBackend>,
    ) -> Self {
        Self {
            grads,
            before,
            units: Vec::new(),
            dots: Vec::new(),
        }
    }
}

impl<B: AutodiffBackend> UnitReader<B> for GainCollector<'_, B> {
    fn skip(&mut self) {
        self.units.push(None);
    }

    fn unit<U: AutodiffModule<B>>(&mut self, unit: &U) {
        let mut visitor = DotVisitor::<B> {
            grads: self.grads,
            before: self.before,
            dot: None,
        };
        unit.visit(&mut visitor);
        match visitor.dot {
            Some(dot) => {
                self.units.push(Some(self.dots.len()));
                self.dots.push(dot);
            }
            None => self.units.push(None),
        }
    }
}

impl<B: AutodiffBackend> GainCollector<'_, B> {
    /// The gain of every unit, in order: minus the dot product of its
    /// gradient with its move since the snapshot.
    pub(crate) fn finish(self) -> Vec<Option<f64>> {
        if self.dots.is_empty() {
            return self.units.iter().map(|_| None).collect();
        }
        let Ok(values) = Tensor::cat(self.dots, 0)
            .into_data()
            .convert::<f64>()
            .into_vec::<f64>()
        else {
            return self.units.iter().map(|_| None).collect();
        };
        self.units
            .iter()
            .map(|slot| slot.map(|i| -values[i]))
            .collect()
    }
}

/// What every level's [`FreezeFront::set_update_gains`](crate::FreezeFront::set_update_gains)
/// does with its own state: measures gains from unit `from` on (`None`:
/// no longer) and, when that stops them, clears the last gains. Returns
/// whether anything changed: the caller then drops its weight snapshots
/// (the next step reads no gain).
///
/// ```
/// use burn_freeze::plumbing::set_gains_from;
///
/// let (mut from, mut gains) = (Some(1), vec![None, Some(0.5)]);
/// assert!(!set_gains_from(&mut from, &mut gains, Some(1))); // measured already
/// assert!(set_gains_from(&mut from, &mut gains, None));
/// assert_eq!((from, gains), (None, vec![None, None]));
/// ```
pub fn set_gains_from(
    gains_from: &mut Option<usize>,
    gains: &mut [Option<f64>],
    from: Option<usize>,
) -> bool {
    if from == *gains_from {
        return false;
    }
    *gains_from = from;
    if from.is_none() {
        gains.fill(None);
    }
    true
}
