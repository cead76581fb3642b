//! The deadline collector: the coordinating thread waits for every replica's share of a step within
//! the step's bound, and leaves behind a replica still in its own computation.

use std::time::{Duration, Instant};

use burn::tensor::backend::Backend;
use burn_freeze::StackTypes;
use burn_pipe::{Pipeline, StepReport};
use crossbeam_channel::Receiver;

use super::nodes::OtherNodes;
use crate::error::ElasticError;

/// What a replica's share of a step gives: its pipelined pass, and the time
/// it waited on the all-reduce of its gradients after computing.
/// A replica's share of a step: its pipeline's report, the exposed
/// communication, and the seconds its pass lost to bubbles (worked out on
/// the replica's own thread).
pub(super) type ShareResult = Result<(StepReport, Duration, f64), ElasticError>;

/// What a replica thread tells the coordinating thread.
pub(super) enum Progress<S: StackTypes, O> {
    /// Every stage of the replica finished computing its pass: from here on
    /// it only waits on the all-reduce.
    Arrived(usize),
    /// The replica's share of the step ended: its pipeline comes back.
    Done(usize, Box<Pipeline<S, O>>, ShareResult),
}

/// Whom the step still waited for when its deadline passed (before any
/// failure had reset the collective).
#[derive(Debug)]
pub(super) struct Overdue {
    /// Replicas still in their own pass at the deadline; every unfinished
    /// replica when all had reached the all-reduce (it stalled).
    pub replicas: Vec<usize>,
    /// The error naming the step and the processes an exchange between
    /// processes waited for, when every replica had reached the all-reduce.
    pub node: Option<ElasticError>,
}

/// What the replicas left when the wait ended.
pub(super) struct Collected<S: StackTypes, O> {
    /// Per replica, its pipeline if it came back (`None`: left behind).
    pub pipelines: Vec<Option<Pipeline<S, O>>>,
    /// Per replica, its share's result if it came back.
    pub results: Vec<Option<ShareResult>>,
    /// Set when the deadline passed before any failure.
    pub overdue: Option<Overdue>,
}

/// The grace after a reset: a tenth of the bound, 20 ms to 1 s.
fn grace(timeout: Duration) -> Duration {
    (timeout / 10).clamp(Duration::from_millis(20), Duration::from_secs(1))
}

/// Waits for `count` replicas' shares of a step on `rx`, at most `timeout`
/// and a short grace; resets the collective of backend `B` (and aborts
/// `nodes`) on the first failure or at the deadline.
///
/// The reset (and the abort of the link to the other processes) makes the
/// replicas blocked in an all-reduce return; the collector then waits a
/// short grace for them, and a replica not back by then is still in its own
/// computation and is left behind.
pub(super) fn collect<B, S, O>(
    rx: Receiver<Progress<S, O>>,
    count: usize,
    timeout: Duration,
    nodes: &OtherNodes,
) -> Collected<S, O>
where
    B: Backend,
    S: StackTypes,
{
    let deadline = Instant::now() + timeout;
    let grace = grace(timeout);
    let mut collected = Collected {
        pipelines: (0..count).map(|_| None).collect(),
        results: (0..count).map(|_| None).collect(),
        overdue: None,
    };
    // Replicas that reached the all-reduce (their pass is done).
    let mut arrived = vec![false; count];
    let mut reset = false;
    // When the deadline passed: from then on, only a short grace.
    let mut timed_out: Option<Instant> = None;
    while collected.pipelines.iter().any(Option::is_none) {
        let bound = timed_out.map_or(deadline, |at| at + grace);
        match rx.recv_deadline(bound) {
            Ok(Progress::Arrived(replica)) => arrived[replica] = true,
            Ok(Progress::Done(replica, pipeline, result)) => {
                arrived[replica] = true;
                if result.is_err() && !reset && (count > 1 || nodes.exist()) {
                    burn::collective::reset_collective::<B>();
                    nodes.abort();
                    reset = true;
                }
                collected.pipelines[replica] = Some(*pipeline);
                collected.results[replica] = Some(result);
            }
            Err(_) if timed_out.is_none() => {
                timed_out = Some(Instant::now());
                if !reset {
                    collected.overdue = Some(overdue(&arrived, &collected.results, nodes));
                    nodes.abort();
                    burn::collective::reset_collective::<B>();
                    reset = true;
                }
            }
            Err(_) => break,
        }
    }
    collected
}

/// Whom the step waits for at its deadline.
fn overdue(arrived: &[bool], results: &[Option<ShareResult>], nodes: &OtherNodes) -> Overdue {
    let late: Vec<usize> = (0..arrived.len()).filter(|&r| !arrived[r]).collect();
    let all_arrived = late.is_empty();
    Overdue {
        replicas: if all_arrived {
            (0..results.len())
                .filter(|&r| results[r].is_none())
                .collect()
        } else {
            late
        },
        node: nodes.waiting_on().filter(|_| all_arrived),
    }
}
