//! Choosing M: the paper's count, the candidates, and the step each is
//! predicted to take on measured unit times.

use burn::serde::{Deserialize, Serialize};

use crate::balance::costs::UnitState;
use crate::balance::micro_count::error::MicroSearchError;
use crate::balance::micro_count::times::MicroBatchTimes;
use crate::runtime::schedule::{Op, Schedule, stage_ops};
use crate::runtime::split::micro_batch_sizes;

/// The micro-batch count the paper found best for a pipeline of `stages`
/// stages: 1 without a pipeline, else 16 (2K for K = 8, 4K for K = 4, 8K for
/// K = 2), and 2K beyond 8 stages.
pub fn default_micro_batches(stages: usize) -> usize {
    match stages {
        0 | 1 => 1,
        k => (2 * k).max(16),
    }
}

/// The micro-batch counts searched for `stages` stages and a batch of
/// `batch` samples per replica: 1 up to the paper's range's top, 6K (or the
/// paper's own count when larger), never more than the samples, so every
/// micro-batch has at least one.
///
/// ```
/// assert_eq!(burn_pipe::micro::micro_batch_candidates(4, 32), (1..=24).collect::<Vec<_>>());
/// assert_eq!(burn_pipe::micro::micro_batch_candidates(2, 8), (1..=8).collect::<Vec<_>>());
/// assert_eq!(burn_pipe::micro::micro_batch_candidates(1, 32), (1..=6).collect::<Vec<_>>());
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
    /// When the devices are threads of one machine (logical CPU devices):
    /// the cores they share and the replicas that run on them; `None`:
    /// every stage on a device of its own.
    pub shared: Option<SharedCores>,
}

/// Logical devices that are threads of one machine: every stage of every
/// replica runs on the same `cores`, so a step takes at least the
/// `replicas`' whole work over the cores, however the stages overlap; the
/// fewer and larger the micro-batches, the less work (a backend's per-op
/// cost falls on every micro-batch).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SharedCores {
    /// Cores this process may use (at least 1).
    pub cores: usize,
    /// Replicas that run on them at once.
    pub replicas: usize,
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
/// `(M + K - 1) t`. On devices that share cores ([`SharedCores`]) a step
/// takes at least every replica's passes summed over the cores.
///
/// ```
/// use std::time::Duration;
/// use burn_pipe::{Schedule, UnitProfile};
/// use burn_pipe::balance::UnitState;
/// use burn_pipe::micro::{predict_step, MicroBatchQuery, MicroBatchTimes, SharedCores};
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
///     shared: None,
/// };
/// // 4 micro-batches of 2: (4 + 3) x 6 ms.
/// assert!((predict_step(&times, &query, 4)? - 0.042).abs() < 1e-9);
/// // The 4 stages on one shared core: all 4 x 4 passes of 6 ms in turn.
/// let one_core = MicroBatchQuery { shared: Some(SharedCores { cores: 1, replicas: 1 }), ..query };
/// assert!((predict_step(&times, &one_core, 4)? - 0.096).abs() < 1e-9);
/// # Ok::<(), burn_pipe::micro::MicroSearchError>(())
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
    let makespan = run_schedule(query.schedule, &stages);
    Ok(match query.shared {
        Some(shared) => {
            let work: f64 = stages.iter().flatten().map(|(f, b)| f + b).sum();
            let bound = work * shared.replicas.max(1) as f64 / shared.cores.max(1) as f64;
            makespan.max(bound)
        }
        None => makespan,
    })
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
/// The paper fixes M per pipeline length ([`default_micro_batches`]); with
/// a small batch per replica that cuts micro-batches below the size where
/// the device stops gaining, and fewer, larger micro-batches are faster
/// despite the longer bubble. The prediction leaves out the cost of sending
/// activations between stages and of a larger micro-batch's memory (bound
/// it with [`choose_micro_batches_where`]). Pure functions: no clock, no
/// device.
///
/// Per-sample time that rises steeply below 8 samples: at K = 4 on 32
/// samples, 4 micro-batches of 8 beat the paper's 16 of 2.
///
/// ```
/// use std::time::Duration;
/// use burn_pipe::{choose_micro_batches, Schedule, UnitProfile};
/// use burn_pipe::balance::UnitState;
/// use burn_pipe::micro::{MicroBatchQuery, MicroBatchTimes};
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
///     shared: None,
/// })?;
/// assert_eq!(choice.micro_batches, 4);
/// assert_eq!(choice.paper_micro_batches, 16);
/// assert!(choice.predicted(16).unwrap() > choice.predicted_step_s);
/// # Ok::<(), burn_pipe::micro::MicroSearchError>(())
/// ```
pub fn choose_micro_batches(
    times: &MicroBatchTimes,
    query: &MicroBatchQuery<'_>,
) -> Result<MicroBatchChoice, MicroSearchError> {
    choose_micro_batches_where(times, query, |_| true)
}

/// [`choose_micro_batches`] among the candidates `allowed` accepts (say,
/// those whose micro-batches of `micro_batch` samples keep the activations
/// in flight within a memory budget); every candidate is still listed in
/// the choice. Fails as `choose_micro_batches` does, and when `allowed`
/// accepts none.
///
/// ```
/// use std::time::Duration;
/// use burn_pipe::{Schedule, UnitProfile};
/// use burn_pipe::balance::UnitState;
/// use burn_pipe::micro::{choose_micro_batches_where, MicroBatchQuery, MicroBatchTimes};
///
/// let times = MicroBatchTimes::from_fn(&[1, 32], 2, |_, n| UnitProfile {
///     forward: Duration::from_millis(n as u64),
///     backward: Duration::from_millis(n as u64),
/// })?;
/// let query = MicroBatchQuery {
///     balance: &[1, 1],
///     states: &[UnitState::Training; 2],
///     batch_per_replica: 32,
///     schedule: Schedule::OneFOneB,
///     shared: None,
/// };
/// // At most 4 samples per micro-batch.
/// let choice = choose_micro_batches_where(&times, &query, |c| c.micro_batch <= 4)?;
/// assert!(choice.micro_batches >= 8);
/// assert!(choose_micro_batches_where(&times, &query, |_| false).is_err());
/// # Ok::<(), burn_pipe::micro::MicroSearchError>(())
/// ```
pub fn choose_micro_batches_where(
    times: &MicroBatchTimes,
    query: &MicroBatchQuery<'_>,
    allowed: impl Fn(&MicroBatchCandidate) -> bool,
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
    // The first least: the smaller M on a tie.
    let best = candidates
        .iter()
        .filter(|c| allowed(c))
        .copied()
        .reduce(|best, c| {
            if c.predicted_step_s < best.predicted_step_s {
                c
            } else {
                best
            }
        })
        .ok_or(MicroSearchError::NoCandidate {
            searched: candidates.len(),
        })?;
    Ok(MicroBatchChoice {
        micro_batches: best.micro_batches,
        predicted_step_s: best.predicted_step_s,
        paper_micro_batches: default_micro_batches(stages),
        candidates,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paper_micro_batch_choices() {
        assert_eq!(default_micro_batches(1), 1);
        assert_eq!(default_micro_batches(2), 16);
        assert_eq!(default_micro_batches(4), 16);
        assert_eq!(default_micro_batches(8), 16);
        assert_eq!(default_micro_batches(16), 32);
    }
}
