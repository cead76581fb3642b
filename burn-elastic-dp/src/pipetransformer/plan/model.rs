//! What the planner knows about a model ([`ModelSpec`]): per-unit pass times, activation sizes,
//! gradient tensors and layers; profiled on a real backend or measured elsewhere, read from JSON.

use burn_freeze::LayerMap;
use burn_pipe::UnitCosts;
use serde::{Deserialize, Serialize};

use crate::pipetransformer::plan::error::{PlanError, check};
use crate::pipetransformer::trainer::{CostModel, LayerSpec};

/// A unit's pass times measured at one batch size.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct MeasuredPass {
    /// Samples in the pass.
    pub batch: usize,
    /// Forward seconds of the whole pass.
    pub forward: f64,
    /// Backward seconds of the whole pass.
    pub backward: f64,
    /// Forward seconds of the pass on the inner backend, as a frozen unit
    /// runs (no autodiff graph); `None` when not measured.
    #[serde(default)]
    pub frozen_forward: Option<f64>,
}

/// Seconds of a pass over `samples` from `measured` (sorted by batch):
/// linear between the two measured sizes around it, proportional to the
/// samples beyond the ends.
fn interpolate(measured: &[MeasuredPass], samples: f64, pass: fn(&MeasuredPass) -> f64) -> f64 {
    let first = &measured[0];
    let last = &measured[measured.len() - 1];
    if samples <= first.batch as f64 {
        return pass(first) * samples / first.batch as f64;
    }
    if samples >= last.batch as f64 {
        return pass(last) * samples / last.batch as f64;
    }
    // `samples` lies past the first pass and before the last: a later pass
    // is at or past it. Samples that are not a number (a caller's) match
    // none and read the last pass's rate: a time that is not a number.
    let Some(right) = (measured.iter())
        .position(|m| m.batch as f64 >= samples)
        .filter(|&right| right > 0)
    else {
        return pass(last) * samples / last.batch as f64;
    };
    let (a, b) = (&measured[right - 1], &measured[right]);
    let w = (samples - a.batch as f64) / (b.batch - a.batch) as f64;
    pass(a) + w * (pass(b) - pass(a))
}

/// One partition unit, as the planner models it: its pass times, output
/// size and gradient tensors.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UnitSpec {
    /// A name for reports (`embedding`, `attention 3`, `head`).
    pub name: String,
    /// Forward seconds per sample.
    pub forward: f64,
    /// Backward seconds per sample (input and parameter gradients).
    pub backward: f64,
    /// Forward seconds per pass whatever its size (kernel launches,
    /// autodiff bookkeeping); 0 when unknown.
    #[serde(default)]
    pub forward_fixed: f64,
    /// Backward seconds per pass whatever its size; 0 when unknown.
    #[serde(default)]
    pub backward_fixed: f64,
    /// Pass times measured at given batch sizes, sorted by batch; when
    /// present they replace the fixed plus per-sample model (interpolated
    /// between sizes), since small and large passes differ in more than a
    /// constant (caches, threads).
    #[serde(default)]
    pub measured: Vec<MeasuredPass>,
    /// Bytes of the unit's output per sample (what the next stage receives).
    pub activation_bytes: usize,
    /// Bytes the unit's forward pass keeps for its backward pass, per
    /// sample (memory-aware AutoPipe's activations); 0 when unknown.
    #[serde(default)]
    pub saved_bytes: u64,
    /// Bytes of each trainable parameter tensor, in the order the replica
    /// group all-reduces them.
    pub param_tensors: Vec<usize>,
}

impl UnitSpec {
    /// Bytes of the unit's parameters.
    pub fn param_bytes(&self) -> usize {
        self.param_tensors.iter().sum()
    }

    /// Forward seconds of a pass over `samples` samples.
    ///
    /// ```
    /// use burn_elastic_dp::plan::{MeasuredPass, UnitSpec};
    ///
    /// let mut unit = UnitSpec {
    ///     name: "mlp".into(), forward: 1e-3, backward: 2e-3, forward_fixed: 1e-4,
    ///     backward_fixed: 0.0, measured: vec![], activation_bytes: 0, saved_bytes: 0, param_tensors: vec![],
    /// };
    /// assert!((unit.forward_time(10.0) - 0.0101).abs() < 1e-12);
    /// unit.measured = vec![
    ///     MeasuredPass { batch: 2, forward: 0.002, backward: 0.004, frozen_forward: None },
    ///     MeasuredPass { batch: 6, forward: 0.010, backward: 0.020, frozen_forward: None },
    /// ];
    /// assert!((unit.forward_time(4.0) - 0.006).abs() < 1e-12);
    /// assert!((unit.backward_time(1.0) - 0.002).abs() < 1e-12);
    /// ```
    pub fn forward_time(&self, samples: f64) -> f64 {
        if self.measured.is_empty() {
            self.forward_fixed + self.forward * samples
        } else {
            interpolate(&self.measured, samples, |m| m.forward)
        }
    }

    /// Forward seconds of a pass over `samples` samples while the unit is
    /// frozen: on the inner backend, where it was measured so at every
    /// measured size; otherwise [`forward_time`](Self::forward_time).
    ///
    /// ```
    /// use burn_elastic_dp::plan::{MeasuredPass, UnitSpec};
    ///
    /// let pass = |batch, frozen_forward| MeasuredPass { batch, forward: 0.01, backward: 0.02, frozen_forward };
    /// let mut unit = UnitSpec {
    ///     name: "mlp".into(), forward: 0.0, backward: 0.0, forward_fixed: 0.0,
    ///     backward_fixed: 0.0, measured: vec![pass(4, Some(0.004)), pass(8, Some(0.006))],
    ///     activation_bytes: 0, saved_bytes: 0, param_tensors: vec![],
    /// };
    /// assert!((unit.frozen_forward_time(6.0) - 0.005).abs() < 1e-12);
    /// unit.measured[1].frozen_forward = None;
    /// assert!((unit.frozen_forward_time(6.0) - 0.01).abs() < 1e-12);
    /// ```
    pub fn frozen_forward_time(&self, samples: f64) -> f64 {
        if !self.measured.is_empty() && self.measured.iter().all(|m| m.frozen_forward.is_some()) {
            interpolate(&self.measured, samples, |m| {
                m.frozen_forward.unwrap_or(m.forward)
            })
        } else {
            self.forward_time(samples)
        }
    }

    /// Backward seconds of a pass over `samples` samples.
    pub fn backward_time(&self, samples: f64) -> f64 {
        if self.measured.is_empty() {
            self.backward_fixed + self.backward * samples
        } else {
            interpolate(&self.measured, samples, |m| m.backward)
        }
    }
}

/// A model as the planner sees it: its units ([`UnitSpec`]) and how they
/// make the layers the freeze rule counts ([`LayerSpec`], as the trainer's
/// configuration gives them; ViT and BERT: layer `l` is units `1 + 2 l` and
/// `2 + 2 l`).
///
/// ```
/// use burn_elastic_dp::LayerSpec;
/// use burn_elastic_dp::plan::{ModelSpec, UnitSpec};
///
/// let unit = |name: &str| UnitSpec {
///     name: name.into(), forward: 1e-3, backward: 2e-3, forward_fixed: 0.0,
///     backward_fixed: 0.0, measured: vec![], activation_bytes: 4096, saved_bytes: 0, param_tensors: vec![4096, 64],
/// };
/// let model = ModelSpec {
///     model: "toy".into(), source: "made up".into(),
///     layers: LayerSpec::Uniform { offset: 1, per_layer: 2, layers: 1 },
///     units: vec![unit("embedding"), unit("attention 0"), unit("mlp 0"), unit("head")],
/// };
/// model.validate().unwrap();
/// assert_eq!(model.layer_map().unwrap().unit_front(1), 3);
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelSpec {
    /// The model, in words.
    pub model: String,
    /// Where the numbers come from (backend, batch sizes, or assumptions).
    pub source: String,
    /// How the units make layers.
    pub layers: LayerSpec,
    /// Every unit, first to last.
    pub units: Vec<UnitSpec>,
}

impl ModelSpec {
    /// Checks every number: at least one unit, finite non-negative times,
    /// layers within the units.
    pub fn validate(&self) -> Result<(), PlanError> {
        check(!self.units.is_empty(), || {
            "the cost file has no unit".into()
        })?;
        if let LayerSpec::Uniform {
            offset,
            per_layer,
            layers,
        } = self.layers
        {
            check(per_layer >= 1, || {
                "units per layer must be at least 1, got 0".into()
            })?;
            let end = offset + per_layer * layers;
            check(end <= self.units.len(), || {
                format!(
                    "{layers} layers of {per_layer} units from unit {offset} end at unit {end}, beyond the {} units",
                    self.units.len()
                )
            })?;
        }
        for (i, u) in self.units.iter().enumerate() {
            let ok = |t: f64| t.is_finite() && t >= 0.0;
            check(
                ok(u.forward) && ok(u.backward) && ok(u.forward_fixed) && ok(u.backward_fixed),
                || {
                    format!(
                        "unit {i} ({}): times must be seconds >= 0, got forward {} backward {} fixed {} / {}",
                        u.name, u.forward, u.backward, u.forward_fixed, u.backward_fixed
                    )
                },
            )?;
            check(
                u.measured.windows(2).all(|w| w[0].batch < w[1].batch)
                    && u.measured
                        .iter()
                        .all(|m| m.batch >= 1 && ok(m.forward) && ok(m.backward)),
                || {
                    format!(
                        "unit {i} ({}): measured passes need batches >= 1 in increasing order and times >= 0",
                        u.name
                    )
                },
            )?;
        }
        Ok(())
    }

    /// The layer-to-unit map the freeze rule uses (as the trainer's).
    pub fn layer_map(&self) -> Result<LayerMap, PlanError> {
        let units = self.units.len();
        match self.layers {
            LayerSpec::PerUnit => Ok(LayerMap::per_unit(units)),
            LayerSpec::Uniform {
                offset,
                per_layer,
                layers,
            } => LayerMap::uniform(offset, per_layer, layers, units)
                .map_err(|e| PlanError::Invalid(e.to_string())),
        }
    }

    /// What AutoPipe balances under `model`, by burn-pipe's one cost rule:
    /// parameter bytes (the trainer counts parameters; bytes are
    /// proportional) with a frozen unit at `frozen_factor` of an active one,
    /// or each unit's forward plus backward seconds per sample with a
    /// frozen unit at its forward seconds, as the trainer's profile costs
    /// them (the times are the ones here: `repeats` is not used).
    /// The units' memory figures: parameter bytes and saved activation
    /// bytes per sample, what memory-aware AutoPipe reads.
    pub fn unit_memory(&self) -> burn_pipe::UnitMemory {
        burn_pipe::UnitMemory::new(
            self.units.iter().map(|u| u.param_bytes() as u64).collect(),
            self.units.iter().map(|u| u.saved_bytes).collect(),
        )
    }

    pub fn unit_costs(&self, model: CostModel) -> UnitCosts {
        match model {
            CostModel::Parameters { frozen_factor } => {
                let bytes: Vec<f64> = self.units.iter().map(|u| u.param_bytes() as f64).collect();
                UnitCosts::scaled(&bytes, frozen_factor)
            }
            CostModel::Profiled { .. } => UnitCosts {
                active: self.units.iter().map(|u| u.forward + u.backward).collect(),
                frozen: self.units.iter().map(|u| u.forward).collect(),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interpolating_a_pass_never_panics() {
        let pass = |batch, forward| MeasuredPass {
            batch,
            forward,
            backward: 0.0,
            frozen_forward: None,
        };
        let sorted = [pass(2, 0.002), pass(6, 0.010)];
        assert!(interpolate(&sorted, f64::NAN, |m| m.forward).is_nan());
        assert!((interpolate(&sorted, 4.0, |m| m.forward) - 0.006).abs() < 1e-12);
    }
}
