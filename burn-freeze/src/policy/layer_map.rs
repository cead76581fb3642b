//! Per-unit and per-layer gradient statistics, read from the gradients a
//! training step already computed (no extra backward pass).

use std::ops::Range;

use burn::module::{AutodiffModule, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;

use crate::error::FreezeError;
use crate::grad_sums::{GradientSums, flatten};

/// Norms of a gradient (of one unit or one layer): one step's, or the sum
/// of several steps' ([`FreezeFront::gradient_sum_norms`](crate::FreezeFront::gradient_sum_norms)).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct GradNorm {
    /// Sum of absolute values (L1 norm), used by the change-rate rule.
    pub l1: f64,
    /// Euclidean (L2) norm, used by the paper's rule.
    pub l2: f64,
}

impl GradNorm {
    /// Combines the norms of disjoint parameter sets.
    pub fn combine(self, other: GradNorm) -> GradNorm {
        GradNorm {
            l1: self.l1 + other.l1,
            l2: (self.l2 * self.l2 + other.l2 * other.l2).sqrt(),
        }
    }
}

/// Where a [`NormCollector`] reads each parameter's gradient from.
pub(crate) enum GradSource<'a, B: AutodiffBackend> {
    /// One step's gradients.
    Step(&'a GradientsParams),
    /// Running sums of gradients over steps.
    Sums(&'a GradientSums<B::InnerBackend>),
}

impl<B: AutodiffBackend> Clone for GradSource<'_, B> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<B: AutodiffBackend> Copy for GradSource<'_, B> {}

/// Per-unit gradient norms of several units, read from the device once:
/// each unit's sums stay on the device until [`finish`](Self::finish).
pub(crate) struct NormCollector<'a, B: AutodiffBackend> {
    source: GradSource<'a, B>,
    /// Per unit, the index of its two sums (L1, squared L2) in `sums`.
    units: Vec<Option<usize>>,
    sums: Vec<Tensor<B::InnerBackend, 1>>,
}

struct SumVisitor<'a, B: AutodiffBackend> {
    source: GradSource<'a, B>,
    l1: Option<Tensor<B::InnerBackend, 1>>,
    sq: Option<Tensor<B::InnerBackend, 1>>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for SumVisitor<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let grad = match self.source {
            GradSource::Step(grads) => grads.get::<B::InnerBackend, D>(param.id).map(flatten),
            GradSource::Sums(sums) => sums.get(param.id).cloned(),
        };
        if let Some(grad) = grad {
            let l1 = grad.clone().abs().sum();
            let sq = grad.powi_scalar(2).sum();
            self.l1 = Some(match self.l1.take() {
                Some(total) => total + l1,
                None => l1,
            });
            self.sq = Some(match self.sq.take() {
                Some(total) => total + sq,
                None => sq,
            });
        }
    }
}

/// What reads a range's units in order, one value each (a frozen unit
/// skipped): the gradient norms, the update gains.
pub(crate) trait UnitReader<B: AutodiffBackend> {
    /// A unit with no value (frozen).
    fn skip(&mut self);
    /// The next unit.
    fn unit<U: AutodiffModule<B>>(&mut self, unit: &U);
}

impl<'a, B: AutodiffBackend> NormCollector<'a, B> {
    pub(crate) fn new(source: GradSource<'a, B>) -> Self {
        Self {
            source,
            units: Vec::new(),
            sums: Vec::new(),
        }
    }
}

impl<B: AutodiffBackend> UnitReader<B> for NormCollector<'_, B> {
    fn skip(&mut self) {
        self.units.push(None);
    }

    fn unit<U: AutodiffModule<B>>(&mut self, unit: &U) {
        let mut visitor = SumVisitor::<B> {
            source: self.source,
            l1: None,
            sq: None,
        };
        unit.visit(&mut visitor);
        match (visitor.l1, visitor.sq) {
            (Some(l1), Some(sq)) => {
                self.units.push(Some(self.sums.len()));
                self.sums.push(l1);
                self.sums.push(sq);
            }
            _ => self.units.push(None),
        }
    }
}

impl<B: AutodiffBackend> NormCollector<'_, B> {
    /// The norms of every unit, in order.
    pub(crate) fn finish(self) -> Vec<Option<GradNorm>> {
        if self.sums.is_empty() {
            return self.units.iter().map(|_| None).collect();
        }
        let values: Vec<f64> = Tensor::cat(self.sums, 0)
            .into_data()
            .convert::<f64>()
            .into_vec()
            .expect("float sums");
        self.units
            .iter()
            .map(|slot| {
                slot.map(|i| GradNorm {
                    l1: values[i],
                    l2: values[i + 1].sqrt(),
                })
            })
            .collect()
    }
}

/// Which units make each layer, for a stack of `units` units.
///
/// A *unit* is a partition unit of the stack. A *layer* is what AutoFreeze
/// counts: in the paper a transformer block, i.e. its attention unit and its
/// MLP unit. A [`LayerMap`] says which units make each layer and turns a
/// layer front into a unit front; the policies work on layers.
///
/// Freezing `f` layers freezes units `0..end of layer f-1`, so whatever lies
/// before the first layer (an embedding) freezes with layer 0; freezing 0
/// layers freezes nothing. Units after the last layer (final norm, head)
/// never freeze through a layer front.
///
/// ```
/// use burn_freeze::LayerMap;
///
/// // ViT with 12 blocks: embedding, (attention, MLP) x 12, norm, head = 27 units.
/// let map = LayerMap::uniform(1, 2, 12, 27).unwrap();
/// assert_eq!(map.num_layers(), 12);
/// assert_eq!(map.unit_front(0), 0);
/// assert_eq!(map.unit_front(1), 3);   // embedding + block 0
/// assert_eq!(map.unit_front(12), 25); // all blocks; norm and head train
/// assert_eq!(map.units_of(2), 5..7);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerMap {
    layers: Vec<Range<usize>>,
    units: usize,
}

impl LayerMap {
    /// Layers of `per_layer` consecutive units each, the first starting at unit
    /// `offset`, in a stack of `units` units.
    pub fn uniform(
        offset: usize,
        per_layer: usize,
        layers: usize,
        units: usize,
    ) -> Result<Self, FreezeError> {
        Self::new(
            (0..layers)
                .map(|l| offset + per_layer * l..offset + per_layer * (l + 1))
                .collect(),
            units,
        )
    }

    /// Every unit its own layer: layer fronts are unit fronts.
    pub fn per_unit(units: usize) -> Self {
        Self {
            layers: (0..units).map(|u| u..u + 1).collect(),
            units,
        }
    }

    /// Layers given as unit ranges, in order, in a stack of `units` units.
    ///
    /// # Panics
    /// When the ranges are empty, overlap or are out of order.
    pub fn new(layers: Vec<Range<usize>>, units: usize) -> Result<Self, FreezeError> {
        for pair in layers.windows(2) {
            assert!(
                pair[0].end <= pair[1].start,
                "layer ranges overlap or are out of order"
            );
        }
        assert!(
            layers.iter().all(|r| r.start < r.end),
            "a layer has no unit"
        );
        let map_end = layers.last().map_or(0, |r| r.end);
        if map_end > units {
            return Err(FreezeError::MapBeyondStack {
                map_end,
                len: units,
            });
        }
        Ok(Self { layers, units })
    }

    /// Number of layers.
    pub fn num_layers(&self) -> usize {
        self.layers.len()
    }

    /// Number of units in the stack.
    pub fn num_units(&self) -> usize {
        self.units
    }

    /// Units of layer `layer`.
    pub fn units_of(&self, layer: usize) -> Range<usize> {
        self.layers[layer].clone()
    }

    /// The unit front that freezes `layers` layers.
    ///
    /// # Panics
    /// When `layers` exceeds [`num_layers`](Self::num_layers); see
    /// [`try_unit_front`](Self::try_unit_front).
    pub fn unit_front(&self, layers: usize) -> usize {
        self.try_unit_front(layers)
            .expect("layer front beyond the map")
    }

    /// The unit front that freezes `layers` layers, or an error beyond the map.
    pub fn try_unit_front(&self, layers: usize) -> Result<usize, FreezeError> {
        match layers {
            0 => Ok(0),
            l if l <= self.layers.len() => Ok(self.layers[l - 1].end),
            l => Err(FreezeError::LayerBeyondMap {
                requested: l,
                layers: self.layers.len(),
            }),
        }
    }

    /// How many whole layers a unit front freezes.
    pub fn layer_front(&self, unit_front: usize) -> usize {
        self.layers
            .iter()
            .take_while(|r| r.end <= unit_front)
            .count()
    }

    /// The first unit of the first layer (units below it, an embedding,
    /// belong to no layer).
    ///
    /// ```
    /// use burn_freeze::LayerMap;
    ///
    /// assert_eq!(LayerMap::uniform(1, 2, 12, 27).unwrap().first_unit(), 1);
    /// assert_eq!(LayerMap::per_unit(4).first_unit(), 0);
    /// ```
    pub fn first_unit(&self) -> usize {
        self.layers.first().map_or(0, |range| range.start)
    }

    /// Per-layer sums of per-unit values (as the update gains of
    /// [`FreezeFront::last_update_gains`](crate::FreezeFront::last_update_gains));
    /// `None` when none of a layer's units has one.
    ///
    /// ```
    /// use burn_freeze::LayerMap;
    ///
    /// let map = LayerMap::uniform(1, 2, 2, 6).unwrap();
    /// let gains = [Some(9.0), Some(1.0), Some(2.0), None, None, Some(5.0)];
    /// assert_eq!(map.layer_sums(&gains), [Some(3.0), None]);
    /// ```
    pub fn layer_sums(&self, unit_values: &[Option<f64>]) -> Vec<Option<f64>> {
        self.layers
            .iter()
            .map(|range| {
                unit_values
                    .get(range.clone())
                    .unwrap_or(&[])
                    .iter()
                    .flatten()
                    .copied()
                    .reduce(|a, b| a + b)
            })
            .collect()
    }

    /// Per-layer norms from per-unit norms (as from
    /// [`FreezeFront::last_gradient_norms`](crate::FreezeFront::last_gradient_norms)):
    /// a layer's norm combines its units'; `None` when none of them has one.
    pub fn layer_norms(&self, unit_norms: &[Option<GradNorm>]) -> Vec<Option<GradNorm>> {
        self.layers
            .iter()
            .map(|range| {
                unit_norms
                    .get(range.clone())
                    .unwrap_or(&[])
                    .iter()
                    .flatten()
                    .copied()
                    .reduce(GradNorm::combine)
            })
            .collect()
    }
}
