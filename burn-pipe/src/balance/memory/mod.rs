//! Memory-aware AutoPipe's estimate of what each pipeline stage holds on
//! its device, from per-unit figures measured on the first batch or given.

mod heap;
mod measure;

pub use heap::HeapCounter;
pub use measure::measure_unit_memory;

use burn::serde::{Deserialize, Serialize};

use crate::runtime::schedule::{Schedule, peak_in_flight, stage_ops};

/// Per-unit memory figures: bytes of parameters, and bytes the unit's
/// forward pass keeps for its backward pass per sample.
///
/// A training unit holds its parameters, their gradients, the optimizer's
/// state (`optimizer_slots` copies of its parameters: 2 for Adam's moments)
/// and, per sample in flight, what its forward pass keeps for the backward
/// pass. A frozen unit holds its parameters only: it runs without a graph,
/// and once cached it does not run at all. [`UnitMemory::stages`] sums them
/// per stage ([`StageMemory`]); [`measure_unit_memory`] measures them.
///
/// ```
/// use burn_pipe::UnitMemory;
///
/// let memory = UnitMemory::new(vec![400, 400], vec![10, 10]);
/// assert_eq!(memory.len(), 2);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(crate = "burn::serde")]
pub struct UnitMemory {
    /// Bytes of each unit's parameters.
    pub params: Vec<u64>,
    /// Bytes each unit's forward pass keeps for its backward pass, per
    /// sample (0 where unknown).
    pub activations: Vec<u64>,
    /// Bytes a training unit's freeze rule keeps beside it (a snapshot of
    /// its weights, its running gradient sums), counted with its optimizer
    /// state; empty or 0 where none.
    #[serde(default)]
    pub evidence: Vec<u64>,
}

/// What one stage holds, in bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(crate = "burn::serde")]
pub struct StageMemory {
    /// Parameters of every unit of the stage, frozen or not.
    pub params: u64,
    /// Gradients of the training units.
    pub grads: u64,
    /// Optimizer state of the training units, and what their freeze rule
    /// keeps beside them ([`UnitMemory::evidence`]).
    pub optimizer: u64,
    /// Activations of the micro-batches in flight.
    pub activations: u64,
}

impl StageMemory {
    /// Bytes in all.
    pub fn total(&self) -> u64 {
        self.params + self.grads + self.optimizer + self.activations
    }
}

/// The pipeline shape a memory estimate is for.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MemoryQuery<'a> {
    /// Units per stage.
    pub balance: &'a [usize],
    /// Units `0..front` are frozen.
    pub front: usize,
    /// Samples per replica per step.
    pub batch: usize,
    /// Micro-batches per step.
    pub micro_batches: usize,
    /// The schedule (how many micro-batches each stage holds at once).
    pub schedule: Schedule,
    /// Optimizer state per parameter, in copies of the parameters (Adam: 2).
    pub optimizer_slots: f64,
}

impl UnitMemory {
    /// Figures for `params.len()` units; `activations` as long as `params`.
    pub fn new(params: Vec<u64>, activations: Vec<u64>) -> Self {
        assert_eq!(params.len(), activations.len(), "one figure per unit");
        Self {
            params,
            activations,
            evidence: Vec::new(),
        }
    }

    /// These figures with `copies` copies of the parameters of each unit
    /// from `from` on kept by a freeze rule beside a training unit (see
    /// [`evidence`](Self::evidence)), added to what is there.
    ///
    /// ```
    /// use burn_pipe::UnitMemory;
    ///
    /// let memory = UnitMemory::new(vec![400, 400], vec![0, 0]).with_evidence(1, 1.0);
    /// assert_eq!(memory.unit(0, false, 0, 2.0).total(), 1600);
    /// assert_eq!(memory.unit(1, false, 0, 2.0).total(), 2000);
    /// assert_eq!(memory.unit(1, true, 0, 2.0).total(), 400);
    /// ```
    pub fn with_evidence(mut self, from: usize, copies: f64) -> Self {
        self.evidence.resize(self.params.len(), 0);
        for (unit, bytes) in self.evidence.iter_mut().enumerate().skip(from) {
            *bytes += (self.params[unit] as f64 * copies).round() as u64;
        }
        self
    }

    /// From parameter counts of `element_bytes` bytes each, activations
    /// unknown (0).
    pub fn from_param_counts(counts: &[usize], element_bytes: usize) -> Self {
        let params = counts
            .iter()
            .map(|&n| (n * element_bytes) as u64)
            .collect::<Vec<_>>();
        let activations = vec![0; params.len()];
        Self {
            params,
            activations,
            evidence: Vec::new(),
        }
    }

    /// Units.
    pub fn len(&self) -> usize {
        self.params.len()
    }

    /// Whether there is no unit.
    pub fn is_empty(&self) -> bool {
        self.params.is_empty()
    }

    /// Whether the activation figures were measured or given (any nonzero).
    pub fn knows_activations(&self) -> bool {
        self.activations.iter().any(|&a| a > 0)
    }

    /// What unit `unit` holds when `frozen` (parameters only) or training
    /// with `samples` samples of activations held.
    pub fn unit(
        &self,
        unit: usize,
        frozen: bool,
        samples: usize,
        optimizer_slots: f64,
    ) -> StageMemory {
        let params = self.params[unit];
        if frozen {
            return StageMemory {
                params,
                ..StageMemory::default()
            };
        }
        let evidence = self.evidence.get(unit).copied().unwrap_or(0);
        StageMemory {
            params,
            grads: params,
            optimizer: (params as f64 * optimizer_slots).round() as u64 + evidence,
            activations: self.activations[unit] * samples as u64,
        }
    }

    /// What each stage of `query`'s shape holds: stage `s` holds the
    /// activations of the most micro-batches the schedule keeps in flight
    /// on it (1F1B: `K - s`; GPipe: all `M`; one stage: one), each of the
    /// largest micro-batch's samples.
    ///
    /// ```
    /// use burn_pipe::{Schedule, UnitMemory};
    /// use burn_pipe::balance::MemoryQuery;
    ///
    /// let memory = UnitMemory::new(vec![100; 4], vec![10; 4]);
    /// let query = MemoryQuery {
    ///     balance: &[2, 2], front: 1, batch: 8, micro_batches: 4,
    ///     schedule: Schedule::OneFOneB, optimizer_slots: 2.0,
    /// };
    /// let stages = memory.stages(&query);
    /// // Stage 0: unit 0 frozen (parameters only), unit 1 training with
    /// // 2 micro-batches of 2 samples in flight.
    /// assert_eq!(stages[0].total(), 100 + 400 + 10 * 4);
    /// // Stage 1: two training units, 1 micro-batch in flight.
    /// assert_eq!(stages[1].total(), 2 * (400 + 10 * 2));
    /// ```
    pub fn stages(&self, query: &MemoryQuery<'_>) -> Vec<StageMemory> {
        let stages = query.balance.len();
        let micro = query.micro_batches.clamp(1, query.batch.max(1));
        let micro_samples = query.batch.div_ceil(micro);
        let mut start = 0;
        query
            .balance
            .iter()
            .enumerate()
            .map(|(stage, &units)| {
                let in_flight = peak_in_flight(&stage_ops(query.schedule, stage, stages, micro));
                let samples = micro_samples * in_flight;
                let held = (start..start + units).fold(StageMemory::default(), |sum, unit| {
                    let u = self.unit(unit, unit < query.front, samples, query.optimizer_slots);
                    StageMemory {
                        params: sum.params + u.params,
                        grads: sum.grads + u.grads,
                        optimizer: sum.optimizer + u.optimizer,
                        activations: sum.activations + u.activations,
                    }
                });
                start += units;
                held
            })
            .collect()
    }

    /// The first unit that does not fit `budget` bytes even alone on a
    /// device (training, with one micro-batch of `micro_samples` samples in
    /// flight), and what it needs.
    pub fn unit_over(
        &self,
        budget: u64,
        micro_samples: usize,
        optimizer_slots: f64,
    ) -> Option<(usize, u64)> {
        (0..self.len())
            .map(|u| {
                (
                    u,
                    self.unit(u, false, micro_samples, optimizer_slots).total(),
                )
            })
            .find(|&(_, needed)| needed > budget)
    }
}

/// The element size of a backend's floats, in bytes.
pub fn float_bytes<B: burn::tensor::backend::Backend>() -> usize {
    std::mem::size_of::<burn::tensor::ops::FloatElem<B>>()
}
