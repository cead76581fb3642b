//! The one owner of a run's shape: where it starts, where it goes when the freeze front moves, the
//! micro-batch count of every shape and whether a shape fits the memory budget. The trainer and
//! the planner both ask it.

use burn_pipe::balance::{StageMemory, UnitState};
use burn_pipe::micro::{
    MicroBatchChoice, MicroBatchQuery, MicroBatchTimes, SharedCores, choose_micro_batches_where,
};
use burn_pipe::{Schedule, UnitCosts, UnitMemory, default_micro_batches};

use crate::sampler::BatchPolicy;

use super::form::{PipelineShape, balanced_shape};
use super::memory::{MemoryFit, StartError, fewest_fitting_stages};
use super::reshape::{Reshaping, reshape};

/// What a run asks of its shapes: the trainer's (or the planner's)
/// settings, as plain values.
///
/// ```
/// use burn_elastic_dp::BatchPolicy;
/// use burn_elastic_dp::shape::ShapeSettings;
///
/// let settings = ShapeSettings::new(4, BatchPolicy::FixedGlobal { batch: 32 });
/// assert_eq!((settings.devices, settings.stages, settings.micro_batches), (4, None, None));
/// assert!(settings.pipe && settings.dp && settings.cache && settings.measure_micro_batches);
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct ShapeSettings {
    /// Devices of one process (every process runs the rule on its own).
    pub devices: usize,
    /// Stages at the start; `None`: the fewest whose every stage fits the
    /// budget (memory-aware AutoPipe; without a budget, one stage).
    pub stages: Option<usize>,
    /// AutoPipe runs: the pipeline shortens as the front moves.
    pub pipe: bool,
    /// AutoDP runs: `devices / K` replicas.
    pub dp: bool,
    /// AutoCache serves the frozen prefix (frozen units cost nothing and
    /// sit on stage 0).
    pub cache: bool,
    /// Bytes one device may hold; `None`: unlimited.
    pub device_bytes: Option<u64>,
    /// Optimizer state per parameter, in copies of the parameters.
    pub optimizer_slots: f64,
    /// Samples per step as replicas come and go.
    pub batch: BatchPolicy,
    /// The user's micro-batch count; `None`: chosen for every shape (from
    /// measured times when there are some, else the paper's count for K).
    pub micro_batches: Option<usize>,
    /// Whether, with no count given, M is chosen from micro-batch times
    /// measured on the run's first batch (the trainer then measures them);
    /// off: the paper's count for each K.
    pub measure_micro_batches: bool,
    /// The pipeline's schedule.
    pub schedule: Schedule,
    /// The cores the devices share when they are threads of one machine
    /// (logical CPU devices): every stage of every replica runs on them, so
    /// M is chosen for the least work rather than the shortest pipeline
    /// ([`SharedCores`]); `None`: every device its own.
    pub shared_cores: Option<usize>,
}

impl ShapeSettings {
    /// What the step model is told of shared cores for a shape of
    /// `replicas` replicas (see [`shared_cores`](Self::shared_cores)).
    pub fn shared(&self, replicas: usize) -> Option<SharedCores> {
        self.shared_cores.map(|cores| SharedCores {
            cores: cores.max(1),
            replicas,
        })
    }

    /// Every part on, no budget, the start and M left to the rule, 1F1B.
    pub fn new(devices: usize, batch: BatchPolicy) -> Self {
        Self {
            devices,
            stages: None,
            pipe: true,
            dp: true,
            cache: true,
            device_bytes: None,
            optimizer_slots: 2.0,
            batch,
            micro_batches: None,
            measure_micro_batches: true,
            schedule: Schedule::OneFOneB,
            shared_cores: None,
        }
    }
}

/// Where a shape's micro-batch count came from.
#[derive(Debug, Clone, PartialEq)]
pub enum MicroBatchSource {
    /// The user's count ([`ShapeSettings::micro_batches`]).
    Configured,
    /// The paper's count for K (no measured times, or measuring off).
    Paper,
    /// The fastest predicted from measured times, and every candidate.
    Measured(MicroBatchChoice),
}

/// A shape's micro-batch count M, and where it came from.
#[derive(Debug, Clone, PartialEq)]
pub struct MicroBatches {
    /// Micro-batches per replica per step.
    pub count: usize,
    /// Why this count.
    pub source: MicroBatchSource,
}

impl MicroBatches {
    /// The measured choice, when M was measured.
    pub fn choice(&self) -> Option<&MicroBatchChoice> {
        match &self.source {
            MicroBatchSource::Measured(choice) => Some(choice),
            _ => None,
        }
    }
}

/// The one owner of a run's shape decisions: the start shape
/// ([`start`](Self::start)), the shape after the freeze front moves
/// ([`after_move`](Self::after_move)), the micro-batch count of a shape
/// ([`micro_batches`](Self::micro_batches)) and whether a shape fits the
/// memory budget ([`fits`](Self::fits), [`stage_memory`](Self::stage_memory)),
/// on what is known of the units: their costs, their memory and, once
/// measured, their times at several micro-batch sizes. The
/// [`Trainer`](crate::Trainer) asks it at every decision and the planner
/// ([`plan`](crate::plan::plan)) for every epoch it predicts.
///
/// ```
/// use burn_elastic_dp::BatchPolicy;
/// use burn_elastic_dp::shape::{PipelineShape, ShapeRule, ShapeSettings};
/// use burn_pipe::{UnitCosts, UnitMemory};
///
/// let mut settings = ShapeSettings::new(4, BatchPolicy::FixedGlobal { batch: 32 });
/// settings.stages = Some(4); // the paper's start: one pipeline over every device
/// let costs = UnitCosts::from_params(&[1; 8], 1.0 / 3.0);
/// let mut rule = ShapeRule::new(settings, costs, UnitMemory::from_param_counts(&[1; 8], 4));
/// let start = rule.start().unwrap();
/// assert_eq!(start, PipelineShape { balance: vec![2; 4], replicas: 1 });
/// // Half the units frozen and cached: 2 stages do what 4 did, on 2 replicas.
/// let next = rule.after_move((0, 4), &start).unwrap();
/// assert_eq!(next, PipelineShape { balance: vec![6, 2], replicas: 2 });
/// // No micro-batch times measured: the paper's count for K = 2.
/// assert_eq!(rule.micro_batches(&next, 4, 2).count, burn_pipe::default_micro_batches(2));
/// ```
#[derive(Debug, Clone)]
pub struct ShapeRule {
    settings: ShapeSettings,
    costs: UnitCosts,
    memory: UnitMemory,
    /// The largest stage's cost at the start: no later stage exceeds it
    /// (the paper's compression).
    initial_largest: f64,
    /// Unit times at several micro-batch sizes, once measured or given.
    times: Option<MicroBatchTimes>,
}

impl ShapeRule {
    /// The rule of a run of `settings` on units costing `costs` and holding
    /// `memory` (what the freeze rule's evidence keeps included).
    pub fn new(settings: ShapeSettings, costs: UnitCosts, memory: UnitMemory) -> Self {
        Self {
            settings,
            costs,
            memory,
            initial_largest: 0.0,
            times: None,
        }
    }

    /// The settings.
    pub fn settings(&self) -> &ShapeSettings {
        &self.settings
    }

    /// The units' costs.
    pub fn costs(&self) -> &UnitCosts {
        &self.costs
    }

    /// The units' memory.
    pub fn memory(&self) -> &UnitMemory {
        &self.memory
    }

    /// The micro-batch times M is chosen from, once measured or given.
    pub fn micro_batch_times(&self) -> Option<&MicroBatchTimes> {
        self.times.as_ref()
    }

    /// The largest stage's cost at the start ([`start`](Self::start)).
    pub fn initial_largest(&self) -> f64 {
        self.initial_largest
    }

    /// Takes measured (or restored) unit costs.
    pub fn set_costs(&mut self, costs: UnitCosts) {
        self.costs = costs;
    }

    /// Takes measured (or restored) unit memory.
    pub fn set_memory(&mut self, memory: UnitMemory) {
        self.memory = memory;
    }

    /// Takes the micro-batch times every later count is chosen from.
    pub fn set_micro_batch_times(&mut self, times: Option<MicroBatchTimes>) {
        self.times = times;
    }

    /// Takes a restored start bound (a checkpoint's).
    pub fn set_initial_largest(&mut self, largest: f64) {
        self.initial_largest = largest;
    }

    /// Whether a run of these settings measures micro-batch times before
    /// its first step: no count given, measuring on, a pipeline of more
    /// than one stage somewhere in the run (one stage has no bubble: M = 1),
    /// no times yet.
    pub fn wants_micro_batch_times(&self, stages: usize) -> bool {
        self.settings.micro_batches.is_none()
            && self.settings.measure_micro_batches
            && self.times.is_none()
            && stages > 1
    }

    /// Memory-aware AutoPipe's fit: with a budget, or with the start left
    /// to the rule (then without a budget every model fits one device);
    /// `None`: the paper's rule (a fixed start, compression under the
    /// starting largest stage). Its estimate counts the user's M, else the
    /// paper's for each K.
    pub fn memory_fit(&self) -> Option<MemoryFit> {
        let s = &self.settings;
        if s.stages.is_some() && s.device_bytes.is_none() {
            return None;
        }
        Some(self.fit(s.device_bytes.unwrap_or(u64::MAX)))
    }

    /// The units' memory estimate under the settings, `device_bytes` a
    /// device.
    fn fit(&self, device_bytes: u64) -> MemoryFit {
        let s = &self.settings;
        MemoryFit {
            units: self.memory.clone(),
            device_bytes,
            batch: s.batch,
            micro_batches: s.micro_batches,
            schedule: s.schedule,
            optimizer_slots: s.optimizer_slots,
        }
    }

    /// The start shape, and the bound later shapes keep: the configured
    /// stages (balanced exactly on the active costs; which must fit a
    /// budget when one is given), else the fewest stages whose every stage
    /// fits (memory-aware AutoPipe). The one answer to "where does the run
    /// start", for the trainer and the planner alike.
    pub fn start(&mut self) -> Result<PipelineShape, StartError> {
        let (shape, largest) = self.starting()?;
        self.initial_largest = largest;
        Ok(shape)
    }

    /// [`start`](Self::start)'s shape and its largest stage's cost, the
    /// bound left as it is.
    fn starting(&self) -> Result<(PipelineShape, f64), StartError> {
        let devices = self.settings.devices;
        let fit = self.memory_fit();
        let (shape, largest) = match (self.settings.stages, &fit) {
            (Some(stages), _) => balanced_shape(&self.costs, stages, (devices / stages).max(1)),
            (None, Some(fit)) => {
                fewest_fitting_stages(&self.costs, fit, devices).map_err(StartError::NoFit)?
            }
            (None, None) => balanced_shape(&self.costs, devices.min(self.costs.len()).max(1), 1),
        };
        if let Some(fit) = &fit {
            let held = fit.stage_memory(&shape.balance, 0, devices);
            if let Some((stage, over)) = held
                .iter()
                .enumerate()
                .find(|(_, m)| m.total() > fit.device_bytes)
            {
                return Err(StartError::StageOver(super::memory::StageOver {
                    stage,
                    stages: shape.stages(),
                    needed: over.total(),
                    budget: fit.device_bytes,
                }));
            }
            tracing::info!(
                K = shape.stages(),
                estimated = ?held.iter().map(|m| m.total()).collect::<Vec<_>>(),
                budget = fit.device_bytes,
                activations_known = self.memory.knows_activations(),
                "memory per stage (bytes)"
            );
        }
        Ok((shape, largest))
    }

    /// The shape for the front `front`, reached from `front_before` with
    /// the run in `before`. Up (or staying), AutoPipe compresses from
    /// `before`, no stage costlier than at the start (the paper's rule) or,
    /// with a budget, every stage within it (memory-aware AutoPipe); AutoDP
    /// runs `devices / K` replicas. Down (a thaw) cannot lengthen a
    /// pipeline, so the shape is derived from the start: the start shape
    /// (front 0), then the rule up to `front`, so that AutoPipe lengthens
    /// the pipeline when the budget (or the paper's bound) needs it. A part
    /// that is off keeps its value.
    pub fn after_move(
        &self,
        (front_before, front): (usize, usize),
        before: &PipelineShape,
    ) -> Result<PipelineShape, StartError> {
        let start = if front < front_before {
            let (start, _) = self.starting()?;
            if front == 0 {
                return Ok(start);
            }
            Some(start)
        } else {
            None
        };
        let s = &self.settings;
        let rules = Reshaping::new(s.pipe, s.dp, s.cache, s.devices, self.initial_largest)
            .with_memory(self.memory_fit());
        Ok(reshape(
            &self.costs,
            front,
            start.as_ref().unwrap_or(before),
            &rules,
        ))
    }

    /// M for `shape` with units `0..front` frozen, its replicas among
    /// `total_replicas` in the whole group (across processes): the user's
    /// count; else, with measured times, the count whose predicted step is
    /// the fastest (burn-pipe's step model, the cached prefix served on
    /// stage 0) among those whose stages fit the memory budget (the
    /// activations in flight grow with the micro-batch); else the paper's
    /// count for K. A shape with no replica (a
    /// lost group) has the paper's.
    pub fn micro_batches(
        &self,
        shape: &PipelineShape,
        front: usize,
        total_replicas: usize,
    ) -> MicroBatches {
        let stages = shape.stages();
        if let Some(count) = self.settings.micro_batches {
            return MicroBatches {
                count,
                source: MicroBatchSource::Configured,
            };
        }
        let paper = MicroBatches {
            count: default_micro_batches(stages.max(1)),
            source: MicroBatchSource::Paper,
        };
        let Some(times) = self
            .times
            .as_ref()
            .filter(|_| total_replicas > 0 && stages > 0)
        else {
            return paper;
        };
        let units = self.costs.len();
        let cached = match self.settings.cache && front > 0 {
            true => burn_freeze::plumbing::cached_prefix(front, &shape.balance),
            false => 0,
        };
        let states: Vec<UnitState> = (0..units)
            .map(|u| UnitState::of(u, front, cached))
            .collect();
        let query = MicroBatchQuery {
            balance: &shape.balance,
            states: &states,
            batch_per_replica: self.settings.batch.global_batch(total_replicas) / total_replicas,
            schedule: self.settings.schedule,
            shared: self.settings.shared(shape.replicas),
        };
        // With a budget, only counts whose stages fit it (the shape fits at
        // the paper's count, which it was judged at).
        let budget = self.memory_fit().filter(|fit| fit.device_bytes < u64::MAX);
        let fits = |m: usize| {
            budget.as_ref().is_none_or(|fit| {
                let fit = MemoryFit {
                    micro_batches: Some(m),
                    ..fit.clone()
                };
                fit.fits(&shape.balance, front, self.settings.devices)
            })
        };
        match choose_micro_batches_where(times, &query, |c| fits(c.micro_batches)) {
            Ok(choice) => MicroBatches {
                count: choice.micro_batches,
                source: MicroBatchSource::Measured(choice),
            },
            Err(error) => {
                tracing::warn!(%error, "micro-batches not chosen; the paper's count holds");
                paper
            }
        }
    }

    /// The estimate of what each stage of `balance` holds with units
    /// `0..front` frozen (see [`UnitMemory::stages`]); unlimited when no
    /// budget is given.
    pub fn stage_memory(&self, balance: &[usize], front: usize) -> Vec<StageMemory> {
        let fit = self.memory_fit().unwrap_or_else(|| self.fit(u64::MAX));
        fit.stage_memory(balance, front, self.settings.devices)
    }

    /// Whether every stage of `balance` fits the budget at `front` (always,
    /// without one).
    pub fn fits(&self, balance: &[usize], front: usize) -> bool {
        match self.memory_fit() {
            Some(fit) => fit.fits(balance, front, self.settings.devices),
            None => true,
        }
    }

    /// The fewest samples a step takes with `replicas` replicas (the whole
    /// group's) of `micro_batches` micro-batches each: one per micro-batch
    /// of every replica.
    pub fn min_batch(replicas: usize, micro_batches: usize) -> usize {
        replicas * micro_batches
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use burn_pipe::UnitProfile;

    use super::*;

    fn rule(stages: Option<usize>, devices: usize) -> ShapeRule {
        let mut settings = ShapeSettings::new(devices, BatchPolicy::FixedGlobal { batch: 64 });
        settings.stages = stages;
        let params = [100; 8];
        ShapeRule::new(
            settings,
            UnitCosts::from_params(&params, 1.0 / 3.0),
            UnitMemory::from_param_counts(&params, 4),
        )
    }

    /// A table in which a micro-batch costs a fixed 10 ms plus 1 ms a
    /// sample: few, large micro-batches are fastest.
    fn overhead_times() -> MicroBatchTimes {
        MicroBatchTimes::from_fn(&[1, 2, 4, 8, 16, 32], 8, |_, n| UnitProfile {
            forward: Duration::from_micros(10_000 + 1_000 * n as u64),
            backward: Duration::from_micros(20_000 + 2_000 * n as u64),
        })
        .unwrap()
    }

    #[test]
    fn without_times_the_paper_count_holds_and_a_given_count_wins() {
        let mut rule = rule(Some(4), 4);
        let shape = rule.start().unwrap();
        let m = rule.micro_batches(&shape, 0, 1);
        assert_eq!(
            (m.count, &m.source),
            (default_micro_batches(4), &MicroBatchSource::Paper)
        );
        rule.settings.micro_batches = Some(3);
        rule.set_micro_batch_times(Some(overhead_times()));
        assert_eq!(rule.micro_batches(&shape, 0, 1).count, 3);
        assert!(!rule.wants_micro_batch_times(4));
    }

    #[test]
    fn measured_times_choose_for_each_shape() {
        let mut rule = rule(Some(2), 4);
        assert!(rule.wants_micro_batch_times(2) && !rule.wants_micro_batch_times(1));
        rule.set_micro_batch_times(Some(overhead_times()));
        assert!(!rule.wants_micro_batch_times(2));
        let shape = rule.start().unwrap();
        assert_eq!((shape.stages(), shape.replicas), (2, 2));
        let m = rule.micro_batches(&shape, 0, 2);
        let choice = m.choice().expect("measured");
        // A fixed cost per micro-batch: fewer than the paper's 16 at K = 2.
        assert!(m.count < choice.paper_micro_batches, "{m:?}");
        // One stage has no bubble: one micro-batch.
        let one = PipelineShape {
            balance: vec![8],
            replicas: 4,
        };
        assert_eq!(rule.micro_batches(&one, 0, 4).count, 1);
    }

    #[test]
    fn a_measured_count_keeps_the_stages_within_the_budget() {
        let mut rule = rule(Some(2), 2);
        // Activations of 10 000 bytes per sample and unit: the fewer and
        // larger the micro-batches, the more 1F1B keeps in flight.
        let memory = UnitMemory::new(vec![400; 8], vec![10_000; 8]);
        rule.set_memory(memory);
        rule.set_micro_batch_times(Some(overhead_times()));
        let shape = rule.start().unwrap();
        let free = rule.micro_batches(&shape, 0, 1).count;
        // A budget that holds the paper's count (16 micro-batches of 4 at
        // K = 2) but not the fastest unbounded count.
        let paper = rule.stage_memory(&shape.balance, 0);
        let worst = paper.iter().map(|m| m.total()).max().unwrap();
        rule.settings.device_bytes = Some(worst);
        assert!(rule.fits(&shape.balance, 0));
        let bounded = rule.micro_batches(&shape, 0, 1).count;
        assert!(bounded > free, "{bounded} <= {free}");
        let fit = MemoryFit {
            micro_batches: Some(bounded),
            ..rule.memory_fit().unwrap()
        };
        assert!(fit.fits(&shape.balance, 0, 2));
    }

    #[test]
    fn the_start_is_one_function_for_fixed_and_fitting_starts() {
        let mut fixed = rule(Some(4), 4);
        assert_eq!(fixed.start().unwrap().balance, vec![2; 4]);
        assert!(fixed.initial_largest() > 0.0);
        // Left to memory-aware AutoPipe without a budget: one stage.
        let mut free = rule(None, 4);
        let start = free.start().unwrap();
        assert_eq!((start.stages(), start.replicas), (1, 4));
        // A budget a quarter of the model fits: four stages.
        free.settings.device_bytes = Some(2 * 1600);
        assert_eq!(free.start().unwrap().balance, vec![2; 4]);
        assert!(free.fits(&[2; 4], 0) && !free.fits(&[4, 4], 0));
        free.settings.device_bytes = Some(1000);
        assert!(matches!(free.start(), Err(StartError::NoFit(_))));
    }

    #[test]
    fn a_thaw_goes_back_through_the_start() {
        let mut rule = rule(Some(4), 4);
        let start = rule.start().unwrap();
        let up = rule.after_move((0, 6), &start).unwrap();
        assert!(up.stages() < 4);
        assert_eq!(rule.after_move((6, 0), &up).unwrap(), start);
    }
}
