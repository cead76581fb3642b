//! The order of forward and backward passes on each stage: the one place the
//! pipeline schedule is decided.

use burn::config::Config;

/// Order in which each stage runs the forward and backward passes of its
/// micro-batches. Both give the same gradients.
#[derive(Config, Debug, Copy, PartialEq, Eq)]
pub enum Schedule {
    /// Fill-drain (GPipe): every forward pass, then every backward pass.
    /// Stage `s` holds the activations of all `M` micro-batches at its peak
    /// (with a single stage, one: see [`stage_ops`](crate::stage_ops)).
    GPipe,
    /// One-forward-one-backward (PipeDream-Flush): after a warm-up of
    /// `K - s - 1` forward passes, stage `s` alternates forward and backward,
    /// so it never holds more than `K - s` micro-batches of activations.
    OneFOneB,
}

/// One pass of one micro-batch on one stage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Forward pass of micro-batch `n`.
    Forward(usize),
    /// Backward pass of micro-batch `n`.
    Backward(usize),
}

/// The passes stage `stage` of `stages` runs, in order, for `micro_batches`
/// micro-batches. Every stage runs forwards and backwards in increasing
/// micro-batch order, so messages between neighbours arrive in the order they
/// are consumed.
///
/// With a single stage there is no pipeline to fill or drain, so both
/// schedules run each micro-batch's backward right after its forward and
/// hold one micro-batch's activations (GPipe's fill-drain order would only
/// keep all of them alive at once, for the same gradients).
///
/// ```
/// use burn_pipe::Schedule;
/// use burn_pipe::schedule::{stage_ops, Op};
///
/// // The first of 2 stages under 1F1B: one warm-up forward, then alternate.
/// assert_eq!(
///     stage_ops(Schedule::OneFOneB, 0, 2, 3),
///     vec![Op::Forward(0), Op::Forward(1), Op::Backward(0), Op::Forward(2), Op::Backward(1), Op::Backward(2)]
/// );
/// // One stage: forward then backward, micro-batch by micro-batch.
/// assert_eq!(
///     stage_ops(Schedule::GPipe, 0, 1, 2),
///     vec![Op::Forward(0), Op::Backward(0), Op::Forward(1), Op::Backward(1)]
/// );
/// ```
pub fn stage_ops(schedule: Schedule, stage: usize, stages: usize, micro_batches: usize) -> Vec<Op> {
    assert!(stage < stages, "stage {stage} of {stages}");
    let forwards = (0..micro_batches).map(Op::Forward);
    let backwards = (0..micro_batches).map(Op::Backward);
    match schedule {
        Schedule::GPipe if stages > 1 => forwards.chain(backwards).collect(),
        Schedule::GPipe => (0..micro_batches)
            .flat_map(|n| [Op::Forward(n), Op::Backward(n)])
            .collect(),
        Schedule::OneFOneB => {
            let warmup = (stages - stage - 1).min(micro_batches);
            let mut ops: Vec<Op> = (0..warmup).map(Op::Forward).collect();
            for n in 0..micro_batches - warmup {
                ops.push(Op::Forward(warmup + n));
                ops.push(Op::Backward(n));
            }
            ops.extend((micro_batches - warmup..micro_batches).map(Op::Backward));
            ops
        }
    }
}

/// The most micro-batches whose activations a stage holds at once under `ops`.
pub fn peak_in_flight(ops: &[Op]) -> usize {
    let mut held = 0usize;
    let mut peak = 0;
    for op in ops {
        match op {
            Op::Forward(_) => {
                held += 1;
                peak = peak.max(held);
            }
            Op::Backward(_) => held -= 1,
        }
    }
    peak
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs every stage's ops against each other with unbounded channels and
    /// returns whether all finish (a pass waits for its neighbour's message).
    fn completes(schedule: Schedule, stages: usize, micro_batches: usize) -> bool {
        let ops: Vec<Vec<Op>> = (0..stages)
            .map(|s| stage_ops(schedule, s, stages, micro_batches))
            .collect();
        let mut next = vec![0; stages];
        // forwarded[s][n]: stage s finished Forward(n); backwarded likewise.
        let mut forwarded = vec![vec![false; micro_batches]; stages];
        let mut backwarded = vec![vec![false; micro_batches]; stages];
        loop {
            let mut progressed = false;
            for s in 0..stages {
                let Some(&op) = ops[s].get(next[s]) else {
                    continue;
                };
                let ready = match op {
                    Op::Forward(n) => s == 0 || forwarded[s - 1][n],
                    Op::Backward(n) => forwarded[s][n] && (s + 1 == stages || backwarded[s + 1][n]),
                };
                if ready {
                    match op {
                        Op::Forward(n) => forwarded[s][n] = true,
                        Op::Backward(n) => backwarded[s][n] = true,
                    }
                    next[s] += 1;
                    progressed = true;
                }
            }
            if !progressed {
                return (0..stages).all(|s| next[s] == ops[s].len());
            }
        }
    }

    #[test]
    fn every_micro_batch_runs_once_each_way_forward_first() {
        for schedule in [Schedule::GPipe, Schedule::OneFOneB] {
            for stages in 1..6 {
                for m in 1..10 {
                    for s in 0..stages {
                        let ops = stage_ops(schedule, s, stages, m);
                        assert_eq!(ops.len(), 2 * m);
                        for n in 0..m {
                            let f = ops.iter().position(|&o| o == Op::Forward(n)).unwrap();
                            let b = ops.iter().position(|&o| o == Op::Backward(n)).unwrap();
                            assert!(f < b);
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn schedules_never_deadlock() {
        for schedule in [Schedule::GPipe, Schedule::OneFOneB] {
            for stages in 1..7 {
                for m in 1..12 {
                    assert!(
                        completes(schedule, stages, m),
                        "{schedule:?} K={stages} M={m}"
                    );
                }
            }
        }
    }

    #[test]
    fn one_f_one_b_holds_at_most_k_minus_s_micro_batches() {
        for stages in 1..7 {
            for m in 1..20 {
                for s in 0..stages {
                    let peak = peak_in_flight(&stage_ops(Schedule::OneFOneB, s, stages, m));
                    assert_eq!(peak, (stages - s).min(m));
                    let gpipe = peak_in_flight(&stage_ops(Schedule::GPipe, s, stages, m));
                    // Fill-drain holds every micro-batch, except with one
                    // stage, which has nothing to fill.
                    assert_eq!(gpipe, if stages == 1 { 1 } else { m });
                }
            }
        }
    }
}
