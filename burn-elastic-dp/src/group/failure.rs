//! The failure precedence: which error a step reports when several replicas fail, or when the
//! deadline passed.

use std::time::Duration;

use burn_pipe::StepReport;

use super::deadline::{Overdue, ShareResult};
use crate::error::ElasticError;

/// Every replica's pass and all-reduce time, or the error the step reports:
/// `results` as the replicas came back (in replica order), `overdue` whom it
/// waited for at the deadline, `timeout` the bound, `lost` the replicas left
/// behind.
///
/// The precedence: a replica's own failure (its pipeline's error, or a panic)
/// explains the others' collective errors and a timeout; a process the
/// exchange waited for at the deadline explains everything; a replica an
/// error names gets its index among the survivors.
pub(super) fn outcome(
    results: Vec<Option<ShareResult>>,
    overdue: Option<Overdue>,
    timeout: Duration,
    lost: &[usize],
) -> Result<(Vec<StepReport>, Vec<Duration>, f64), ElasticError> {
    let mut reports = Vec::with_capacity(results.len());
    let mut all_reduce = Vec::with_capacity(results.len());
    let mut bubble = 0.0;
    let mut failure: Option<ElasticError> = None;
    for result in results.into_iter().flatten() {
        match result {
            Ok((report, reduce, lost)) => {
                reports.push(report);
                all_reduce.push(reduce);
                bubble += lost;
            }
            Err(error) if is_own_failure(&error) => {
                if !failure.as_ref().is_some_and(is_own_failure) {
                    failure = Some(error);
                }
            }
            Err(error) => {
                failure.get_or_insert(error);
            }
        }
    }
    match overdue {
        Some(Overdue {
            node: Some(node), ..
        }) => {
            failure = Some(node);
        }
        Some(Overdue { replicas, .. }) if !failure.as_ref().is_some_and(is_own_failure) => {
            failure = Some(ElasticError::Timeout {
                missing: replicas,
                waited: timeout,
                lost: lost.to_vec(),
            });
        }
        _ => {}
    }
    match failure {
        Some(error) => Err(renumber(error, lost)),
        None => {
            let bubble = bubble / reports.len().max(1) as f64;
            Ok((reports, all_reduce, bubble))
        }
    }
}

/// A replica's own failure: its pipeline's error or a panic, which explains
/// the others' collective errors.
fn is_own_failure(error: &ElasticError) -> bool {
    matches!(
        error,
        ElasticError::Replica { .. } | ElasticError::ReplicaPanicked { .. }
    )
}

/// `error` of a step that lost the replicas `lost`: a replica it names
/// (one that came back) gets its index among the survivors.
fn renumber(error: ElasticError, lost: &[usize]) -> ElasticError {
    let shift = |replica: usize| replica - lost.iter().filter(|&&l| l < replica).count();
    match error {
        ElasticError::Replica { replica, source } => ElasticError::Replica {
            replica: shift(replica),
            source,
        },
        ElasticError::ReplicaPanicked { replica, message } => ElasticError::ReplicaPanicked {
            replica: shift(replica),
            message,
        },
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn panicked(replica: usize) -> ElasticError {
        ElasticError::ReplicaPanicked {
            replica,
            message: "boom".into(),
        }
    }

    fn collective(replica: usize) -> ElasticError {
        ElasticError::Collective {
            replica,
            operation: "all-reduce".into(),
            message: "reset".into(),
        }
    }

    const BOUND: Duration = Duration::from_millis(50);

    #[test]
    fn a_replicas_own_failure_wins_over_the_others_collective_errors() {
        let results = vec![Some(Err(collective(0))), Some(Err(panicked(1)))];
        let error = outcome(results, None, BOUND, &[]).unwrap_err();
        assert!(
            matches!(error, ElasticError::ReplicaPanicked { replica: 1, .. }),
            "{error}"
        );
    }

    #[test]
    fn the_first_own_failure_stays_and_the_first_other_error_stays() {
        let results = vec![
            Some(Err(panicked(0))),
            Some(Err(panicked(1))),
            Some(Err(collective(2))),
        ];
        let error = outcome(results, None, BOUND, &[]).unwrap_err();
        assert!(
            matches!(error, ElasticError::ReplicaPanicked { replica: 0, .. }),
            "{error}"
        );
        let results = vec![Some(Err(collective(0))), Some(Err(collective(1)))];
        let error = outcome(results, None, BOUND, &[]).unwrap_err();
        assert!(
            matches!(error, ElasticError::Collective { replica: 0, .. }),
            "{error}"
        );
    }

    #[test]
    fn a_timeout_wins_over_collective_errors_but_not_over_an_own_failure() {
        let overdue = || Overdue {
            replicas: vec![1],
            node: None,
        };
        let results = vec![Some(Err(collective(0))), None];
        let error = outcome(results, Some(overdue()), BOUND, &[1]).unwrap_err();
        assert!(
            matches!(&error, ElasticError::Timeout { missing, lost, .. } if missing == &[1] && lost == &[1]),
            "{error}"
        );
        let results = vec![None, Some(Err(panicked(1)))];
        let error = outcome(results, Some(overdue()), BOUND, &[0]).unwrap_err();
        // Renumbered among the survivors: replica 0 was lost.
        assert!(
            matches!(error, ElasticError::ReplicaPanicked { replica: 0, .. }),
            "{error}"
        );
    }

    #[test]
    fn a_process_waited_for_at_the_deadline_wins_over_everything() {
        let overdue = Overdue {
            replicas: vec![0],
            node: Some(ElasticError::NodesMissing {
                missing: vec![2],
                waited: BOUND,
            }),
        };
        let results = vec![Some(Err(panicked(0)))];
        let error = outcome(results, Some(overdue), BOUND, &[]).unwrap_err();
        assert!(
            matches!(&error, ElasticError::NodesMissing { missing, .. } if missing == &[2]),
            "{error}"
        );
    }

    #[test]
    fn without_failure_every_report_comes_back_in_replica_order() {
        let report = |loss| StepReport {
            loss,
            micro_batches: 1,
            wall: Duration::ZERO,
            busy: vec![Duration::ZERO],
            peak_saved: vec![1],
            messages: 0,
        };
        let results = vec![
            Some(Ok((report(1.0), Duration::from_millis(1), 0.5))),
            Some(Ok((report(2.0), Duration::from_millis(2), 1.5))),
        ];
        let (reports, all_reduce, bubble) = outcome(results, None, BOUND, &[]).unwrap();
        assert_eq!(bubble, 1.0, "the replicas' mean");
        assert_eq!(reports, vec![report(1.0), report(2.0)]);
        assert_eq!(
            all_reduce,
            vec![Duration::from_millis(1), Duration::from_millis(2)]
        );
    }
}
