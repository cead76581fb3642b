//! Choosing the micro-batch count M by measurement: each unit's forward and
//! backward time profiled at a few micro-batch sizes ([`MicroBatchTimes`]),
//! and the step time of every candidate M predicted by running the
//! pipeline's schedule on those times ([`predict_step`]); the fastest wins
//! ([`choose_micro_batches`]). Pure functions: no clock, no device.
//!
//! The paper fixes M per pipeline length
//! ([`default_micro_batches`](crate::default_micro_batches)); with a small
//! batch per replica that cuts micro-batches below the size where the
//! device stops gaining, and a shorter pipeline with fewer, larger
//! micro-batches is faster.

use burn::serde::{Deserialize, Serialize};

use crate::config::Schedule;
use crate::microbatch::micro_batch_sizes;
use crate::partition::{UnitState, default_micro_batches};
use crate::profile::UnitProfile;
use crate::schedule::{Op, stage_ops};

/// What is wrong with a timing table or a query.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MicroSearchError {
    /// No micro-batch size measured.
    #[error("a timing table needs at least one micro-batch size, got none")]
    NoSizes,
    /// Sizes not strictly increasing from 1 up.
    #[error("micro-batch sizes {sizes:?} must be at least 1 and strictly increasing")]
    BadSizes {
        /// The sizes given.
        sizes: Vec<usize>,
    },
    /// A size's profile with another number of units than the first's.
    #[error(
        "the profile at micro-batch size {size} has {units} units, expected {expected} (at least 1)"
    )]
    UnitCount {
        /// The micro-batch size.
        size: usize,
        /// Units in its profile.
        units: usize,
        /// Units in the first size's profile.
        expected: usize,
    },
    /// Not one profile per size.
    #[error("{profiles} profiles given for {sizes} micro-batch sizes: give one per size")]
    ProfileCount {
        /// Profiles given.
        profiles: usize,
        /// Sizes given.
        sizes: usize,
    },
    /// More micro-batches than samples, or none.
    #[error("{micro_batches} micro-batches of a batch of {batch}: M must be 1 to {batch}")]
    MicroBatchCount {
        /// M asked for.
        micro_batches: usize,
        /// Samples per replica.
        batch: usize,
    },
    /// A size to profile beyond the samples at hand.
    #[error(
        "cannot profile micro-batches of {size} samples on a batch of {batch}: sizes must be 1 to {batch}"
    )]
    SizeTooLarge {
        /// The size asked for.
        size: usize,
        /// Samples in the batch.
        batch: usize,
    },
    /// No sample per replica.
    #[error("the batch per replica must be at least 1 sample, got 0")]
    NoSamples,
    /// A balance that does not cover the timed units with non-empty stages.
    #[error("balance {balance:?} does not split the {units} timed units into non-empty stages")]
    BadBalance {
        /// Units per stage, as given.
        balance: Vec<usize>,
        /// Units in the table.
        units: usize,
    },
    /// Not one state per unit.
    #[error("{states} unit states given for {units} timed units: give one per unit")]
    StateCount {
        /// States given.
        states: usize,
        /// Units in the table.
        units: usize,
    },
}

/// Each unit's forward and backward time at several micro-batch sizes: a
/// profile per size ([`profile_micro_batches`](crate::profile_micro_batches)
/// measures one), read at any size by linear interpolation between the
/// measured sizes. Below the smallest size a micro-batch costs what the
/// smallest did; above the largest, the largest's time per sample.
///
/// ```
/// use std::time::Duration;
/// use burn_pipe::{MicroBatchTimes, UnitProfile};
///
/// // Two units; a micro-batch of n samples costs n ms forward, 2n ms backward.
/// let times = MicroBatchTimes::from_fn(&[1, 4], 2, |_unit, n| UnitProfile {
///     forward: Duration::from_millis(n as u64),
///     backward: Duration::from_millis(2 * n as u64),
/// })?;
/// assert_eq!(times.units(), 2);
/// let (forward, backward) = times.unit_seconds(0, 2);
/// assert!((forward - 0.002).abs() < 1e-12 && (backward - 0.004).abs() < 1e-12);
/// assert!((times.unit_seconds(1, 8).0 - 0.008).abs() < 1e-12);
/// # Ok::<(), burn_pipe::MicroSearchError>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct MicroBatchTimes {
    sizes: Vec<usize>,
    /// `profiles[i][u]`: unit `u` at `sizes[i]` samples.
    profiles: Vec<Vec<UnitProfile>>,
}

impl MicroBatchTimes {
    /// From one profile per size (`profiles[i]`, every unit at `sizes[i]`
    /// samples). Fails when there is no size, the sizes are not strictly
    /// increasing from 1 up, or the profiles differ in their (non-zero)
    /// number of units.
    pub fn new(
        sizes: Vec<usize>,
        profiles: Vec<Vec<UnitProfile>>,
    ) -> Result<Self, MicroSearchError> {
        check_sizes(&sizes)?;
        if profiles.len() != sizes.len() {
            return Err(MicroSearchError::ProfileCount {
                profiles: profiles.len(),
                sizes: sizes.len(),
            });
        }
        let expected = profiles[0].len();
        for (profile, &size) in profiles.iter().zip(&sizes) {
            if profile.len() != expected || expected == 0 {
                return Err(MicroSearchError::UnitCount {
                    size,
                    units: profile.len(),
                    expected,
                });
            }
        }
        Ok(Self { sizes, profiles })
    }

    /// A table of `units` units at `sizes`, unit `u` at `n` samples timed
    /// `time(u, n)`: synthetic tables, for tests and what-if studies.
    pub fn from_fn(
        sizes: &[usize],
        units: usize,
        time: impl Fn(usize, usize) -> UnitProfile,
    ) -> Result<Self, MicroSearchError> {
        let profiles = sizes
            .iter()
            .map(|&n| (0..units).map(|u| time(u, n)).collect())
            .collect();
        Self::new(sizes.to_vec(), profiles)
    }

    /// Units timed.
    pub fn units(&self) -> usize {
        self.profiles[0].len()
    }

    /// The measured sizes, increasing.
    pub fn sizes(&self) -> &[usize] {
        &self.sizes
    }

    /// Unit `unit`'s forward and backward seconds on a micro-batch of `size`
    /// samples.
    ///
    /// # Panics
    /// When `unit >= units()`.
    pub fn unit_seconds(&self, unit: usize, size: usize) -> (f64, f64) {
        let point = |i: usize| {
            let p = &self.profiles[i][unit];
            (p.forward.as_secs_f64(), p.backward.as_secs_f64())
        };
        let last = self.sizes.len() - 1;
        match self.sizes.binary_search(&size) {
            Ok(i) => point(i),
            Err(0) => point(0),
            Err(i) if i > last => {
                let (f, b) = point(last);
                let scale = size as f64 / self.sizes[last] as f64;
                (f * scale, b * scale)
            }
            Err(i) => {
                let (lo, hi) = (self.sizes[i - 1] as f64, self.sizes[i] as f64);
                let w = (size as f64 - lo) / (hi - lo);
                let ((f0, b0), (f1, b1)) = (point(i - 1), point(i));
                (f0 + w * (f1 - f0), b0 + w * (b1 - b0))
            }
        }
    }

    /// A stage's forward and backward seconds on `size` samples: the sum
    /// over `units` of each unit's, under the one cost rule (a frozen unit
    /// runs forward only, a cached one not at all).
    fn stage_seconds(
        &self,
        units: std::ops::Range<usize>,
        states: &[UnitState],
        size: usize,
    ) -> (f64, f64) {
        units.fold((0.0, 0.0), |(f, b), u| {
            let (uf, ub) = self.unit_seconds(u, size);
            match states[u] {
                UnitState::Training => (f + uf, b + ub),
                UnitState::Frozen => (f + uf, b),
                UnitState::Cached => (f, b),
            }
        })
    }
}

/// At least one size, strictly increasing from 1 up.
pub(crate) fn check_sizes(sizes: &[usize]) -> Result<(), MicroSearchError> {
    if sizes.is_empty() {
        return Err(MicroSearchError::NoSizes);
    }
    if sizes[0] == 0 || sizes.windows(2).any(|w| w[0] >= w[1]) {
        return Err(MicroSearchError::BadSizes {
            sizes: sizes.to_vec(),
        });
    }
    Ok(())
}

/// The sizes at which to profile for batches of up to `batch` samples per
/// replica: the powers of two below `batch`, and `batch` itself.
///
/// ```
/// assert_eq!(burn_pipe::micro_batch_profile_sizes(12), vec![1, 2, 4, 8, 12]);
/// assert_eq!(burn_pipe::micro_batch_profile_sizes(1), vec![1]);
/// assert!(burn_pipe::micro_batch_profile_sizes(0).is_empty());
/// ```
pub fn micro_batch_profile_sizes(batch: usize) -> Vec<usize> {
    let mut sizes: Vec<usize> = (0..usize::BITS)
        .map(|p| 1usize << p)
        .take_while(|&n| n < batch)
        .collect();
    if batch > 0 {
        sizes.push(batch);
    }
    sizes
}

/// The micro-batch counts searched for `stages` stages and a batch of
/// `batch` samples per replica: 1 up to the paper's range's top, 6K (or the
/// paper's own count when larger), never more than the samples, so every
/// micro-batch has at least one.
///
/// ```
/// assert_eq!(burn_pipe::micro_batch_candidates(4, 32), (1..=24).collect::<Vec<_>>());
/// assert_eq!(burn_pipe::micro_batch_candidates(2, 8), (1..=8).collect::<Vec<_>>());
/// assert_eq!(burn_pipe::micro_batch_candidates(1, 32), (1..=6).collect::<Vec<_>>());
/// ```
pub fn micro_batch_candidates(stages: usize, batch: usize) -> Vec<usize> {
    let top = (6 * stages).max(default_micro_batches(stages));
    (1..=top.min(batch)).collect()
}

/// One shape whose micro-batch count is asked for.
#[derive(Debug, Clone, Copy)]
pub struct MicroBatchQuery<'a> {
    /// Units per stage (K = its length).
    pub balance: &'a [usize],
    /// Each unit's state (see [`UnitState::of`]).
    pub states: &'a [UnitState],
    /// Samples per replica per step.
    pub batch_per_replica: usize,
    /// The pipeline's schedule.
    pub schedule: Schedule,
}

/// One candidate micro-batch count and its predicted step.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(crate = "burn::serde")]
pub struct MicroBatchCandidate {
    /// M.
    pub micro_batches: usize,
    /// Samples in its largest micro-batch.
    pub micro_batch: usize,
    /// Predicted seconds of one replica's forward and backward pass.
    pub predicted_step_s: f64,
}

/// What [`choose_micro_batches`] chose, and every candidate it weighed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(crate = "burn::serde")]
pub struct MicroBatchChoice {
    /// The chosen M.
    pub micro_batches: usize,
    /// Its predicted seconds per step (one replica's pass).
    pub predicted_step_s: f64,
    /// The paper's M for this K ([`default_micro_batches`]), for comparison.
    pub paper_micro_batches: usize,
    /// Every candidate, by increasing M.
    pub candidates: Vec<MicroBatchCandidate>,
}

impl MicroBatchChoice {
    /// The predicted step of `micro_batches`, if it was a candidate.
    pub fn predicted(&self, micro_batches: usize) -> Option<f64> {
        self.candidates
            .iter()
            .find(|c| c.micro_batches == micro_batches)
            .map(|c| c.predicted_step_s)
    }
}

/// Checks a query against a table of `units` units.
fn check_query(units: usize, query: &MicroBatchQuery<'_>) -> Result<(), MicroSearchError> {
    if query.batch_per_replica == 0 {
        return Err(MicroSearchError::NoSamples);
    }
    let balance = query.balance;
    if balance.is_empty() || balance.contains(&0) || balance.iter().sum::<usize>() != units {
        return Err(MicroSearchError::BadBalance {
            balance: balance.to_vec(),
            units,
        });
    }
    if query.states.len() != units {
        return Err(MicroSearchError::StateCount {
            states: query.states.len(),
            units,
        });
    }
    Ok(())
}

/// Predicted seconds of one replica's forward and backward pass of the
/// query's shape with `micro_batches` micro-batches (1 to the batch): the
/// schedule's passes ([`stage_ops`]) run on each stage in order, each as
/// soon as its stage is free and its input (the previous stage's forward,
/// the next stage's backward) has arrived, every pass taking the table's
/// time at its micro-batch's size. Sending a message costs nothing here.
/// With K equal stages of time `t` per micro-batch, this is
/// `(M + K - 1) t`.
///
/// ```
/// use std::time::Duration;
/// use burn_pipe::{predict_step, MicroBatchQuery, MicroBatchTimes, Schedule, UnitProfile, UnitState};
///
/// let times = MicroBatchTimes::from_fn(&[1, 8], 4, |_, n| UnitProfile {
///     forward: Duration::from_millis(n as u64),
///     backward: Duration::from_millis(2 * n as u64),
/// })?;
/// let query = MicroBatchQuery {
///     balance: &[1, 1, 1, 1],
///     states: &[UnitState::Training; 4],
///     batch_per_replica: 8,
///     schedule: Schedule::OneFOneB,
/// };
/// // 4 micro-batches of 2: (4 + 3) x 6 ms.
/// assert!((predict_step(&times, &query, 4)? - 0.042).abs() < 1e-9);
/// # Ok::<(), burn_pipe::MicroSearchError>(())
/// ```
pub fn predict_step(
    times: &MicroBatchTimes,
    query: &MicroBatchQuery<'_>,
    micro_batches: usize,
) -> Result<f64, MicroSearchError> {
    check_query(times.units(), query)?;
    let sizes = micro_batch_sizes(query.batch_per_replica, micro_batches).map_err(|_| {
        MicroSearchError::MicroBatchCount {
            micro_batches,
            batch: query.batch_per_replica,
        }
    })?;
    let mut start = 0;
    let stages: Vec<Vec<(f64, f64)>> = query
        .balance
        .iter()
        .map(|&n| {
            let units = start..start + n;
            start += n;
            sizes
                .iter()
                .map(|&size| times.stage_seconds(units.clone(), query.states, size))
                .collect()
        })
        .collect();
    Ok(run_schedule(query.schedule, &stages))
}

/// The makespan of the schedule's passes on stages whose micro-batch `n`
/// takes `stages[s][n]` seconds forward and backward.
fn run_schedule(schedule: Schedule, stages: &[Vec<(f64, f64)>]) -> f64 {
    let (k, m) = (stages.len(), stages[0].len());
    let ops: Vec<Vec<Op>> = (0..k).map(|s| stage_ops(schedule, s, k, m)).collect();
    let mut next = vec![0; k];
    let mut clock = vec![0.0f64; k];
    let mut forward_done = vec![vec![None::<f64>; m]; k];
    let mut backward_done = vec![vec![None::<f64>; m]; k];
    // Each round runs at least one pass (the schedules never deadlock), so
    // at most 2 K M rounds.
    for _ in 0..2 * k * m {
        let mut progressed = false;
        for s in 0..k {
            while let Some(&op) = ops[s].get(next[s]) {
                let (ready, duration) = match op {
                    Op::Forward(n) => {
                        let ready = if s == 0 {
                            Some(0.0)
                        } else {
                            forward_done[s - 1][n]
                        };
                        (ready, stages[s][n].0)
                    }
                    Op::Backward(n) => {
                        let from_next = if s + 1 == k {
                            Some(0.0)
                        } else {
                            backward_done[s + 1][n]
                        };
                        let ready = from_next.zip(forward_done[s][n]).map(|(a, b)| a.max(b));
                        (ready, stages[s][n].1)
                    }
                };
                let Some(ready) = ready else { break };
                let end = clock[s].max(ready) + duration;
                clock[s] = end;
                match op {
                    Op::Forward(n) => forward_done[s][n] = Some(end),
                    Op::Backward(n) => backward_done[s][n] = Some(end),
                }
                next[s] += 1;
                progressed = true;
            }
        }
        if !progressed {
            break;
        }
    }
    clock.into_iter().fold(0.0, f64::max)
}

/// The micro-batch count with the fastest predicted step
/// ([`predict_step`]) among [`micro_batch_candidates`] for the query's
/// shape (the smaller M on a tie: larger micro-batches, fewer messages).
/// Fails on a query that does not fit the table: no sample, a balance that
/// does not cover its units, not one state per unit.
///
/// Per-sample time that rises steeply below 8 samples: at K = 4 on 32
/// samples, 4 micro-batches of 8 beat the paper's 16 of 2.
///
/// ```
/// use std::time::Duration;
/// use burn_pipe::{choose_micro_batches, MicroBatchQuery, MicroBatchTimes, Schedule, UnitProfile, UnitState};
///
/// let times = MicroBatchTimes::from_fn(&[1, 2, 4, 8, 16, 32], 4, |_, n| UnitProfile {
///     forward: Duration::from_micros(100 * n.max(8) as u64),
///     backward: Duration::from_micros(200 * n.max(8) as u64),
/// })?;
/// let choice = choose_micro_batches(&times, &MicroBatchQuery {
///     balance: &[1, 1, 1, 1],
///     states: &[UnitState::Training; 4],
///     batch_per_replica: 32,
///     schedule: Schedule::OneFOneB,
/// })?;
/// assert_eq!(choice.micro_batches, 4);
/// assert_eq!(choice.paper_micro_batches, 16);
/// assert!(choice.predicted(16).unwrap() > choice.predicted_step_s);
/// # Ok::<(), burn_pipe::MicroSearchError>(())
/// ```
pub fn choose_micro_batches(
    times: &MicroBatchTimes,
    query: &MicroBatchQuery<'_>,
) -> Result<MicroBatchChoice, MicroSearchError> {
    check_query(times.units(), query)?;
    let stages = query.balance.len();
    let candidates = micro_batch_candidates(stages, query.batch_per_replica)
        .into_iter()
        .map(|m| {
            Ok(MicroBatchCandidate {
                micro_batches: m,
                micro_batch: query.batch_per_replica.div_ceil(m),
                predicted_step_s: predict_step(times, query, m)?,
            })
        })
        .collect::<Result<Vec<_>, MicroSearchError>>()?;
    let best = candidates
        .iter()
        .copied()
        .reduce(|best, c| {
            if c.predicted_step_s < best.predicted_step_s {
                c
            } else {
                best
            }
        })
        .ok_or(MicroSearchError::NoSamples)?;
    Ok(MicroBatchChoice {
        micro_batches: best.micro_batches,
        predicted_step_s: best.predicted_step_s,
        paper_micro_batches: default_micro_batches(stages),
        candidates,
    })
}
